package queuetest

import (
	"reflect"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// testReopen puts rows in every state, reopens the store and checks that
// states, attempts, history, leases, the fence sequence, consent and
// idempotency all survived.
func testReopen(t *testing.T, h Harness) {
	if h.Reopen == nil {
		t.Skip("Harness.Reopen is nil: the store does not persist")
	}
	f := setup(t, h)
	ids := []string{"pending", "sending", "sent", "retryable", "dead", "bounced", "complaint", "suppressed", "expired", "unresolved", "reply"}
	for _, id := range ids {
		f.grant(dflt, "u-"+id)
	}
	out := func(l *queue.Lease, o queue.Outcome) { f.t.Helper(); f.commit(l, o) }
	one := func(id string) *queue.Lease {
		t.Helper()
		ls := f.claimReq(queue.ClaimRequest{Owner: "worker-1", Lease: DefaultLease, Limit: 1, Tenant: dflt})
		if len(ls) != 1 || ls[0].Key.EnvelopeID != id {
			t.Fatalf("Claim = %v, want %s", keys(ls), id)
		}
		return ls[0]
	}
	var maxFence uint64
	track := func(l *queue.Lease) *queue.Lease {
		maxFence = max(maxFence, l.Fence)
		return l
	}

	// Built one at a time so that each claim takes the intended row.
	f.enqueue(Reply("unresolved", "u-unresolved", "u"))
	track(one("unresolved"))
	f.clock.Advance(DefaultLease)
	rs := f.recover(1)
	out(track(rs[0]), queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown})

	x := Reply("expired", "u-expired", "x")
	x.ExpiresAt = f.clock.Now().Add(time.Minute)
	f.enqueue(x)
	f.clock.Advance(time.Minute)
	f.noClaim("expiring")

	f.enqueue(Digest("sent", "u-sent"))
	out(track(one("sent")), queue.Outcome{State: envelope.StateSent, Receipt: "re_1"})
	f.enqueue(Digest("retryable", "u-retryable"))
	out(track(one("retryable")), queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassRateLimited, RetryAfter: time.Hour})
	f.enqueue(Nudge("dead", "u-dead"))
	out(track(one("dead")), queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassPayloadTooLarge})
	f.enqueue(Nudge("bounced", "u-bounced"))
	out(track(one("bounced")), queue.Outcome{State: envelope.StateBounced, Class: envelope.ClassSubscriptionGone})
	f.enqueue(Digest("complaint", "u-complaint"))
	out(track(one("complaint")), queue.Outcome{State: envelope.StateComplaint, Class: envelope.ClassComplaint})
	f.enqueue(Digest("suppressed", "u-suppressed"))
	if err := f.s.SetConsent(f.ctx, dflt, "u-suppressed", queue.ConsentFlags{Cadence: "daily"}); err != nil {
		t.Fatal(err)
	}
	f.noClaim("suppressing")
	f.replyOf("reply", "u-reply", 3)
	out(track(one("reply")), queue.Outcome{State: envelope.StateSent, Receipt: "m-1"})
	l := track(one("reply"))
	out(l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassTimeout})
	f.enqueue(Reply("sending", "u-sending", "s"))
	sending := track(one("sending"))
	pending := Reply("pending", "u-pending", "p")
	pending.NotBefore = f.clock.Now().Add(2 * time.Hour)
	f.enqueue(pending)

	wantStates := map[string]envelope.State{
		"pending": envelope.StatePending, "sending": envelope.StateSending, "sent": envelope.StateSent,
		"retryable": envelope.StateRetryable, "dead": envelope.StateDeadLetter, "bounced": envelope.StateBounced,
		"complaint": envelope.StateComplaint, "suppressed": envelope.StateSuppressed, "expired": envelope.StateExpired,
		"unresolved": envelope.StateUnresolved, "reply": envelope.StateSent,
	}
	before := map[string]*queue.EnvelopeStatus{}
	for _, id := range ids {
		st := f.get(dflt, id)
		if st.Segments[0].State != wantStates[id] {
			t.Fatalf("setup: %s is %s, want %s", id, st.Segments[0].State, wantStates[id])
		}
		before[id] = st
	}
	consentBefore := map[string]queue.Consent{}
	for _, id := range ids {
		consentBefore[id] = f.consent(dflt, "u-"+id)
	}
	countsBefore := f.counts("")
	dueBefore := f.nextDue()

	f.reopen()

	for _, id := range ids {
		sameStatus(t, id, before[id], f.get(dflt, id))
		if got, want := f.consent(dflt, "u-"+id), consentBefore[id]; !sameConsent(got, want) {
			t.Fatalf("consent of u-%s after reopen = %+v, want %+v", id, got, want)
		}
	}
	if got := f.counts(""); !reflect.DeepEqual(nonZero(got), nonZero(countsBefore)) {
		t.Fatalf("Counts after reopen = %v, want %v", got, countsBefore)
	}
	if got := f.nextDue(); !got.Equal(dueBefore) {
		t.Fatalf("NextDue after reopen = %v, want %v", got, dueBefore)
	}

	// Idempotency survives.
	if res := f.enqueue(Digest("sent", "u-sent")); !res[0].Duplicate {
		t.Fatal("an envelope enqueued before the reopen is not a duplicate after it")
	}
	// Consent decisions survive: the bounced subscription stays suppressed.
	_, err := f.s.Enqueue(f.ctx, Nudge("bounced-again", "u-bounced"))
	wantErr(t, err, queue.ErrConsentDenied, "Enqueue to a subscription that bounced before the reopen")

	// The lease taken before the reopen still holds, with its fence.
	out(sending, queue.Outcome{State: envelope.StateSent, Receipt: "after-reopen"})

	// Chat order survives: segment 2 waits for segment 1's retry.
	f.clock.Advance(time.Second)
	l1 := f.claimOne("reply")
	if l1.Key.Segment != 1 || l1.Attempt != 2 {
		t.Fatalf("after reopen claimed %+v, want segment 1, attempt 2", l1.Key)
	}
	if l1.Fence <= maxFence {
		t.Fatalf("fence after reopen = %d, want > %d (every fence issued before)", l1.Fence, maxFence)
	}
	f.noClaim("segment 2 before segment 1 is sent")
	out(l1, queue.Outcome{State: envelope.StateSent})
	l2 := f.claimOne("reply")
	if l2.Fence <= l1.Fence {
		t.Fatalf("fences not increasing after reopen: %d then %d", l1.Fence, l2.Fence)
	}

	// Reopen once more: the fence sequence keeps going up.
	f.reopen()
	f.clock.Advance(2 * time.Hour)
	ls := f.claim(10)
	found := false
	for _, l := range ls {
		found = found || l.Key.EnvelopeID == "pending"
		if l.Fence <= l2.Fence {
			t.Fatalf("fence after a second reopen = %d, want > %d", l.Fence, l2.Fence)
		}
	}
	if !found {
		t.Fatalf("Claim after not_before = %v, want it to include pending", keys(ls))
	}
}

