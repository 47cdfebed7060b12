package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vmHWM returns the peak resident set of process pid in bytes (Linux).
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestE2E_MemoryLimits runs `outbox serve` (issue K, item 8): a foreign
// appender's 50 MiB line without a newline is never read into the
// daemon's memory, and once it ends it is quarantined and the record after
// it is delivered.
func TestE2E_MemoryLimits(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	const token = "memlimit-token-91c3"
	d := startServe(t, bin, data, token, "--max-body", "65536", "--max-inflight", "65536", "--rescan", "200ms")

	// The bound on bodies in flight (503 overloaded with Retry-After) is
	// tested in process (queue/httpapi TestInflightBound): through the
	// binary its timing depends on when the server has read a slow
	// request's headers, which nothing outside the process can see.

	// The user's log, created by an enqueue.
	if code, b := request(t, "POST", d.base+"/v1/envelopes", token, replyJSON("first-1", "u1")); code != http.StatusCreated {
		t.Fatalf("POST = %d %s", code, b)
	}

	// A foreign appender's 50 MiB line, written 1 MiB at a time with no
	// newline, under the running daemon (fsnotify and the rescan see each
	// write).
	out, c := outbox(t, bin, "path", "--data", data, "--user", "u1")
	if c != 0 {
		t.Fatalf("outbox path = %d %s", c, out)
	}
	path := strings.TrimSpace(out)
	pid := d.cmd.Process.Pid
	linux := runtime.GOOS == "linux"
	var before int64
	if linux {
		before = vmHWM(t, pid)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(b []byte) {
		t.Helper()
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	write([]byte(`{"schema_version":"1","id":"huge","user_id":"u1","payload":{"text":"`))
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	for range 50 {
		write(chunk)
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // two rescans
	write(append(append([]byte(`"}}`+"\n"), replyJSON("after-1", "u1")...), '\n'))

	deadline := time.Now().Add(30 * time.Second)
	for {
		code, b := request(t, "GET", d.base+"/v1/envelopes/after-1", token, nil)
		if code == 200 && strings.Contains(string(b), `"status":"delivered"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after-1 not delivered: %d %s", code, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	out, c = outbox(t, bin, "ls", "--data", data, "--quarantine")
	if c != 0 || !strings.Contains(out, "line exceeds 1114112 bytes") {
		t.Fatalf("outbox ls --quarantine = %d:\n%s", c, out)
	}
	if linux {
		after := vmHWM(t, pid)
		t.Logf("peak RSS of serve: %d MiB before the long line, %d MiB after", before>>20, after>>20)
		if after-before > 40<<20 {
			t.Fatalf("peak RSS grew by %d MiB while a 50 MiB line was appended", (after-before)>>20)
		}
	}
	d.stop(t)
}
