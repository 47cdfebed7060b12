package queuetest

import (
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// replyOf enqueues a reply that SplitReply cuts into n segments.
func (f *fixture) replyOf(id, user string, n int) {
	f.t.Helper()
	text := ReplyText(n)
	if got := len(envelope.SplitReply(text)); got != n {
		f.t.Fatalf("ReplyText(%d) splits into %d segments", n, got)
	}
	res := f.enqueue(Reply(id, user, text))
	if res[0].Segments != n || res[0].Duplicate {
		f.t.Fatalf("Enqueue = %+v, want %d segments", res[0], n)
	}
}

func testReplySegments(t *testing.T, h Harness) {
	f := setup(t, h)
	f.replyOf("rp", "u-1", 3)
	st := f.get(dflt, "rp")
	if len(st.Segments) != 3 || st.Status != string(envelope.StatePending) {
		t.Fatalf("Get = %+v, want 3 pending segments", st)
	}
	for i, s := range st.Segments {
		if s.Index != i || s.State != envelope.StatePending || s.Attempts != 0 {
			t.Fatalf("segment %d = %+v", i, s)
		}
	}

	// Only segment 0 is eligible; later segments wait for their turn.
	l0 := f.claimOne("rp")
	if l0.Key.Segment != 0 || l0.Segments != 3 {
		t.Fatalf("first lease = %+v, want segment 0 of 3", l0)
	}
	f.noClaim("segment 1 before segment 0 is sent")
	f.wantNextDue(T0.Add(DefaultLease)) // only segment 0's lease; waiting segments are not due
	f.clock.Advance(time.Hour)
	f.noClaim("segment 1 an hour later, segment 0 still sending")

	f.drain()
	f.commit(l0, queue.Outcome{State: envelope.StateSent, Receipt: "m-100"})
	f.wantNotify("segment 0 sent")

	// Segment 1 fails twice; segment 0 stays sent; segment 2 waits.
	l1 := f.claimOne("rp")
	if l1.Key.Segment != 1 || l1.Attempt != 1 || jsonOf(t, l1.Envelope) != jsonOf(t, l0.Envelope) {
		t.Fatalf("second lease = %+v, want segment 1, attempt 1, the same envelope", l1)
	}
	f.commit(l1, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassRateLimited})
	if st := f.get(dflt, "rp"); st.Status != string(envelope.StateRetryable) || st.Segments[0].State != envelope.StateSent {
		t.Fatalf("after segment 1 failed: status %q, segment 0 %s", st.Status, st.Segments[0].State)
	}
	f.noClaim("during segment 1's backoff")
	f.clock.Advance(time.Second)
	l1 = f.claimOne("rp")
	if l1.Key.Segment != 1 || l1.Attempt != 2 {
		t.Fatalf("retry lease = %+v", l1)
	}
	f.commit(l1, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassTimeout})
	f.clock.Advance(2 * time.Second)
	l1 = f.claimOne("rp")
	if l1.Attempt != 3 {
		t.Fatalf("attempt = %d, want 3", l1.Attempt)
	}
	f.noClaim("segment 2 while segment 1 is sending")
	f.commit(l1, queue.Outcome{State: envelope.StateSent, Receipt: "m-101"})
	l2 := f.claimOne("rp")
	if l2.Key.Segment != 2 {
		t.Fatalf("third lease = %+v, want segment 2", l2)
	}
	if st := f.get(dflt, "rp"); st.Status != string(envelope.StateSending) {
		t.Fatalf("Status while the last segment is sending = %q", st.Status)
	}
	f.commit(l2, queue.Outcome{State: envelope.StateSent, Receipt: "m-102"})

	st = f.get(dflt, "rp")
	if st.Status != queue.StatusDelivered {
		t.Fatalf("Status = %q, want delivered", st.Status)
	}
	wantAttempts := []int{1, 3, 1}
	wantReceipts := []string{"m-100", "m-101", "m-102"}
	for i, s := range st.Segments {
		sent := 0
		for _, a := range s.History {
			if a.State == envelope.StateSent {
				sent++
			}
		}
		if s.State != envelope.StateSent || sent != 1 || s.Attempts != wantAttempts[i] || s.Receipt != wantReceipts[i] ||
			len(s.History) != wantAttempts[i] {
			t.Fatalf("segment %d = %+v, want sent exactly once after %d attempts", i, s, wantAttempts[i])
		}
	}
	f.noClaim("after delivery")
}

