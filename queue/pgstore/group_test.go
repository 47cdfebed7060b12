package pgstore_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

type enqResult struct {
	res []queue.EnqueueResult
	err error
}

// Concurrent Enqueue calls share one statement, each still all or
// nothing: a call refused by Admit fails alone, an id two calls of one
// group carry is stored once, and when the server refuses the group's
// statement every call is tried alone, so that only the call at fault
// fails.
func TestEnqueue_GroupCommit(t *testing.T) {
	ctx := context.Background()
	s, schema, waiting, groups := hookedStore(t, pgstore.SetEnqueueHooks)
	tbl := pgx.Identifier{schema}.Sanitize() + ".envelopes"

	// round runs first alone while an uncommitted row of the admin's holds
	// its id, so that the calls started meanwhile (in order) wait and then
	// run as one group.
	round := func(first string, meanwhile func(), calls ...[]*envelope.Envelope) []enqResult {
		t.Helper()
		tx, err := pgtest.Admin().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO `+tbl+` (tenant, id, seq, user_id, channel, template, addr_target, segments, enqueued_ns, body)
			VALUES ('default', $1, -1, 'u', 'telegram', 'reply-text.v1', '', 1, 0, '\x7b7d')`, first); err != nil {
			t.Fatal(err)
		}
		blocked := make(chan error, 1)
		go func() {
			_, err := s.Enqueue(ctx, queuetest.Reply(first, "u-0", "hi"))
			blocked <- err
		}()
		if n := <-groups; n != 1 {
			t.Fatalf("the first call ran in a group of %d", n)
		}
		waitBlocked(t, schema)
		out := make([]enqResult, len(calls))
		done := make(chan int, len(calls))
		for i, envs := range calls {
			go func() {
				out[i].res, out[i].err = s.Enqueue(ctx, envs...)
				done <- i
			}()
			<-waiting
		}
		meanwhile()
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-blocked; err != nil {
			t.Fatalf("the first call: %v", err)
		}
		for range calls {
			<-done
		}
		return out
	}
	stored := func(id string) bool {
		t.Helper()
		_, err := s.Get(ctx, "", id)
		if err != nil && !errors.Is(err, queue.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}

	expired := queuetest.Reply("c2", "u-3", "late")
	expired.ExpiresAt = time.Now().Add(-time.Hour)
	// A call whose context ends while it waits returns at once and
	// stores nothing.
	gone := func() {
		cctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := s.Enqueue(cctx, queuetest.Reply("x1", "u-9", "hi"))
			errc <- err
		}()
		<-waiting
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("a call cancelled while it waits = %v, want context.Canceled", err)
		}
	}
	r := round("block1", gone,
		[]*envelope.Envelope{queuetest.Reply("a1", "u-1", "hi"), queuetest.Reply("dup", "u-1", "one"), queuetest.Reply("a2", "u-1", "hi")},
		[]*envelope.Envelope{queuetest.Reply("b1", "u-2", "hi"), queuetest.Reply("dup", "u-2", "two")},
		[]*envelope.Envelope{queuetest.Reply("c1", "u-3", "hi"), expired},
	)
	if n := <-groups; n != 3 {
		t.Fatalf("the waiting calls ran in a group of %d, want 3", n)
	}
	if r[0].err != nil || len(r[0].res) != 3 || r[0].res[0].Duplicate || r[0].res[1].Duplicate || r[0].res[2].Duplicate {
		t.Errorf("call 1 = %+v, %v; want three new envelopes", r[0].res, r[0].err)
	}
	if r[1].err != nil || len(r[1].res) != 2 || r[1].res[0].Duplicate || !r[1].res[1].Duplicate || r[1].res[1].Segments != 1 {
		t.Errorf("call 2 = %+v, %v; want b1 new and dup a duplicate of call 1's (1 segment)", r[1].res, r[1].err)
	}
	var ee *queue.EnqueueError
	if !errors.As(r[2].err, &ee) || ee.Index != 1 || !errors.Is(r[2].err, queue.ErrExpired) || r[2].res != nil {
		t.Errorf("call 3 = %+v, %v; want ErrExpired at index 1", r[2].res, r[2].err)
	}
	for id, want := range map[string]bool{"block1": true, "a1": true, "a2": true, "dup": true, "b1": true, "c1": false, "c2": false, "x1": false} {
		if got := stored(id); got != want {
			t.Errorf("%s stored = %v, want %v", id, got, want)
		}
	}
	if st, err := s.Get(ctx, "", "dup"); err != nil || st.Envelope.UserID != "u-1" {
		t.Errorf("dup = %+v, %v; want call 1's", st, err)
	}

	// The server refuses one call's envelope: the group's statement fails,
	// and each call is tried alone.
	if _, err := pgtest.Admin().Exec(ctx, `ALTER TABLE `+tbl+` ADD CONSTRAINT poison CHECK (id <> 'poison')`); err != nil {
		t.Fatal(err)
	}
	r = round("block2", func() {},
		[]*envelope.Envelope{queuetest.Reply("d1", "u-4", "hi"), queuetest.Reply("poison", "u-4", "hi")},
		[]*envelope.Envelope{queuetest.Reply("e1", "u-5", "hi")},
	)
	if n := <-groups; n != 2 {
		t.Fatalf("the waiting calls ran in a group of %d, want 2", n)
	}
	if r[0].err == nil || !containsAll(r[0].err.Error(), "enqueue", "poison") {
		t.Errorf("call with the refused envelope: err = %v, want the server's refusal", r[0].err)
	}
	if r[1].err != nil || len(r[1].res) != 1 || r[1].res[0].Duplicate {
		t.Errorf("the other call = %+v, %v; want e1 stored", r[1].res, r[1].err)
	}
	for id, want := range map[string]bool{"d1": false, "poison": false, "e1": true} {
		if got := stored(id); got != want {
			t.Errorf("%s stored = %v, want %v", id, got, want)
		}
	}
}

// hookedStore opens a store in a fresh schema with a group's test hooks
// (set): waiting gets a value when a call starts waiting for a group,
// groups the size of each group that runs.
func hookedStore(t *testing.T, set func(*pgstore.Store, func(), func(int))) (*pgstore.Store, string, chan struct{}, chan int) {
	t.Helper()
	schema := pgtest.Schema(t)
	s, err := pgstore.Open(context.Background(), pgtest.DSN(), &pgstore.Options{Schema: schema,
		Options: queue.Options{Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	waiting, groups := make(chan struct{}, 16), make(chan int, 16)
	set(s, func() { waiting <- struct{}{} }, func(n int) { groups <- n })
	return s, schema, waiting, groups
}

// waitBlocked waits until a session waits for a lock in schema (the first
// call's insert, behind the admin's uncommitted row).
func waitBlocked(t *testing.T, schema string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; { // a liveness bound, not a timing assertion
		var n int
		if err := pgtest.Admin().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, `"`+schema+`".envelopes`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no call waited for the admin's lock")
		}
		time.Sleep(time.Millisecond)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
