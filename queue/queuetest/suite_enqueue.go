package queuetest

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

func testEnqueueGet(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	e := Digest("d-1", "u-1")
	before := jsonOf(t, e)

	res := f.enqueue(e)
	if want := (queue.EnqueueResult{Tenant: dflt, ID: "d-1", Segments: 1}); res[0] != want {
		t.Fatalf("Enqueue result = %+v, want %+v", res[0], want)
	}
	if e.TenantID != "" || jsonOf(t, e) != before {
		t.Fatal("Enqueue modified the caller's envelope")
	}

	stored := jsonOf(t, withTenant(e, dflt))
	st := f.get(dflt, "d-1")
	if st.Tenant != dflt || st.ID != "d-1" || st.UserID != "u-1" || st.Channel != envelope.ChannelEmail ||
		st.Template != envelope.TemplateDigest || st.Status != string(envelope.StatePending) || !st.EnqueuedAt.Equal(T0) {
		t.Fatalf("Get = %+v, want the pending digest of u-1 enqueued at T0", st)
	}
	if got := jsonOf(t, st.Envelope); got != stored {
		t.Fatalf("stored envelope =\n%s\nwant (tenant set to default)\n%s", got, stored)
	}
	if len(st.Segments) != 1 {
		t.Fatalf("Get has %d segments, want 1", len(st.Segments))
	}
	if s := st.Segments[0]; s.Index != 0 || s.State != envelope.StatePending || s.Attempts != 0 ||
		!s.NextAt.Equal(T0) || len(s.History) != 0 || s.Receipt != "" || s.Class != "" {
		t.Fatalf("segment = %+v, want pending, no attempts, due at T0", s)
	}

	// The store keeps its own copy: changing the caller's envelope or a
	// returned copy changes nothing stored.
	e.Recipient.Email = "someone.else@example.com"
	e.Payload[0] = ' '
	st.Envelope.UserID = "mallory"
	st.Envelope.Payload = nil
	if got := jsonOf(t, f.get(dflt, "d-1").Envelope); got != stored {
		t.Fatalf("stored envelope changed through an alias:\n%s", got)
	}

	f.clock.Advance(2 * time.Second)
	l := f.claimOne("d-1")
	wantKey := envelope.Key{Tenant: dflt, EnvelopeID: "d-1", Segment: 0}
	if l.Key != wantKey || l.UserID != "u-1" || l.Channel != envelope.ChannelEmail || l.Owner != "worker-1" ||
		l.Fence == 0 || l.Attempt != 1 || !l.ExpiresAt.Equal(T0.Add(2*time.Second+DefaultLease)) || l.Segments != 1 ||
		!l.EnqueuedAt.Equal(T0) {
		t.Fatalf("lease = %+v", l)
	}
	if got := jsonOf(t, l.Envelope); got != stored {
		t.Fatalf("lease envelope =\n%s\nwant\n%s", got, stored)
	}
	l.Envelope.Recipient.Email = "x@example.org"
	if got := jsonOf(t, f.get(dflt, "d-1").Envelope); got != stored {
		t.Fatal("changing a lease's envelope changed the stored one")
	}
	s := f.seg(dflt, "d-1", 0)
	if s.State != envelope.StateSending || s.Attempts != 1 || s.Fence != l.Fence || !s.LeaseEnd.Equal(l.ExpiresAt) {
		t.Fatalf("claimed segment = %+v, want sending, attempt 1, fence %d, lease end %v", s, l.Fence, l.ExpiresAt)
	}
	if st := f.get(dflt, "d-1"); st.Status != string(envelope.StateSending) {
		t.Fatalf("Status = %q, want sending", st.Status)
	}

	f.wantNotFound(dflt, "no-such-id")

	// An envelope naming a tenant lives in that tenant only.
	f.grant("acme", "u-2")
	n := Nudge("n-1", "u-2")
	n.TenantID = "acme"
	if res := f.enqueue(n); res[0] != (queue.EnqueueResult{Tenant: "acme", ID: "n-1", Segments: 1}) {
		t.Fatalf("Enqueue result = %+v", res[0])
	}
	f.wantNotFound(dflt, "n-1")
	if st := f.get("acme", "n-1"); st.Tenant != "acme" || st.Envelope.TenantID != "acme" {
		t.Fatalf("Get(acme) = %+v", st)
	}
}

