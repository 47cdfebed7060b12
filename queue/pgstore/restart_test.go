package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// TestRestart_MidLoad restarts the server (pgtest.Restart) under a
// producer and a worker: enqueues fail with a clear error and are all or
// nothing, acknowledged envelopes are all there, the store resumes by
// itself, and after the leases cut by the outage are recovered every row
// is sent, none twice.
func TestRestart_MidLoad(t *testing.T) {
	ctx := context.Background()
	clock := queuetest.NewClock(queuetest.T0)
	var logs syncBuffer
	// The mark too: a crash of the server is not a restore (a number drawn
	// by a transaction the crash cut may be drawn again; one committed
	// never is).
	mark := filepath.Join(t.TempDir(), "pg.mark")
	opts := &pgstore.Options{Schema: pgtest.Schema(t), MarkFile: mark, Options: queue.Options{
		Now:    clock.Now,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}}
	s, err := pgstore.Open(ctx, pgtest.DSN(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s.Close()
		if s2, err := pgstore.Open(ctx, pgtest.DSN(), opts); err != nil {
			t.Errorf("Open with the mark after the crash = %v", err)
		} else {
			s2.Close()
		}
	}()

	type batch struct {
		ids []string
		err error
	}
	var (
		mu      sync.Mutex
		batches []batch
		acked   int
		sent    = map[envelope.Key]int{} // successful sent commits
		lost    int                      // commits that failed (some may have committed)
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	pause := func() {
		select {
		case <-stop:
		case <-time.After(5 * time.Millisecond):
		}
	}
	wg.Go(func() { // the producer
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			var (
				ids  []string
				envs []*envelope.Envelope
			)
			for j := range 4 {
				id := fmt.Sprintf("b%d-%d", i, j)
				text := "hi"
				if j == 0 {
					text = queuetest.ReplyText(2)
				}
				ids, envs = append(ids, id), append(envs, queuetest.Reply(id, "u-1", text))
			}
			c, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := s.Enqueue(c, envs...)
			cancel()
			mu.Lock()
			batches = append(batches, batch{ids, err})
			if err == nil {
				acked++
			}
			mu.Unlock()
			if err != nil {
				pause()
			}
		}
	})
	wg.Go(func() { // the worker
		for {
			select {
			case <-stop:
				return
			default:
			}
			ls, err := s.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: 30 * time.Second, Limit: 4})
			if err != nil || len(ls) == 0 {
				pause()
				continue
			}
			for _, l := range ls {
				err := s.Commit(ctx, l, queue.Outcome{State: envelope.StateSent})
				mu.Lock()
				if err == nil {
					sent[l.Key]++
				} else {
					lost++
				}
				mu.Unlock()
			}
		}
	})
	waitAcked := func(n int) {
		t.Helper()
		for end := time.Now().Add(2 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			a := acked
			mu.Unlock()
			if a >= n {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("only %d batches acknowledged, want %d", a, n)
			}
		}
	}
	waitAcked(20)
	if err := pgtest.Restart(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	after := acked
	mu.Unlock()
	waitAcked(after + 20) // the store resumed by itself
	close(stop)
	wg.Wait()

	// Nothing half-written, nothing acknowledged lost; the errors say what
	// failed, without the DSN.
	failed := 0
	host := strings.TrimPrefix(strings.Fields(pgtest.DSN())[0], "host=")
	for _, b := range batches {
		present := 0
		for _, id := range b.ids {
			_, err := s.Get(ctx, envelope.DefaultTenant, id)
			switch {
			case err == nil:
				present++
			case !errors.Is(err, queue.ErrNotFound):
				t.Fatal(err)
			}
		}
		if b.err == nil && present != len(b.ids) {
			t.Errorf("batch %v acknowledged, %d of its envelopes stored", b.ids, present)
		}
		if b.err != nil {
			failed++
			if present != 0 && present != len(b.ids) {
				t.Errorf("failed batch %v half written: %d of %d envelopes stored", b.ids, present, len(b.ids))
			}
			if msg := b.err.Error(); !strings.HasPrefix(msg, "pgstore: enqueue") || strings.Contains(msg, host) {
				t.Errorf("enqueue error %q: want it to name the operation, without the DSN", msg)
			}
		}
	}
	if pgtest.Private() && failed == 0 {
		t.Error("no enqueue failed while the server was down")
	}

	// Leases cut by the outage expire and are reconciled; then nothing is left.
	clock.Advance(time.Hour)
	for {
		ls, err := s.Recover(ctx, queue.ClaimRequest{Owner: "r", Lease: time.Minute, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		more, err := s.Claim(ctx, queue.ClaimRequest{Owner: "w2", Lease: time.Minute, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, more...)
		if len(ls) == 0 {
			break
		}
		for _, l := range ls {
			if err := s.Commit(ctx, l, queue.Outcome{State: envelope.StateSent}); err != nil {
				t.Fatal(err)
			}
			sent[l.Key]++
		}
	}
	c, err := s.Counts(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for st, m := range c {
		for _, n := range m {
			rows += n
		}
		if st != envelope.StateSent {
			t.Errorf("%d rows %s, want every row sent", c.Total(st), st)
		}
	}
	for k, n := range sent {
		if n != 1 {
			t.Errorf("%v: %d successful sent commits", k, n)
		}
	}
	if len(sent) > rows || rows-len(sent) > lost {
		t.Errorf("%d rows sent by a commit that succeeded, %d rows stored, %d commits failed", len(sent), rows, lost)
	}
	if out := logs.String(); !strings.Contains(out, "listen connection lost") || strings.Contains(out, host) {
		t.Errorf("the log does not say the LISTEN connection was lost, or names the server:\n%s", out)
	}
	t.Logf("%d batches, %d failed; %d rows, %d commits failed", len(batches), failed, rows, lost)
}
