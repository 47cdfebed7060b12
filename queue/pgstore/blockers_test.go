package pgstore_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// Blockers names a session that holds a table lock on the store's tables,
// and one holding a row lock that another session waits for; it names no
// session while none blocks, nor one younger than asked.
func TestBlockers(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	s, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, Options: queue.Options{Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Enqueue(ctx, queuetest.Reply("r-1", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	pool, err := pgstore.Connect(ctx, pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	blockers := func(older time.Duration) []pgstore.Blocker {
		t.Helper()
		b, err := pgstore.Blockers(ctx, pool, schema, older)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if b := blockers(0); len(b) != 0 {
		t.Fatalf("blockers of a quiet store: %v", b)
	}

	// A table lock left in an open transaction.
	admin := pgtest.Admin()
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+schema+".deliveries IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	b := blockers(0)
	if len(b) != 1 || b[0].PID != pid || b[0].Table != schema+".deliveries" {
		t.Fatalf("blockers with a SHARE lock held by pid %d: %+v", pid, b)
	}
	msg := b[0].String()
	if !strings.Contains(msg, "pg_terminate_backend("+strconv.Itoa(pid)+")") || strings.Contains(msg, "LOCK TABLE") {
		t.Errorf("blocker's text %q: want the way out, and never the session's query", msg)
	}
	if b := blockers(time.Hour); len(b) != 0 {
		t.Errorf("blockers in a transaction for an hour or more: %+v", b)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// A row lock that another session waits for.
	holder, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, "SELECT 1 FROM "+schema+".envelopes WHERE id = 'r-1' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	waiter, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Rollback(ctx)
	waitCtx, stop := context.WithCancel(ctx)
	defer stop()
	waiting := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(waitCtx, "SELECT 1 FROM "+schema+".envelopes WHERE id = 'r-1' FOR UPDATE")
		waiting <- err
	}()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b = blockers(0)
		if len(b) == 1 && b[0].PID == pid {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("blockers with a waiter behind pid %d's row lock: %+v", pid, b)
		}
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
}
