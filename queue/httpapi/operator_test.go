package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

func TestGetEnvelope(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.grant("acme", "u_1")
	e := digest("digest/u_1/2026-W10", "u_1")
	f.enqueue(http.StatusCreated, e)
	other := digest("acme-only", "u_1")
	other.TenantID = "acme"
	f.enqueue(http.StatusCreated, other)

	t.Run("WithoutFull", func(t *testing.T) {
		w := f.call("GET", "/v1/envelopes/"+esc(e.ID), "")
		if w.Code != http.StatusOK {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		var st queue.EnvelopeStatus
		decode(t, w, &st)
		if st.ID != e.ID || st.Tenant != "default" || st.Status != string(envelope.StatePending) || len(st.Segments) != 1 {
			t.Fatalf("status %+v", st)
		}
		if st.Envelope != nil || strings.Contains(w.Body.String(), e.Recipient.Email) || strings.Contains(w.Body.String(), `"payload"`) {
			t.Fatalf("personal data without full=1: %s", w.Body)
		}
	})
	t.Run("Full", func(t *testing.T) {
		w := f.call("GET", "/v1/envelopes/"+esc(e.ID)+"?full=1", "")
		var st queue.EnvelopeStatus
		decode(t, w, &st)
		if st.Envelope == nil || st.Envelope.Recipient.Email != e.Recipient.Email {
			t.Fatalf("full=1 without the envelope: %s", w.Body)
		}
	})
	t.Run("OtherTenant", func(t *testing.T) {
		wantError(t, f.call("GET", "/v1/envelopes/acme-only", ""), 404, CodeNotFound)
		if w := f.call("GET", "/v1/envelopes/acme-only?tenant=acme", ""); w.Code != 200 {
			t.Fatalf("tenant=acme: %d", w.Code)
		}
		wantError(t, f.call("GET", "/v1/envelopes/"+esc(e.ID)+"?tenant=acme", ""), 404, CodeNotFound)
	})
	t.Run("Unknown", func(t *testing.T) {
		wantError(t, f.call("GET", "/v1/envelopes/nope", ""), 404, CodeNotFound)
	})
	t.Run("BadParams", func(t *testing.T) {
		wantError(t, f.call("GET", "/v1/envelopes/x?full=maybe", ""), 400, CodeBadRequest)
		wantError(t, f.call("GET", "/v1/envelopes/x?tenant=a%00b", ""), 400, CodeBadRequest)
		wantError(t, f.call("GET", "/v1/envelopes/a%0Ab", ""), 400, CodeBadRequest)
		wantError(t, f.call("GET", "/v1/envelopes/"+strings.Repeat("x", 201), ""), 400, CodeBadRequest)
	})
}

func TestListEnvelopes(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	for i := range 5 {
		f.enqueue(http.StatusCreated, digest("d/"+string(rune('a'+i)), "u_1"))
	}
	f.enqueue(http.StatusCreated, nudge("n/1", "u_1"))
	f.enqueue(http.StatusCreated, reply("r/1", "u_1", "hello"))

	list := func(t *testing.T, query string) queue.Page {
		t.Helper()
		w := f.call("GET", "/v1/envelopes?"+query, "")
		if w.Code != http.StatusOK {
			t.Fatalf("list %s: %d %s", query, w.Code, w.Body)
		}
		var p queue.Page
		decode(t, w, &p)
		return p
	}
	if p := list(t, ""); len(p.Rows) != 7 || p.Next != "" {
		t.Fatalf("all: %d rows, next %q", len(p.Rows), p.Next)
	}
	if p := list(t, "channel=push"); len(p.Rows) != 1 || p.Rows[0].Key.EnvelopeID != "n/1" {
		t.Fatalf("channel=push: %+v", p.Rows)
	}
	if p := list(t, "state=sent"); len(p.Rows) != 0 {
		t.Fatalf("state=sent: %+v", p.Rows)
	}
	if p := list(t, "state=pending&channel=email"); len(p.Rows) != 5 {
		t.Fatalf("pending email: %d rows", len(p.Rows))
	}
	if p := list(t, "tenant=acme"); len(p.Rows) != 0 {
		t.Fatalf("tenant=acme: %+v", p.Rows)
	}
	// Paging visits every row once.
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("paging does not end")
		}
		p := list(t, "limit=2&cursor="+url.QueryEscape(cursor))
		for _, r := range p.Rows {
			if seen[r.Key.String()] {
				t.Fatalf("row %s twice", r.Key)
			}
			seen[r.Key.String()] = true
		}
		if p.Next == "" {
			break
		}
		cursor = p.Next
	}
	if len(seen) != 7 {
		t.Fatalf("paging saw %d rows, want 7", len(seen))
	}
	for _, q := range []string{"state=nope", "channel=fax", "limit=0", "limit=x", "limit=1001", "cursor=%21%21%21", "cursor=" + strings.Repeat("A", 300)} {
		t.Run("Bad/"+q, func(t *testing.T) {
			wantError(t, f.call("GET", "/v1/envelopes?"+q, ""), 400, CodeBadRequest)
		})
	}
	// A bad state or channel lists the valid ones.
	if e := wantError(t, f.call("GET", "/v1/envelopes?state=nope", ""), 400, CodeBadRequest); !strings.Contains(e.Error.Message, "dead_letter, bounced") {
		t.Fatalf("bad state: %q", e.Error.Message)
	}
	if e := wantError(t, f.call("GET", "/v1/envelopes?channel=fax", ""), 400, CodeBadRequest); !strings.Contains(e.Error.Message, "email, push") {
		t.Fatalf("bad channel: %q", e.Error.Message)
	}
}

