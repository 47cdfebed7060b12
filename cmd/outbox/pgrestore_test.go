package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// The operator restores the PostgreSQL database from last night's dump
// (pg_dump; DROP SCHEMA and psql of the dump), in which envelopes since
// delivered are still pending. serve refuses to start on it instead of
// delivering them again, doctor says what happened, and doctor
// --after-restore makes those deliveries unresolved: serve then starts and
// sends nothing twice.
func TestPG_RestoredFromABackup(t *testing.T) {
	bin := buildBinary(t)
	schema := pgtest.Schema(t)
	data := t.TempDir()
	const token = "restore-token-0123456789abcdef"
	env := append(pgEnv(schema), "INTERNAL_OUTBOX_TOKEN="+token)
	sent := func() int {
		fs, _ := filepath.Glob(filepath.Join(data, "sink", "telegram", "*"))
		return len(fs)
	}

	// Enqueued while no provider runs, then dumped: pending in the dump.
	d, out, _ := launchServe(t, bin, data, env, "--no-sink")
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	for _, id := range []string{"r-1", "r-2", "r-3"} {
		if code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON(id, "u-"+id, 1)); code != http.StatusCreated {
			t.Fatalf("POST %s = %d %s", id, code, b)
		}
	}
	d.stop(t)
	dump := filepath.Join(t.TempDir(), "backup.sql")
	pgTool(t, "pg_dump", "-d", pgtest.DSN(), "-n", schema, "-f", dump)

	d, out, _ = launchServe(t, bin, data, env)
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	eventually(t, "the three delivered", func() bool { return sent() == 3 })
	d.stop(t)

	if _, err := pgtest.Admin().Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	pgTool(t, "psql", "-d", pgtest.DSN(), "-q", "-v", "ON_ERROR_STOP=1", "-f", dump)

	const hint = "Run outbox doctor --after-restore"
	if d, out, code := launchServe(t, bin, data, env); d != nil || code == 0 || !strings.Contains(out, "the database is older than the one this store used") || !strings.Contains(out, hint) {
		if d != nil {
			d.kill()
		}
		t.Fatalf("serve on the restored database: started %v, exit %d\n%s", d != nil, code, out)
	}
	if out, code := outboxEnv(t, bin, env, "doctor", "--data", data); code == 0 || !strings.Contains(out, "problem: pgstore: the database is older") {
		t.Errorf("doctor on the restored database: exit %d\n%s", code, out)
	}
	if out, code := outboxEnv(t, bin, env, "doctor", "--data", data, "--after-restore"); code != 0 || !strings.Contains(out, "after restore: 3 envelopes had deliveries of unknown fate: they are unresolved") {
		t.Fatalf("doctor --after-restore: exit %d\n%s", code, out)
	}

	d, out, _ = launchServe(t, bin, data, env)
	if d == nil {
		t.Fatalf("serve after doctor --after-restore:\n%s", out)
	}
	if out, code := outboxEnv(t, bin, env, "ls", "--state", "unresolved"); code != 0 || strings.Count(out, "unresolved") < 3 {
		t.Errorf("ls --state unresolved: exit %d\n%s", code, out)
	}
	if code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON("r-4", "u-r-4", 1)); code != http.StatusCreated {
		t.Fatalf("POST r-4 = %d %s", code, b)
	}
	eventually(t, "r-4 delivered", func() bool { return sent() == 4 })
	d.stop(t)
	if n := sent(); n != 4 {
		t.Errorf("%d deliveries, want 4: the restored ones were sent again", n)
	}
}

// pgTool runs one of the PostgreSQL client programs.
func pgTool(t *testing.T, name string, args ...string) {
	t.Helper()
	bin, err := pgtest.Bin(name)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = os.Environ()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}
