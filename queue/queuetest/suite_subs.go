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

// emailTo returns a digest of user to addr (the user's own address when
// addr is "").
func emailTo(id, user, addr string) *envelope.Envelope {
	e := Digest(id, user)
	if addr != "" {
		e.Recipient.Email = addr
	}
	return e
}

// addressSups returns the tenant's address suppressions.
func (f *fixture) addressSups(tenant string) []queue.Suppression {
	f.t.Helper()
	list, err := f.s.AddressSuppressions(f.ctx, tenant)
	if err != nil {
		f.t.Fatalf("AddressSuppressions(%q): %v", tenant, err)
	}
	return list
}

// wantAddressSups checks the tenant's address suppressions (in target
// order).
func (f *fixture) wantAddressSups(tenant string, want ...queue.Suppression) {
	f.t.Helper()
	got := f.addressSups(tenant)
	slices.SortFunc(want, func(a, b queue.Suppression) int { return cmp.Compare(a.Target, b.Target) })
	if len(got) != len(want) {
		f.t.Fatalf("AddressSuppressions(%q) = %+v, want %+v", tenant, got, want)
	}
	for i := range got {
		if !sameSuppression(got[i], want[i]) {
			f.t.Fatalf("AddressSuppressions(%q) = %+v, want %+v", tenant, got, want)
		}
	}
}

// wantDenied expects an Enqueue of e refused by consent with class why.
func (f *fixture) wantDenied(e *envelope.Envelope, why envelope.ErrorClass, what string) {
	f.t.Helper()
	_, err := f.s.Enqueue(f.ctx, e)
	var ee *queue.EnqueueError
	if !errors.As(err, &ee) || !errors.Is(err, queue.ErrConsentDenied) || ee.Reason != why {
		f.t.Fatalf("%s: Enqueue = %v, want a consent denial (%s)", what, err, why)
	}
}

// testSuppressEmail: an address reported bounced later is suppressed for
// the tenant: every envelope of any user of the tenant to it, stored
// already or enqueued later, even when no envelope carried it when it was
// reported; other tenants and every consent record are untouched.
func testSuppressEmail(t *testing.T, h Harness) {
	f := setup(t, h)
	const shared, fresh = "family.inbox@example.com", "new.reader@example.com"
	for _, u := range []string{"u-1", "u-2", "u-3", "u-4"} {
		f.grant(dflt, u)
	}
	f.grant("t2", "u-1")
	// u-1's envelope to the shared address is delivered already; u-2's is
	// pending; u-3 has one to its own address only, u-4 none at all.
	f.enqueue(emailTo("d-1a", "u-1", shared))
	f.commit(f.claimOne("d-1a"), queue.Outcome{State: envelope.StateSent})
	f.enqueue(emailTo("d-1b", "u-1", ""), emailTo("d-2", "u-2", shared), emailTo("d-3", "u-3", ""), withTenant(emailTo("d-9", "u-1", shared), "t2"))
	f.wantAddressSups(dflt)

	f.clock.Advance(time.Minute)
	if err := f.s.SuppressEmail(f.ctx, dflt, shared, envelope.ClassBounced); err != nil {
		t.Fatalf("SuppressEmail: %v", err)
	}
	want := queue.Suppression{Channel: envelope.ChannelEmail, Target: queue.TargetOf(emailTo("", "u-1", shared)), Reason: envelope.ClassBounced, At: f.clock.Now()}
	f.wantAddressSups(dflt, want)
	f.wantAddressSups("t2")
	// The address is the tenant's: no user's consent record changes.
	granted := queue.ConsentFlags{DigestEnabled: true, PushEnabled: true, EmailVerified: true, Cadence: "weekly"}
	for _, k := range []struct{ tenant, user string }{{dflt, "u-1"}, {dflt, "u-2"}, {dflt, "u-3"}, {dflt, "u-4"}, {"t2", "u-1"}} {
		if c := f.consent(k.tenant, k.user); len(c.Suppressions) != 0 || c.ConsentFlags != granted {
			t.Fatalf("consent of %s/%s after SuppressEmail = %+v, want the flags kept and no suppression", k.tenant, k.user, c)
		}
	}

	// A claim suppresses u-2's pending envelope; the others go.
	if got := sorted(keys(f.claim(10))); !equal(got, sorted([]string{key("d-1b", 0), key("d-3", 0), "t2/d-9#0"})) {
		t.Fatalf("Claim after SuppressEmail = %v, want d-1b, d-3 and t2's d-9", got)
	}
	f.wantState(dflt, "d-2", 0, envelope.StateSuppressed, envelope.ClassBounced)
	f.wantState(dflt, "d-1a", 0, envelope.StateSent, "")
	// Every user of the tenant is refused the address, also one that never
	// had an envelope to it; the same users' own addresses and the other
	// tenant still go.
	f.wantDenied(emailTo("d-5", "u-1", shared), envelope.ClassBounced, "Enqueue to the suppressed address")
	f.wantDenied(emailTo("d-6", "u-3", shared), envelope.ClassBounced, "Enqueue of another user to the suppressed address")
	f.wantDenied(emailTo("d-7", "u-4", shared), envelope.ClassBounced, "Enqueue of a user with no envelope yet to the suppressed address")
	f.wantDenied(emailTo("d-8", "u-5", shared), envelope.ClassBounced, "Enqueue of a user with no consent record to the suppressed address")
	f.enqueue(emailTo("d-4", "u-4", ""), withTenant(emailTo("d-6", "u-1", shared), "t2"))

	// An address that no envelope carries yet is suppressed all the same.
	if err := f.s.SuppressEmail(f.ctx, dflt, fresh, envelope.ClassComplaint); err != nil {
		t.Fatal(err)
	}
	wantFresh := queue.Suppression{Channel: envelope.ChannelEmail, Target: queue.TargetOf(emailTo("", "u-1", fresh)), Reason: envelope.ClassComplaint, At: f.clock.Now()}
	f.wantAddressSups(dflt, want, wantFresh)
	f.wantDenied(emailTo("d-10", "u-2", fresh), envelope.ClassComplaint, "Enqueue to an address suppressed before any envelope carried it")

	// Reported again (a complaint now): still one suppression of the
	// address, the first.
	f.clock.Advance(time.Minute)
	if err := f.s.SuppressEmail(f.ctx, dflt, shared, envelope.ClassComplaint); err != nil {
		t.Fatal(err)
	}
	f.wantAddressSups(dflt, want, wantFresh)

	// An operator lifts it: the address works again, for every user.
	wantErr(t, f.s.LiftAddressSuppression(f.ctx, "t2", want.Target), queue.ErrNotFound, "LiftAddressSuppression in a tenant that has none")
	if err := f.s.LiftAddressSuppression(f.ctx, "", want.Target); err != nil {
		t.Fatalf("LiftAddressSuppression: %v", err)
	}
	wantErr(t, f.s.LiftAddressSuppression(f.ctx, dflt, want.Target), queue.ErrNotFound, "LiftAddressSuppression twice")
	f.wantAddressSups(dflt, wantFresh)
	f.enqueue(emailTo("d-11", "u-3", shared))
}