// deadLetter enqueues an email digest for user and fails it through the
// seam (leasing every pending email row on the way).
func (f *fixture) deadLetter(id, user string) {
	f.t.Helper()
	f.enqueue(http.StatusCreated, digest(id, user))
	f.pending("email", 100)
	if w := f.call("POST", "/internal/outbox/"+esc(id)+"/status", `{"status":"failed"}`); w.Code != 200 {
		f.t.Fatalf("failed status: %d %s", w.Code, w.Body)
	}
}

// unresolved enqueues an email digest and drives it to unresolved as a
// worker would: claim, lease expiry, recover, commit unresolved.
func (f *fixture) unresolved(id, user string) {
	f.t.Helper()
	ctx := context.Background()
	f.enqueue(http.StatusCreated, digest(id, user))
	ls, err := f.q.Claim(ctx, queue.ClaimRequest{Owner: "worker", Lease: time.Minute, Limit: 1})
	if err != nil || len(ls) != 1 {
		f.t.Fatalf("claim: %v %d", err, len(ls))
	}
	f.clock.Advance(2 * time.Minute)
	rs, err := f.q.Recover(ctx, queue.ClaimRequest{Owner: "worker", Lease: time.Minute, Limit: 1})
	if err != nil || len(rs) != 1 {
		f.t.Fatalf("recover: %v %d", err, len(rs))
	}
	if err := f.q.Commit(ctx, rs[0], queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown}); err != nil {
		f.t.Fatalf("commit unresolved: %v", err)
	}
}

func TestRequeue(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.deadLetter("d/1", "u_1")
	if st := f.get("", "d/1").Status; st != string(envelope.StateDeadLetter) {
		t.Fatalf("status %q, want dead_letter", st)
	}
	w := f.call("POST", "/v1/envelopes/d%2F1/requeue", "")
	var rep operatorReply
	decode(t, w, &rep)
	if w.Code != 200 || rep.Status != string(envelope.StatePending) {
		t.Fatalf("requeue: %d %+v", w.Code, rep)
	}
	w = f.call("POST", "/v1/envelopes/d%2F1/requeue", "")
	wantError(t, w, 409, CodeInvalidTransition)
	// The refusal names the current state and the states requeue applies to.
	if body := w.Body.String(); !strings.Contains(body, "the envelope is pending") || !strings.Contains(body, "dead_letter, unresolved, expired, suppressed") {
		t.Fatalf("requeue of a pending envelope: %s", body)
	}
	wantError(t, f.call("POST", "/v1/envelopes/nope/requeue", ""), 404, CodeNotFound)
	wantError(t, f.call("POST", "/v1/envelopes/d%2F1/requeue?tenant=acme", ""), 404, CodeNotFound)
}