func testEnqueueDuplicate(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	f.enqueue(Digest("d-1", "u-1"))

	again := Digest("d-1", "u-1")
	again.Recipient.Email = "someone.else@example.com"
	res := f.enqueue(again)
	if want := (queue.EnqueueResult{Tenant: dflt, ID: "d-1", Duplicate: true, Segments: 1}); res[0] != want {
		t.Fatalf("second Enqueue = %+v, want %+v", res[0], want)
	}
	if got := f.get(dflt, "d-1").Envelope.Recipient.Email; got != EmailOf("u-1") {
		t.Fatal("a duplicate replaced the stored envelope")
	}

	// Duplicates within one call; a reply's duplicate reports the
	// segments of the first.
	text := ReplyText(2)
	res = f.enqueue(Reply("r-1", "u-1", text), Reply("r-1", "u-1", "a different text"), Reply("r-2", "u-1", "hello"))
	want := []queue.EnqueueResult{
		{Tenant: dflt, ID: "r-1", Segments: 2},
		{Tenant: dflt, ID: "r-1", Duplicate: true, Segments: 2},
		{Tenant: dflt, ID: "r-2", Segments: 1},
	}
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("Enqueue = %+v, want %+v", res, want)
	}
	res = f.enqueue(Reply("r-1", "u-1", "again"))
	if res[0] != (queue.EnqueueResult{Tenant: dflt, ID: "r-1", Duplicate: true, Segments: 2}) {
		t.Fatalf("Enqueue of an existing reply = %+v", res[0])
	}
	if got := f.counts("").Total(envelope.StatePending); got != 4 {
		t.Fatalf("pending rows = %d, want 4 (digest, two reply segments, one reply)", got)
	}
	if ls := f.claim(100); len(ls) != 3 {
		t.Fatalf("Claim = %v, want d-1, r-1#0, r-2#0", keys(ls))
	}
}

