package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// lockedBuffer is a bytes.Buffer safe for a writer and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// serve, run in this process and stopped by its context, returns only
// after every goroutine it started has ended (the worker, the servers, the
// pruner, the second-signal watch).
func TestServe_StopLeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var errb lockedBuffer
	e := &env{Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Stderr: &errb, Getenv: func(string) string { return "" }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- runServe(ctx, e, []string{"--data", t.TempDir(), "--addr", "127.0.0.1:0", "--log-format", "json"})
	}()
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(errb.String(), "listening on") {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s", errb.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("serve = %d:\n%s", code, errb.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// A hangup (the terminal serve runs in is closed) stops serve as SIGTERM
// does: in-flight work finishes and it exits 0, instead of dying at once
// and leaving its leases to be reconciled.
func TestServe_HangupStopsCleanly(t *testing.T) {
	bin := buildBinary(t)
	d, out, _ := launchServe(t, bin, t.TempDir(), nil)
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		<-d.scanned
		done <- d.cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(d.logs.String(), "shutting down") {
			t.Fatalf("serve after SIGHUP: %v\n%s", err, d.logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop on SIGHUP")
	}
}

// outbox enqueue beside a running serve asks it which envelopes it has:
// an id serve already has is reported duplicate and not appended again
// (before, it printed queued and appended a second record).
func TestEnqueue_BesideServeReportsDuplicates(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	d, out, _ := launchServe(t, bin, data, nil)
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	defer d.stop(t)
	file := writeTemp(t, "e.json", string(replyJSON("beside-1", "u1")))
	if out, code := outbox(t, bin, "enqueue", "--data", data, file); code != 0 || !strings.Contains(out, "queued default/beside-1") {
		t.Fatalf("first enqueue = %d %s", code, out)
	}
	eventually(t, "serve indexed it", func() bool {
		out, code := outbox(t, bin, "show", "beside-1", "--data", data)
		return code == 0 && strings.Contains(out, "default/beside-1")
	})
	if out, code := outbox(t, bin, "enqueue", "--data", data, file); code != 0 || !strings.Contains(out, "duplicate default/beside-1") {
		t.Fatalf("second enqueue = %d %s", code, out)
	}
	logs, _ := filepath.Glob(filepath.Join(data, "logs", "*", "*.jsonl"))
	if len(logs) != 1 {
		t.Fatalf("logs %v", logs)
	}
	if b, err := os.ReadFile(logs[0]); err != nil || bytes.Count(b, []byte("\n")) != 1 {
		t.Errorf("the log holds %d records, want 1 (%v)", bytes.Count(b, []byte("\n")), err)
	}
}

// The operator socket removed under a running serve (a clean-up of the
// data directory): serve makes it again, and the operator commands reach
// serve instead of finding the store in use.
func TestServe_OperatorSocketRemovedIsMadeAgain(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	d := startServe(t, bin, data, "socket-token-0123456789abcdef")
	if err := os.Remove(filepath.Join(data, SocketName)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "outbox ls to reach serve again", func() bool {
		_, code := outbox(t, bin, "ls", "--data", data)
		return code == 0
	})
	if !strings.Contains(d.logs.String(), "the operator socket was removed under the running serve: made again") {
		t.Errorf("serve did not say it made its socket again:\n%s", d.logs)
	}
	d.stop(t)
	if _, err := os.Lstat(filepath.Join(data, SocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is left after serve stopped: %v", err)
	}
}

// The unsubscribe key missing from a data directory an earlier serve used
// (a restore that left it out): serve makes a new one and says that the
// links of what was sent before no longer work, and how to fix it.
func TestServe_MissingUnsubscribeKeyIsReported(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	const token = "key-token-0123456789abcdef"
	d := startServe(t, bin, data, token)
	d.stop(t)
	if strings.Contains(d.logs.String(), "new_unsubscribe_key") {
		t.Fatalf("a new data directory's key was reported:\n%s", d.logs)
	}
	if err := os.Remove(filepath.Join(data, "unsubscribe.key")); err != nil {
		t.Fatal(err)
	}
	d = startServe(t, bin, data, token)
	d.stop(t)
	if !strings.Contains(d.logs.String(), "was missing from a data directory an earlier serve used") {
		t.Fatalf("serve did not report the missing key:\n%s", d.logs)
	}
}
