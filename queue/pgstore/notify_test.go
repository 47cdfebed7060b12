package pgstore_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// A store closed right after an enqueue (outbox enqueue --database-url: one
// process per call) still tells the other processes: the NOTIFY its
// throttle held back goes out at Close instead of being dropped, which left
// the envelope waiting for the worker's slow rescan.
func TestClose_SendsTheHeldNotify(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	quiet := &pgstore.Options{Schema: schema, Options: queue.Options{Logger: slog.New(slog.DiscardHandler)}}
	a, err := pgstore.Open(ctx, pgtest.DSN(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	waitListening(t, schema, 1)
	// A's signals so far (its own connect) are drained; the next one can
	// only be b's NOTIFY.
	time.Sleep(50 * time.Millisecond)
	select {
	case <-a.Notify():
	default:
	}
	for i := range 20 { // each round: a fresh store that enqueues once and closes at once
		b, err := pgstore.Open(ctx, pgtest.DSN(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Enqueue(ctx, queuetest.Reply("r-"+string(rune('a'+i)), "u-1", "hi")); err != nil {
			t.Fatal(err)
		}
		b.Close()
		select {
		case <-a.Notify():
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: no wake-up from a store closed right after its enqueue", i)
		}
	}
}

// A store's listener does not signal Notify for the store's own NOTIFY:
// the store signalled when it asked for it, and a second signal cost the
// worker a turn that found nothing (a claim, a recovery check and a due
// time, three transactions per envelope). Another store's NOTIFY signals.
func TestListen_IgnoresItsOwnNotify(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	heard := make(chan bool, 16)
	oa := &pgstore.Options{Schema: schema, Options: queue.Options{Logger: slog.New(slog.DiscardHandler)}}
	pgstore.WithListenHook(oa, func(signalled bool) { heard <- signalled })
	a, err := pgstore.Open(ctx, pgtest.DSN(), oa)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, Options: queue.Options{Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	waitListening(t, schema, 2)
	next := func(what string) bool {
		select {
		case s := <-heard:
			return s
		case <-time.After(20 * time.Second):
			t.Fatalf("a's listener heard no NOTIFY for %s", what)
			return false
		}
	}
	// a's own NOTIFY reaches its listener before b's (the server delivers
	// them in commit order), so each is told apart.
	if _, err := a.Enqueue(ctx, queuetest.Reply("r-a", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	if next("a's enqueue") {
		t.Fatal("a's listener signalled Notify for a's own NOTIFY")
	}
	if _, err := b.Enqueue(ctx, queuetest.Reply("r-b", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	if !next("b's enqueue") {
		t.Fatal("a's listener did not signal Notify for b's NOTIFY")
	}
}

// waitListening waits until n connections LISTEN on schema's channel.
func waitListening(t *testing.T, schema string, n int) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var got int
		if err := pgtest.Admin().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE query = $1`, `LISTEN "outbox_wake_`+schema+`"`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d stores listen", got, n)
		}
	}
}