func testEnqueueConcurrentDuplicates(t *testing.T, h Harness) {
	f := setup(t, h)
	const n = 16
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created int
		errs    []error
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			res, err := f.s.Enqueue(f.ctx, Reply("same", "u-1", "only once, please"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if !res[0].Duplicate {
				created++
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent Enqueue: %v", errs[0])
	}
	if created != 1 {
		t.Fatalf("%d of %d identical enqueues created the envelope, want exactly 1", created, n)
	}
	if got := f.counts("").Total(envelope.StatePending); got != 1 {
		t.Fatalf("pending rows = %d, want 1", got)
	}
	if ls := f.claim(100); len(ls) != 1 {
		t.Fatalf("Claim = %v, want one lease", keys(ls))
	}
}

func testEnqueueBatchAtomic(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	bad := Digest("b-3", "u-1")
	sections := DigestItems()
	sections[0].Items[1].DeepLink = "" // breaks the moat rule
	bad.Payload = mustJSON(envelope.DigestPayload{Sections: sections})
	batch := func() []*envelope.Envelope {
		return []*envelope.Envelope{
			Digest("b-1", "u-1"), Reply("b-2", "u-1", ReplyText(2)), bad, Nudge("b-4", "u-1"), Digest("b-5", "u-1"),
		}
	}

	_, err := f.s.Enqueue(f.ctx, batch()...)
	var ee *queue.EnqueueError
	if !errors.As(err, &ee) {
		t.Fatalf("Enqueue error = %v, want *queue.EnqueueError", err)
	}
	if ee.Index != 2 || ee.ID != "b-3" || ee.Tenant != dflt {
		t.Fatalf("EnqueueError = {Index %d, Tenant %q, ID %q}, want {2, default, b-3}", ee.Index, ee.Tenant, ee.ID)
	}
	var ve *envelope.ValidationError
	if !errors.As(err, &ve) || !errors.Is(err, envelope.ErrInvalid) {
		t.Fatalf("Enqueue error = %v, want it to wrap *envelope.ValidationError (ErrInvalid)", err)
	}
	if errors.Is(err, queue.ErrConsentDenied) {
		t.Fatal("a validation failure reported as a consent denial")
	}

	f.noClaim("after a failed batch")
	for _, id := range []string{"b-1", "b-2", "b-3", "b-4", "b-5"} {
		f.wantNotFound(dflt, id)
	}
	if c := f.counts(""); len(c) != 0 && c.Total(envelope.StatePending) != 0 {
		t.Fatalf("Counts after a failed batch = %v", c)
	}
	f.wantNextDue(time.Time{})

	// Nothing of the failed call is remembered, not even for idempotency.
	good := pick(batch(), 0, 1, 3, 4)
	for i, r := range f.enqueue(good...) {
		if r.Duplicate {
			t.Fatalf("envelope %d (%s) reported duplicate after a failed batch", i, r.ID)
		}
	}
}

// pick picks elements of s by index.
func pick(s []*envelope.Envelope, idx ...int) []*envelope.Envelope {
	out := make([]*envelope.Envelope, len(idx))
	for i, j := range idx {
		out[i] = s[j]
	}
	return out
}

func testEnqueueConsent(t *testing.T, h Harness) {
	const user = "u-1"
	otherEndpoint := func(id string) *envelope.Envelope {
		n := Nudge(id, user)
		n.Recipient.PushSubscription.Endpoint = "https://push.example.net/wpush/v2/another-device"
		return n
	}
	flags := func(c queue.ConsentFlags) func(*fixture) {
		return func(f *fixture) {
			if err := f.s.SetConsent(f.ctx, dflt, user, c); err != nil {
				t.Fatal(err)
			}
		}
	}
	suppress := func(s queue.Suppression) func(*fixture) {
		return func(f *fixture) {
			f.grant(dflt, user)
			if err := f.s.Suppress(f.ctx, dflt, user, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name   string
		setup  func(*fixture)
		env    *envelope.Envelope
		denied envelope.ErrorClass // "" = allowed
	}{
		{"NoRecordDigest", nil, Digest("e", user), envelope.ClassNoConsent},
		{"NoRecordNudge", nil, Nudge("e", user), envelope.ClassNoConsent},
		{"NoRecordTelegramAllowed", nil, Reply("e", user, "hi"), ""},
		{"DigestDisabled", flags(queue.ConsentFlags{PushEnabled: true, EmailVerified: true}), Digest("e", user), envelope.ClassConsentWithdrawn},
		{"EmailUnverified", flags(queue.ConsentFlags{DigestEnabled: true, PushEnabled: true}), Digest("e", user), envelope.ClassConsentWithdrawn},
		{"PushDisabled", flags(queue.ConsentFlags{DigestEnabled: true, EmailVerified: true}), Nudge("e", user), envelope.ClassConsentWithdrawn},
		{"DigestGranted", flags(queue.ConsentFlags{DigestEnabled: true, EmailVerified: true}), Digest("e", user), ""},
		{"PushGranted", flags(queue.ConsentFlags{PushEnabled: true}), Nudge("e", user), ""},
		{"EmailChannelSuppressed", suppress(queue.Suppression{Channel: envelope.ChannelEmail, Reason: envelope.ClassUnsubscribed, At: T0}),
			Digest("e", user), envelope.ClassUnsubscribed},
		{"PushSubscriptionSuppressed", suppress(queue.Suppression{Channel: envelope.ChannelPush, Target: TargetOfNudge(user), Reason: envelope.ClassSubscriptionGone, At: T0}),
			Nudge("e", user), envelope.ClassSubscriptionGone},
		{"OtherSubscriptionAllowed", suppress(queue.Suppression{Channel: envelope.ChannelPush, Target: TargetOfNudge(user), Reason: envelope.ClassSubscriptionGone, At: T0}),
			otherEndpoint("e"), ""},
		{"TelegramSuppressed", suppress(queue.Suppression{Channel: envelope.ChannelTelegram, Reason: envelope.ClassBlockedByUser, At: T0}),
			Reply("e", user, "hi"), envelope.ClassBlockedByUser},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t, h)
			if tc.setup != nil {
				tc.setup(f)
			}
			// An allowed reply (telegram needs no opt-in) first: a denial
			// must fail the whole call.
			ok := Reply("first", "u-other", "fine")
			res, err := f.s.Enqueue(f.ctx, ok, tc.env)
			if tc.denied == "" {
				if err != nil {
					t.Fatalf("Enqueue: %v, want allowed", err)
				}
				if res[1].Duplicate {
					t.Fatal("reported duplicate")
				}
				f.get(dflt, "e")
				return
			}
			wantErr(t, err, queue.ErrConsentDenied, "Enqueue")
			var ee *queue.EnqueueError
			if !errors.As(err, &ee) || ee.Index != 1 || ee.ID != "e" || ee.Tenant != dflt || ee.Reason != tc.denied {
				t.Fatalf("Enqueue error = %#v, want EnqueueError{Index 1, ID e, Reason %s}", err, tc.denied)
			}
			f.wantNotFound(dflt, "first")
			f.wantNotFound(dflt, "e")
			f.noClaim("after a denied batch")
		})
	}
}

// TargetOfNudge returns the suppression target of the push subscription
// the Nudge builder uses for user.
func TargetOfNudge(user string) string { return queue.TargetOf(Nudge("", user)) }

// consentSource is a ConsentSource backed by a map, for the suite.
type consentSource struct {
	mu  sync.Mutex
	m   map[string]queue.Consent
	err error
}

func (c *consentSource) Consent(_ context.Context, tenant, user string) (queue.Consent, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return queue.Consent{}, false, c.err
	}
	v, ok := c.m[tenant+"/"+user]
	return v, ok, nil
}

