package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNew_Config(t *testing.T) {
	q := newFixture(t).q
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{"NoStore", Config{Token: testToken}, true},
		{"ShortToken", Config{Store: q, Token: "short"}, true},
		{"NoToken", Config{Store: q}, false},
		{"Token", Config{Store: q, Token: testToken}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := New(tt.cfg)
			if (err != nil) != tt.wantErr {
				t.Fatalf("New: err %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && h == nil {
				t.Fatal("New returned a nil handler")
			}
		})
	}
}

func TestAuth(t *testing.T) {
	f := newFixture(t)
	routes := []struct{ method, target, body string }{
		{"GET", "/v1/stats", ""},
		{"GET", "/v1/envelopes", ""},
		{"POST", "/v1/envelopes", `{}`},
		{"GET", "/v1/envelopes/x", ""},
		{"PUT", "/v1/consent/u_1", `{}`},
		{"GET", "/internal/outbox/pending?channel=email", ""},
		{"POST", "/internal/outbox/x/status", `{"status":"delivered"}`},
		{"POST", "/api/app/push/subscribe?user=u_1", `{}`},
	}
	auths := []struct {
		name string
		opt  reqOpt
		ok   bool
	}{
		{"Missing", noAuth, false},
		{"Wrong", withAuth("Bearer " + strings.Repeat("x", len(testToken))), false},
		{"WrongLonger", withAuth("Bearer " + testToken + "x"), false},
		{"Prefix", withAuth("Bearer " + testToken[:len(testToken)-1]), false},
		{"BasicScheme", withAuth("Basic " + testToken), false},
		{"NoScheme", withAuth(testToken), false},
		{"Right", withAuth("Bearer " + testToken), true},
		{"LowercaseScheme", withAuth("bearer " + testToken), true},
	}
	var unauthorized string
	for _, rt := range routes {
		for _, a := range auths {
			t.Run(rt.method+rt.target+"/"+a.name, func(t *testing.T) {
				w := f.call(rt.method, rt.target, rt.body, a.opt)
				if !a.ok {
					wantError(t, w, http.StatusUnauthorized, CodeUnauthorized)
					if w.Header().Get("WWW-Authenticate") == "" {
						t.Error("401 without WWW-Authenticate")
					}
					// Missing and wrong tokens get the same body.
					if unauthorized == "" {
						unauthorized = w.Body.String()
					} else if w.Body.String() != unauthorized {
						t.Errorf("401 body %q differs from %q", w.Body, unauthorized)
					}
					return
				}
				if w.Code == http.StatusUnauthorized {
					t.Fatalf("right token refused: %s", w.Body)
				}
			})
		}
	}
}

func TestNoToken_RoutesNotServed(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Token = "" })
	for _, target := range []string{"/v1/stats", "/v1/envelopes", "/internal/outbox/pending?channel=email"} {
		if w := f.call("GET", target, ""); w.Code != http.StatusNotFound {
			t.Errorf("GET %s without a configured token: status %d, want 404", target, w.Code)
		}
	}
	if w := f.call("POST", "/api/app/push/subscribe?user=u", `{}`); w.Code != http.StatusNotFound {
		t.Errorf("push subscribe without token or User: status %d, want 404", w.Code)
	}
	if w := f.call("GET", "/healthz", ""); w.Code != http.StatusOK {
		t.Errorf("healthz: %d", w.Code)
	}
}

func TestHealth(t *testing.T) {
	ready := false
	f := newFixture(t, func(c *Config) { c.Ready = func() bool { return ready } })
	if w := f.call("GET", "/healthz", "", noAuth); w.Code != http.StatusOK || w.Body.String() != "ok\n" {
		t.Fatalf("healthz: %d %q", w.Code, w.Body)
	}
	if w := f.call("GET", "/readyz", "", noAuth); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("readyz not ready: %d", w.Code)
	}
	ready = true
	if w := f.call("GET", "/readyz", "", noAuth); w.Code != http.StatusOK {
		t.Fatalf("readyz ready: %d", w.Code)
	}
}

func TestPostEnvelopes(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.grant("", "u_2")

	// One object: created.
	w := f.enqueue(http.StatusCreated, digest("d/1", "u_1"))
	var res struct{ Results []EnqueueResult }
	decode(t, w, &res)
	if len(res.Results) != 1 || res.Results[0] != (EnqueueResult{Tenant: "default", ID: "d/1", Status: StatusCreated, Segments: 1}) {
		t.Fatalf("results %+v", res.Results)
	}
	// The same again: 200 duplicate.
	w = f.enqueue(http.StatusOK, digest("d/1", "u_1"))
	decode(t, w, &res)
	if res.Results[0].Status != StatusDuplicate {
		t.Fatalf("results %+v, want duplicate", res.Results)
	}
	// A batch with one new and one duplicate: 201.
	w = f.enqueue(http.StatusCreated, digest("d/1", "u_1"), nudge("n/1", "u_2"))
	decode(t, w, &res)
	if len(res.Results) != 2 || res.Results[0].Status != StatusDuplicate || res.Results[1].Status != StatusCreated {
		t.Fatalf("results %+v", res.Results)
	}
	if got := f.get("", "n/1").Status; got != string(envelope.StatePending) {
		t.Fatalf("n/1 status %q", got)
	}
}

