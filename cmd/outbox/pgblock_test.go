package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// outbox doctor on a schema whose table another session holds locked (a
// LOCK TABLE, or a migration's transaction, left open in psql: every
// statement of serve waits behind it until statement_timeout) names that
// session and how to end it, at once, instead of waiting behind the lock
// itself; once the lock is gone it is ok again.
func TestPG_DoctorNamesASessionHoldingALock(t *testing.T) {
	defer func(d time.Duration) { blockerAge = d }(blockerAge)
	blockerAge = 0
	schema := pgtest.Schema(t)
	getenv := func(k string) string {
		switch k {
		case EnvDatabaseURL:
			return pgtest.DSN()
		case "OUTBOX_DATABASE_SCHEMA":
			return schema
		}
		return ""
	}
	doctor := func() (string, int) {
		var out bytes.Buffer
		e := &env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out, Getenv: getenv}
		code := run(context.Background(), e, []string{"doctor", "--data", t.TempDir()})
		return out.String(), code
	}
	ctx := context.Background()
	var out bytes.Buffer
	if code := run(ctx, &env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &out, Getenv: getenv}, []string{"migrate"}); code != 0 {
		t.Fatalf("migrate: %d %s", code, out.String())
	}
	tx, err := pgtest.Admin().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+schema+".deliveries IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, code := doctor()
	if code == 0 || !strings.Contains(got, "session pid "+strconv.Itoa(pid)) || !strings.Contains(got, "pg_terminate_backend("+strconv.Itoa(pid)+")") ||
		!strings.Contains(got, schema+".deliveries") {
		t.Fatalf("doctor with pid %d holding %s.deliveries = %d:\n%s", pid, schema, code, got)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("doctor took %s: it waited behind the lock", d)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got, code := doctor(); code != 0 || strings.Contains(got, "session pid") {
		t.Fatalf("doctor after the lock was released = %d:\n%s", code, got)
	}
}
