package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Canary values: personal data and message text sent in requests. None may
// appear in an error response or a log line.
const (
	canaryEmail    = "canary.leak.4f1d@canary-mail.example"
	canaryEndpoint = "https://canary-push.example/wpush/CANARYENDPOINT93b"
	canaryText     = "CANARY-BODY-TEXT-7e55a"
	canaryUser     = "canary_user_c0ffee"
)

var canaries = []string{canaryEmail, canaryEndpoint, "CANARYENDPOINT93b", canaryText, canaryUser}

func assertNoCanary(t *testing.T, where, s string) {
	t.Helper()
	for _, c := range canaries {
		if strings.Contains(s, c) {
			t.Errorf("%s contains canary %q:\n%s", where, c, s)
		}
	}
}

func TestRedaction_Canaries(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_ok")

	invalid := digest("canary/1", canaryUser)
	invalid.Recipient.Email = canaryEmail
	invalid.Payload = []byte(`{"sections":[{"kind":"revisit","items":[{"quote":"` + canaryText + `","graph_refs":[],"deep_link":"` + canaryText + `"}]}]}`)

	noConsent := digest("canary/2", canaryUser)
	noConsent.Recipient.Email = canaryEmail

	badEmail := digest("canary/3", "u_ok")
	badEmail.Recipient.Email = canaryText + " not an address"

	badPush := nudge("canary/4", "u_ok")
	badPush.Recipient.PushSubscription.Endpoint = strings.Replace(canaryEndpoint, "https", "http", 1)

	okPush := nudge("canary/5", "u_ok")
	okPush.Recipient.PushSubscription.Endpoint = canaryEndpoint

	httpSub := pushSub(strings.Replace(canaryEndpoint, "https", "http", 1))
	badKeys := pushSub(canaryEndpoint)
	badKeys.Keys.Auth = canaryText + "!" // (canaryText alone is valid base64url)

	requests := []struct {
		name, method, target, body string
		status                     int
	}{
		{"InvalidEnvelope", "POST", "/v1/envelopes", mustJSON(t, invalid), 400},
		{"ConsentDenied", "POST", "/v1/envelopes", mustJSON(t, noConsent), 409},
		{"BadEmail", "POST", "/v1/envelopes", mustJSON(t, badEmail), 400},
		{"BadPushEndpoint", "POST", "/v1/envelopes", mustJSON(t, badPush), 400},
		{"MalformedJSON", "POST", "/v1/envelopes", `{"recipient":{"email":"` + canaryEmail + `", "x": ` + canaryText, 400},
		{"SyntaxInBatch", "POST", "/v1/envelopes", `[{"id":"` + canaryText + `"}, ` + canaryText + `]`, 400},
		{"UnknownFieldValue", "POST", "/v1/envelopes", strings.Replace(mustJSON(t, badEmail), `"id"`, `"zz":"`+canaryText+`","id"`, 1), 400},
		{"BadCadence", "PUT", "/v1/consent/u_ok", `{"cadence":"` + canaryText + `"}`, 400},
		{"BadConsentJSON", "PUT", "/v1/consent/u_ok", `{"digest_enabled":"` + canaryEmail + `"}`, 400},
		{"BadState", "GET", "/v1/envelopes?state=" + canaryText, "", 400},
		{"BadCursor", "GET", "/v1/envelopes?cursor=" + canaryText, "", 400},
		{"UnknownID", "GET", "/v1/envelopes/" + canaryUser, "", 404},
		{"BadStatus", "POST", "/internal/outbox/x/status", `{"status":"` + canaryText + `"}`, 400},
		{"BadStatusClass", "POST", "/internal/outbox/x/status", `{"status":"failed","error_class":"` + canaryText + `"}`, 400},
		{"PushHTTP", "POST", "/api/app/push/subscribe?user=" + canaryUser, mustJSON(t, httpSub), 400},
		{"PushBadKeys", "POST", "/api/app/push/subscribe?user=" + canaryUser, mustJSON(t, badKeys), 400},
		{"PushDeleteUnknown", "DELETE", "/api/app/push/subscribe?user=" + canaryUser, `{"endpoint":"` + canaryEndpoint + `"}`, 404},
		{"UnsubscribeBad", "POST", "/unsubscribe/" + canaryText, "", 400},
		{"UnauthorizedWithCanaryToken", "GET", "/v1/stats", "", 401},
	}
	for _, rq := range requests {
		t.Run(rq.name, func(t *testing.T) {
			opts := []reqOpt{}
			if rq.status == 401 {
				opts = append(opts, withAuth("Bearer "+canaryText))
			}
			w := f.call(rq.method, rq.target, rq.body, opts...)
			if w.Code != rq.status {
				t.Fatalf("status %d, want %d: %s", w.Code, rq.status, w.Body)
			}
			assertNoCanary(t, "response", w.Body.String())
			for k, v := range w.Header() {
				assertNoCanary(t, "header "+k, strings.Join(v, " "))
			}
		})
	}

	// A valid push envelope with a canary endpoint, delivered through the
	// seam with a status detail holding provider text.
	f.enqueue(http.StatusCreated, okPush)
	p := f.pending("push", 10)
	if len(p.Envelopes) != 1 || p.Envelopes[0].Recipient.PushSubscription.Endpoint != canaryEndpoint {
		t.Fatal("the seam must hand out the full envelope") // proves the canary was really in play
	}
	code, _, _ := f.status("canary/5", `{"status":"bounced","detail":"410 Gone for `+canaryEndpoint+` `+canaryText+`"}`)
	if code != 200 {
		t.Fatalf("status: %d", code)
	}
	w := f.call("GET", "/v1/envelopes/canary%2F5", "")
	assertNoCanary(t, "envelope status without full=1", w.Body.String())
	w = f.call("GET", "/v1/consent/u_ok", "")
	assertNoCanary(t, "consent", w.Body.String())

	logs := f.logs.String()
	if !strings.Contains(logs, "operation=") {
		t.Fatalf("no request logs were captured:\n%s", logs)
	}
	assertNoCanary(t, "logs", logs)
}

