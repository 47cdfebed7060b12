package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// pending calls GET /internal/outbox/pending and decodes the answer.
func (f *fixture) pending(channel string, limit int) PendingReply {
	f.t.Helper()
	w := f.call("GET", "/internal/outbox/pending?channel="+channel+"&limit="+strconv.Itoa(limit), "")
	if w.Code != http.StatusOK {
		f.t.Fatalf("pending: %d %s", w.Code, w.Body)
	}
	var p PendingReply
	decode(f.t, w, &p)
	if len(p.Envelopes) != len(p.Leases) {
		f.t.Fatalf("%d envelopes but %d leases", len(p.Envelopes), len(p.Leases))
	}
	return p
}

// status posts a seam status and decodes a 200 answer.
func (f *fixture) status(id, body string) (int, StatusReply, *errorBody) {
	f.t.Helper()
	w := f.call("POST", "/internal/outbox/"+esc(id)+"/status", body)
	if w.Code != http.StatusOK {
		var e errorBody
		decode(f.t, w, &e)
		return w.Code, StatusReply{}, &e
	}
	var r StatusReply
	decode(f.t, w, &r)
	return w.Code, r, nil
}

func TestPending(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.grant("", "u_2")
	f.enqueue(http.StatusCreated, digest("d/1", "u_1"), digest("d/2", "u_2"), nudge("n/1", "u_1"), reply("r/1", "u_1", "hi"))

	p := f.pending("email", 10)
	if len(p.Envelopes) != 2 {
		t.Fatalf("email: %d envelopes, want 2", len(p.Envelopes))
	}
	for i, e := range p.Envelopes {
		l := p.Leases[i]
		if e.ID != l.ID || l.Tenant != "default" || l.Fence == 0 || !l.ExpiresAt.Equal(t0.Add(DefaultSeamLease)) {
			t.Errorf("lease %+v for %s", l, e.ID)
		}
		// Full envelopes: the external worker needs the recipient.
		if e.Recipient.Email != emailOf(e.UserID) || len(e.Payload) == 0 {
			t.Errorf("envelope %s is not complete: %+v", e.ID, e)
		}
		st := f.get("", e.ID)
		if st.Segments[0].State != envelope.StateSending || st.Segments[0].Fence != l.Fence {
			t.Errorf("%s after pending: %+v", e.ID, st.Segments[0])
		}
	}
	if p := f.pending("email", 10); len(p.Envelopes) != 0 {
		t.Fatalf("second call got %d leased envelopes again", len(p.Envelopes))
	}
	if p := f.pending("push", 10); len(p.Envelopes) != 1 || p.Envelopes[0].ID != "n/1" {
		t.Fatalf("push: %+v", p.Envelopes)
	}
	for _, q := range []string{"channel=telegram", "", "channel=email&limit=0", "channel=email&limit=-3", "channel=email&limit=x", "channel=email&tenant=%00"} {
		t.Run("Bad/"+q, func(t *testing.T) {
			wantError(t, f.call("GET", "/internal/outbox/pending?"+q, ""), 400, CodeBadRequest)
		})
	}
	// The chat envelope was never offered.
	if st := f.get("", "r/1"); st.Segments[0].State != envelope.StatePending {
		t.Fatalf("chat envelope state %s", st.Segments[0].State)
	}
}

