package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/queue/queuetest"
)

// The app's mux serves its own route and outbox's: the push-subscription
// routes answer for the signed-in user only, the API for the token only.
func TestEmbedHTTP(t *testing.T) {
	const token = "example-token-0123456789abcdef0123456789"
	mux, q, err := setup(t.TempDir(), token, "BDemoVapidPublicKey")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	srv := httptest.NewServer(mux)
	defer srv.Close()

	call := func(method, path, cookie, auth string, body []byte) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: "session", Value: cookie})
		}
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	sub, _ := json.Marshal(queuetest.Nudge("n", "u_7").Recipient.PushSubscription)

	if code, body := call("GET", "/", "", "", nil); code != 200 || body != "the app\n" {
		t.Errorf("the app's own route: %d %q", code, body)
	}
	if code, body := call("GET", "/api/app/push/vapid-key", "", "", nil); code != 200 || !strings.Contains(body, "BDemoVapidPublicKey") {
		t.Errorf("vapid key: %d %s", code, body)
	}
	if code, body := call("POST", "/api/app/push/subscribe", "", "", sub); code != 401 {
		t.Errorf("subscribe signed out: %d %s, want 401", code, body)
	}
	if code, body := call("POST", "/api/app/push/subscribe", "u_7", "", sub); code != 201 {
		t.Fatalf("subscribe signed in: %d %s, want 201", code, body)
	}
	subs, err := q.Subscriptions(context.Background(), "", "u_7")
	if err != nil || len(subs) != 1 {
		t.Fatalf("u_7's subscriptions: %v, %v; want the one saved", subs, err)
	}
	if code, body := call("GET", "/v1/stats", "", "", nil); code != 401 {
		t.Errorf("API without the token: %d %s, want 401", code, body)
	}
	if code, body := call("GET", "/v1/stats", "", token, nil); code != 200 {
		t.Errorf("API with the token: %d %s, want 200", code, body)
	}
}
