package queuetest

import (
	"cmp"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// secondDevice is the endpoint of a user's second browser in these tests.
const secondDevice = "https://push.example.net/wpush/v2/second-device"

// pushSub returns the push subscription the Nudge builder uses for user,
// moved to endpoint when endpoint is not "".
func pushSub(user, endpoint string) envelope.PushSubscription {
	sub := *Nudge("", user).Recipient.PushSubscription
	if endpoint != "" {
		sub.Endpoint = endpoint
	}
	return sub
}

func (f *fixture) saveSub(tenant, user string, sub envelope.PushSubscription) {
	f.t.Helper()
	if err := f.s.SaveSubscription(f.ctx, tenant, user, sub); err != nil {
		f.t.Fatalf("SaveSubscription(%q, %q): %v", tenant, user, err)
	}
}

// subs lists a user's subscriptions by endpoint (the contract fixes no
// order).
func (f *fixture) subs(tenant, user string) []queue.Subscription {
	f.t.Helper()
	list, err := f.s.Subscriptions(f.ctx, tenant, user)
	if err != nil {
		f.t.Fatalf("Subscriptions(%q, %q): %v", tenant, user, err)
	}
	list = slices.Clone(list)
	slices.SortFunc(list, func(a, b queue.Subscription) int { return cmp.Compare(a.Sub.Endpoint, b.Sub.Endpoint) })
	return list
}

// wantSubs checks a user's subscriptions (any order): endpoint and keys.
func (f *fixture) wantSubs(tenant, user string, want ...envelope.PushSubscription) []queue.Subscription {
	f.t.Helper()
	got := f.subs(tenant, user)
	want = slices.Clone(want)
	slices.SortFunc(want, func(a, b envelope.PushSubscription) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].Sub.Endpoint == want[i].Endpoint && got[i].Sub.Keys == want[i].Keys
	}
	if !ok {
		f.t.Fatalf("Subscriptions(%q, %q) = %+v, want %+v", tenant, user, got, want)
	}
	return got
}

func testSubscriptions(t *testing.T, h Harness) {
	f := setup(t, h)
	f.wantSubs(dflt, "u-1")

	a, b := pushSub("u-1", ""), pushSub("u-1", secondDevice)
	f.saveSub(dflt, "u-1", a)
	f.clock.Advance(time.Minute)
	f.saveSub(dflt, "u-1", b)
	got := f.wantSubs(dflt, "u-1", a, b)
	for _, s := range got {
		want := T0
		if s.Sub.Endpoint == secondDevice {
			want = T0.Add(time.Minute)
		}
		if !s.Created.Equal(want) {
			t.Fatalf("subscription %s created at %v, want %v", s.Sub.Endpoint, s.Created, want)
		}
	}

	// The same endpoint again replaces the subscription (new keys).
	f.clock.Advance(time.Minute)
	a2 := a
	a2.Keys.Auth = pushSub("u-2", "").Keys.Auth
	f.saveSub("", "u-1", a2) // "" is the default tenant
	f.wantSubs(dflt, "u-1", a2, b)

	// The list is a copy.
	got = f.subs(dflt, "u-1")
	got[0].Sub.Keys.Auth = "tampered"
	f.wantSubs(dflt, "u-1", a2, b)

	// An invalid subscription is refused and changes nothing, not even the
	// one it names.
	for name, bad := range map[string]func(*envelope.PushSubscription){
		"no endpoint": func(s *envelope.PushSubscription) { s.Endpoint = "" },
		"no p256dh":   func(s *envelope.PushSubscription) { s.Keys.P256dh = "" },
		"no auth":     func(s *envelope.PushSubscription) { s.Keys.Auth = "" },
	} {
		sub := a
		bad(&sub)
		if err := f.s.SaveSubscription(f.ctx, dflt, "u-1", sub); err == nil {
			t.Fatalf("SaveSubscription of a subscription with %s succeeded", name)
		}
	}
	f.wantSubs(dflt, "u-1", a2, b)

	// Per user and per tenant.
	f.wantSubs(dflt, "u-10")
	f.wantSubs(dflt, "u")
	f.wantSubs("t2", "u-1")
	c := pushSub("u-1", "https://push.example.net/wpush/v2/t2-device")
	f.saveSub("t2", "u-1", c)
	f.saveSub("t2", "u-1", a)
	f.wantSubs("t2", "u-1", a, c)
	f.wantSubs(dflt, "u-1", a2, b)

	// Delete by endpoint.
	if err := f.s.DeleteSubscription(f.ctx, dflt, "u-1", secondDevice); err != nil {
		t.Fatalf("DeleteSubscription: %v", err)
	}
	f.wantSubs(dflt, "u-1", a2)
	for _, del := range []struct{ tenant, user, endpoint, what string }{
		{dflt, "u-1", secondDevice, "a second DeleteSubscription"},
		{dflt, "u-1", "https://push.example.net/wpush/v2/never-saved", "DeleteSubscription of an unknown endpoint"},
		{dflt, "u-2", a.Endpoint, "DeleteSubscription of another user's endpoint"},
		{dflt, "never-seen", a.Endpoint, "DeleteSubscription for an unknown user"},
		{"t3", "u-1", a.Endpoint, "DeleteSubscription in another tenant"},
		{dflt, "u-1", "", "DeleteSubscription of an empty endpoint"},
	} {
		wantErr(t, f.s.DeleteSubscription(f.ctx, del.tenant, del.user, del.endpoint), queue.ErrNotFound, del.what)
	}
	f.wantSubs(dflt, "u-1", a2)
	f.wantSubs("t2", "u-1", a, c)
	if err := f.s.DeleteSubscription(f.ctx, "t2", "u-1", a.Endpoint); err != nil {
		t.Fatalf("DeleteSubscription in t2: %v", err)
	}
	f.wantSubs("t2", "u-1", c)
	f.wantSubs(dflt, "u-1", a2)

	// A deleted endpoint can be saved again.
	f.saveSub(dflt, "u-1", b)
	f.wantSubs(dflt, "u-1", a2, b)
}