func TestPending_LimitAndFilters(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.grant("", "u_2")
	f.grant("acme", "u_1")
	var envs []*envelope.Envelope
	for i := range 120 {
		envs = append(envs, digest(fmt.Sprintf("d/%03d", i), "u_1"))
	}
	f.enqueue(http.StatusCreated, envs...)
	a := digest("acme/1", "u_1")
	a.TenantID = "acme"
	f.enqueue(http.StatusCreated, a)
	f.enqueue(http.StatusCreated, digest("late/1", "u_2"))

	// Consent withdrawn after enqueue: never handed out.
	if err := f.q.SetConsent(context.Background(), "", "u_2", queue.ConsentFlags{}); err != nil {
		t.Fatal(err)
	}
	if p := f.pending("email", 5); len(p.Envelopes) != 5 {
		t.Fatalf("limit=5: %d", len(p.Envelopes))
	}
	w := f.call("GET", "/internal/outbox/pending?channel=email&tenant=acme", "")
	var p PendingReply
	decode(t, w, &p)
	if len(p.Envelopes) != 1 || p.Leases[0].Tenant != "acme" {
		t.Fatalf("tenant=acme: %+v", p.Leases)
	}
	// Default limit 10; above 100 is capped at 100.
	decode(t, f.call("GET", "/internal/outbox/pending?channel=email", ""), &p)
	if len(p.Envelopes) != DefaultPendingLimit {
		t.Fatalf("default limit: %d", len(p.Envelopes))
	}
	if p := f.pending("email", 1000); len(p.Envelopes) != MaxPendingLimit {
		t.Fatalf("limit=1000: %d, want %d", len(p.Envelopes), MaxPendingLimit)
	}
	p = f.pending("email", 100)
	for _, e := range p.Envelopes {
		if e.ID == "late/1" {
			t.Fatal("an envelope whose consent was withdrawn was handed out")
		}
	}
	if st := f.get("", "late/1"); st.Status != string(envelope.StateSuppressed) {
		t.Fatalf("withdrawn envelope status %s", st.Status)
	}
}

func TestPending_ConcurrentCallersNeverShare(t *testing.T) {
	f := newFixture(t)
	const n = 60
	var envs []*envelope.Envelope
	for i := range n {
		user := "u_" + strconv.Itoa(i%6)
		f.grant("", user)
		envs = append(envs, digest("c/"+strconv.Itoa(i), user))
	}
	f.enqueue(http.StatusCreated, envs...)

	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				r := f.call("GET", "/internal/outbox/pending?channel=email&limit=3", "")
				if r.Code != http.StatusOK {
					t.Errorf("pending: %d", r.Code)
					return
				}
				var p PendingReply
				decode(t, r, &p)
				if len(p.Envelopes) == 0 {
					return
				}
				mu.Lock()
				for _, e := range p.Envelopes {
					seen[e.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("%d distinct envelopes handed out, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("%s handed out %d times", id, c)
		}
	}
}

func TestStatus(t *testing.T) {
	tests := []struct {
		name       string
		make       func(id, user string) *envelope.Envelope
		body       string
		wantStatus string
		wantSupp   envelope.ErrorClass // suppression written ("" = none)
		wantClass  envelope.ErrorClass
	}{
		{"Delivered", digest, `{"status":"delivered","detail":"ok"}`, queue.StatusDelivered, "", ""},
		{"Sent", digest, `{"status":"sent"}`, queue.StatusDelivered, "", ""},
		{"Failed", digest, `{"status":"failed"}`, string(envelope.StateDeadLetter), "", envelope.ClassUnknown},
		{"FailedWithClass", digest, `{"status":"failed","error_class":"auth_failed"}`, string(envelope.StateDeadLetter), "", envelope.ClassAuthFailed},
		{"Bounced", digest, `{"status":"bounced"}`, string(envelope.StateBounced), envelope.ClassBounced, envelope.ClassBounced},
		{"PushBounced", nudge, `{"status":"bounced"}`, string(envelope.StateBounced), envelope.ClassSubscriptionGone, envelope.ClassSubscriptionGone},
		{"Complaint", digest, `{"status":"complaint"}`, string(envelope.StateComplaint), envelope.ClassComplaint, envelope.ClassComplaint},
		{"Suppressed", digest, `{"status":"suppressed"}`, string(envelope.StateSuppressed), envelope.ClassUnsubscribed, envelope.ClassUnsubscribed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.grant("", "u_1")
			e := tt.make("e/1", "u_1")
			f.enqueue(http.StatusCreated, e)
			p := f.pending(string(e.Channel), 10)
			if len(p.Leases) != 1 {
				t.Fatalf("pending: %d", len(p.Leases))
			}
			code, rep, eb := f.status("e/1", tt.body)
			if code != 200 || rep.Status != tt.wantStatus || rep.Noop {
				t.Fatalf("status: %d %+v %+v", code, rep, eb)
			}
			st := f.get("", "e/1")
			if st.Status != tt.wantStatus || st.Segments[0].Class != tt.wantClass {
				t.Fatalf("stored: %s %s", st.Status, st.Segments[0].Class)
			}
			c, _ := f.q.Consent(context.Background(), "", "u_1")
			switch {
			case tt.wantSupp == "" && len(c.Suppressions) != 0:
				t.Fatalf("unexpected suppressions %+v", c.Suppressions)
			case tt.wantSupp != "" && (len(c.Suppressions) != 1 || c.Suppressions[0].Reason != tt.wantSupp ||
				c.Suppressions[0].Channel != e.Channel || c.Suppressions[0].Target != queue.TargetOf(e)):
				t.Fatalf("suppressions %+v, want %s on the recipient", c.Suppressions, tt.wantSupp)
			}
			// A repeated status (any) is a no-op.
			for _, again := range []string{tt.body, `{"status":"delivered"}`, `{"status":"failed"}`} {
				code, rep, eb = f.status("e/1", again)
				if code != 200 || !rep.Noop || rep.Status != tt.wantStatus {
					t.Fatalf("repeat %s: %d %+v %+v", again, code, rep, eb)
				}
			}
			if st2 := f.get("", "e/1"); st2.Status != st.Status || len(st2.Segments[0].History) != len(st.Segments[0].History) {
				t.Fatalf("a repeated status changed the envelope: %+v", st2.Segments[0])
			}
		})
	}
}

