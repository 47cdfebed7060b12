package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue/httpapi"
)

func runCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	code := run(context.Background(), e, args)
	return out.String(), errb.String(), code
}

// doctor detects a corrupted index and rebuilds it from the logs; the
// rebuilt rows are unresolved, never redelivered.
func TestDoctor_RebuildsCorruptIndex(t *testing.T) {
	data := t.TempDir()
	if out, errs, code := runCmd(t, "demo", "--data", data); code != 0 {
		t.Fatalf("demo = %d %s %s", code, out, errs)
	}
	if out, _, code := runCmd(t, "doctor", "--data", data); code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("doctor on a healthy store = %d %s", code, out)
	}
	idx := filepath.Join(data, "index.db")
	b, err := os.ReadFile(idx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(b); i += 7 {
		b[i] ^= 0x5a
	}
	if err := os.WriteFile(idx, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code := runCmd(t, "doctor", "--data", data)
	if code != 0 || !strings.Contains(out, "rebuilding the index") || !strings.Contains(out, "rebuilt: 3 envelopes") {
		t.Fatalf("doctor on a corrupt index = %d\n%s\n%s", code, out, errs)
	}
	out, _, code = runCmd(t, "ls", "--data", data, "--tenant", "*", "--state", "unresolved")
	if code != 0 || strings.Count(out, "index_rebuilt") != 5 {
		t.Fatalf("rows after rebuild:\n%s", out)
	}
	// A second demo run finds the envelopes (duplicates) and sends nothing.
	out, _, code = runCmd(t, "demo", "--data", data)
	if code != 0 || !strings.Contains(out, "duplicate") {
		t.Fatalf("demo after rebuild = %d %s", code, out)
	}
}

// The HTTP servers refuse slow clients: every timeout is set.
func TestServe_ServerTimeouts(t *testing.T) {
	s := newHTTPServer(nil, slog.Default())
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 || s.MaxHeaderBytes <= 0 {
		t.Fatalf("server limits not all set: %+v", s)
	}
	if s.ReadHeaderTimeout > 10*time.Second {
		t.Fatalf("ReadHeaderTimeout %s is too generous for slow-header clients", s.ReadHeaderTimeout)
	}
	// A store that does not answer gets its 503 through (httpapi bounds
	// the store calls of a request by StoreTimeout).
	if s.WriteTimeout <= httpapi.DefaultStoreTimeout {
		t.Fatalf("WriteTimeout %s would cut the API's 503 after %s", s.WriteTimeout, httpapi.DefaultStoreTimeout)
	}
}

// A short token is refused by its variable's name, before the store is
// opened (nothing is created in the data directory).
func TestServe_ShortTokenRefusedFirst(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	var out, errb bytes.Buffer
	e := &env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		if k == "INTERNAL_OUTBOX_TOKEN" {
			return "short"
		}
		return ""
	}}
	code := run(context.Background(), e, []string{"serve", "--data", data, "--addr", "127.0.0.1:0"})
	if code != exitFailure || !strings.Contains(errb.String(), "INTERNAL_OUTBOX_TOKEN is 5 bytes; it must be at least 16") {
		t.Fatalf("serve with a short token = %d %q", code, errb.String())
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Fatalf("the data directory was created before the token was checked: %v", err)
	}
}

func TestServe_RefusesNonLoopbackWithoutToken(t *testing.T) {
	_, errs, code := runCmd(t, "serve", "--data", t.TempDir(), "--addr", "0.0.0.0:0")
	if code != exitFailure || !strings.Contains(errs, "INTERNAL_OUTBOX_TOKEN") {
		t.Fatalf("serve on 0.0.0.0 without a token = %d %s", code, errs)
	}
}