func TestResolve(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.unresolved("u/1", "u_1")
	f.unresolved("u/2", "u_1")
	tests := []struct {
		name, id, body string
		status         int
		code, want     string
	}{
		{"BadAs", "u/1", `{"as":"delivered"}`, 400, CodeBadRequest, ""},
		{"UnknownField", "u/1", `{"as":"sent","x":1}`, 400, CodeBadJSON, ""},
		{"NotJSON", "u/1", `as=sent`, 400, CodeBadJSON, ""},
		{"Sent", "u/1", `{"as":"sent"}`, 200, "", queue.StatusDelivered},
		{"Retry", "u/2", `{"as":"retry"}`, 200, "", string(envelope.StateRetryable)},
		{"AgainNotUnresolved", "u/1", `{"as":"sent"}`, 409, CodeInvalidTransition, ""},
		{"Unknown", "nope", `{"as":"sent"}`, 404, CodeNotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := f.call("POST", "/v1/envelopes/"+esc(tt.id)+"/resolve", tt.body)
			if tt.code != "" {
				wantError(t, w, tt.status, tt.code)
				return
			}
			var rep operatorReply
			decode(t, w, &rep)
			if w.Code != tt.status || rep.Status != tt.want {
				t.Fatalf("%d %+v, want %d %s", w.Code, rep, tt.status, tt.want)
			}
		})
	}
}

func TestConsent(t *testing.T) {
	f := newFixture(t)
	put := `{"digest_enabled":true,"push_enabled":false,"email_verified":true,"cadence":"daily"}`
	w := f.call("PUT", "/v1/consent/u_1?tenant=acme", put)
	var cv ConsentView
	decode(t, w, &cv)
	if w.Code != 200 || !cv.DigestEnabled || cv.PushEnabled || !cv.EmailVerified || cv.Cadence != "daily" || cv.Tenant != "acme" || cv.UserID != "u_1" {
		t.Fatalf("PUT: %d %+v", w.Code, cv)
	}
	c, err := f.q.Consent(context.Background(), "acme", "u_1")
	if err != nil || !c.DigestEnabled || c.Cadence != "daily" {
		t.Fatalf("stored consent %+v %v", c, err)
	}
	if err := f.q.Suppress(context.Background(), "acme", "u_1", queue.Suppression{Channel: envelope.ChannelEmail, Reason: envelope.ClassBounced}); err != nil {
		t.Fatal(err)
	}
	w = f.call("GET", "/v1/consent/u_1?tenant=acme", "")
	decode(t, w, &cv)
	if !cv.DigestEnabled || len(cv.Suppressions) != 1 || cv.Suppressions[0].Reason != envelope.ClassBounced {
		t.Fatalf("GET: %+v", cv)
	}
	// Another tenant's user is untouched.
	w = f.call("GET", "/v1/consent/u_1", "")
	cv = ConsentView{}
	decode(t, w, &cv)
	if cv.DigestEnabled || len(cv.Suppressions) != 0 || cv.Tenant != "default" {
		t.Fatalf("default tenant: %+v", cv)
	}
	for name, tt := range map[string]struct {
		target, body, code string
	}{
		"BadCadence":   {"/v1/consent/u_1", `{"cadence":"hourly"}`, CodeBadRequest},
		"UnknownField": {"/v1/consent/u_1", `{"digest":true}`, CodeBadJSON},
		"WrongType":    {"/v1/consent/u_1", `{"digest_enabled":"yes"}`, CodeBadJSON},
		"BadUser":      {"/v1/consent/u%01x", `{}`, CodeBadRequest},
	} {
		t.Run(name, func(t *testing.T) {
			wantError(t, f.call("PUT", tt.target, tt.body), 400, tt.code)
		})
	}
}

func TestStats(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.grant("acme", "u_1")
	f.deadLetter("d/4", "u_1")
	f.enqueue(http.StatusCreated, digest("d/1", "u_1"), digest("d/2", "u_1"), nudge("n/1", "u_1"))
	e := digest("d/3", "u_1")
	e.TenantID = "acme"
	f.enqueue(http.StatusCreated, e)

	var s Stats
	decode(t, f.call("GET", "/v1/stats", ""), &s)
	if s.Total != 5 || s.ByChannel[envelope.ChannelEmail] != 4 || s.ByChannel[envelope.ChannelPush] != 1 ||
		s.ByState[envelope.StateDeadLetter] != 1 || s.Counts[envelope.StatePending][envelope.ChannelEmail] != 3 {
		b, _ := json.Marshal(s)
		t.Fatalf("stats %s", b)
	}
	decode(t, f.call("GET", "/v1/stats?tenant=acme", ""), &s)
	if s.Total != 1 || s.Tenant != "acme" {
		t.Fatalf("acme stats %+v", s)
	}
}
