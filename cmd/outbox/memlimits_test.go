package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/url"
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

// TestE2E_MemoryLimits runs `outbox serve` (issue K, item 8): request
// bodies in flight past --max-inflight are answered 503 overloaded with
// Retry-After and nothing is read of them; a foreign appender's 50 MiB
// line without a newline is never read into the daemon's memory, and once
// it ends it is quarantined and the record after it is delivered.
func TestE2E_MemoryLimits(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	const token = "memlimit-token-91c3"
	d := startServe(t, bin, data, token, "--max-body", "65536", "--max-inflight", "65536", "--rescan", "200ms")
	u, err := url.Parse(d.base)
	if err != nil {
		t.Fatal(err)
	}

	// A request whose body is still arriving holds its Content-Length.
	env := replyJSON("slow-1", "u1")
	const length = 40000
	body := append(bytes.Repeat([]byte(" "), length-len(env)), env...)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/envelopes HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", u.Host, token, length)
	if _, err := conn.Write(body[:100]); err != nil {
		t.Fatal(err)
	}
	// Another body of that size waits its turn: 503 with Retry-After.
	other := append(bytes.Repeat([]byte(" "), length-len(replyJSON("other-1", "u1"))), replyJSON("other-1", "u1")...)
	var resp *http.Response
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, _ := http.NewRequest("POST", d.base+"/v1/envelopes", bytes.NewReader(other))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		if resp, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			break
		}
		if resp.StatusCode == http.StatusCreated || time.Now().After(deadline) {
			t.Fatalf("POST beside a slow body = %d, want 503", resp.StatusCode)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("503 without Retry-After: %v", resp.Header)
	}
	code, b := request(t, "POST", d.base+"/v1/envelopes", token, other)
	if code != http.StatusServiceUnavailable || !strings.Contains(string(b), `"code":"overloaded"`) {
		t.Fatalf("POST = %d %s, want 503 overloaded", code, b)
	}
	// The slow body ends: it is answered 201 and its bytes are free again.
	if _, err := conn.Write(body[100:]); err != nil {
		t.Fatal(err)
	}
	sr, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || sr.StatusCode != http.StatusCreated {
		t.Fatalf("slow POST = %v, %v", sr, err)
	}
	sr.Body.Close()
	if code, b := request(t, "POST", d.base+"/v1/envelopes", token, other); code != http.StatusCreated {
		t.Fatalf("POST after the slow one = %d %s", code, b)
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

	deadline = time.Now().Add(30 * time.Second)
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