// An envelope of another tenant is found and named; a user without a
// consent record is said to have none.
func TestCLI_HintsWhereToLook(t *testing.T) {
	data := t.TempDir()
	if out, errs, code := runCmd(t, "demo", "--data", data); code != 0 {
		t.Fatalf("demo = %d %s %s", code, out, errs)
	}
	_, errs, code := runCmd(t, "show", "reply/tg/734519028/msg_88412", "--data", data)
	if code != exitFailure || !strings.Contains(errs, `it is in tenant "podcast-companion": add --tenant podcast-companion`) {
		t.Fatalf("show of another tenant's envelope = %d %q", code, errs)
	}
	_, errs, _ = runCmd(t, "requeue", "nope", "--data", data)
	if !strings.Contains(errs, "--tenant") {
		t.Fatalf("requeue of an unknown id: %q", errs)
	}
	out, _, code := runCmd(t, "consent", "show", "u_nobody", "--data", data)
	if code != 0 || !strings.Contains(out, "no consent record for u_nobody") {
		t.Fatalf("consent show of an unknown user = %d %q", code, out)
	}
}

// A store only appended to (outbox enqueue before any serve): doctor and
// the operator commands index its records as new work, as serve does,
// not as rows of unknown fate.
func TestDoctor_StoreOnlyAppendedTo(t *testing.T) {
	for _, first := range []string{"doctor", "ls"} {
		t.Run(first, func(t *testing.T) {
			data := t.TempDir()
			env := `{"schema_version":"1","id":"reply/tg/1/m2","user_id":"u_7","channel":"telegram","template":"reply-text.v1","recipient":{"chat_id":"7"},"payload":{"text":"hi"},"created_at":"` + time.Now().UTC().Format(time.RFC3339) + `"}`
			f := filepath.Join(t.TempDir(), "e.json")
			if err := os.WriteFile(f, []byte(env), 0o600); err != nil {
				t.Fatal(err)
			}
			if out, errs, code := runCmd(t, "enqueue", "--data", data, f); code != 0 {
				t.Fatalf("enqueue = %d %s %s", code, out, errs)
			}
			out, errs, code := runCmd(t, first, "--data", data)
			if code != 0 || strings.Contains(out, "rebuil") || strings.Contains(out, "unresolved") {
				t.Fatalf("%s on a store only appended to = %d\n%s\n%s", first, code, out, errs)
			}
			out, _, code = runCmd(t, "ls", "--data", data, "--json")
			if code != 0 || !strings.Contains(out, `"state": "pending"`) || strings.Contains(out, "index_rebuilt") {
				t.Fatalf("the appended row after %s:\n%s", first, out)
			}
			if out, _, code := runCmd(t, "doctor", "--data", data); code != 0 || !strings.Contains(out, "ok") {
				t.Fatalf("doctor afterwards = %d %s", code, out)
			}
		})
	}
}

// A serve that takes an operator call but never answers (stopped with
// SIGSTOP, a suspended machine) gets a timeout that names it and says what
// to do, not a bare client error.
func TestCLI_StoppedServeNamed(t *testing.T) {
	dir, err := os.MkdirTemp("", "op") // short: a socket path has a limit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, "outbox.sock"))
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	quit, accepting := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held.Add(1)
			go func() { // read the request, answer nothing
				defer held.Done()
				defer c.Close()
				go func() { _, _ = io.Copy(io.Discard, c) }()
				<-quit
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-accepting // no Add after this
		close(quit)
		held.Wait()
	})
	if err := os.WriteFile(filepath.Join(dir, "outbox.pid"), []byte("4242\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := opTimeout
	opTimeout = 200 * time.Millisecond
	t.Cleanup(func() { opTimeout = old })
	for _, cmd := range [][]string{{"ls"}, {"stats"}, {"show", "n-1"}} {
		out, errs, code := runCmd(t, append(cmd, "--data", dir)...)
		if code != 1 || !strings.Contains(errs, "serve (pid 4242) took the call but did not answer within 200ms") ||
			!strings.Contains(errs, "kill -CONT 4242") || strings.Contains(errs, "Client.Timeout") {
			t.Errorf("%v = %d, stdout %q, stderr %q", cmd, code, out, errs)
		}
	}
}
