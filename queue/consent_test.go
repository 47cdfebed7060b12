package queue_test

import (
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

func mail(user, addr string) *envelope.Envelope {
	return &envelope.Envelope{TenantID: "t", UserID: user, Channel: envelope.ChannelEmail, Recipient: envelope.Recipient{Email: addr}}
}

// Permits: the tenant's suppression of the address refuses any user's
// envelope to it, before and whatever the user's consent; it does not
// touch another address or channel.
func TestPermits(t *testing.T) {
	granted := &queue.Consent{ConsentFlags: queue.ConsentFlags{DigestEnabled: true, EmailVerified: true, PushEnabled: true}}
	addr := queue.EmailSuppression("shared@example.com", envelope.ClassComplaint, t0)
	if ok, why := queue.Permits(mail("u-1", "shared@example.com"), granted, true, &addr); ok || why != envelope.ClassComplaint {
		t.Errorf("granted user, suppressed address: %v %q, want refused (complaint)", ok, why)
	}
	if ok, why := queue.Permits(mail("u-2", "shared@example.com"), &queue.Consent{}, false, &addr); ok || why != envelope.ClassComplaint {
		t.Errorf("no consent record, suppressed address: %v %q, want refused (complaint)", ok, why)
	}
	if ok, _ := queue.Permits(mail("u-1", "own@example.com"), granted, true, &addr); !ok {
		t.Errorf("another address refused by the shared one's suppression")
	}
	if ok, _ := queue.Permits(mail("u-1", "own@example.com"), granted, true, nil); !ok {
		t.Errorf("granted user, no suppression: refused")
	}
	push := &envelope.Envelope{TenantID: "t", UserID: "u-1", Channel: envelope.ChannelPush,
		Recipient: envelope.Recipient{PushSubscription: &envelope.PushSubscription{Endpoint: "shared@example.com"}}}
	if queue.AddressTarget(push) != "" {
		t.Errorf("a push envelope has an address target")
	}
	if ok, _ := queue.Permits(push, granted, true, &addr); !ok {
		t.Errorf("a push envelope refused by an e-mail address suppression")
	}
	// The user's own consent still decides when the address is free.
	if ok, why := queue.Permits(mail("u-1", "own@example.com"), &queue.Consent{}, true, nil); ok || why != envelope.ClassConsentWithdrawn {
		t.Errorf("no digest consent: %v %q", ok, why)
	}
	if v := queue.Judge(mail("u-1", "shared@example.com"), *granted, true, &addr, t0); v.State != envelope.StateSuppressed || v.Class != envelope.ClassComplaint {
		t.Errorf("Judge = %+v, want suppressed (complaint)", v)
	}
}

// A committed bounce or complaint asks for the tenant's suppression of an
// e-mail address; an unsubscribe, a sent row and a push bounce do not.
func TestCommit_AddressSuppression(t *testing.T) {
	must := musts(t)
	claimed := func() []queue.Delivery {
		rows := queue.NewRows(&envelope.Envelope{}, 1, t0)
		s := must(queue.Claim(rows, 0, queue.Verdict{State: envelope.StateSending}, queue.ClaimRequest{Owner: "w", Lease: time.Minute}, func() uint64 { return 1 }, t0))
		return s.Rows
	}
	e := mail("u-1", "shared@example.com")
	for _, tc := range []struct {
		out  queue.Outcome
		env  *envelope.Envelope
		want envelope.ErrorClass // "" = no address suppression
	}{
		{queue.Outcome{State: envelope.StateBounced}, e, envelope.ClassBounced},
		{queue.Outcome{State: envelope.StateComplaint}, e, envelope.ClassComplaint},
		{queue.Outcome{State: envelope.StateBounced, Class: envelope.ClassInvalidRecipient}, e, envelope.ClassInvalidRecipient},
		{queue.Outcome{State: envelope.StateSuppressed}, e, ""},
		{queue.Outcome{State: envelope.StateSent}, e, ""},
		{queue.Outcome{State: envelope.StateBounced, Class: envelope.ClassSubscriptionGone},
			&envelope.Envelope{Channel: envelope.ChannelPush, Recipient: envelope.Recipient{PushSubscription: &envelope.PushSubscription{Endpoint: "x"}}}, ""},
	} {
		rows := claimed()
		s := must(queue.Commit(queue.Backoff{}, rows, lease(rows, 0), tc.out, t0))
		a, ok := s.AddressSuppression(tc.env, t0)
		if ok != (tc.want != "") || (ok && (a.Reason != tc.want || a.Target != queue.TargetOf(e) || a.Channel != envelope.ChannelEmail || !a.At.Equal(t0))) {
			t.Errorf("commit %s/%q of %s: AddressSuppression = %+v, %v, want reason %q", tc.out.State, tc.out.Class, tc.env.Channel, a, ok, tc.want)
		}
	}
}

// Without a record email and push are refused as no_consent; with one that
// lacks a flag, as consent_withdrawn; telegram needs no record.
func TestAllows_NoRecordIsNoConsent(t *testing.T) {
	reply := &envelope.Envelope{Channel: envelope.ChannelTelegram, Recipient: envelope.Recipient{ChatID: "1"}}
	push := &envelope.Envelope{Channel: envelope.ChannelPush, Recipient: envelope.Recipient{PushSubscription: &envelope.PushSubscription{Endpoint: "https://push.example/1"}}}
	for _, tc := range []struct {
		e     *envelope.Envelope
		c     queue.Consent
		found bool
		ok    bool
		why   envelope.ErrorClass
	}{
		{mail("u", "a@example.com"), queue.Consent{}, false, false, envelope.ClassNoConsent},
		{push, queue.Consent{}, false, false, envelope.ClassNoConsent},
		{mail("u", "a@example.com"), queue.Consent{ConsentFlags: queue.ConsentFlags{DigestEnabled: true}}, true, false, envelope.ClassConsentWithdrawn},
		{push, queue.Consent{ConsentFlags: queue.ConsentFlags{PushEnabled: true}}, true, true, ""},
		{reply, queue.Consent{}, false, true, ""},
	} {
		if ok, why := tc.c.Allows(tc.found, tc.e); ok != tc.ok || why != tc.why {
			t.Errorf("%s found=%v %+v: %v %q, want %v %q", tc.e.Channel, tc.found, tc.c.ConsentFlags, ok, why, tc.ok, tc.why)
		}
	}
}
