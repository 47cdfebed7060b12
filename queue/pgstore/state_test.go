package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/prometheus/client_golang/prometheus"
)

// wantState checks that err is a StateError of the given kind that says
// why, is queue.ErrUnavailable, and holds nothing of the DSN.
func wantState(t *testing.T, what string, err error, kind error, phrase string) {
	t.Helper()
	var se *pgstore.StateError
	if !errors.As(err, &se) || !errors.Is(err, kind) || !errors.Is(err, queue.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), phrase) {
		t.Errorf("%s = %v, want a StateError (%v) saying %q", what, err, kind, phrase)
		return
	}
	for _, leak := range []string{pgtest.DSN(), "postgres://", "password"} {
		if strings.Contains(err.Error(), leak) {
			t.Errorf("%s: %q holds %q", what, err, leak)
		}
	}
}

// A database that accepts no writes (a standby the URL still names after a
// failover, or default_transaction_read_only) fails every write with
// storage_read_only's error and says to point the URL at the primary;
// Ping (the readiness check) says so too; reads still answer; nothing
// stored changes.
func TestReadOnlyDatabase(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	rw, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	if _, err := rw.Enqueue(ctx, queuetest.Reply("before", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	roDSN := withParam(t, pgtest.DSN(), "default_transaction_read_only", "on")
	const phrase = "the database accepts no writes (it is a standby, or default_transaction_read_only is on): point the URL at the primary"
	if _, err := pgstore.Open(ctx, roDSN, &pgstore.Options{Schema: schema}); err == nil {
		t.Fatal("Open (migrating) on a read-only database succeeded")
	} else {
		wantState(t, "Open", err, queue.ErrStorageReadOnly, phrase)
	}
	ro, err := pgstore.Open(ctx, roDSN, &pgstore.Options{Schema: schema, NoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	_, enqErr := ro.Enqueue(ctx, queuetest.Reply("during", "u-1", "hi"))
	_, claimErr := ro.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute})
	consentErr := ro.SetConsent(ctx, "", "u-2", queue.ConsentFlags{})
	for name, err := range map[string]error{"Enqueue": enqErr, "Claim": claimErr, "SetConsent": consentErr, "Ping": ro.Ping(ctx)} {
		wantState(t, name, err, queue.ErrStorageReadOnly, phrase)
		if p := queue.StorageProblemOf(err); p != queue.StorageReadOnly {
			t.Errorf("StorageProblemOf(%s's error) = %q", name, p)
		}
	}
	c, err := ro.Counts(ctx, "")
	if err != nil {
		t.Fatalf("Counts on a read-only database = %v", err)
	}
	if n := c.Total(envelope.StatePending); n != 1 {
		t.Errorf("pending = %d, want 1 (before; during was not stored)", n)
	}
	if err := rw.Ping(ctx); err != nil {
		t.Errorf("Ping of the writable store = %v", err)
	}
	if ls, err := rw.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute}); err != nil || len(ls) != 1 || ls[0].Key.EnvelopeID != "before" {
		t.Errorf("Claim of the writable store = %v, %v", ls, err)
	}
}

