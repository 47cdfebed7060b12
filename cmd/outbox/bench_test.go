package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// outbox bench runs the harness's phases through the real store and worker
// and reports the harness's metric names; --only picks phase groups.
func TestBench_SmallRun(t *testing.T) {
	data := t.TempDir()
	out, errs, code := runCmd(t, "bench", "--json", "--data", data, "-n", "60", "--e2e-n", "20", "--e2e-rate", "2000", "--users", "3", "--only", "p1,e2e")
	if left, _ := os.ReadDir(data); len(left) != 0 {
		t.Errorf("the run left %d stores behind in its data directory", len(left))
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var res struct {
		Metrics map[string]float64 `json:"metrics"`
		Params  map[string]any     `json:"params"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	for _, k := range []string{"send_p1_per_s", "drain_c1_per_s", "e2e_c1_p50_us", "e2e_c4_p99_us", "e2e_c1_send_p50_us"} {
		if res.Metrics[k] <= 0 {
			t.Errorf("metric %s = %v, want > 0", k, res.Metrics[k])
		}
	}
	if v, ok := res.Metrics["duplicates_n"]; !ok || v != 0 {
		t.Errorf("duplicates_n = %v (present %v), want 0", v, ok)
	}
	// It states its durability, including that the claims are not
	// fsynced (the no-op provider redelivers idempotently).
	if d, _ := res.Params["durability"].(string); !strings.HasPrefix(d, "durable") || !strings.Contains(d, "claims unsynced") {
		t.Errorf("params.durability = %q, want the enqueue's and the claims' durability", d)
	}
	if _, ran := res.Metrics["send_p16_per_s"]; ran {
		t.Error("--only p1,e2e ran send_p16")
	}

	_, errs, code = runCmd(t, "bench", "--only", "p2")
	if code != 2 || !strings.Contains(errs, `unknown phase group "p2"`) {
		t.Errorf("--only p2: exit %d, stderr %q; want 2 and the unknown group named", code, errs)
	}
}
