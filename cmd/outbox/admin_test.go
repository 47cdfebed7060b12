package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	s := newHTTPServer(nil)
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 || s.MaxHeaderBytes <= 0 {
		t.Fatalf("server limits not all set: %+v", s)
	}
	if s.ReadHeaderTimeout > 10*time.Second {
		t.Fatalf("ReadHeaderTimeout %s is too generous for slow-header clients", s.ReadHeaderTimeout)
	}
}

func TestServe_RefusesNonLoopbackWithoutToken(t *testing.T) {
	_, errs, code := runCmd(t, "serve", "--data", t.TempDir(), "--addr", "0.0.0.0:0")
	if code != exitFailure || !strings.Contains(errs, "INTERNAL_OUTBOX_TOKEN") {
		t.Fatalf("serve on 0.0.0.0 without a token = %d %s", code, errs)
	}
}