// failingStore returns errors (and panics) whose text holds a canary.
type failingStore struct {
	queue.Store
}

func (failingStore) Get(ctx context.Context, tenant, id string) (*queue.EnvelopeStatus, error) {
	return nil, fmt.Errorf("disk exploded while reading %s for %s", canaryEmail, canaryText)
}

func (failingStore) Counts(ctx context.Context, tenant string) (queue.Counts, error) {
	panic("counts panicked on " + canaryEmail)
}

func (failingStore) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]queue.EnqueueResult, error) {
	return nil, &queue.EnqueueError{Index: 0, Err: errors.New("write failed: " + canaryText)}
}

func (failingStore) Suppress(ctx context.Context, tenant, user string, s queue.Suppression) error {
	return errors.New("suppress failed for " + canaryEmail)
}

func TestRedaction_UnexpectedErrors(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.cfg.Store = failingStore{f.q}
	f.reopen()
	tests := []struct {
		name, method, target, body string
	}{
		{"GetError", "GET", "/v1/envelopes/x", ""},
		{"Panic", "GET", "/v1/stats", ""},
		{"EnqueueError", "POST", "/v1/envelopes", mustJSON(t, digest("d/1", "u_1"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := f.call(tt.method, tt.target, tt.body)
			e := wantError(t, w, http.StatusInternalServerError, CodeInternal)
			if e.Error.Message != "internal error" {
				t.Errorf("message %q", e.Error.Message)
			}
			assertNoCanary(t, "response", w.Body.String())
			if w.Header().Get("X-Request-Id") == "" {
				t.Error("no request id")
			}
		})
	}
	// The unsubscribe page answers plain text on a store failure.
	path := "/unsubscribe/" + f.unsub.Token("default", "u_1", envelope.ChannelEmail, "r")
	w := f.call("POST", path, "", noAuth)
	if w.Code != 500 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		t.Fatalf("unsubscribe on store failure: %d", w.Code)
	}
	assertNoCanary(t, "unsubscribe response", w.Body.String())

	logs := f.logs.String()
	for _, want := range []string{"request failed", "handler panicked", "unsubscribe failed"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	assertNoCanary(t, "logs", logs)
}

// TestRedaction_AbortHandlerPropagates checks that http.ErrAbortHandler still
// aborts the response as net/http intends.
func TestRedaction_AbortHandlerPropagates(t *testing.T) {
	f := newFixture(t)
	f.cfg.Store = abortStore{f.q}
	f.reopen()
	defer func() {
		if p := recover(); p != http.ErrAbortHandler {
			t.Fatalf("recovered %v, want http.ErrAbortHandler", p)
		}
	}()
	f.call("GET", "/v1/stats", "")
	t.Fatal("ServeHTTP returned")
}

type abortStore struct{ queue.Store }

func (abortStore) Counts(ctx context.Context, tenant string) (queue.Counts, error) {
	panic(http.ErrAbortHandler)
}

// downErr is a store's error marked safe to log (queue.Loggable), as the
// PostgreSQL store's answers of the server are.
type downErr struct{}

func (downErr) Error() string {
	return "pgstore: get: the database server is short of memory or connections (SQLSTATE 53300)"
}
func (downErr) Loggable()            {}
func (downErr) Is(target error) bool { return target == queue.ErrUnavailable }

// downStore fails Get with a Loggable error wrapped in text that is not.
type downStore struct{ queue.Store }

func (downStore) Get(ctx context.Context, tenant, id string) (*queue.EnvelopeStatus, error) {
	return nil, fmt.Errorf("reading %s: %w", canaryUser, downErr{})
}

// A failed request's log line says why the store cannot serve when the
// store marked the reason safe to log (an operator at a database out of
// connections saw only "unavailable"), never the text around it; the
// response stays the generic 503.
func TestRedaction_LoggableReason(t *testing.T) {
	f := newFixture(t)
	f.cfg.Store = downStore{f.q}
	f.reopen()
	w := f.call("GET", "/v1/envelopes/x", "")
	e := wantError(t, w, http.StatusServiceUnavailable, CodeUnavailable)
	if strings.Contains(e.Error.Message, "SQLSTATE") {
		t.Errorf("the response names the store's reason: %q", e.Error.Message)
	}
	logs := f.logs.String()
	if !strings.Contains(logs, "short of memory or connections (SQLSTATE 53300)") {
		t.Errorf("the log lacks the store's reason:\n%s", logs)
	}
	assertNoCanary(t, "logs", logs)
}
