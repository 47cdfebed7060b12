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
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := pgtest.Admin().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = $1`, `LISTEN "outbox_wake_`+schema+`"`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("a never listened")
		}
	}
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
