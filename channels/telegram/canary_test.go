package telegram

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// errorTexts returns every text an error chain can show.
func errorTexts(err error) []string {
	if err == nil {
		return nil
	}
	out := []string{fmt.Sprintf("%v", err), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)}
	var walk func(e error)
	walk = func(e error) {
		for e != nil {
			out = append(out, e.Error())
			if m, ok := e.(interface{ Unwrap() []error }); ok {
				for _, c := range m.Unwrap() {
					walk(c)
				}
				return
			}
			e = errors.Unwrap(e)
		}
	}
	walk(err)
	return out
}

// TestProvider_Canary sends a canary token, chat id and text through every
// outcome, including a network error whose net/http text holds the URL
// (and so the token), and checks that none reaches an error (or its
// causes), a receipt or the log.
func TestProvider_Canary(t *testing.T) {
	const (
		token  = "424242:canary-TOKEN_9fQx2"
		chatID = "7000123987"
		text   = "canary body text 5be1"
	)
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var errs []error
	var receipts []string
	deliver := func(ctx context.Context, baseURL string, client *http.Client) {
		t.Helper()
		p, err := New(Options{Token: token, BaseURL: baseURL, HTTPClient: client, Logger: logger, PerChat: 1000, Global: 1000})
		if err != nil {
			t.Fatal(err)
		}
		rc, err := p.Deliver(ctx, testKey, chat(chatID, text, "HTML"))
		errs = append(errs, err)
		receipts = append(receipts, rc.ID)
	}
	echo := func(status int, prefix string) func(http.ResponseWriter, *sentMessage, *http.Request) {
		// Telegram's descriptions can quote the request; this one does.
		return func(w http.ResponseWriter, m *sentMessage, _ *http.Request) {
			writeAPI(w, status, map[string]any{"ok": false, "error_code": status,
				"description": prefix + string(m.ChatID) + " " + m.Text + " " + token})
		}
	}
	for _, respond := range []func(http.ResponseWriter, *sentMessage, *http.Request){
		nil,
		echo(403, "Forbidden: bot was blocked by the user "),
		echo(400, "Bad Request: can't parse entities "),
		echo(400, "Bad Request: chat not found "),
		echo(500, "Internal Server Error "),
		apiError(429, "Too Many Requests: retry after 1", map[string]any{"retry_after": 1}),
		apiError(400, "Bad Request: group chat was upgraded to a supergroup chat", map[string]any{"migrate_to_chat_id": -100777}),
	} {
		api := newBotAPI(t, token, respond)
		deliver(context.Background(), api.srv.URL, api.srv.Client())
	}
	// A wrong token path (401) and a bad base path (404).
	other := newBotAPI(t, "1:other", nil)
	deliver(context.Background(), other.srv.URL, other.srv.Client())
	deliver(context.Background(), other.srv.URL+"/x", other.srv.Client())

	// A timeout.
	hung := newBotAPI(t, token, hangAPI)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	deliver(ctx, hung.srv.URL, hung.srv.Client())
	cancel()

	// The server is gone (provider_unreachable). net/http's error quotes the URL
	// with the token; make sure of it, then that ours does not.
	gone := httptest.NewServer(http.NotFoundHandler())
	base := gone.URL
	gone.Close()
	client := &http.Client{Timeout: 5 * time.Second}
	if _, raw := client.Post(base+"/bot"+token+"/sendMessage", "application/json", nil); raw == nil || !strings.Contains(raw.Error(), token) {
		t.Fatalf("precondition: net/http's error should quote the token, got %v", raw)
	}
	deliver(context.Background(), base, client)

	secrets := []string{token, "canary-TOKEN", chatID, text, testKey.EnvelopeID}
	failures := 0
	for _, err := range errs {
		if err != nil {
			failures++
		}
		for _, s := range errorTexts(err) {
			for _, c := range secrets {
				if strings.Contains(s, c) {
					t.Errorf("error text %q contains a canary", s)
				}
			}
		}
	}
	if failures != len(errs)-1 {
		t.Errorf("%d of %d deliveries failed, want all but the first", failures, len(errs))
	}
	for _, rc := range receipts {
		for _, c := range secrets {
			if strings.Contains(rc, c) {
				t.Errorf("receipt %q contains a canary", rc)
			}
		}
	}
	out := logs.String()
	for _, c := range secrets {
		if strings.Contains(out, c) {
			t.Errorf("log output contains canary %q:\n%s", c, out)
		}
	}
	for _, want := range []string{`"error_class":"blocked_by_user"`, `"error_class":"auth_failed"`, `"hint":`, `"error_class":"provider_unreachable"`, `"error_class":"timeout"`, `"error_code":429`} {
		if !strings.Contains(out, want) {
			t.Errorf("log output lacks %s:\n%s", want, out)
		}
	}
}
