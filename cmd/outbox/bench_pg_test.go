package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// outbox bench --store postgres runs every phase on PostgreSQL through the
// store contract, names the store in its JSON, and drops the schemas it
// made.
func TestBench_Postgres(t *testing.T) {
	dsn := pgtest.DSN()
	out, errs, code := runCmd(t, "bench", "--store", "postgres", "--database-url", dsn, "--json",
		"-n", "40", "--e2e-n", "20", "--e2e-rate", "2000", "--users", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if strings.Contains(out+errs, dsn) {
		t.Error("the output repeats the database URL")
	}
	var res struct {
		Store   string             `json:"store"`
		Metrics map[string]float64 `json:"metrics"`
		Params  map[string]any     `json:"params"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	if res.Store != "postgres" {
		t.Errorf("store = %q, want postgres", res.Store)
	}
	for _, p := range []string{"send_p1", "drain_c1", "send_p16", "drain_c4", "e2e_c1", "e2e_c4"} {
		keys := []string{p + "_per_s"}
		switch {
		case strings.HasPrefix(p, "send"):
			keys = append(keys, p+"_p50_us", p+"_p99_us", p+"_cpu_us_per_msg")
		case strings.HasPrefix(p, "drain"):
			keys = append(keys, p+"_cpu_us_per_msg")
		default:
			keys = append(keys, p+"_p50_us", p+"_p99_us", p+"_send_p50_us")
		}
		for _, k := range keys {
			if res.Metrics[k] <= 0 {
				t.Errorf("metric %s = %v, want > 0", k, res.Metrics[k])
			}
		}
		// The throwaway server runs here: its CPU is counted.
		if _, ok := res.Metrics[p+"_server_cpu_us_per_msg"]; pgtest.Private() && !ok {
			t.Errorf("no %s_server_cpu_us_per_msg for a server on this machine", p)
		}
	}
	if v, ok := res.Metrics["duplicates_n"]; !ok || v != 0 {
		t.Errorf("duplicates_n = %v (present %v), want 0", v, ok)
	}
	if d, _ := res.Params["durability"].(string); !strings.Contains(d, "synchronous_commit=on") {
		t.Errorf("params.durability = %q, want the server's commit settings", d)
	}
	if n := benchSchemas(t); n != 0 {
		t.Errorf("%d outbox_bench_ schemas left after the run", n)
	}

	// The URL from the environment, and the text table.
	var o, eb bytes.Buffer
	e := &env{Stdin: strings.NewReader(""), Stdout: &o, Stderr: &eb, Getenv: func(k string) string {
		if k == "OUTBOX_DATABASE_URL" {
			return dsn
		}
		return ""
	}}
	if code := run(context.Background(), e, []string{"bench", "--store", "postgres", "-n", "5", "--only", "p1"}); code != 0 {
		t.Fatalf("with OUTBOX_DATABASE_URL: exit %d: %s", code, eb.String())
	}
	if !strings.Contains(o.String(), "store postgres") || !strings.Contains(o.String(), "send_p1") {
		t.Errorf("text output lacks the store or the phase:\n%s", o.String())
	}
	if n := benchSchemas(t); n != 0 {
		t.Errorf("%d outbox_bench_ schemas left after the second run", n)
	}
}

func benchSchemas(t *testing.T) int {
	t.Helper()
	var n int
	if err := pgtest.Admin().QueryRow(context.Background(),
		`SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'outbox\_bench\_%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Wrong store flags are usage errors that say what is wrong.
func TestBench_StoreFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", "mysql"}, `unknown store "mysql"`},
		{[]string{"--store", "postgres"}, "needs --database-url or OUTBOX_DATABASE_URL"},
		{[]string{"--store", "postgres", "--database-url", "postgres://x@127.0.0.1:1/x", "--relaxed"}, "--relaxed is for --store file"},
		{[]string{"--database-url", "postgres://x@127.0.0.1:1/x"}, "--database-url needs --store postgres"},
	} {
		_, errs, code := runCmd(t, append([]string{"bench"}, c.args...)...)
		if code != exitUsage || !strings.Contains(errs, c.want) {
			t.Errorf("bench %v: exit %d, stderr %q; want %d and %q", c.args, code, errs, exitUsage, c.want)
		}
	}
}