// testSubscriptionResubscribe: saving a subscription lifts the suppression
// of that endpoint (a 404/410 earlier), and only that one.
func testSubscriptionResubscribe(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	f.grant("t2", "u-1")
	f.enqueue(Nudge("n-1", "u-1"))
	f.commit(f.claimOne("n-1"), queue.Outcome{State: envelope.StateBounced, Class: envelope.ClassSubscriptionGone})
	other := queue.Suppression{Channel: envelope.ChannelPush, Target: queue.TargetOfValue("push:" + secondDevice), Reason: envelope.ClassSubscriptionGone, At: T0}
	email := queue.Suppression{Channel: envelope.ChannelEmail, Target: queue.TargetOf(Digest("", "u-1")), Reason: envelope.ClassBounced, At: T0}
	gone := queue.Suppression{Channel: envelope.ChannelPush, Target: TargetOfNudge("u-1"), Reason: envelope.ClassSubscriptionGone, At: T0}
	for _, s := range []queue.Suppression{other, email} {
		if err := f.s.Suppress(f.ctx, dflt, "u-1", s); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.s.Suppress(f.ctx, "t2", "u-1", gone); err != nil {
		t.Fatal(err)
	}
	_, err := f.s.Enqueue(f.ctx, Nudge("n-2", "u-1"))
	wantErr(t, err, queue.ErrConsentDenied, "Enqueue to the gone subscription")

	// The browser subscribes again with the same endpoint.
	f.clock.Advance(time.Minute)
	f.saveSub(dflt, "u-1", pushSub("u-1", ""))
	c := f.consent(dflt, "u-1")
	if len(c.Suppressions) != 2 || !sameSuppression(c.Suppressions[0], other) || !sameSuppression(c.Suppressions[1], email) {
		t.Fatalf("suppressions after SaveSubscription = %+v, want only [%+v %+v]", c.Suppressions, other, email)
	}
	if !c.PushEnabled || !c.DigestEnabled || !c.EmailVerified {
		t.Fatalf("flags changed by SaveSubscription: %+v", c.ConsentFlags)
	}
	f.enqueue(Nudge("n-3", "u-1"))
	f.claimOne("n-3")
	// The bounced envelope stays as it was.
	f.wantState(dflt, "n-1", 0, envelope.StateBounced, envelope.ClassSubscriptionGone)

	// The same endpoint in another tenant is still suppressed there.
	if c := f.consent("t2", "u-1"); len(c.Suppressions) != 1 || !sameSuppression(c.Suppressions[0], gone) {
		t.Fatalf("suppressions in t2 = %+v, want [%+v]", c.Suppressions, gone)
	}

	// A channel-wide push suppression (unsubscribed) is not lifted by a new
	// subscription.
	f.grant(dflt, "u-2")
	all := queue.Suppression{Channel: envelope.ChannelPush, Reason: envelope.ClassUnsubscribed, At: T0}
	if err := f.s.Suppress(f.ctx, dflt, "u-2", all); err != nil {
		t.Fatal(err)
	}
	f.saveSub(dflt, "u-2", pushSub("u-2", ""))
	if c := f.consent(dflt, "u-2"); len(c.Suppressions) != 1 || !sameSuppression(c.Suppressions[0], all) {
		t.Fatalf("suppressions of u-2 = %+v, want [%+v]", c.Suppressions, all)
	}
	_, err = f.s.Enqueue(f.ctx, Nudge("n-4", "u-2"))
	wantErr(t, err, queue.ErrConsentDenied, "Enqueue after unsubscribing from push")

	// A user with no consent record: the subscription is saved, nothing is granted.
	f.saveSub(dflt, "u-3", pushSub("u-3", ""))
	if c := f.consent(dflt, "u-3"); c.ConsentFlags != (queue.ConsentFlags{}) || len(c.Suppressions) != 0 {
		t.Fatalf("consent of u-3 after SaveSubscription = %+v, want none", c)
	}
	_, err = f.s.Enqueue(f.ctx, Nudge("n-5", "u-3"))
	wantErr(t, err, queue.ErrConsentDenied, "Enqueue for a user who saved a subscription but never consented")
}

func testEraseSubscriptions(t *testing.T, h Harness) {
	f := setup(t, h)
	f.saveSub(dflt, "u-1", pushSub("u-1", ""))
	f.saveSub(dflt, "u-1", pushSub("u-1", secondDevice))
	f.saveSub(dflt, "u-2", pushSub("u-2", ""))
	f.saveSub("t2", "u-1", pushSub("u-1", ""))
	if err := f.s.Erase(f.ctx, dflt, "u-1"); err != nil {
		t.Fatalf("Erase: %v", err)
	}
	f.wantSubs(dflt, "u-1")
	wantErr(t, f.s.DeleteSubscription(f.ctx, dflt, "u-1", secondDevice), queue.ErrNotFound, "DeleteSubscription after Erase")
	f.wantSubs(dflt, "u-2", pushSub("u-2", ""))
	f.wantSubs("t2", "u-1", pushSub("u-1", ""))
}

// testSuppressEmail: an address reported bounced later is suppressed for
// every user of the tenant with an envelope to it, whatever that envelope's
// state.
func testSuppressEmail(t *testing.T, h Harness) {
	f := setup(t, h)
	const shared = "family.inbox@example.com"
	to := func(id, user, addr string) *envelope.Envelope {
		e := Digest(id, user)
		if addr != "" {
			e.Recipient.Email = addr
		}
		return e
	}
	for _, u := range []string{"u-1", "u-2", "u-3", "u-4"} {
		f.grant(dflt, u)
	}
	f.grant("t2", "u-1")
	// u-1's envelope to the shared address is delivered already; u-2's is
	// pending; u-3 has one to its own address only, u-4 none at all.
	f.enqueue(to("d-1a", "u-1", shared))
	f.commit(f.claimOne("d-1a"), queue.Outcome{State: envelope.StateSent})
	f.enqueue(to("d-1b", "u-1", ""), to("d-2", "u-2", shared), to("d-3", "u-3", ""), withTenant(to("d-9", "u-1", shared), "t2"))

	f.clock.Advance(time.Minute)
	if err := f.s.SuppressEmail(f.ctx, dflt, shared, envelope.ClassBounced); err != nil {
		t.Fatalf("SuppressEmail: %v", err)
	}
	want := queue.Suppression{Channel: envelope.ChannelEmail, Target: queue.TargetOf(to("", "u-1", shared)), Reason: envelope.ClassBounced, At: f.clock.Now()}
	granted := queue.ConsentFlags{DigestEnabled: true, PushEnabled: true, EmailVerified: true, Cadence: "weekly"}
	for _, u := range []string{"u-1", "u-2"} {
		c := f.consent(dflt, u)
		if len(c.Suppressions) != 1 || !sameSuppression(c.Suppressions[0], want) || c.ConsentFlags != granted {
			t.Fatalf("consent of %s after SuppressEmail = %+v, want the flags kept and only %+v", u, c, want)
		}
	}
	for _, k := range []struct{ tenant, user string }{{dflt, "u-3"}, {dflt, "u-4"}, {"t2", "u-1"}} {
		if c := f.consent(k.tenant, k.user); len(c.Suppressions) != 0 {
			t.Fatalf("SuppressEmail suppressed %s/%s: %+v", k.tenant, k.user, c.Suppressions)
		}
	}

	// A claim suppresses u-2's pending envelope; the others go.
	if got := sorted(keys(f.claim(10))); !equal(got, sorted([]string{key("d-1b", 0), key("d-3", 0), "t2/d-9#0"})) {
		t.Fatalf("Claim after SuppressEmail = %v, want d-1b, d-3 and t2's d-9", got)
	}
	f.wantState(dflt, "d-2", 0, envelope.StateSuppressed, envelope.ClassBounced)
	f.wantState(dflt, "d-1a", 0, envelope.StateSent, "")
	_, err := f.s.Enqueue(f.ctx, to("d-5", "u-1", shared))
	var ee *queue.EnqueueError
	if !errors.As(err, &ee) || !errors.Is(err, queue.ErrConsentDenied) || ee.Reason != envelope.ClassBounced {
		t.Fatalf("Enqueue to the suppressed address: %v, want a denial (bounced)", err)
	}
	f.enqueue(withTenant(to("d-6", "u-1", shared), "t2"))

	// Reported again (a complaint now): still one suppression of the address.
	f.clock.Advance(time.Minute)
	if err := f.s.SuppressEmail(f.ctx, dflt, shared, envelope.ClassComplaint); err != nil {
		t.Fatal(err)
	}
	if c := f.consent(dflt, "u-2"); len(c.Suppressions) != 1 || c.Suppressions[0].Target != want.Target {
		t.Fatalf("suppressions after a second report = %+v, want one of the address", c.Suppressions)
	}
	// An address nobody has changes nothing.
	if err := f.s.SuppressEmail(f.ctx, dflt, "nobody@example.com", envelope.ClassBounced); err != nil {
		t.Fatal(err)
	}
	if c := f.consent(dflt, "u-3"); len(c.Suppressions) != 0 {
		t.Fatalf("SuppressEmail of an unknown address suppressed u-3: %+v", c.Suppressions)
	}
}

// testSubscriptionsReopen: subscriptions and a lifted suppression survive a
// reopen.
func testSubscriptionsReopen(t *testing.T, h Harness) {
	if h.Reopen == nil {
		t.Skip("Harness.Reopen is nil: the store does not persist")
	}
	f := setup(t, h)
	f.grant(dflt, "u-1")
	f.enqueue(Nudge("n-1", "u-1"))
	f.commit(f.claimOne("n-1"), queue.Outcome{State: envelope.StateBounced, Class: envelope.ClassSubscriptionGone})
	a, b := pushSub("u-1", ""), pushSub("u-1", secondDevice)
	a.Keys.Auth = pushSub("u-2", "").Keys.Auth
	f.saveSub(dflt, "u-1", a)
	f.saveSub(dflt, "u-1", b)
	f.saveSub("t2", "u-1", pushSub("u-1", ""))
	if err := f.s.DeleteSubscription(f.ctx, "t2", "u-1", a.Endpoint); err != nil {
		t.Fatal(err)
	}
	before := f.subs(dflt, "u-1")

	f.reopen()
	got := f.wantSubs(dflt, "u-1", a, b)
	for i := range got {
		if !got[i].Created.Equal(before[i].Created) {
			t.Fatalf("subscription %s created at %v after reopen, want %v", got[i].Sub.Endpoint, got[i].Created, before[i].Created)
		}
	}
	f.wantSubs("t2", "u-1")
	if c := f.consent(dflt, "u-1"); len(c.Suppressions) != 0 {
		t.Fatalf("suppressions after reopen = %+v, want the lifted one gone", c.Suppressions)
	}
	f.enqueue(Nudge("n-2", "u-1"))
}
