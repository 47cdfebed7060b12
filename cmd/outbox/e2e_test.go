package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildBinary builds cmd/outbox once per test binary run.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "outbox")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go build: %v", err)
	}
	return bin
}

type daemon struct {
	cmd     *exec.Cmd
	base    string
	logs    *lockedBuffer
	scanned chan struct{} // closed once stderr reached EOF
}

// startServe runs `outbox serve --addr 127.0.0.1:0` and waits for its
// "listening on" line.
func startServe(t *testing.T, bin, data, token string, extra ...string) *daemon {
	t.Helper()
	d, out, code := launchServe(t, bin, data, []string{"INTERNAL_OUTBOX_TOKEN=" + token}, append([]string{"--lease", "2s"}, extra...)...)
	if d == nil {
		t.Fatalf("serve exited with %d before listening; logs:\n%s", code, out)
	}
	return d
}

func (d *daemon) stop(t *testing.T) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() {
		<-d.scanned // every read of the pipe before Wait closes it
		done <- d.cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
}

func request(t *testing.T, method, url, token string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func outbox(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	return outboxEnv(t, bin, nil, args...)
}

// eventually re-checks cond until it holds (bounded).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// replyJSON is a telegram reply envelope (no consent needed).
func replyJSON(id, user string) []byte { return replyToJSON(id, user, "424242") }

// replyToJSON is replyJSON to another chat (Telegram paces each chat).
func replyToJSON(id, user, chat string) []byte {
	b, _ := json.Marshal(map[string]any{
		"schema_version": "1", "id": id, "user_id": user, "channel": "telegram", "template": "reply-text.v1",
		"recipient": map[string]any{"chat_id": chat}, "payload": map[string]any{"text": "hello from " + id},
		"created_at": "2026-11-01T00:00:00Z",
	})
	return b
}

func TestE2E_ServeEnqueueOperateRestart(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	const token = "e2e-token-CANARY-7c1d"
	d := startServe(t, bin, data, token)

	// Over HTTP.
	code, body := request(t, "POST", d.base+"/v1/envelopes", token, replyJSON("http-1", "u1"))
	if code != http.StatusCreated {
		t.Fatalf("POST /v1/envelopes = %d %s", code, body)
	}
	code, _ = request(t, "POST", d.base+"/v1/envelopes", token, replyJSON("http-1", "u1"))
	if code != http.StatusOK {
		t.Fatalf("duplicate POST = %d, want 200", code)
	}
	code, _ = request(t, "POST", d.base+"/v1/envelopes", "wrong", replyJSON("http-2", "u1"))
	if code != http.StatusUnauthorized {
		t.Fatalf("wrong token = %d, want 401", code)
	}

	// From another process, by appending to the log.
	f := filepath.Join(t.TempDir(), "env.json")
	os.WriteFile(f, replyJSON("cli-1", "u2"), 0o600)
	if out, code := outbox(t, bin, "enqueue", "--data", data, f); code != 0 || !strings.Contains(out, "queued default/cli-1") {
		t.Fatalf("outbox enqueue = %d %s", code, out)
	}

	sent := func(id string) bool {
		code, b := request(t, "GET", d.base+"/v1/envelopes/"+id, token, nil)
		return code == 200 && strings.Contains(string(b), `"status":"delivered"`)
	}
	eventually(t, "http-1 delivered", func() bool { return sent("http-1") })
	eventually(t, "cli-1 delivered", func() bool { return sent("cli-1") })
	files, _ := filepath.Glob(filepath.Join(data, "sink", "telegram", "*.json"))
	if len(files) != 2 {
		t.Fatalf("sink has %d telegram messages, want 2", len(files))
	}

	// Operator commands go through the running daemon.
	if out, code := outbox(t, bin, "show", "--data", data, "http-1"); code != 0 || !strings.Contains(out, "DELIVERED") {
		t.Fatalf("outbox show = %d %s", code, out)
	}
	if out, code := outbox(t, bin, "ls", "--data", data, "--state", "sent"); code != 0 || !strings.Contains(out, "cli-1") {
		t.Fatalf("outbox ls = %d %s", code, out)
	}
	if out, code := outbox(t, bin, "requeue", "--data", data, "http-1"); code != 1 {
		t.Fatalf("requeue of a delivered envelope = %d %s, want 1", code, out)
	}
	if out, code := outbox(t, bin, "stats", "--data", data); code != 0 || !strings.Contains(out, "sent") {
		t.Fatalf("outbox stats = %d %s", code, out)
	}

	// Health and metrics.
	if code, _ := request(t, "GET", d.base+"/healthz", "", nil); code != 200 {
		t.Fatalf("healthz = %d", code)
	}
	if code, b := request(t, "GET", d.base+"/metrics", "", nil); code != 200 || !strings.Contains(string(b), "outbox_enqueued_total") {
		t.Fatalf("metrics = %d", code)
	}

	d.stop(t)
	if strings.Contains(d.logs.String(), token) {
		t.Fatal("the token appeared in the daemon's logs")
	}

	// Restart: state intact; doctor is happy.
	if out, code := outbox(t, bin, "doctor", "--data", data); code != 0 {
		t.Fatalf("doctor = %d %s", code, out)
	}
	d = startServe(t, bin, data, token)
	if !sent("http-1") || !sent("cli-1") {
		t.Fatal("state lost across restart")
	}
	d.stop(t)
	_ = context.Background
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// TestE2E_Seam drives the RFC's seam for an external delivery worker: with
// --no-sink and no provider configured, outbox only stores and leases.
func TestE2E_Seam(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	const token = "seam-token-0123456789"
	d := startServe(t, bin, data, token, "--no-sink")
	id := postSeamDigest(t, d.base, token)

	code, b := request(t, "GET", d.base+"/internal/outbox/pending?channel=email&limit=5", token, nil)
	if code != 200 {
		t.Fatalf("pending = %d %s", code, b)
	}
	var pending struct {
		Envelopes []map[string]any `json:"envelopes"`
		Leases    []struct {
			ID    string `json:"id"`
			Fence uint64 `json:"fence"`
		} `json:"leases"`
	}
	if err := json.Unmarshal(b, &pending); err != nil || len(pending.Leases) != 1 || pending.Leases[0].ID != id {
		t.Fatalf("pending = %s", b)
	}
	// A second caller gets nothing: the envelope is leased.
	if _, b := request(t, "GET", d.base+"/internal/outbox/pending?channel=email", token, nil); strings.Contains(string(b), id) {
		t.Fatalf("leased twice: %s", b)
	}
	status := fmt.Sprintf(`{"status":"delivered","fence":%d}`, pending.Leases[0].Fence)
	path := d.base + "/internal/outbox/" + url.PathEscape(id) + "/status"
	if code, b := request(t, "POST", path, token, []byte(status)); code != 200 {
		t.Fatalf("status = %d %s", code, b)
	}
	if code, b := request(t, "POST", path, token, []byte(status)); code != 200 {
		t.Fatalf("repeated status = %d %s (want 200, a no-op)", code, b)
	}
	if code, _ := request(t, "POST", d.base+"/internal/outbox/nope/status", token, []byte(status)); code != 404 {
		t.Fatalf("unknown id = %d, want 404", code)
	}
	code, b = request(t, "GET", d.base+"/v1/envelopes/"+url.PathEscape(id), token, nil)
	if code != 200 || !strings.Contains(string(b), `"status":"delivered"`) {
		t.Fatalf("after status = %d %s", code, b)
	}
	d.stop(t)
}

// postSeamDigest sets u_42's consent and posts the digest fixture, due now
// and not expired, for the seam's tests; it returns the envelope's id.
func postSeamDigest(t *testing.T, base, token string) string {
	t.Helper()
	if code, b := request(t, "PUT", base+"/v1/consent/u_42", token, []byte(`{"digest_enabled":true,"push_enabled":true,"email_verified":true,"cadence":"weekly"}`)); code != 200 {
		t.Fatalf("PUT consent = %d %s", code, b)
	}
	digest, err := os.ReadFile("demodata/your-week-digest.v1.golden.json")
	if err != nil {
		t.Fatal(err)
	}
	// Move the fixture's window around now so it is due and not expired.
	var env map[string]any
	json.Unmarshal(digest, &env)
	env["not_before"] = time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	env["expires_at"] = time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	body, _ := json.Marshal(env)
	if code, b := request(t, "POST", base+"/v1/envelopes", token, body); code != 201 {
		t.Fatalf("POST = %d %s", code, b)
	}
	return env["id"].(string)
}