func (c *consentSource) set(tenant, user string, v queue.Consent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[tenant+"/"+user] = v
}

func testConsentSource(t *testing.T, h Harness) {
	src := &consentSource{m: map[string]queue.Consent{}}
	src.set(dflt, "u-app", queue.Consent{ConsentFlags: queue.ConsentFlags{DigestEnabled: true, EmailVerified: true}})
	f := setup(t, h, func(o *queue.Options) { o.Consent = src })

	// The source is the authority: the store's own records are not used.
	f.grant(dflt, "u-store")
	f.enqueue(Digest("d-app", "u-app"))
	_, err := f.s.Enqueue(f.ctx, Digest("d-store", "u-store"))
	wantErr(t, err, queue.ErrConsentDenied, "Enqueue for a user the source does not know")

	// Consent withdrawn in the source after enqueue: suppressed at claim.
	f.enqueue(Digest("d-app-2", "u-app"))
	src.set(dflt, "u-app", queue.Consent{ConsentFlags: queue.ConsentFlags{EmailVerified: true}})
	f.noClaim("after the source withdrew consent")
	f.wantState(dflt, "d-app", 0, envelope.StateSuppressed, envelope.ClassConsentWithdrawn)
	f.wantState(dflt, "d-app-2", 0, envelope.StateSuppressed, envelope.ClassConsentWithdrawn)

	// A failing source fails the enqueue and stores nothing, and fails a
	// claim without changing any row.
	src.set(dflt, "u-app", queue.Consent{ConsentFlags: queue.ConsentFlags{DigestEnabled: true, EmailVerified: true}})
	f.enqueue(Digest("d-app-3", "u-app"))
	errSource := errors.New("consent service unavailable")
	src.mu.Lock()
	src.err = errSource
	src.mu.Unlock()
	_, err = f.s.Enqueue(f.ctx, Digest("d-app-4", "u-app"))
	wantErr(t, err, errSource, "Enqueue with a failing consent source")
	f.wantNotFound(dflt, "d-app-4")
	_, err = f.s.Claim(f.ctx, req(10))
	wantErr(t, err, errSource, "Claim with a failing consent source")
	if s := f.seg(dflt, "d-app-3", 0); s.State != envelope.StatePending || s.Attempts != 0 {
		t.Fatalf("after a failed claim: %+v, want pending with no attempt", s)
	}
	src.mu.Lock()
	src.err = nil
	src.mu.Unlock()
	f.claimOne("d-app-3")
}

func testConsentWithdrawn(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	f.enqueue(Digest("d-1", "u-1"), Nudge("n-1", "u-1"), Reply("r-1", "u-1", "hi"))

	if err := f.s.SetConsent(f.ctx, dflt, "u-1", queue.ConsentFlags{PushEnabled: true, EmailVerified: true}); err != nil {
		t.Fatal(err)
	}
	ls := f.claim(10)
	if got, want := sorted(keys(ls)), sorted([]string{key("n-1", 0), key("r-1", 0)}); !equal(got, want) {
		t.Fatalf("Claim = %v, want %v (the digest is no longer allowed)", got, want)
	}
	f.wantState(dflt, "d-1", 0, envelope.StateSuppressed, envelope.ClassConsentWithdrawn)
	if st := f.get(dflt, "d-1"); st.Status != string(envelope.StateSuppressed) {
		t.Fatalf("Status = %q, want suppressed", st.Status)
	}

	// A suppression added after enqueue applies at claim too.
	f.enqueue(Reply("r-2", "u-1", "hello"))
	if err := f.s.Suppress(f.ctx, dflt, "u-1", queue.Suppression{Channel: envelope.ChannelTelegram, Reason: envelope.ClassBlockedByUser, At: T0}); err != nil {
		t.Fatal(err)
	}
	f.noClaim("after a telegram suppression")
	f.wantState(dflt, "r-2", 0, envelope.StateSuppressed, envelope.ClassBlockedByUser)

	// Suppressed is final until an operator requeues: consent granted
	// again does not bring it back by itself.
	f.grant(dflt, "u-1")
	f.clock.Advance(time.Hour)
	f.noClaim("after consent was granted again")
	f.wantState(dflt, "d-1", 0, envelope.StateSuppressed, "-")
}

