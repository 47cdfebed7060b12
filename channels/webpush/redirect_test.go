package webpush

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// A push service that answers with a redirect is not followed, with the
// caller's client (which would follow it) as with the default ones: the
// VAPID authorization and the encrypted payload never reach the server the
// redirect points to, and the answer is a provider error.
func TestProvider_NeverFollowsRedirects(t *testing.T) {
	var elsewhere atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer target.Close()
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			ps := newPushService(t, func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, target.URL+r.URL.RequestURI(), code)
			})
			t.Run("CallerClient", func(t *testing.T) {
				// ps.srv.Client() follows redirects on its own.
				p := mustProvider(t, ps, Options{HTTPClient: ps.srv.Client()})
				checkNotFollowed(t, p, ps.subscription("/push/abc"))
			})
			t.Run("DefaultClient", func(t *testing.T) {
				// AllowInsecureEndpoints' default client, on plain http.
				plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					http.Redirect(w, r, target.URL+r.URL.RequestURI(), code)
				}))
				defer plain.Close()
				p := mustProvider(t, nil, Options{})
				sub := ps.subscription("/push/abc")
				sub.Endpoint = plain.URL + "/push/abc"
				checkNotFollowed(t, p, sub)
			})
			if n := elsewhere.Load(); n != 0 {
				t.Fatalf("the redirect's target got %d requests, want none", n)
			}
		})
	}
}

func checkNotFollowed(t *testing.T, p *Provider, sub envelope.PushSubscription) {
	t.Helper()
	_, err := p.Deliver(context.Background(), testKey, pushMessage(sub, []byte("hello"), time.Hour, "", ""))
	de := envelope.Classify(err)
	if err == nil || de.Class != envelope.ClassProviderUnavailable {
		t.Fatalf("Deliver after a redirect = %v, want a provider error (provider_unavailable)", err)
	}
}
