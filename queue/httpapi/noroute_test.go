package httpapi

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// Every answer is JSON, a missing route and a wrong method included.
func TestNoRoute_JSON(t *testing.T) {
	f := newFixture(t)
	wantError(t, f.call("GET", "/nope", ""), 404, CodeNotFound)
	wantError(t, f.call("GET", "/v1/envelopes/a/b/c", ""), 404, CodeNotFound)
	w := f.call("DELETE", "/v1/envelopes", "")
	e := wantError(t, w, 405, CodeMethodNotAllowed)
	if got := w.Header().Get("Allow"); got != "GET, POST" || !strings.Contains(e.Error.Message, "GET, POST") {
		t.Fatalf("405: Allow %q, message %q", got, e.Error.Message)
	}
	wantError(t, f.call("PUT", "/healthz", ""), 405, CodeMethodNotAllowed)
}

// Without a token the API routes are missing, and the 404 says why.
func TestNoRoute_NoTokenSaysWhy(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Token = "" })
	e := wantError(t, f.call("GET", "/v1/envelopes", ""), 404, CodeNotFound)
	if !strings.Contains(e.Error.Message, "INTERNAL_OUTBOX_TOKEN") {
		t.Fatalf("404 without a token: %q", e.Error.Message)
	}
}

// A bad body names the field and the type it needs; an unknown field is
// named only when its name is a plain identifier.
func TestBadJSON_NamesTheField(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct{ body, want string }{
		{`{"digest_enabled":"yes"}`, `field "digest_enabled" must be a boolean, not a JSON string`},
		{`{"digest_enabled":true,"colour":1}`, `unknown field "colour"`},
		{`{"a@b.example":1}`, `the body has an unknown field`},
		{`{"digest_enabled":`, `empty or cut short`},
		{`{"digest_enabled" true}`, `not valid JSON (at byte 19)`},
		{`[1]`, `the body must be an object, not a JSON array`},
		{`{} {}`, `more than one JSON value`},
	} {
		e := wantError(t, f.call("PUT", "/v1/consent/u_1", tc.body), 400, CodeBadJSON)
		if !strings.Contains(e.Error.Message, tc.want) || strings.Contains(e.Error.Message, "a@b") {
			t.Errorf("%s: %q, want %q", tc.body, e.Error.Message, tc.want)
		}
	}
}

// An envelope past its expires_at is refused with 422 and where.
func TestPostEnvelopes_Expired(t *testing.T) {
	f := newFixture(t)
	e := queuetest.Reply("r/1", "u_1", "hi")
	e.ExpiresAt = f.clock.Now()
	w := f.call("POST", "/v1/envelopes", mustJSON(t, e))
	b := wantError(t, w, 422, CodeExpired)
	if len(b.Error.Problems) != 1 || b.Error.Problems[0].Path != "expires_at" {
		t.Fatalf("problems %+v", b.Error.Problems)
	}
	if _, err := f.q.Get(context.Background(), "", "r/1"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("the expired envelope was stored: %v", err)
	}
}
