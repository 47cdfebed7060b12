package httpapi

import (
	"strings"
	"testing"
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