func equal(a, b []string) bool { return reflect.DeepEqual(a, b) }

func testNotBefore(t *testing.T, h Harness) {
	f := setup(t, h)
	later := Reply("later", "u-1", "good morning")
	later.NotBefore = T0.Add(time.Hour)
	past := Reply("past", "u-1", "hello")
	past.NotBefore = T0.Add(-time.Hour)
	f.enqueue(later)
	if s := f.seg(dflt, "later", 0); !s.NextAt.Equal(T0.Add(time.Hour)) {
		t.Fatalf("NextAt = %v, want not_before", s.NextAt)
	}
	f.wantNextDue(T0.Add(time.Hour))
	f.noClaim("before not_before")

	f.enqueue(past)
	if s := f.seg(dflt, "past", 0); !s.NextAt.Equal(T0) {
		t.Fatalf("NextAt of a past not_before = %v, want now", s.NextAt)
	}
	f.claimOne("past")

	f.clock.Advance(time.Hour - time.Second)
	f.noClaim("a second before not_before")
	f.clock.Advance(time.Second)
	f.claimOne("later")
}

func testExpiresAt(t *testing.T, h Harness) {
	f := setup(t, h)
	retried := Reply("retried", "u-1", "one")
	retried.ExpiresAt = T0.Add(10 * time.Minute)
	live := Reply("live", "u-1", "two")
	live.ExpiresAt = T0.Add(time.Hour)
	f.enqueue(retried, live)
	l := f.claim(1)
	if len(l) != 1 || l[0].Key.EnvelopeID != "retried" {
		t.Fatalf("Claim = %v, want retried", keys(l))
	}
	f.commit(l[0], queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassRateLimited, RetryAfter: 15 * time.Minute})

	waiting := Reply("waiting", "u-1", "three")
	waiting.NotBefore = T0.Add(5 * time.Minute)
	waiting.ExpiresAt = T0.Add(10 * time.Minute)
	f.enqueue(waiting)

	// At expires_at exactly, the row is expired and not returned.
	f.clock.Set(T0.Add(10 * time.Minute))
	f.claimOne("live")
	f.wantState(dflt, "waiting", 0, envelope.StateExpired, envelope.ClassExpired)
	if st := f.get(dflt, "waiting"); st.Status != string(envelope.StateExpired) {
		t.Fatalf("Status = %q, want expired", st.Status)
	}

	// A retry due after expires_at expires instead of being delivered.
	f.clock.Set(T0.Add(15 * time.Minute))
	f.noClaim("a retry past expires_at")
	f.wantState(dflt, "retried", 0, envelope.StateExpired, envelope.ClassExpired)
	if s := f.seg(dflt, "retried", 0); s.Attempts != 1 {
		t.Fatalf("attempts = %d, want 1", s.Attempts)
	}

	f.clock.Advance(24 * time.Hour)
	f.noClaim("long after expiry")
	f.wantState(dflt, "waiting", 0, envelope.StateExpired, envelope.ClassExpired)
}

// An envelope already past its expires_at is refused at enqueue (it could
// never be delivered), with nothing of its call stored; one stored before
// it expired is still a duplicate when posted again (idempotency first).
func testEnqueueExpired(t *testing.T, h Harness) {
	f := setup(t, h)
	stored := Reply("stored", "u-1", "one")
	stored.ExpiresAt = T0.Add(time.Minute)
	f.enqueue(stored)

	f.clock.Set(T0.Add(time.Minute)) // at expires_at exactly: expired
	late := Reply("late", "u-1", "two")
	late.ExpiresAt = T0.Add(time.Minute)
	fresh := Reply("fresh", "u-1", "three")
	_, err := f.s.Enqueue(f.ctx, fresh, late)
	var ee *queue.EnqueueError
	if !errors.Is(err, queue.ErrExpired) || !errors.As(err, &ee) || ee.Index != 1 || ee.Reason != envelope.ClassExpired || ee.ID != "late" {
		t.Fatalf("Enqueue of an expired envelope = %v, want ErrExpired for index 1", err)
	}
	f.wantNotFound(dflt, "late")
	f.wantNotFound(dflt, "fresh")

	res, err := f.s.Enqueue(f.ctx, stored)
	if err != nil || len(res) != 1 || !res[0].Duplicate {
		t.Fatalf("re-post of a stored, now expired envelope = %+v, %v; want a duplicate", res, err)
	}
}