// A transient failure reported through the seam is retried with backoff:
// the envelope is retryable, /pending hands it out again once it is due,
// with a new fence, and the attempt limit still dead-letters it.
func TestStatus_Retry(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.enqueue(http.StatusCreated, digest("e/1", "u_1"))
	p := f.pending("email", 1)
	code, rep, eb := f.status("e/1", fmt.Sprintf(`{"status":"retry","error_class":"rate_limited","fence":%d}`, p.Leases[0].Fence))
	if code != 200 || rep.Status != string(envelope.StateRetryable) || rep.Noop {
		t.Fatalf("retry: %d %+v %+v", code, rep, eb)
	}
	st := f.get("", "e/1")
	if seg := st.Segments[0]; seg.State != envelope.StateRetryable || seg.Class != envelope.ClassRateLimited || !seg.NextAt.After(f.clock.Now()) {
		t.Fatalf("after retry: %+v", seg)
	}
	if p2 := f.pending("email", 1); len(p2.Leases) != 0 {
		t.Fatalf("handed out again before its backoff: %+v", p2.Leases)
	}
	f.clock.Advance(time.Hour)
	p2 := f.pending("email", 1)
	if len(p2.Leases) != 1 || p2.Leases[0].Fence <= p.Leases[0].Fence {
		t.Fatalf("pending after the backoff: %+v", p2.Leases)
	}
	if code, rep, eb := f.status("e/1", `{"status":"delivered"}`); code != 200 || rep.Status != queue.StatusDelivered {
		t.Fatalf("delivered after a retry: %d %+v %+v", code, rep, eb)
	}
}

// A bad status lists the statuses the seam accepts.
func TestStatus_BadStatusListsThem(t *testing.T) {
	f := newFixture(t)
	w := f.call("POST", "/internal/outbox/x/status", `{"status":"ok"}`)
	wantError(t, w, 400, CodeBadRequest)
	for _, s := range SeamStatuses {
		if !strings.Contains(w.Body.String(), s) {
			t.Fatalf("400 does not list %q: %s", s, w.Body.String())
		}
	}
}

