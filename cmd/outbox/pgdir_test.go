package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// A serve restarted without its database URL (an environment file not
// loaded) would start an empty file store in the data directory it used
// on PostgreSQL and acknowledge envelopes there that no serve on
// PostgreSQL delivers: every command that would use the directory as a
// file store refuses instead, and makes nothing there.
func TestPG_ADataDirOfAPostgreSQLServeIsNoFileStore(t *testing.T) {
	schema := pgtest.Schema(t)
	data := t.TempDir()
	vars := map[string]string{EnvDatabaseURL: pgtest.DSN(), "OUTBOX_DATABASE_SCHEMA": schema}
	if _, logs, stop := startServeEnv(t, vars, "--data", data); stop() != 0 {
		t.Fatalf("serve on PostgreSQL:\n%s", logs.String())
	}
	nudge := writeTemp(t, "nudge.json", withoutExpiry(t, "resurface-nudge.v1.golden.json"))
	want := data + " is the data directory of a serve on PostgreSQL (schema " + schema + "), not a file store: pass --database-url"
	for _, args := range [][]string{
		{"serve", "--addr", "127.0.0.1:0"},
		{"enqueue", nudge},
		{"doctor"},
		{"stats"},
		{"ls", "--state", "pending"},
		{"path", "--user", "u_42"},
		{"compact"},
	} {
		// A serve that starts anyway is stopped after a while (and fails the test).
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var errb bytes.Buffer
		code := run(ctx, &env{Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Stderr: &errb, Getenv: func(string) string { return "" }}, append(args, "--data", data))
		cancel()
		errs := errb.String()
		if code == exitOK || !strings.Contains(errs, want) {
			t.Errorf("%s without the URL = %d %q, want it refused", args[0], code, errs)
		}
	}
	for _, name := range []string{"index.db", "logs", "store.version"} {
		if _, err := os.Lstat(filepath.Join(data, name)); err == nil {
			t.Errorf("%s was made in the PostgreSQL serve's data directory", name)
		}
	}

	// A file store made there on purpose (the mark removed) is used as
	// asked; a serve on PostgreSQL beside it says that it leaves it alone.
	mark := pgMark(data, schema)
	markBytes, err := os.ReadFile(mark)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(mark); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := runCmd(t, "enqueue", "--data", data, nudge); code != exitOK {
		t.Fatalf("enqueue to a file store = %d %q %q", code, out, errs)
	}
	if out, errs, code := runCmd(t, "doctor", "--data", data); code != exitOK {
		t.Fatalf("doctor of the file store = %d %q %q", code, out, errs)
	}
	if err := os.WriteFile(mark, markBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := runCmd(t, "stats", "--data", data); code != exitOK {
		t.Errorf("stats of a file store with a PostgreSQL mark beside it = %d %q", code, errs)
	}
	_, logs, stop := startServeEnv(t, vars, "--data", data)
	if stop() != 0 || !strings.Contains(logs.String(), "holds a file store too: a serve on PostgreSQL does not deliver its envelopes") {
		t.Errorf("serve on PostgreSQL beside a file store:\n%s", logs.String())
	}
}

// A serve restarted without its schema setting would migrate a new, empty
// queue in the default schema beside the one in use: a data directory
// marked by a serve on another schema only is refused, and the new schema
// is not made.
func TestPG_ADataDirKeepsItsSchema(t *testing.T) {
	used, other := pgtest.Schema(t), pgtest.Schema(t)
	data := t.TempDir()
	start := func(schema string) (*lockedBuffer, int) {
		vars := map[string]string{EnvDatabaseURL: pgtest.DSN(), "OUTBOX_DATABASE_SCHEMA": schema}
		_, logs, stop := startServeEnv(t, vars, "--data", data)
		return logs, stop()
	}
	if logs, code := start(used); code != 0 {
		t.Fatalf("serve on %s = %d:\n%s", used, code, logs.String())
	}
	logs, code := start(other)
	want := data + " is the data directory of a serve on PostgreSQL schema " + used + ", and this serve is set for schema " + other
	if code == exitOK || !strings.Contains(logs.String(), want) {
		t.Fatalf("serve on %s = %d, want it refused:\n%s", other, code, logs.String())
	}
	var made bool
	if err := pgtest.Admin().QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, other).Scan(&made); err != nil || made {
		t.Errorf("schema %s made: %v %v", other, made, err)
	}
	if logs, code := start(used); code != 0 {
		t.Errorf("serve on %s again = %d:\n%s", used, code, logs.String())
	}
}
