package telegram

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"golang.org/x/time/rate"
)

// A Bot API that answers with a redirect is not followed, by the default
// client and by a caller's client (which would follow it): the request,
// whose path holds the bot token, never reaches the server the redirect
// points to, and the answer is a provider error.
func TestProvider_NeverFollowsRedirects(t *testing.T) {
	var mu sync.Mutex
	var elsewhere []string
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		elsewhere = append(elsewhere, r.URL.Path)
		mu.Unlock()
		writeAPI(w, http.StatusOK, map[string]any{"ok": true, "result": map[string]any{"message_id": 1}})
	}))
	defer target.Close()
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		b := newBotAPI(t, testToken, func(w http.ResponseWriter, _ *sentMessage, r *http.Request) {
			http.Redirect(w, r, target.URL+r.URL.RequestURI(), code)
		})
		for name, client := range map[string]*http.Client{
			"DefaultClient": nil,
			"CallerClient":  {Timeout: 10 * time.Second},
		} {
			t.Run(strconv.Itoa(code)+"/"+name, func(t *testing.T) {
				opts := Options{Token: Token(b.token), BaseURL: b.srv.URL, HTTPClient: client,
					Logger: slog.New(slog.DiscardHandler), PerChat: rate.Inf, Global: rate.Inf}
				p, err := New(opts)
				if err != nil {
					t.Fatal(err)
				}
				_, err = p.Deliver(context.Background(), testKey, chat("734519028", "hello", ""))
				de := envelope.Classify(err)
				if err == nil || de.Class != envelope.ClassProviderUnavailable {
					t.Fatalf("Deliver after a redirect = %v, want a provider error (provider_unavailable)", err)
				}
				if strings.Contains(err.Error(), testToken) {
					t.Errorf("error %q holds the token", err)
				}
				mu.Lock()
				defer mu.Unlock()
				if len(elsewhere) != 0 {
					t.Fatalf("the redirect's target got %d requests, want none", len(elsewhere))
				}
			})
		}
	}
}
