package main

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestE2E_LogFaults deletes, truncates and replaces users' logs under a
// running `outbox serve` (the sink provider, real files), and while it is
// stopped: every envelope acknowledged afterwards is in the file under its
// log's name and is delivered, also after a restart, and doctor reports a
// truncated or replaced log with a hint (issue K, item 4).
func TestE2E_LogFaults(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	const token = "logfault-token-5e2a"
	d := startServe(t, bin, data, token, "--rescan", "200ms")

	post := func(id, user string) {
		t.Helper()
		if code, b := request(t, "POST", d.base+"/v1/envelopes", token, replyJSON(id, user)); code != http.StatusCreated {
			t.Fatalf("POST %s = %d %s", id, code, b)
		}
	}
	// delivered waits for id to be delivered and fails at once if it ends
	// anywhere else (dead_letter record_lost).
	delivered := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			var last string
			deadline := time.Now().Add(30 * time.Second)
			for {
				code, b := request(t, "GET", d.base+"/v1/envelopes/"+id, token, nil)
				last = string(b)
				if code == 200 && strings.Contains(last, `"status":"delivered"`) {
					break
				}
				if strings.Contains(last, "dead_letter") || strings.Contains(last, "record_lost") || time.Now().After(deadline) {
					t.Fatalf("%s not delivered: %d %s", id, code, last)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	logOf := func(user string) string {
		t.Helper()
		out, code := outbox(t, bin, "path", "--data", data, "--user", user)
		if code != 0 {
			t.Fatalf("outbox path = %d %s", code, out)
		}
		return strings.TrimSpace(out)
	}
	inLog := func(user string, ids ...string) {
		t.Helper()
		b, err := os.ReadFile(logOf(user))
		if err != nil {
			t.Fatalf("log of %s: %v", user, err)
		}
		for _, id := range ids {
			if !bytes.Contains(b, []byte(`"id":"`+id+`"`)) {
				t.Fatalf("%s is not in the file under its log's name", id)
			}
		}
	}

	// (a) rm of a user's log.
	post("a-1", "ua")
	delivered("a-1")
	if err := os.Remove(logOf("ua")); err != nil {
		t.Fatal(err)
	}
	post("a-2", "ua")
	delivered("a-2")
	inLog("ua", "a-2")

	// (b) truncation to 0 (the next record is as long as the cut one),
	// then into the middle of a record.
	post("b-1", "ub")
	delivered("b-1")
	if err := os.Truncate(logOf("ub"), 0); err != nil {
		t.Fatal(err)
	}
	post("b-2", "ub")
	delivered("b-2")
	post("b-3", "ub")
	delivered("b-3")
	fi, err := os.Stat(logOf("ub"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(logOf("ub"), fi.Size()-20); err != nil {
		t.Fatal(err)
	}
	post("b-4", "ub")
	delivered("b-4")
	inLog("ub", "b-2", "b-4")

	// (c) replacement: a new file (the old content and a foreign record)
	// renamed over the log.
	post("c-1", "uc")
	delivered("c-1")
	old, err := os.ReadFile(logOf("uc"))
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(logOf("uc")), "new.tmp")
	if err := os.WriteFile(tmp, append(append(old, replyJSON("c-f", "uc")...), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, logOf("uc")); err != nil {
		t.Fatal(err)
	}
	post("c-2", "uc")
	delivered("c-2", "c-f")
	inLog("uc", "c-1", "c-f", "c-2")
	d.stop(t)

	// While serve is stopped: ub's log truncated and appended to by
	// `outbox enqueue`, uc's replaced by a copy; doctor reports both.
	if err := os.Truncate(logOf("ub"), 0); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "b-5.json")
	if err := os.WriteFile(f, replyJSON("b-5", "ub"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := outbox(t, bin, "enqueue", "--data", data, f); code != 0 {
		t.Fatalf("outbox enqueue = %d %s", code, out)
	}
	cp, _ := os.ReadFile(logOf("uc"))
	if err := os.WriteFile(tmp, cp, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, logOf("uc")); err != nil {
		t.Fatal(err)
	}
	out, code := outbox(t, bin, "doctor", "--data", data)
	if code != 1 || !strings.Contains(out, "truncated") || !strings.Contains(out, "replaced") || !strings.Contains(out, "hint:") {
		t.Fatalf("doctor = %d, want the truncated and the replaced log reported with a hint:\n%s", code, out)
	}
	if strings.Contains(out, "rebuilding") || strings.Contains(out, "--rebuild rebuilds") {
		t.Fatalf("doctor rebuilt the index, or advised it, for a log problem:\n%s", out)
	}

	// Restart: what was delivered stays delivered, the record appended
	// while serve was stopped is delivered, and so is a new one.
	d = startServe(t, bin, data, token, "--rescan", "200ms")
	delivered("a-2", "b-2", "b-4", "c-2", "c-f", "b-5")
	post("b-6", "ub")
	post("c-3", "uc")
	delivered("b-6", "c-3")
	inLog("ub", "b-5", "b-6")
	d.stop(t)
	out, _ = outbox(t, bin, "doctor", "--data", data)
	if strings.Contains(out, "truncated") || strings.Contains(out, "replaced") {
		t.Fatalf("doctor still reports a log once serve indexed it again:\n%s", out)
	}
	// The records the faults took are gone for good: doctor says so and
	// does not advise a rebuild (it would make every row, sent ones too,
	// unresolved).
	if strings.Contains(out, "--rebuild rebuilds") {
		t.Fatalf("doctor advises a rebuild for records gone from the logs:\n%s", out)
	}
}
