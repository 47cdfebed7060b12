//go:build linux

package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// serve runs out of file descriptors (a LimitNOFILE too low for a burst
// to many users' logs): every refused enqueue is 503 overloaded with
// Retry-After, never 500; no envelope is dead-lettered because its record
// could not be opened for want of a descriptor (before: record_lost);
// every acknowledged envelope is delivered, and nothing that was refused
// is; net/http's accept errors come out in the service's log format.
func TestFault_TooManyOpenFiles(t *testing.T) {
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Fatal("prlimit (util-linux) is needed")
	}
	bin := buildBinary(t)
	// Go raises a soft limit to the hard one at start: set both.
	wrap := filepath.Join(t.TempDir(), "outbox-nofile")
	if err := os.WriteFile(wrap, []byte("#!/bin/sh\nexec prlimit --nofile=64:64 "+bin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	const token = "nofile-token-0123456789abcdef"
	d, out, _ := launchServe(t, wrap, data, []string{"INTERNAL_OUTBOX_TOKEN=" + token},
		"--rescan", "1s", "--backoff-base", "100ms", "--backoff-cap", "1s", "--log-format", "json")
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	t.Cleanup(func() {
		if t.Failed() { // what serve did, for a failure that does not repeat
			t.Logf("serve's last log lines:\n%s", lastLines(d.logs.String(), 80))
		}
	})
	const n = 150
	var (
		mu       sync.Mutex
		acked    []string
		refused  []string
		statuses = map[int]int{}
		wg       sync.WaitGroup
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("nofile-%d", i)
			req, _ := http.NewRequest("POST", d.base+"/v1/envelopes", strings.NewReader(string(chatJSON(id, fmt.Sprintf("u-%d", i), 1))))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil { // the connection refused or reset: nothing acknowledged
				refused = append(refused, id)
				return
			}
			defer resp.Body.Close()
			statuses[resp.StatusCode]++
			switch {
			case resp.StatusCode == http.StatusCreated:
				acked = append(acked, id)
			case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
				refused = append(refused, id)
			default:
				t.Errorf("POST %s = %d (Retry-After %q), want 201 or 503 with Retry-After", id, resp.StatusCode, resp.Header.Get("Retry-After"))
			}
		}()
	}
	wg.Wait()
	t.Logf("statuses %v, %d refused", statuses, len(refused))
	if len(acked) == 0 || len(refused) == 0 {
		t.Fatalf("acked %d, refused %d: the limit did not bite, or nothing got through", len(acked), len(refused))
	}
	for _, id := range acked {
		defer func() {
			if t.Failed() {
				code, b := request(t, "GET", d.base+"/v1/envelopes/"+id, token, nil)
				t.Logf("GET %s = %d %s", id, code, b)
			}
		}()
		t0 := time.Now()
		eventually(t, id+" delivered", func() bool {
			code, b := request(t, "GET", d.base+"/v1/envelopes/"+id, token, nil)
			return code == http.StatusOK && strings.Contains(string(b), `"status":"delivered"`)
		})
		if time.Since(t0) > 5*time.Second {
			t.Logf("%s delivered after %v", id, time.Since(t0))
		}
	}
	for _, id := range refused {
		if code, b := request(t, "GET", d.base+"/v1/envelopes/"+id, token, nil); code != http.StatusNotFound {
			t.Errorf("refused %s: GET = %d %s, want 404 (nothing of it stored)", id, code, b)
		}
	}
	d.kill()
	logs := d.logs.String()
	if os.Getenv("NOFILE_DEBUG") != "" {
		t.Logf("logs:\n%s", logs)
	}
	// A claim whose sync failed for want of a descriptor, given up, leaves
	// its leases to expire and be reconciled (Telegram's: unresolved).
	if strings.Contains(logs, `"operation":"reconcile"`) {
		t.Errorf("leases were left to expire and be reconciled though serve knew what it had claimed:\n%s", logs)
	}
	for _, bad := range []string{"record_lost", `"dead_letter"`, "internal_error"} {
		if strings.Contains(logs, bad) {
			t.Errorf("the log holds %s:\n%s", bad, logs)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		if !strings.HasPrefix(line, "{") && !strings.HasPrefix(line, "listening on ") {
			t.Errorf("a log line not in the service's format: %q", line)
		}
	}
}
