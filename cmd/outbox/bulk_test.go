package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// chatLines is n telegram replies, ids PREFIX-0…, one JSON line each; the
// first has two segments.
func chatLines(prefix string, n int) string {
	var b strings.Builder
	for i := range n {
		segs := 1
		if i == 0 {
			segs = 2
		}
		b.Write(chatJSON(fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("u%d", i%7), segs))
		b.WriteByte('\n')
	}
	return b.String()
}

// rebuiltStore is a file store of n telegram replies (chatLines) whose
// index was rebuilt: every row is unresolved (index_rebuilt).
func rebuiltStore(t *testing.T, prefix string, n int) *filestore.Queue {
	t.Helper()
	dir := t.TempDir()
	q, err := filestore.Open(dir, &filestore.Options{DisableWatcher: true})
	if err != nil {
		t.Fatal(err)
	}
	var envs []*envelope.Envelope
	for _, line := range strings.Split(strings.TrimSpace(chatLines(prefix, n)), "\n") {
		env, err := envelope.Parse([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		envs = append(envs, env)
	}
	if _, err := q.Enqueue(context.Background(), envs...); err != nil {
		t.Fatal(err)
	}
	q.Close()
	if err := os.Remove(filepath.Join(dir, filestore.IndexFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := filestore.Rebuild(dir, nil); err != nil {
		t.Fatal(err)
	}
	if q, err = filestore.Open(dir, &filestore.Options{DisableWatcher: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

func unresolvedOf(t *testing.T, counts string) int {
	t.Helper()
	var c queue.Counts
	if err := json.Unmarshal([]byte(counts), &c); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, counts)
	}
	return c.Total(envelope.StateUnresolved)
}

// After a lost index every row is unresolved, more than the store's page
// of 1000: ls lists them all, resolve --all settles them by filter, and
// requeue --all returns another tenant's to pending. Without paging, ls
// stopped at 1000 rows and said "raise --limit" (which could not help);
// without --all an operator resolved them one ID at a time.
func TestBulk_AfterALostIndex(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	for tenant, lines := range map[string]string{"default": chatLines("r", 1005), "acme": chatLines("a", 12)} {
		file := filepath.Join(t.TempDir(), "envs.jsonl")
		if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		if tenant != "default" {
			lines = strings.ReplaceAll(lines, `"schema_version"`, `"tenant_id":"`+tenant+`","schema_version"`)
			if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if out, errs, code := runCmd(t, "enqueue", "--data", data, file); code != 0 {
			t.Fatalf("enqueue = %d %s %s", code, out, errs)
		}
	}
	// stats opens the store, which indexes the records as pending.
	if out, errs, code := runCmd(t, "stats", "--data", data, "--json"); code != 0 || !strings.Contains(out, `"pending"`) {
		t.Fatalf("stats = %d %s %s", code, out, errs)
	}
	if err := os.Remove(filepath.Join(data, filestore.IndexFile)); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := runCmd(t, "doctor", "--rebuild", "--data", data); code != 0 || !strings.Contains(out, "outbox resolve --all --class index_rebuilt") {
		t.Fatalf("doctor --rebuild = %d %s %s", code, out, errs)
	}

	// ls pages through the store: 1006 rows of tenant default, 13 of acme
	// (r-0 and a-0 have two).
	out, errs, code := runCmd(t, "ls", "--data", data, "--state", "unresolved", "--class", "index_rebuilt", "--limit", "0", "--json")
	var page queue.Page
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Rows) != 1019 {
		t.Fatalf("ls --limit 0 --json = %d, %d rows, %s", code, len(page.Rows), errs)
	}
	out, errs, code = runCmd(t, "ls", "--data", data, "--state", "unresolved", "--limit", "3")
	if code != 0 || strings.Count(out, "index_rebuilt") != 3 || !strings.Contains(errs, "more rows") {
		t.Fatalf("ls --limit 3 = %d\n%s\n%s", code, out, errs)
	}
	if out, _, _ = runCmd(t, "ls", "--data", data, "--class", "reconcile_unknown"); strings.Count(out, "\n") != 1 {
		t.Fatalf("ls --class reconcile_unknown lists rows:\n%s", out)
	}

	// Usage: --all takes no ID, the filters need --all, requeue --all a state.
	for _, args := range [][]string{
		{"resolve", "--all", "r-1", "--as", "sent"},
		{"resolve", "r-1", "--class", "index_rebuilt", "--as", "sent"},
		{"resolve", "--all"},
		{"requeue", "--all"},
		{"requeue", "r-1", "--dry-run"},
		{"resolve", "r-1", "--as", "sent", "--user", "u1"},
		{"requeue", "--all", "--state", "unresolve"},
		{"requeue", "--all", "--state", "pending"},
	} {
		if _, errs, code := runCmd(t, append(args, "--data", data)...); code != exitUsage {
			t.Errorf("%v = %d %s, want a usage error", args, code, errs)
		}
	}

	stats := func(tenant string) int {
		out, _, _ := runCmd(t, "stats", "--data", data, "--tenant", tenant, "--json")
		return unresolvedOf(t, out)
	}
	out, _, code = runCmd(t, "resolve", "--all", "--as", "sent", "--dry-run", "--data", data)
	if code != 0 || !strings.Contains(out, "would resolve 1005 envelopes as sent") || stats("default") != 1006 {
		t.Fatalf("resolve --all --dry-run = %d %s; unresolved %d", code, out, stats("default"))
	}
	out, _, code = runCmd(t, "resolve", "--all", "--as", "sent", "--class", "reconcile_unknown", "--data", data)
	if code != 0 || !strings.Contains(out, "resolved 0 of 0 envelopes") {
		t.Fatalf("resolve --all --class reconcile_unknown = %d %s", code, out)
	}
	out, errs, code = runCmd(t, "resolve", "--all", "--as", "sent", "--class", "index_rebuilt", "--channel", "telegram", "--data", data)
	if code != 0 || !strings.Contains(out, `resolved 1005 of 1005 envelopes as sent (tenant "default", state unresolved, channel telegram, class index_rebuilt)`) {
		t.Fatalf("resolve --all = %d %s %s", code, out, errs)
	}
	if stats("default") != 0 || stats("acme") != 13 {
		t.Fatalf("unresolved after resolve --all: default %d, acme %d", stats("default"), stats("acme"))
	}
	st, _, _ := runCmd(t, "show", "r-0", "--data", data)
	if !strings.Contains(st, "DELIVERED") || strings.Count(st, ": sent,") != 2 {
		t.Fatalf("r-0's two segments after resolve --all:\n%s", st)
	}

	// One user's first (a-1 and a-8 are u1's), then every tenant's.
	if out, _, _ := runCmd(t, "ls", "--data", data, "--tenant", "acme", "--user", "u1"); strings.Count(out, "unresolved") != 2 {
		t.Fatalf("ls --user u1:\n%s", out)
	}
	out, errs, code = runCmd(t, "requeue", "--all", "--state", "unresolved", "--tenant", "acme", "--user", "u1", "--data", data)
	if code != 0 || !strings.Contains(out, `requeued 2 of 2 envelopes (tenant "acme", state unresolved, user u1)`) {
		t.Fatalf("requeue --all --user = %d %s %s", code, out, errs)
	}
	out, errs, code = runCmd(t, "requeue", "--all", "--state", "unresolved", "--tenant", "*", "--data", data)
	if code != 0 || !strings.Contains(out, "requeued 10 of 10 envelopes (every tenant, state unresolved)") {
		t.Fatalf("requeue --all = %d %s %s", code, out, errs)
	}
	out, _, _ = runCmd(t, "stats", "--data", data, "--tenant", "acme", "--json")
	var c queue.Counts
	if err := json.Unmarshal([]byte(out), &c); err != nil || c.Total(envelope.StatePending) != 13 || c.Total(envelope.StateUnresolved) != 0 {
		t.Fatalf("acme after requeue --all: %s", out)
	}
}

// Through a running serve's operator socket, bulk lists and acts with the
// socket's calls; an envelope the store refuses is reported with its
// reason, the others are done, and the command exits 1.
func TestBulk_OperatorSocket(t *testing.T) {
	q := rebuiltStore(t, "s", 4)
	ctx := context.Background()
	srv := httptest.NewServer(operatorHandler(&directBackend{q: q}))
	defer srv.Close()
	b := &socketBackend{c: &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	}}}}

	// s-2 is resolved by hand between the listing and the bulk's call.
	sel := selection{filter: queue.ListFilter{Tenant: "default", State: envelope.StateUnresolved}}
	act := func(ctx context.Context, tenant, id string) error {
		if id == "s-2" {
			if err := b.Resolve(ctx, tenant, id, envelope.StateSent); err != nil {
				return err
			}
		}
		return b.Resolve(ctx, tenant, id, envelope.StateRetryable)
	}
	res, err := bulk(ctx, b, sel, false, act)
	if err != nil || res.Matched != 4 || res.Done != 3 || len(res.Failed) != 1 || res.Failed[0].ID != "s-2" || !strings.Contains(res.Failed[0].Error, "unresolved") {
		t.Fatalf("bulk = %+v, %v", res, err)
	}
	var out, errb strings.Builder
	e := &env{Stdout: &out, Stderr: &errb}
	if code := printBulk(e, false, sel, "resolve", "resolved", " as retryable", res, nil); code != exitFailure ||
		!strings.Contains(out.String(), "resolved 3 of 4 envelopes as retryable") || !strings.Contains(errb.String(), "not resolved: default/s-2: ") {
		t.Fatalf("printBulk = %d\n%s\n%s", code, out.String(), errb.String())
	}
	counts, err := b.Counts(ctx, "default")
	if err != nil || counts.Total(envelope.StateRetryable) != 4 || counts.Total(envelope.StateSent) != 1 {
		t.Fatalf("counts = %v, %v", counts, err)
	}

	// Interrupted, it stops between two envelopes.
	cctx, cancel := context.WithCancel(ctx)
	n := 0
	res, err = bulk(cctx, b, selection{filter: queue.ListFilter{Tenant: "default"}}, false, func(ctx context.Context, tenant, id string) error {
		if n++; n == 2 {
			cancel()
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "interrupted after 2 of 4") || res.Done != 2 {
		t.Fatalf("bulk cancelled = %+v, %v", res, err)
	}
}

// On PostgreSQL: after doctor --after-restore, resolve --all settles the
// restored deliveries by their class.
func TestBulk_PostgreSQL(t *testing.T) {
	vars := map[string]string{EnvDatabaseURL: pgtest.DSN(), "OUTBOX_DATABASE_SCHEMA": pgtest.Schema(t)}
	if out, code := runIn(vars, "migrate"); code != 0 {
		t.Fatalf("migrate = %d %s", code, out)
	}
	file := filepath.Join(t.TempDir(), "envs.jsonl")
	if err := os.WriteFile(file, []byte(chatLines("p", 5)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := runIn(vars, "enqueue", "--data", t.TempDir(), file); code != 0 {
		t.Fatalf("enqueue = %d %s", code, out)
	}
	if out, code := runIn(vars, "doctor", "--after-restore", "--data", t.TempDir()); code != 0 || !strings.Contains(out, "resolve --all --class database_restored") {
		t.Fatalf("doctor --after-restore = %d %s", code, out)
	}
	if out, code := runIn(vars, "resolve", "--all", "--class", "database_restored", "--as", "retry"); code != 0 || !strings.Contains(out, "resolved 5 of 5 envelopes as retryable") {
		t.Fatalf("resolve --all = %d %s", code, out)
	}
	out, code := runIn(vars, "stats", "--json")
	var c queue.Counts
	if code != 0 || json.Unmarshal([]byte(out), &c) != nil || c.Total(envelope.StateRetryable) != 6 || c.Total(envelope.StateUnresolved) != 0 {
		t.Fatalf("stats after resolve --all = %d %s", code, out)
	}
}