func sameStatus(t *testing.T, id string, want, got *queue.EnvelopeStatus) {
	t.Helper()
	if got.Tenant != want.Tenant || got.ID != want.ID || got.UserID != want.UserID || got.Channel != want.Channel ||
		got.Template != want.Template || got.Status != want.Status || !got.EnqueuedAt.Equal(want.EnqueuedAt) ||
		len(got.Segments) != len(want.Segments) {
		t.Fatalf("%s after reopen = %+v, want %+v", id, got, want)
	}
	if jsonOf(t, got.Envelope) != jsonOf(t, want.Envelope) {
		t.Fatalf("%s envelope changed across reopen", id)
	}
	for i := range got.Segments {
		g, w := got.Segments[i], want.Segments[i]
		if g.Index != w.Index || g.State != w.State || g.Attempts != w.Attempts || g.Class != w.Class ||
			g.Receipt != w.Receipt || g.Fence != w.Fence || !g.NextAt.Equal(w.NextAt) || !g.LeaseEnd.Equal(w.LeaseEnd) ||
			!g.UpdatedAt.Equal(w.UpdatedAt) || !sameHistory(g.History, w.History) {
			t.Fatalf("%s segment %d after reopen = %+v, want %+v", id, i, g, w)
		}
	}
}

func sameConsent(a, b queue.Consent) bool {
	if a.ConsentFlags != b.ConsentFlags || !a.UpdatedAt.Equal(b.UpdatedAt) || len(a.Suppressions) != len(b.Suppressions) {
		return false
	}
	for i := range a.Suppressions {
		if !sameSuppression(a.Suppressions[i], b.Suppressions[i]) {
			return false
		}
	}
	return true
}

// nonZero drops empty entries so that two Counts compare equal however
// they represent zero.
func nonZero(c queue.Counts) map[envelope.State]map[envelope.Channel]int {
	out := map[envelope.State]map[envelope.Channel]int{}
	for st, m := range c {
		for ch, n := range m {
			if n == 0 {
				continue
			}
			if out[st] == nil {
				out[st] = map[envelope.Channel]int{}
			}
			out[st][ch] = n
		}
	}
	return out
}
