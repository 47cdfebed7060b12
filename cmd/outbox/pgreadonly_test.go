package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// serve pointed at a database that accepts no writes (a standby the URL
// still names after a failover; here default_transaction_read_only through
// PGOPTIONS, the same refusal, SQLSTATE 25006): without --no-migrate it
// does not start and says to point the URL at the primary, doctor reports
// it as a problem; with --no-migrate serve
// runs not ready, answers enqueues 503 storage_read_only (not 500
// internal_error), and the worker's failed calls are logged as
// storage_read_only. No output holds the DSN.
func TestPG_ReadOnlyDatabase(t *testing.T) {
	bin := buildBinary(t)
	schema := pgtest.Schema(t)
	if out, code := outboxEnv(t, bin, pgEnv(schema), "migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, out)
	}
	const token = "ro-token-0123456789abcdef"
	env := append(pgEnv(schema), "INTERNAL_OUTBOX_TOKEN="+token, "PGOPTIONS=-c default_transaction_read_only=on")
	const primary = "the database accepts no writes (it is a standby, or default_transaction_read_only is on): point the URL at the primary"

	d, out, code := launchServe(t, bin, t.TempDir(), env, "--no-sink")
	if d != nil {
		t.Fatal("serve started (migrating) on a read-only database")
	}
	if code == 0 || !strings.Contains(out, primary) {
		t.Errorf("serve on a read-only database: exit %d, output:\n%s\nwant a failure saying %q", code, out, primary)
	}

	if out, code := outboxEnv(t, bin, env, "doctor"); code == 0 || !strings.Contains(out, "problem: pgstore: ping: "+primary) {
		t.Errorf("doctor on a read-only database: exit %d, output:\n%s", code, out)
	}

	d, out, _ = launchServe(t, bin, t.TempDir(), env, "--no-migrate", "--log-format", "json")
	if d == nil {
		t.Fatalf("serve --no-migrate:\n%s", out)
	}
	if code, b := request(t, "GET", d.base+"/readyz", "", nil); code != http.StatusServiceUnavailable {
		t.Errorf("readyz on a read-only database = %d %s, want 503", code, b)
	}
	code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON("ro-1", "u-ro", 1))
	if code != http.StatusServiceUnavailable || !strings.Contains(string(b), `"storage_read_only"`) || !strings.Contains(string(b), "standby or read-only") {
		t.Errorf("POST on a read-only database = %d %s, want 503 storage_read_only", code, b)
	}
	eventually(t, "the worker's failed claims logged as storage_read_only", func() bool {
		return strings.Contains(d.logs.String(), `"error_class":"storage_read_only"`)
	})
	d.kill()
	logs := d.logs.String() + out
	if strings.Contains(logs, pgtest.DSN()) || strings.Contains(logs, "postgres://") {
		t.Errorf("the output holds the DSN:\n%s", logs)
	}
	if strings.Contains(logs, `"error_class":"store_error"`) || strings.Contains(logs, "internal_error") {
		t.Errorf("a failure without its reason was logged:\n%s", logs)
	}
}