// A role without the privileges the store needs is told which grant is
// missing (storage_permission_denied's error), not an internal error; what
// it may do still works.
func TestRoleWithoutPrivilege(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	rw, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	role := schema + "_reader"
	admin := pgtest.Admin()
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+role)
	})
	// The session takes the role at its start (SET ROLE), whatever the
	// server's authentication.
	dsn := withParam(t, pgtest.DSN(), "role", role)
	const phrase = "the database role has no privilege on the store's schema or tables: grant it"
	if _, err := pgstore.Open(ctx, dsn, &pgstore.Options{Schema: schema, NoMigrate: true}); err == nil {
		t.Fatal("Open by a role without USAGE on the schema succeeded")
	} else {
		wantState(t, "Open without USAGE", err, queue.ErrStorageDenied, phrase)
	}
	for _, g := range []string{"GRANT USAGE ON SCHEMA " + schema + " TO " + role, "GRANT SELECT ON ALL TABLES IN SCHEMA " + schema + " TO " + role, "GRANT SELECT ON ALL SEQUENCES IN SCHEMA " + schema + " TO " + role} {
		if _, err := admin.Exec(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	s, err := pgstore.Open(ctx, dsn, &pgstore.Options{Schema: schema, NoMigrate: true})
	if err != nil {
		t.Fatalf("Open by a role that may read = %v", err)
	}
	defer s.Close()
	_, err = s.Enqueue(ctx, queuetest.Reply("r-1", "u-1", "hi"))
	wantState(t, "Enqueue by a role that may only read", err, queue.ErrStorageDenied, phrase)
	if _, err := s.Counts(ctx, ""); err != nil {
		t.Errorf("Counts by a role that may read = %v", err)
	}
}

// The server's other refusals for its state are unavailable (retry
// later), each saying why.
func TestStateErrors(t *testing.T) {
	for _, tc := range []struct {
		state, phrase string
		kind          error
	}{
		{"25006", "accepts no writes", queue.ErrStorageReadOnly},
		{"53100", "disk is full", queue.ErrStorageFull},
		{"53200", "short of memory or connections", nil},
		{"53300", "short of memory or connections", nil},
		{"42501", "no privilege", queue.ErrStorageDenied},
		{"40001", "conflicted", nil},
		{"40P01", "conflicted", nil},
		{"55P03", "conflicted", nil},
	} {
		err := pgstore.SafeErr("claim", tc.state)
		kind := tc.kind
		if kind == nil {
			kind = queue.ErrUnavailable
		}
		wantState(t, tc.state, err, kind, tc.phrase)
		if tc.kind == nil && queue.StorageProblemOf(err) != "" {
			t.Errorf("%s: a storage problem (%q)", tc.state, queue.StorageProblemOf(err))
		}
	}
	if err := pgstore.SafeErr("claim", "23505"); errors.Is(err, queue.ErrUnavailable) {
		t.Errorf("a unique violation is unavailable: %v", err)
	}
}

// A migration that cannot take the schema's migration lock (another
// session holds it) waits as long as its context lets it, then names the
// session: before, it ended with "timeout: context deadline exceeded".
func TestMigrate_LockHeldNamesTheHolder(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	pool, err := pgstore.Connect(ctx, pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	holder, err := pgtest.Admin().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	var pid int
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, pgstore.MigrateLockKey, schema); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_, err = pgstore.Migrate(short, pool, schema)
	var le *pgstore.MigrateLockError
	if !errors.As(err, &le) || le.PID != pid || !strings.Contains(err.Error(), fmt.Sprintf("pg_terminate_backend(%d)", pid)) {
		t.Fatalf("Migrate with the lock held by pid %d = %v", pid, err)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pgstore.Migrate(ctx, pool, schema); err != nil {
		t.Errorf("Migrate once the lock is free = %v", err)
	}
}

// A host whose clock is off from the database server's by more than
// MaxClockSkew is warned about at Open (leases are judged by each
// process's clock), and the gauge says by how much; an accurate one is not.
func TestClockSkew_Warned(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		offset time.Duration // the host clock's error
		warn   bool
	}{{"in sync", 0, false}, {"ten seconds behind", -10 * time.Second, true}, {"a minute ahead", time.Minute, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			reg := prometheus.NewRegistry()
			o := &pgstore.Options{Schema: pgtest.Schema(t), Options: queue.Options{
				Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg}}
			pgstore.WithHostClock(o, func() time.Time { return time.Now().Add(tc.offset) })
			s, err := pgstore.Open(ctx, pgtest.DSN(), o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			warned := strings.Contains(logs.String(), "keep every host's clock in sync (NTP)")
			if warned != tc.warn {
				t.Errorf("warned %v, want %v:\n%s", warned, tc.warn, logs.String())
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var skew *float64
			for _, mf := range mfs {
				if mf.GetName() == "outbox_pg_clock_skew_seconds" {
					skew = ptr(mf.GetMetric()[0].GetGauge().GetValue())
				}
			}
			if want := -tc.offset.Seconds(); skew == nil || *skew < want-0.5 || *skew > want+0.5 {
				t.Errorf("outbox_pg_clock_skew_seconds = %v, want about %v", skew, want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// A mark file that cannot be written (a read-only data directory) does
// not keep the store from opening: it warns once, and a restore under the
// running store is still found, even before the store's first draw.
func TestMarkFile_NotWritable(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	open := func() (*pgstore.Store, error) {
		return pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, MarkFile: filepath.Join(notDir, "pg.mark"),
			Options: queue.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}})
	}
	s, err := open()
	if err != nil {
		t.Fatalf("Open with a mark file that cannot be written = %v", err)
	}
	if _, err := s.Enqueue(ctx, queuetest.Reply("a", "u-a", "hi")); err != nil {
		t.Fatal(err)
	}
	backup := pgDump(t, schema)
	if _, err := s.Enqueue(ctx, queuetest.Reply("b", "u-b", "hi")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if n := strings.Count(logs.String(), "mark file cannot be written"); n != 1 {
		t.Errorf("warnings about the mark file = %d, want 1:\n%s", n, logs.String())
	}

	s, err = open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pgRestore(t, schema, backup)
	if _, err := s.Enqueue(ctx, queuetest.Reply("c", "u-c", "hi")); err == nil {
		t.Fatal("Enqueue on a database restored under the store before its first draw succeeded")
	}
	var re *pgstore.RestoredError
	if err := s.Ping(ctx); !errors.As(err, &re) || !re.AtRuntime {
		t.Errorf("Ping after a restore under the store = %v, want the RestoredError", err)
	}
}

// pgDump dumps schema as an operator backs one up.
func pgDump(t *testing.T, schema string) string {
	t.Helper()
	bin, err := pgtest.Bin("pg_dump")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dump.sql")
	if out, err := exec.Command(bin, "-d", pgtest.DSN(), "-n", schema, "-f", file).CombinedOutput(); err != nil {
		t.Fatalf("pg_dump: %v %s", err, out)
	}
	return file
}

// pgRestore drops schema and loads a dump of it, as an operator restores one.
func pgRestore(t *testing.T, schema, file string) {
	t.Helper()
	if _, err := pgtest.Admin().Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	bin, err := pgtest.Bin("psql")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-d", pgtest.DSN(), "-q", "-v", "ON_ERROR_STOP=1", "-f", file).CombinedOutput(); err != nil {
		t.Fatalf("psql: %v %s", err, out)
	}
}

// A database restored from a backup (pg_dump, then DROP SCHEMA and psql
// of the dump, as an operator restores one) is refused, by the mark file
// at Open and by a running store at its next draw, instead of delivering
// again what was delivered since the dump; AfterRestore makes the
// deliveries of unknown fate unresolved and the store serves again. A
// schema made afresh is not a restore.
func TestRestoredDatabase(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	mark := filepath.Join(t.TempDir(), "pg.mark")
	open := func(mark string) (*pgstore.Store, error) {
		return pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, MarkFile: mark})
	}
	dump := func(string) string { t.Helper(); return pgDump(t, schema) }
	restore := func(file string) { t.Helper(); pgRestore(t, schema, file) }
	s, err := open(mark)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Enqueue(ctx, queuetest.Reply(id, "u-"+id, "hi")); err != nil {
			t.Fatal(err)
		}
	}
	backup := dump("backup")
	ls, err := s.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 2})
	if err != nil || len(ls) != 2 {
		t.Fatalf("Claim = %v, %v", ls, err)
	}
	if err := s.Commit(ctx, ls[0], queue.Outcome{State: envelope.StateSent}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	restore(backup) // every envelope is pending again: a, sent, would go out twice
	const hint = "it was restored from a backup, or is a copy; everything delivered since the backup would be delivered again. Run outbox doctor --after-restore"
	var re *pgstore.RestoredError
	if _, err := open(mark); !errors.As(err, &re) || !errors.Is(err, queue.ErrUnavailable) || !strings.Contains(err.Error(), hint) {
		t.Fatalf("Open of the restored database with the mark = %v", err)
	}
	s, err = open("")
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.AfterRestore(ctx)
	if err != nil || n != 3 {
		t.Fatalf("AfterRestore = %d, %v; want the 3 envelopes pending in the backup", n, err)
	}
	for _, id := range []string{"a", "b", "c"} {
		st, err := s.Get(ctx, "", id)
		if err != nil || st.Segments[0].State != envelope.StateUnresolved || st.Segments[0].Class != envelope.ClassRestored {
			t.Errorf("%s after AfterRestore = %+v, %v; want unresolved (database_restored)", id, st, err)
		}
	}
	if ls, err := s.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 5}); err != nil || len(ls) != 0 {
		t.Errorf("Claim after AfterRestore = %v, %v; want nothing", ls, err)
	}
	s.Close()
	s, err = open(mark) // a new instance: the old mark is superseded
	if err != nil {
		t.Fatalf("Open with the old mark after AfterRestore = %v", err)
	}

	// Restored under a running store: its next draw finds it.
	if _, err := s.Enqueue(ctx, queuetest.Reply("d", "u-d", "hi")); err != nil {
		t.Fatal(err)
	}
	second := dump("second")
	if _, err := s.Enqueue(ctx, queuetest.Reply("e", "u-e", "hi")); err != nil {
		t.Fatal(err)
	}
	restore(second)
	if _, err := s.Enqueue(ctx, queuetest.Reply("f", "u-f", "hi")); err == nil {
		t.Fatal("Enqueue on a database restored under the store succeeded")
	}
	if err := s.Ping(ctx); !errors.As(err, &re) || !re.AtRuntime {
		t.Errorf("Ping after a restore under the store = %v, want the RestoredError", err)
	}
	s.Close()

	// A schema made afresh (dropped, migrated again) is another queue.
	if _, err := pgtest.Admin().Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	if s, err = open(mark); err != nil {
		t.Fatalf("Open of a schema made afresh with the old mark = %v", err)
	}
	s.Close()
}

