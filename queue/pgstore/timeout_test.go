package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// withParam returns dsn (a URL or key=value string) with one more setting.
func withParam(t *testing.T, dsn, key, value string) string {
	t.Helper()
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " " + key + "=" + value
}

func showTimeout(t *testing.T, dsn string) string { return show(t, dsn, "statement_timeout") }

func show(t *testing.T, dsn, setting string) string {
	t.Helper()
	ctx := context.Background()
	pool, err := pgstore.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var v string
	if err := pool.QueryRow(ctx, "SHOW "+setting).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Every statement is bounded: 30 s unless the DSN says otherwise.
func TestStatementTimeout_Default(t *testing.T) {
	if got := showTimeout(t, pgtest.DSN()); got != pgstore.DefaultStatementTimeout {
		t.Errorf("statement_timeout = %q, want %q", got, pgstore.DefaultStatementTimeout)
	}
	if got := showTimeout(t, withParam(t, pgtest.DSN(), "statement_timeout", "1500")); got != "1500ms" {
		t.Errorf("statement_timeout with the DSN's 1500 = %q", got)
	}
}

// A session idle inside a transaction (its process paused while it held
// envelopes' locks) is ended after 5 s unless the DSN says otherwise, and
// the locks it held are free again.
func TestIdleInTransactionTimeout(t *testing.T) {
	const k = "idle_in_transaction_session_timeout"
	if got := show(t, pgtest.DSN(), k); got != pgstore.DefaultIdleInTransactionTimeout {
		t.Errorf("%s = %q, want %q", k, got, pgstore.DefaultIdleInTransactionTimeout)
	}
	dsn := withParam(t, pgtest.DSN(), k, "300")
	if got := show(t, dsn, k); got != "300ms" {
		t.Errorf("%s with the DSN's 300 = %q", k, got)
	}
	ctx := context.Background()
	pool, err := pgstore.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(4242)"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // idle in the transaction, as a paused process would be
	if _, err := tx.Exec(ctx, "SELECT 1"); err == nil {
		t.Errorf("a session idle in its transaction for 1 s was not ended")
	}
	_ = tx.Rollback(ctx)
	var free bool
	if err := pool.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock(4242)").Scan(&free); err != nil || !free {
		t.Errorf("the ended session's lock is still held: %v %v", free, err)
	}
}

// A statement stuck behind a lock another session holds ends at
// statement_timeout with an error that says so (queue.ErrUnavailable: the
// HTTP API answers 503), stores nothing, and the store works once the
// lock is gone.
func TestStatementTimeout_LockedTable(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	s, err := pgstore.Open(ctx, withParam(t, pgtest.DSN(), "statement_timeout", "300"), &pgstore.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Enqueue(ctx, queuetest.Reply("before", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	tx, err := pgtest.Admin().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE "+schema+".deliveries IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	// Bounded by the test too: without statement_timeout the calls would
	// end only here, with the context's error.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req := queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 5}
	for name, call := range map[string]func() error{
		"Claim":   func() error { _, err := s.Claim(cctx, req); return err },
		"Enqueue": func() error { _, err := s.Enqueue(cctx, queuetest.Reply("during", "u-2", "hi")); return err },
		"Counts":  func() error { _, err := s.Counts(cctx, ""); return err },
	} {
		start := time.Now()
		err := call()
		var te *pgstore.TimeoutError
		if !errors.As(err, &te) || !errors.Is(err, queue.ErrUnavailable) {
			t.Fatalf("%s behind the lock after %v: %v, want a *pgstore.TimeoutError (queue.ErrUnavailable)", name, time.Since(start), err)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "", "during"); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("the timed-out enqueue: Get = %v, want ErrNotFound", err)
	}
	ls, err := s.Claim(ctx, req)
	if err != nil || len(ls) != 1 {
		t.Fatalf("Claim after the lock: %d leases, %v", len(ls), err)
	}
}

// A schema dropped under a running store (an operator's DROP SCHEMA, a URL
// that names another database after a failover) fails every call with an
// error that says what to do, as queue.ErrUnavailable (HTTP 503, the worker
// backs off), and Ping fails (/readyz answers 503); once the schema is
// migrated again the same store works.
func TestMissingSchema(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	s, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Enqueue(ctx, queuetest.Reply("before", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping = %v", err)
	}
	if _, err := pgtest.Admin().Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	want := "the store's tables are not in the database (its schema was dropped, or the URL names another database): migrate it again (outbox migrate, or pgstore.Migrate)"
	_, enqErr := s.Enqueue(ctx, queuetest.Reply("after", "u-1", "hi"))
	_, claimErr := s.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute})
	_, countErr := s.Counts(ctx, "")
	for name, err := range map[string]error{"Enqueue": enqErr, "Claim": claimErr, "Counts": countErr, "Ping": s.Ping(ctx)} {
		if !errors.Is(err, queue.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("%s after the schema was dropped = %v", name, err)
		}
	}
	pool, err := pgstore.Connect(ctx, pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pgstore.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping after migrating again = %v", err)
	}
	if _, err := s.Enqueue(ctx, queuetest.Reply("again", "u-1", "hi")); err != nil {
		t.Errorf("Enqueue after migrating again = %v", err)
	}
	if ls, err := s.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute}); err != nil || len(ls) != 1 || ls[0].Key.EnvelopeID != "again" {
		t.Errorf("Claim after migrating again = %v, %v", ls, err)
	}
}