func TestPostEnvelopes_Errors(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	bad := digest("bad/1", "u_1")
	bad.Payload = []byte(`{"sections":[{"kind":"revisit","items":[{"quote":"q","graph_refs":[],"deep_link":"https://a.example/x"}]}]}`)
	bad.Recipient.Email = ""
	noConsent := digest("nc/1", "u_nobody")

	tests := []struct {
		name   string
		body   string
		status int
		code   string
		check  func(t *testing.T, e errorBody)
	}{
		{"MalformedJSON", `{"schema_version":"1",`, 400, CodeBadJSON, nil},
		{"NotAnObject", `"envelope"`, 400, CodeBadJSON, nil},
		{"Number", `42`, 400, CodeBadJSON, nil},
		{"Empty", ``, 400, CodeBadJSON, nil},
		{"TrailingData", `{} {}`, 400, CodeBadJSON, nil},
		{"EmptyArray", `[]`, 400, CodeBadRequest, nil},
		{"InvalidSingle", mustJSON(t, bad), 400, CodeInvalidEnvelope, func(t *testing.T, e errorBody) {
			paths := map[string]bool{}
			for _, p := range e.Error.Problems {
				if p.Index != 0 || p.Rule == "" {
					t.Errorf("problem %+v", p)
				}
				paths[p.Path] = true
			}
			for _, want := range []string{"recipient.email", "payload.sections[0].items[0].graph_refs"} {
				if !paths[want] {
					t.Errorf("no problem at %s in %+v", want, e.Error.Problems)
				}
			}
		}},
		{"InvalidInBatch", mustJSON(t, []any{digest("ok/1", "u_1"), bad, digest("ok/2", "u_1"), 7}), 400, CodeInvalidEnvelope, func(t *testing.T, e errorBody) {
			idx := map[int]bool{}
			for _, p := range e.Error.Problems {
				idx[p.Index] = true
			}
			if !idx[1] || !idx[3] || idx[0] || idx[2] {
				t.Errorf("problems at indexes %v, want 1 and 3: %+v", idx, e.Error.Problems)
			}
		}},
		{"ConsentDenied", mustJSON(t, []any{digest("ok/3", "u_1"), noConsent}), 409, CodeConsentDenied, func(t *testing.T, e errorBody) {
			if len(e.Error.Problems) != 1 || e.Error.Problems[0].Index != 1 || e.Error.Problems[0].Rule != string(envelope.ClassNoConsent) {
				t.Errorf("problems %+v", e.Error.Problems)
			}
			// The refusal names what is missing and the rules.
			if !strings.Contains(e.Error.Message, "no consent record") || !strings.Contains(e.Error.Message, queue.ConsentRules) {
				t.Errorf("message %q", e.Error.Message)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := f.call("POST", "/v1/envelopes", tt.body)
			e := wantError(t, w, tt.status, tt.code)
			if tt.check != nil {
				tt.check(t, e)
			}
		})
	}
	// Nothing was stored by any of them.
	for _, id := range []string{"ok/1", "ok/2", "ok/3", "bad/1", "nc/1"} {
		if _, err := f.q.Get(context.Background(), "", id); !errors.Is(err, queue.ErrNotFound) {
			t.Errorf("%s stored after a failed request (err %v)", id, err)
		}
	}
	c, err := f.q.Counts(context.Background(), "")
	if err != nil || len(c) != 0 {
		t.Errorf("counts after failed requests: %v %v", c, err)
	}
}

func TestPostEnvelopes_TooLarge(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxBody = 4 << 10 })
	f.grant("", "u_1")
	e := reply("r/1", "u_1", strings.Repeat("long reply ", 600))
	wantError(t, f.call("POST", "/v1/envelopes", mustJSON(t, e)), http.StatusRequestEntityTooLarge, CodeBodyTooLarge)
	if _, err := f.q.Get(context.Background(), "", "r/1"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("stored after 413: %v", err)
	}
	// Within the limit it goes through.
	f.enqueue(http.StatusCreated, reply("r/2", "u_1", "short"))
}

func TestPostEnvelopes_TooManyInBatch(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxBody = 8 << 20 })
	envs := make([]string, MaxBatch+1)
	for i := range envs {
		envs[i] = "{}"
	}
	wantError(t, f.call("POST", "/v1/envelopes", "["+strings.Join(envs, ",")+"]"), 400, CodeBadRequest)
}
