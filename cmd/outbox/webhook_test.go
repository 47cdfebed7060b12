package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startServeEnv runs serve in this process with the environment vars (and
// extra flags, which override the defaults) and returns its base URL, its
// stderr and a stop function that waits for it.
func startServeEnv(t *testing.T, vars map[string]string, extra ...string) (string, *lockedBuffer, func() int) {
	t.Helper()
	var errb lockedBuffer
	e := &env{Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Stderr: &errb, Getenv: func(k string) string { return vars[k] }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- runServe(ctx, e, append([]string{"--data", t.TempDir(), "--addr", "127.0.0.1:0", "--log-format", "json"}, extra...))
	}()
	stop := func() int {
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(15 * time.Second):
			t.Fatal("serve did not stop")
			return -1
		}
	}
	re := regexp.MustCompile(`listening on (http://\S+)`)
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m := re.FindStringSubmatch(errb.String()); m != nil {
			return m[1], &errb, stop
		}
		select {
		case code := <-done:
			done <- code
			return "", &errb, stop
		default:
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("serve did not start:\n%s", errb.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// signedWebhook builds a Resend (Svix) webhook request signed with key.
func signedWebhook(t *testing.T, url string, key []byte, body string) *http.Request {
	t.Helper()
	id, ts := "msg_test_1", strconv.FormatInt(time.Now().Unix(), 10)
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "." + body))
	req, err := http.NewRequest(http.MethodPost, url+"/webhooks/resend", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("svix-id", id)
	req.Header.Set("svix-timestamp", ts)
	req.Header.Set("svix-signature", "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	return req
}

// RESEND_WEBHOOK_SECRET without RESEND_API_KEY: serve serves the webhook
// (its bounces and complaints suppress addresses whoever sent the mail)
// and says so at start, instead of a silent 404; a secret it cannot use
// refuses the start with a message naming the variable.
func TestServe_ResendWebhookWithoutAPIKey(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	url, errb, stop := startServeEnv(t, map[string]string{"RESEND_WEBHOOK_SECRET": secret})
	if url == "" {
		t.Fatalf("serve exited:\n%s", errb.String())
	}
	body := `{"type":"email.bounced","created_at":"2026-05-04T07:00:00Z","data":{"email_id":"4ef9a417-02e9-4d39-ad75-9611e0fcc33c","to":["ada@example.org"]}}`
	resp, err := http.DefaultClient.Do(signedWebhook(t, url, key, body))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(got), "processed") {
		t.Errorf("signed bounce: %d %s, want 200 processed", resp.StatusCode, got)
	}
	// An unsigned request is refused by the webhook, not unknown to serve.
	resp, err = http.Post(url+"/webhooks/resend", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unsigned webhook: %d, want 401", resp.StatusCode)
	}
	if code := stop(); code != exitOK {
		t.Fatalf("serve = %d:\n%s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "RESEND_API_KEY is not set") {
		t.Errorf("serve did not say that the webhook is served without an API key:\n%s", errb.String())
	}
	http.DefaultClient.CloseIdleConnections()

	t.Run("UnusableSecret", func(t *testing.T) {
		url, errb, stop := startServeEnv(t, map[string]string{"RESEND_WEBHOOK_SECRET": "whsec_not base64!"})
		code := stop()
		if url != "" || code != exitFailure || !strings.Contains(errb.String(), "RESEND_WEBHOOK_SECRET") {
			t.Fatalf("serve with an unusable secret: started %v, exit %d, want a refusal naming the variable:\n%s", url != "", code, errb.String())
		}
	})
}
