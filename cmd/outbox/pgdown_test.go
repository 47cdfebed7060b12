package main

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// The database server stops under a running serve: an enqueue is answered
// 503 store unavailable and stores nothing (all or none), the worker's
// failing claims back off (a bounded number of log lines, not a spin), serve
// stays up; once the server is back, what waited and what was enqueued
// since is delivered, each segment once.
func TestPG_DatabaseDown(t *testing.T) {
	if !pgtest.Private() {
		t.Skip("stops pgtest's throwaway server; " + pgtest.EnvURL + " names another")
	}
	bin := buildBinary(t)
	schema := pgtest.Schema(t)
	data := t.TempDir()
	const token = "down-token-0123456789abcdef"
	d, out, _ := launchServe(t, bin, data, append(pgEnv(schema), "INTERNAL_OUTBOX_TOKEN="+token),
		"--lease", "1s", "--sink-journal", "--backoff-base", "100ms", "--backoff-cap", "1s", "--log-format", "json")
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	post := func(id string) (int, string) {
		code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON(id, "u-"+id, 3))
		return code, string(b)
	}
	for i := range 5 {
		if code, b := post("before-" + strconv.Itoa(i)); code != http.StatusCreated {
			t.Fatalf("POST before = %d %s", code, b)
		}
	}
	down := true
	t.Cleanup(func() {
		if down {
			if err := pgtest.Start(); err != nil {
				t.Errorf("pgtest.Start: %v", err)
			}
		}
	})
	if err := pgtest.Stop(); err != nil {
		t.Fatal(err)
	}
	var refused []string
	for i := range 10 {
		id := "during-" + strconv.Itoa(i)
		code, b := post(id)
		if code != http.StatusServiceUnavailable || !strings.Contains(b, `"unavailable"`) || !strings.Contains(b, "store unavailable") {
			t.Fatalf("POST with the database down = %d %s, want 503 store unavailable", code, b)
		}
		refused = append(refused, id)
	}
	if code, _ := request(t, "GET", d.base+"/healthz", "", nil); code != 200 {
		t.Fatalf("healthz with the database down = %d", code)
	}
	if code, b := request(t, "GET", d.base+"/readyz", "", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz with the database down = %d %s, want 503", code, b)
	}
	eventually(t, "the worker's failed store calls logged", func() bool {
		return strings.Count(d.logs.String(), `"error_class":"store_unavailable"`) >= 2
	})
	failures := strings.Count(d.logs.String(), `"error_class":"store_unavailable"`)
	if err := pgtest.Start(); err != nil {
		t.Fatal(err)
	}
	down = false
	// A spinning worker logs a failure per loop; backing off (100 ms
	// doubling to 30 s, and a turn per LISTEN retry) it logs a handful.
	if failures > 500 {
		t.Errorf("%d failed store calls logged while the database was down: the worker does not back off", failures)
	}
	t.Logf("store calls failed while the database was down: %d", failures)

	// What was refused was not stored, not even in part; posted again it is.
	for _, id := range refused {
		var code int
		var b []byte
		eventually(t, "the API answering again", func() bool {
			code, b = request(t, "GET", d.base+"/v1/envelopes/"+id, token, nil)
			return code != http.StatusServiceUnavailable
		})
		if code != http.StatusNotFound {
			t.Fatalf("GET %s, refused with 503 = %d %s; want 404 (nothing stored)", id, code, b)
		}
		eventually(t, "POST "+id+" accepted", func() bool { c, _ := post(id); return c == http.StatusCreated })
	}
	if code, b := request(t, "GET", d.base+"/readyz", "", nil); code != http.StatusOK {
		t.Fatalf("readyz with the database back = %d %s, want 200", code, b)
	}
	all := append([]string{"before-0", "before-1", "before-2", "before-3", "before-4"}, refused...)
	for _, id := range all {
		eventually(t, id+" delivered", func() bool {
			code, b := request(t, "GET", d.base+"/v1/envelopes/"+id, token, nil)
			return code == 200 && strings.Contains(string(b), `"status":"delivered"`)
		})
	}
	d.stop(t)
	per := sinkJournal(t, data, "telegram")
	for _, id := range all {
		for seg := range 3 {
			if n := per[envelope.Key{Tenant: "default", EnvelopeID: id, Segment: seg}.Hash()]; n != 1 {
				t.Errorf("%s segment %d delivered %d times", id, seg, n)
			}
		}
	}
}
