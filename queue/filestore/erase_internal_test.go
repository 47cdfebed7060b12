package filestore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// holdWriter makes the writer wait inside a transaction until the returned
// release is called.
func holdWriter(t *testing.T, q *Queue) (release func()) {
	t.Helper()
	in, out := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- q.write(context.Background(), true, func(*bolt.Tx) error {
			close(in)
			<-out
			return nil
		})
	}()
	<-in
	return func() {
		close(out)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// waitQueued waits until n ops are queued for the writer.
func waitQueued(t *testing.T, q *Queue, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(q.ops) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d ops queued, want %d", len(q.ops), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// An Enqueue whose record is durable but whose index update is queued
// after an Erase of the same user leaves nothing behind: the record went
// with the log, and no row may point to it.
func TestErase_RacingAnEnqueueLeavesNoRow(t *testing.T) {
	q := openFault(t, t.TempDir())
	defer q.Close()
	ctx := context.Background()
	release := holdWriter(t, q)
	erased := make(chan error, 1)
	go func() { erased <- q.Erase(ctx, "", "u1") }()
	waitQueued(t, q, 1) // the Erase, first in line
	if _, err := q.Enqueue(ctx, faultEnvelope("late", "u1")); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, q, 2) // then the Enqueue's index update
	release()
	if err := <-erased; err != nil {
		t.Fatal(err)
	}
	if st, err := q.Get(ctx, "", "late"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("after Erase, the envelope appended before it is indexed: %+v, %v", st, err)
	}
}

// An erased user's envelopes do not survive in the envelope cache: a
// record another process appends to the user's new log at the same offset
// is read from the log, not answered with the erased envelope.
func TestErase_ForgetsCachedEnvelopes(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	defer q.Close()
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, faultEnvelope("old", "u1")); err != nil {
		t.Fatal(err)
	}
	if err := q.Erase(ctx, "", "u1"); err != nil {
		t.Fatal(err)
	}
	next := faultEnvelope("new", "u1")
	next.Recipient.ChatID = "777"
	if err := Append(dir, next); err != nil {
		t.Fatal(err)
	}
	q.Rescan()
	if err := q.catchUpAll(false); err != nil {
		t.Fatal(err)
	}
	st, err := q.Get(ctx, "", "new")
	if err != nil {
		t.Fatal(err)
	}
	var rec *envRec
	if err := q.viewNow(func(tx *bolt.Tx) error {
		var err error
		rec, err = getEnv(tx, envKey(st.Tenant, st.ID))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	env, err := q.readEnvelope(envKey(st.Tenant, st.ID), rec)
	if err != nil {
		t.Fatal(err)
	}
	if env.ID != "new" || env.Recipient.ChatID != "777" {
		t.Fatalf("read back %q for chat %q: the erased envelope, from the cache", env.ID, env.Recipient.ChatID)
	}
}

// Enqueues (in process and by another process's appender) racing Erases of
// the same users leave a consistent store: the index and the logs agree,
// and every claimed row carries its own envelope.
func TestErase_RacingEnqueuesLeaveAConsistentStore(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	defer q.Close()
	ctx := context.Background()
	const users = 4 // u0 and u1 are erased over and over; u2 and u3 are not
	var writers sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 3 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range 150 {
				e := faultEnvelope(fmt.Sprintf("w%d-%d", w, i), fmt.Sprintf("u%d", i%users))
				e.Recipient.ChatID = fmt.Sprintf("%d", 1000*w+i)
				var err error
				if w == 2 {
					err = Append(dir, e) // another process's appender
				} else {
					_, err = q.Enqueue(ctx, e)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { writers.Wait(); close(done) }()
	erased := make(chan struct{})
	go func() {
		defer close(erased)
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if err := q.Erase(ctx, "", fmt.Sprintf("u%d", i%2)); err != nil {
				errs <- err
				return
			}
		}
	}()
	<-erased
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := q.catchUpAll(false); err != nil { // the other process's last lines
		t.Fatal(err)
	}
	rep, err := q.Check()
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("store inconsistent after enqueues racing erases: %v", rep.Problems)
	}
	leases, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, l := range leases {
		if l.Envelope == nil || l.Envelope.ID != l.Key.EnvelopeID {
			t.Fatalf("lease of %s carries envelope %+v", l.Key.EnvelopeID, l.Envelope)
		}
		if l.UserID == "u2" || l.UserID == "u3" {
			kept++
		}
	}
	want := 0
	for i := range 150 {
		if i%users >= 2 {
			want += 3
		}
	}
	if kept != want {
		t.Fatalf("%d rows of the users never erased, want %d", kept, want)
	}
}