func TestStatus_Errors(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.enqueue(http.StatusCreated, digest("e/1", "u_1"), digest("e/2", "u_1"))
	p := f.pending("email", 1)
	fence := p.Leases[0].Fence

	tests := []struct {
		name, id, body string
		status         int
		code           string
	}{
		{"BadStatus", "e/1", `{"status":"done"}`, 400, CodeBadRequest},
		{"NoStatus", "e/1", `{}`, 400, CodeBadRequest},
		{"BadClass", "e/1", `{"status":"failed","error_class":"kaboom"}`, 400, CodeBadRequest},
		{"BadJSON", "e/1", `{"status":`, 400, CodeBadJSON},
		{"FenceWrongType", "e/1", `{"status":"delivered","fence":"1"}`, 400, CodeBadJSON},
		{"UnknownID", "nope", `{"status":"delivered"}`, 404, CodeNotFound},
		{"OtherTenant", "e/1?tenant=acme", `{"status":"delivered"}`, 404, CodeNotFound},
		{"StaleFence", "e/1", fmt.Sprintf(`{"status":"delivered","fence":%d}`, fence+1000), 409, CodeStaleFence},
		{"NotLeased", "e/2", `{"status":"delivered"}`, 409, CodeLeaseLost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, query, _ := strings.Cut(tt.id, "?")
			w := f.call("POST", "/internal/outbox/"+esc(id)+"/status?"+query, tt.body)
			wantError(t, w, tt.status, tt.code)
		})
	}
	if st := f.get("", "e/1"); st.Segments[0].State != envelope.StateSending {
		t.Fatalf("e/1 changed by failed requests: %s", st.Segments[0].State)
	}
	// The right fence commits.
	code, rep, eb := f.status("e/1", fmt.Sprintf(`{"status":"delivered","fence":%d}`, fence))
	if code != 200 || rep.Status != queue.StatusDelivered {
		t.Fatalf("right fence: %d %+v %+v", code, rep, eb)
	}
}

func TestStatus_LeaseLostAfterRestart(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.enqueue(http.StatusCreated, digest("e/1", "u_1"))
	f.pending("email", 1)
	f.reopen() // the HTTP layer restarted: its leases are gone
	code, _, eb := f.status("e/1", `{"status":"delivered"}`)
	if code != http.StatusConflict || eb.Error.Code != CodeLeaseLost {
		t.Fatalf("after restart: %d %+v", code, eb)
	}
	if st := f.get("", "e/1"); st.Segments[0].State != envelope.StateSending {
		t.Fatalf("state %s", st.Segments[0].State)
	}
}

// With the fence from /pending, a status after a restart of the HTTP layer
// still commits (the store checks the fence); a wrong fence is refused.
func TestStatus_FenceSurvivesRestart(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.enqueue(http.StatusCreated, digest("e/1", "u_1"))
	p := f.pending("email", 1)
	if len(p.Leases) != 1 {
		t.Fatalf("pending = %+v", p)
	}
	f.reopen()
	code, _, eb := f.status("e/1", fmt.Sprintf(`{"status":"delivered","fence":%d}`, p.Leases[0].Fence+1))
	if code != http.StatusConflict || eb.Error.Code != CodeStaleFence {
		t.Fatalf("wrong fence after restart: %d %+v", code, eb)
	}
	code, rep, eb := f.status("e/1", fmt.Sprintf(`{"status":"delivered","fence":%d}`, p.Leases[0].Fence))
	if code != http.StatusOK || rep.Status != queue.StatusDelivered {
		t.Fatalf("right fence after restart: %d %+v %+v", code, rep, eb)
	}
}