func testPushBounce(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	e1 := EndpointOf("u-1")
	n2 := Nudge("n-2", "u-1")
	n2.Recipient.PushSubscription.Endpoint = "https://push.example.net/wpush/v2/second-device"
	f.enqueue(Nudge("n-1", "u-1"), n2, Nudge("n-3", "u-1"), Digest("d-1", "u-1"))

	l := f.claim(1, envelope.ChannelPush)
	if len(l) != 1 || l[0].Key.EnvelopeID != "n-1" || l[0].Envelope.Recipient.PushSubscription.Endpoint != e1 {
		t.Fatalf("Claim = %v, want n-1", keys(l))
	}
	f.clock.Advance(time.Second)
	f.commit(l[0], queue.Outcome{State: envelope.StateBounced, Class: envelope.ClassSubscriptionGone})

	// The suppression is there as soon as the commit returns.
	f.wantState(dflt, "n-1", 0, envelope.StateBounced, envelope.ClassSubscriptionGone)
	c := f.consent(dflt, "u-1")
	want := queue.Suppression{Channel: envelope.ChannelPush, Target: TargetOfNudge("u-1"), Reason: envelope.ClassSubscriptionGone, At: T0.Add(time.Second)}
	if len(c.Suppressions) != 1 || !sameSuppression(c.Suppressions[0], want) {
		t.Fatalf("suppressions = %+v, want only %+v", c.Suppressions, want)
	}
	if !c.PushEnabled || !c.DigestEnabled || !c.EmailVerified {
		t.Fatalf("flags changed by a bounce: %+v", c.ConsentFlags)
	}

	// Only that subscription: the other device and the email still go.
	ls := f.claim(10)
	if got := sorted(keys(ls)); !equal(got, sorted([]string{key("n-2", 0), key("d-1", 0)})) {
		t.Fatalf("Claim after bounce = %v, want n-2 and d-1", got)
	}
	f.wantState(dflt, "n-3", 0, envelope.StateSuppressed, envelope.ClassSubscriptionGone)

	_, err := f.s.Enqueue(f.ctx, Nudge("n-4", "u-1"))
	wantErr(t, err, queue.ErrConsentDenied, "Enqueue to the dead subscription")
	n5 := Nudge("n-5", "u-1")
	n5.Recipient.PushSubscription.Endpoint = "https://push.example.net/wpush/v2/third-device"
	f.enqueue(n5)
}

func sameSuppression(a, b queue.Suppression) bool {
	return a.Channel == b.Channel && a.Target == b.Target && a.Reason == b.Reason && a.At.Equal(b.At)
}

func testBounceSegments(t *testing.T, h Harness) {
	f := setup(t, h)
	f.replyOf("rp", "u-1", 3)
	l := f.claimOne("rp")
	f.commit(l, queue.Outcome{State: envelope.StateBounced, Class: envelope.ClassBlockedByUser})

	st := f.get(dflt, "rp")
	if st.Status != string(envelope.StateBounced) {
		t.Fatalf("Status = %q, want bounced", st.Status)
	}
	for i, want := range []envelope.State{envelope.StateBounced, envelope.StateSuppressed, envelope.StateSuppressed} {
		if st.Segments[i].State != want {
			t.Fatalf("segment %d = %s, want %s", i, st.Segments[i].State, want)
		}
	}
	c := f.consent(dflt, "u-1")
	target := queue.TargetOf(Reply("", "u-1", "x"))
	if len(c.Suppressions) != 1 || c.Suppressions[0].Channel != envelope.ChannelTelegram ||
		c.Suppressions[0].Target != target || c.Suppressions[0].Reason != envelope.ClassBlockedByUser {
		t.Fatalf("suppressions = %+v", c.Suppressions)
	}
	f.clock.Advance(time.Hour)
	f.noClaim("after a bounce")
	_, err := f.s.Enqueue(f.ctx, Reply("next", "u-1", "hello?"))
	wantErr(t, err, queue.ErrConsentDenied, "Enqueue to a chat that blocked the bot")
	f.enqueue(Reply("other", "u-2", "hello"))
}

func testSuppressionReasons(t *testing.T, h Harness) {
	tests := []struct {
		state envelope.State
		class envelope.ErrorClass
		want  envelope.ErrorClass
	}{
		{envelope.StateBounced, "", envelope.ClassBounced},
		{envelope.StateComplaint, "", envelope.ClassComplaint},
		{envelope.StateComplaint, envelope.ClassComplaint, envelope.ClassComplaint},
		{envelope.StateSuppressed, envelope.ClassUnsubscribed, envelope.ClassUnsubscribed},
	}
	for _, tc := range tests {
		t.Run(string(tc.state)+"_"+string(tc.class), func(t *testing.T) {
			f := setup(t, h)
			f.grant(dflt, "u-1")
			f.enqueue(Digest("d-1", "u-1"), Nudge("n-1", "u-1"))
			l := f.claim(1, envelope.ChannelEmail)
			f.commit(l[0], queue.Outcome{State: tc.state, Class: tc.class})
			f.wantState(dflt, "d-1", 0, tc.state, "-")
			c := f.consent(dflt, "u-1")
			want := queue.Suppression{Channel: envelope.ChannelEmail, Target: queue.TargetOf(Digest("", "u-1")), Reason: tc.want, At: T0}
			if len(c.Suppressions) != 1 || !sameSuppression(c.Suppressions[0], want) {
				t.Fatalf("suppressions = %+v, want %+v", c.Suppressions, want)
			}
			// Email is suppressed for that address only; push still goes.
			f.claimOne("n-1")
			_, err := f.s.Enqueue(f.ctx, Digest("d-2", "u-1"))
			wantErr(t, err, queue.ErrConsentDenied, "Enqueue to a suppressed address")
		})
	}
}