// An explicit opt-in lifts that channel's unsubscribe (not a bounce or a
// gone subscription: an operator lifts those with LiftSuppression); an
// envelope stored before the unsubscribe is still a duplicate when posted
// again; the history says who did what.
func testConsentReOptIn(t *testing.T, h Harness) {
	f := setup(t, h)
	f.grant(dflt, "u-1")
	stored := Digest("d-1", "u-1")
	f.enqueue(stored)
	unsub := queue.Suppression{Channel: envelope.ChannelEmail, Reason: envelope.ClassUnsubscribed, At: T0}
	gone := queue.Suppression{Channel: envelope.ChannelPush, Target: TargetOfNudge("u-1"), Reason: envelope.ClassSubscriptionGone, At: T0}
	for _, s := range []queue.Suppression{unsub, gone} {
		if err := f.s.Suppress(f.ctx, dflt, "u-1", s); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := f.s.Enqueue(f.ctx, stored); err != nil || !res[0].Duplicate {
		t.Fatalf("re-post of a stored envelope after an unsubscribe = %+v, %v; want a duplicate", res, err)
	}
	f.wantDenied(Digest("d-2", "u-1"), envelope.ClassUnsubscribed, "after the unsubscribe")

	flags := queue.ConsentFlags{DigestEnabled: true, PushEnabled: true, EmailVerified: true, By: "user"}
	if err := f.s.SetConsent(f.ctx, dflt, "u-1", flags); err != nil {
		t.Fatal(err)
	}
	f.enqueue(Digest("d-2", "u-1"))
	f.wantDenied(Nudge("n-1", "u-1"), envelope.ClassSubscriptionGone, "a gone subscription after the opt-in")
	c := f.consent(dflt, "u-1")
	if len(c.Suppressions) != 1 || c.Suppressions[0].Reason != envelope.ClassSubscriptionGone {
		t.Fatalf("suppressions after the opt-in: %+v", c.Suppressions)
	}
	var byUser, lifted bool
	for _, ch := range c.History {
		byUser = byUser || ch.By == "user" && strings.HasPrefix(ch.Change, "set ")
		lifted = lifted || strings.Contains(ch.Change, "lifted email unsubscribed")
	}
	if !byUser || !lifted {
		t.Fatalf("history %+v, want the set by user and the lift", c.History)
	}

	if err := f.s.LiftSuppression(f.ctx, dflt, "u-1", envelope.ChannelPush, ""); err != nil {
		t.Fatal(err)
	}
	f.enqueue(Nudge("n-1", "u-1"))
	wantErr(t, f.s.LiftSuppression(f.ctx, dflt, "u-1", envelope.ChannelPush, ""), queue.ErrNotFound, "LiftSuppression with nothing to lift")
	wantErr(t, f.s.LiftSuppression(f.ctx, dflt, "", envelope.ChannelPush, ""), queue.ErrNoUser, "LiftSuppression without a user")
}

// A row suppressed because the user blocked the chat is not requeued
// while the block stands (it would only be suppressed again at claim):
// the refusal says why; once an operator lifts the block, it is.
func testRequeueStillSuppressed(t *testing.T, h Harness) {
	f := setup(t, h)
	f.enqueue(Reply("r", "u-1", "hi"))
	block := queue.Suppression{Channel: envelope.ChannelTelegram, Reason: envelope.ClassBlockedByUser, At: T0}
	if err := f.s.Suppress(f.ctx, dflt, "u-1", block); err != nil {
		t.Fatal(err)
	}
	f.noClaim("a blocked chat")
	f.wantState(dflt, "r", 0, envelope.StateSuppressed, envelope.ClassBlockedByUser)
	err := f.s.Requeue(f.ctx, dflt, "r")
	var te *queue.TransitionError
	if !errors.Is(err, queue.ErrInvalidTransition) || !errors.As(err, &te) || te.Because != envelope.ClassBlockedByUser {
		t.Fatalf("Requeue while the block stands = %v, want a TransitionError naming blocked_by_user", err)
	}
	f.wantState(dflt, "r", 0, envelope.StateSuppressed, envelope.ClassBlockedByUser)
	if err := f.s.LiftSuppression(f.ctx, dflt, "u-1", envelope.ChannelTelegram, ""); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Requeue(f.ctx, dflt, "r"); err != nil {
		t.Fatalf("Requeue after the lift = %v", err)
	}
	f.claimOne("r")
}
