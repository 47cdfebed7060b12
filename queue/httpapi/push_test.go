package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

func (f *fixture) subs(tenant, user string) []queue.Subscription {
	f.t.Helper()
	s, err := f.q.Subscriptions(context.Background(), tenant, user)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func TestPushSubscribe_WithToken(t *testing.T) {
	f := newFixture(t)
	sub := pushSub("https://fcm.googleapis.com/fcm/send/abc123")
	body := mustJSON(t, sub)

	w := f.call("POST", "/api/app/push/subscribe?user=u_1&tenant=acme", body)
	var rep subscribeReply
	decode(t, w, &rep)
	if w.Code != http.StatusCreated || rep.Status != "subscribed" {
		t.Fatalf("subscribe: %d %s", w.Code, w.Body)
	}
	got := f.subs("acme", "u_1")
	if len(got) != 1 || got[0].Sub.Endpoint != sub.Endpoint || got[0].Sub.Keys != sub.Keys {
		t.Fatalf("stored %+v", got)
	}
	if len(f.subs("", "u_1")) != 0 {
		t.Fatal("saved under the default tenant too")
	}
	// Consent flags are the app's: subscribing does not change them.
	if c := f.consent("acme", "u_1"); c.PushEnabled {
		t.Fatal("subscribe turned push_enabled on")
	}

	wantError(t, f.call("POST", "/api/app/push/subscribe?user=u_1", body, noAuth), 401, CodeUnauthorized)
	wantError(t, f.call("POST", "/api/app/push/subscribe", body), 400, CodeBadRequest)

	del := `{"endpoint":"` + sub.Endpoint + `"}`
	w = f.call("DELETE", "/api/app/push/subscribe?user=u_1&tenant=acme", del)
	decode(t, w, &rep)
	if w.Code != 200 || rep.Status != "unsubscribed" || len(f.subs("acme", "u_1")) != 0 {
		t.Fatalf("delete: %d %s", w.Code, w.Body)
	}
	wantError(t, f.call("DELETE", "/api/app/push/subscribe?user=u_1&tenant=acme", del), 404, CodeNotFound)
	wantError(t, f.call("DELETE", "/api/app/push/subscribe?user=u_1", `{}`), 400, CodeBadRequest)
}

func TestPushSubscribe_Invalid(t *testing.T) {
	f := newFixture(t)
	good := pushSub("https://push.example.net/x")
	mut := func(fn func(s *envelope.PushSubscription)) string {
		s := *good
		fn(&s)
		return mustJSON(t, s)
	}
	neg := -1.0
	tests := map[string]struct {
		body, ctype, code string
		status            int
	}{
		"HTTPEndpoint":   {mut(func(s *envelope.PushSubscription) { s.Endpoint = "http://push.example.net/x" }), "", CodeBadRequest, 400},
		"NoEndpoint":     {mut(func(s *envelope.PushSubscription) { s.Endpoint = "" }), "", CodeBadRequest, 400},
		"NoHost":         {mut(func(s *envelope.PushSubscription) { s.Endpoint = "https:///x" }), "", CodeBadRequest, 400},
		"UserInfo":       {mut(func(s *envelope.PushSubscription) { s.Endpoint = "https://a:b@push.example.net/x" }), "", CodeBadRequest, 400},
		"LongEndpoint":   {mut(func(s *envelope.PushSubscription) { s.Endpoint = "https://p.example/" + strings.Repeat("x", 2100) }), "", CodeBadRequest, 400},
		"ShortP256dh":    {mut(func(s *envelope.PushSubscription) { s.Keys.P256dh = "BAAA" }), "", CodeBadRequest, 400},
		"NoAuth":         {mut(func(s *envelope.PushSubscription) { s.Keys.Auth = "" }), "", CodeBadRequest, 400},
		"BadAuthBase64":  {mut(func(s *envelope.PushSubscription) { s.Keys.Auth = "!!!!!!!!!!!!!!!!!!!!!!" }), "", CodeBadRequest, 400},
		"NegativeExpiry": {mut(func(s *envelope.PushSubscription) { s.ExpirationTime = &neg }), "", CodeBadRequest, 400},
		"NotJSON":        {`endpoint=https://x`, "", CodeBadJSON, 400},
		"FormType":       {mustJSON(t, good), "application/x-www-form-urlencoded", CodeUnsupportedMedia, 415},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			opts := []reqOpt{}
			if tt.ctype != "" {
				opts = append(opts, withHeader("Content-Type", tt.ctype))
			}
			wantError(t, f.call("POST", "/api/app/push/subscribe?user=u_1", tt.body, opts...), tt.status, tt.code)
		})
	}
	if len(f.subs("", "u_1")) != 0 {
		t.Fatal("an invalid subscription was stored")
	}
}

func TestPushSubscribe_AppAuth(t *testing.T) {
	errNoSession := errors.New("no session")
	f := newFixture(t, func(c *Config) {
		c.User = func(r *http.Request) (string, string, error) {
			if r.Header.Get("Cookie") != "session=ok" {
				return "", "", errNoSession
			}
			return "app", "u_9", nil
		}
	})
	body := mustJSON(t, pushSub("https://push.example.net/y"))
	// The app's authentication, not the token, decides; ?user= is ignored.
	w := f.call("POST", "/api/app/push/subscribe?user=intruder", body, noAuth, withHeader("Cookie", "session=ok"))
	if w.Code != http.StatusCreated {
		t.Fatalf("subscribe: %d %s", w.Code, w.Body)
	}
	if len(f.subs("app", "u_9")) != 1 || len(f.subs("", "intruder")) != 0 {
		t.Fatal("saved under the wrong user")
	}
	wantError(t, f.call("POST", "/api/app/push/subscribe", body), 401, CodeUnauthorized)
	// A cross-site form post cannot send JSON: refused before anything is read.
	wantError(t, f.call("POST", "/api/app/push/subscribe", body, withHeader("Cookie", "session=ok"), withHeader("Content-Type", "text/plain")), 415, CodeUnsupportedMedia)
}

func TestVAPIDKey(t *testing.T) {
	f := newFixture(t)
	w := f.call("GET", "/api/app/push/vapid-key", "", noAuth)
	var v struct {
		PublicKey string `json:"public_key"`
	}
	decode(t, w, &v)
	if w.Code != 200 || v.PublicKey != "BPublicVapidKeyForTests" {
		t.Fatalf("%d %+v", w.Code, v)
	}
	f = newFixture(t, func(c *Config) { c.VAPIDPublicKey = "" })
	if w := f.call("GET", "/api/app/push/vapid-key", "", noAuth); w.Code != http.StatusNotFound {
		t.Fatalf("without a key: %d", w.Code)
	}
}
