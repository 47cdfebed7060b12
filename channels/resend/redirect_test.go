package resend

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"golang.org/x/time/rate"
)

// An API that answers with a redirect is not followed, by the default
// client and by a caller's client (which would follow it): the API key in
// the Authorization header and the message never reach the server the
// redirect points to, and the answer is a provider error. The same for
// Reconcile's replay and the poller's list.
func TestProvider_NeverFollowsRedirects(t *testing.T) {
	var elsewhere atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"4ef9a417-02e9-4d39-ad75-9611e0fcc33c","data":[]}`))
	}))
	defer target.Close()
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+r.URL.RequestURI(), code)
		}))
		defer api.Close()
		for name, client := range map[string]*http.Client{
			"DefaultClient": nil,
			"CallerClient":  {Timeout: 10 * time.Second},
		} {
			t.Run(strconv.Itoa(code)+"/"+name, func(t *testing.T) {
				p := mustProvider(t, Options{APIKey: testAPIKey, From: "Outbox <outbox@example.com>",
					BaseURL: api.URL, HTTPClient: client, Rate: rate.Inf, Logger: slog.New(slog.DiscardHandler)})
				key := envelope.Key{Tenant: "t", EnvelopeID: "e-" + name, Segment: 0}
				_, err := p.Deliver(context.Background(), key, emailMessage("ada@example.org", "hi"))
				mustClass(t, err, envelope.KindRetryable, envelope.ClassProviderUnavailable)
				rec, err := p.Reconcile(context.Background(), key, emailMessage("ada@example.org", "hi"))
				if err == nil || rec.Outcome != channels.Unknown {
					t.Errorf("Reconcile after a redirect = %+v, %v; want Unknown with a provider error", rec, err)
				}
				poller, err := NewPoller(p, &recordingSuppressor{}, PollerOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := poller.PollOnce(context.Background()); err == nil {
					t.Error("PollOnce after a redirect = nil, want a provider error")
				}
				if n := elsewhere.Load(); n != 0 {
					t.Fatalf("the redirect's target got %d requests, want none", n)
				}
			})
		}
	}
}