// Leases are judged by the database server's clock: a process on a host
// whose clock is 40 s ahead (more than the lease) does not take over a
// live lease of another process, and its store's clock is the server's.
func TestClockSkew_LeasesAreJudgedByTheServersClock(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, Options: queue.Options{Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ob := &pgstore.Options{Schema: schema, Options: queue.Options{Logger: quiet}}
	pgstore.WithHostClock(ob, func() time.Time { return time.Now().Add(40 * time.Second) })
	b, err := pgstore.Open(ctx, pgtest.DSN(), ob)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := a.Enqueue(ctx, queuetest.Reply("skew-1", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	ls, err := a.Claim(ctx, queue.ClaimRequest{Owner: "a", Lease: 30 * time.Second, Limit: 1})
	if err != nil || len(ls) != 1 {
		t.Fatalf("claim on a = %d leases, %v", len(ls), err)
	}
	if got, err := b.Recover(ctx, queue.ClaimRequest{Owner: "b", Lease: 30 * time.Second, Limit: 10}); err != nil || len(got) != 0 {
		t.Fatalf("the host 40 s ahead recovered %d live leases (%v)", len(got), err)
	}
	if err := a.Commit(ctx, ls[0], queue.Outcome{State: envelope.StateSent, Receipt: "m"}); err != nil {
		t.Fatalf("a's commit after b looked: %v", err)
	}
	if d := time.Until(b.Now()); d > time.Second || d < -time.Second {
		t.Errorf("the skewed host's store clock is %v off the server's", d)
	}
}