func TestStatus_ExpiredSeamLease(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.SeamLease = time.Minute })
	f.grant("", "u_1")
	f.enqueue(http.StatusCreated, digest("e/1", "u_1"))
	first := f.pending("email", 1).Leases[0]

	// The lease expires; the worker's Recover returns the row to pending
	// (and hands no seam row to the worker).
	f.clock.Advance(2 * time.Minute)
	got, err := f.q.Recover(context.Background(), queue.ClaimRequest{Owner: "worker", Lease: time.Minute, Limit: 10})
	if err != nil || len(got) != 0 {
		t.Fatalf("recover: %v, %d leases", err, len(got))
	}
	if st := f.get("", "e/1"); st.Segments[0].State != envelope.StatePending {
		t.Fatalf("after recover: %s", st.Segments[0].State)
	}
	code, _, eb := f.status("e/1", `{"status":"delivered"}`)
	if code != http.StatusConflict || eb.Error.Code != CodeLeaseLost {
		t.Fatalf("expired lease: %d %+v", code, eb)
	}
	// Fetched again, under a new fence; the old fence is stale.
	second := f.pending("email", 1).Leases[0]
	if second.ID != "e/1" || second.Fence <= first.Fence {
		t.Fatalf("second lease %+v after %+v", second, first)
	}
	code, _, eb = f.status("e/1", fmt.Sprintf(`{"status":"delivered","fence":%d}`, first.Fence))
	if code != http.StatusConflict || eb.Error.Code != CodeStaleFence {
		t.Fatalf("old fence: %d %+v", code, eb)
	}
	code, rep, _ := f.status("e/1", fmt.Sprintf(`{"status":"delivered","fence":%d}`, second.Fence))
	if code != 200 || rep.Status != queue.StatusDelivered {
		t.Fatalf("new fence: %d %+v", code, rep)
	}
}

func TestStatus_ConcurrentRepeatsAreIdempotent(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	f.enqueue(http.StatusCreated, digest("e/1", "u_1"))
	f.pending("email", 1)
	var wg sync.WaitGroup
	results := make([]StatusReply, 8)
	for i := range results {
		wg.Go(func() {
			code, rep, eb := f.status("e/1", `{"status":"delivered"}`)
			if code != 200 {
				t.Errorf("concurrent status: %d %+v", code, eb)
			}
			results[i] = rep
		})
	}
	wg.Wait()
	applied := 0
	for _, r := range results {
		if r.Status != queue.StatusDelivered {
			t.Errorf("reply %+v", r)
		}
		if !r.Noop {
			applied++
		}
	}
	if applied != 1 {
		t.Fatalf("%d requests applied the status, want exactly 1", applied)
	}
	if st := f.get("", "e/1"); st.Segments[0].Attempts != 1 || len(st.Segments[0].History) != 1 {
		t.Fatalf("history %+v", st.Segments[0])
	}
}

func TestLeaseCache_Bounded(t *testing.T) {
	c := newLeaseCache(3)
	lease := func(id string, fence uint64, exp time.Duration) *queue.Lease {
		return &queue.Lease{Key: envelope.Key{Tenant: "t", EnvelopeID: id}, Fence: fence, ExpiresAt: t0.Add(exp)}
	}
	c.put(lease("a", 1, time.Minute), t0)
	c.put(lease("b", 2, -time.Minute), t0) // already expired
	c.put(lease("c", 3, 3*time.Minute), t0)
	c.put(lease("d", 4, 2*time.Minute), t0) // evicts b (expired)
	if c.len() != 3 || c.get("t", "b") != nil || c.get("t", "a") == nil {
		t.Fatalf("after d: len %d", c.len())
	}
	c.put(lease("e", 5, 4*time.Minute), t0) // evicts a (expires first)
	if c.len() != 3 || c.get("t", "a") != nil || c.get("t", "e") == nil {
		t.Fatalf("after e: len %d", c.len())
	}
	// Replacing a lease does not evict; drop honours the fence.
	c.put(lease("c", 6, 5*time.Minute), t0)
	c.drop(lease("c", 3, 0))
	if l := c.get("t", "c"); l == nil || l.Fence != 6 {
		t.Fatalf("stale drop removed the newer lease: %+v", l)
	}
	c.drop(lease("c", 6, 0))
	if c.get("t", "c") != nil {
		t.Fatal("drop with the current fence kept the lease")
	}
}