// testBounceSuppressesAddress: a committed bounce or complaint of an
// e-mail suppresses the address for every user of the tenant (not only
// for the user whose envelope bounced); a push bounce stays the user's.
// Erase keeps the tenant's address suppressions; a reopen too.
func testBounceSuppressesAddress(t *testing.T, h Harness) {
	f := setup(t, h)
	const shared = "family.inbox@example.com"
	for _, u := range []string{"u-1", "u-2", "u-3"} {
		f.grant(dflt, u)
	}
	f.grant("t2", "u-2")
	f.enqueue(emailTo("d-1", "u-1", shared))
	l := f.claimOne("d-1")
	f.enqueue(emailTo("d-2", "u-2", shared), withTenant(emailTo("d-9", "u-2", shared), "t2"))
	f.clock.Advance(time.Second)
	f.commit(l, queue.Outcome{State: envelope.StateBounced})
	want := queue.Suppression{Channel: envelope.ChannelEmail, Target: queue.TargetOf(emailTo("", "u-1", shared)), Reason: envelope.ClassBounced, At: f.clock.Now()}
	f.wantAddressSups(dflt, want)
	f.wantAddressSups("t2")
	if got := keys(f.claim(10)); !equal(got, []string{"t2/d-9#0"}) {
		t.Fatalf("Claim after a bounce of the shared address = %v, want only t2's d-9", got)
	}
	f.wantState(dflt, "d-2", 0, envelope.StateSuppressed, envelope.ClassBounced)
	f.wantDenied(emailTo("d-3", "u-3", shared), envelope.ClassBounced, "Enqueue of another user to a bounced address")

	// A complaint of another address, committed: the same.
	f.enqueue(emailTo("d-4", "u-3", ""))
	f.commit(f.claimOne("d-4"), queue.Outcome{State: envelope.StateComplaint})
	own := queue.Suppression{Channel: envelope.ChannelEmail, Target: queue.TargetOf(emailTo("", "u-3", "")), Reason: envelope.ClassComplaint, At: f.clock.Now()}
	f.wantAddressSups(dflt, want, own)
	// An unsubscribe (suppressed) is the user's choice, and a push bounce
	// suppresses only that user's subscription: neither is the tenant's.
	f.enqueue(emailTo("d-5", "u-2", ""), Nudge("n-1", "u-2"))
	for range 2 {
		l := f.claim(1)
		if len(l) != 1 {
			t.Fatalf("Claim = %v, want one lease", keys(l))
		}
		st := envelope.StateSuppressed
		if l[0].Channel == envelope.ChannelPush {
			st = envelope.StateBounced
		}
		f.commit(l[0], queue.Outcome{State: st})
	}
	f.wantAddressSups(dflt, want, own)

	if err := f.s.Erase(f.ctx, dflt, "u-1"); err != nil {
		t.Fatal(err)
	}
	f.wantAddressSups(dflt, want, own)
	if h.Reopen != nil {
		f.reopen()
		f.wantAddressSups(dflt, want, own)
		f.wantAddressSups("t2")
		f.wantDenied(emailTo("d-6", "u-2", shared), envelope.ClassBounced, "Enqueue to a bounced address after a reopen")
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
