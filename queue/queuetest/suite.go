package queuetest

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Harness opens the store under test.
type Harness struct {
	// Open returns a fresh, empty store configured by opts. The suite
	// closes it when the subtest ends (Close must be idempotent).
	Open func(t testing.TB, opts *queue.Options) queue.Store
	// Reopen, optional (nil for an in-memory store), closes s and opens the
	// same store again with the same options, for persistence tests.
	Reopen func(t testing.TB, s queue.Store, opts *queue.Options) queue.Store
	// Rebuilt, optional (nil for a store whose index cannot be lost),
	// returns a store opened on what a rebuild of s's index from its
	// durable files recovers, built on a copy (s stays open and as it
	// was); the caller closes it. Differential checks that it holds the
	// same consent facts as s.
	Rebuilt func(t testing.TB, s queue.Store, opts *queue.Options) queue.Store
}

// T0 is the time at which every subtest's Clock starts.
var T0 = time.Date(2026, time.March, 2, 9, 0, 0, 0, time.UTC)

// DefaultLease is the lease duration the suite claims with unless a test says
// otherwise.
const DefaultLease = 30 * time.Second

// signalWait bounds the wait for a Notify signal.
const signalWait = 5 * time.Second

// Exercise runs the queue.Store contract suite against the stores h opens.
// Every subtest opens its own store with a Clock (starting at T0) in
// Options.Now and Backoff{NoJitter: true, Base: time.Second}.
func Exercise(t *testing.T, h Harness) {
	if h.Open == nil {
		t.Fatal("queuetest: Harness.Open is nil")
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"EnqueueGet", testEnqueueGet},
		{"EnqueueDuplicate", testEnqueueDuplicate},
		{"EnqueueConcurrentDuplicates", testEnqueueConcurrentDuplicates},
		{"EnqueueBatchAtomic", testEnqueueBatchAtomic},
		{"EnqueueConsent", testEnqueueConsent},
		{"ConsentSource", testConsentSource},
		{"ConsentWithdrawnAfterEnqueue", testConsentWithdrawn},
		{"NotBefore", testNotBefore},
		{"ExpiresAt", testExpiresAt},
		{"EnqueueExpired", testEnqueueExpired},
		{"ConsentReOptIn", testConsentReOptIn},
		{"RequeueStillSuppressed", testRequeueStillSuppressed},
		{"ClaimOrder", testClaimOrder},
		{"ClaimFilters", testClaimFilters},
		{"ClaimRequestValidation", testClaimValidation},
		{"FencesIncrease", testFences},
		{"ConcurrentClaims", testConcurrentClaims},
		{"CommitSent", testCommitSent},
		{"CommitRetryableBackoff", testRetryBackoff},
		{"CommitMaxAttempts", testMaxAttempts},
		{"CommitPermanent", testPermanent},
		{"StaleFence", testStaleFence},
		{"LeaseLost", testLeaseLost},
		{"Release", testRelease},
		{"ReleaseRecovered", testReleaseRecovered},
		{"RecoverReconcile", testRecover},
		{"ExpireToPending", testExpireToPending},
		{"ReplySegments", testReplySegments},
		{"PushBounceSuppressesSubscription", testPushBounce},
		{"BounceSuppressesRemainingSegments", testBounceSegments},
		{"SuppressionDefaultReasons", testSuppressionReasons},
		{"CrossTenant", testCrossTenant},
		{"Requeue", testRequeue},
		{"RequeueFreshBudget", testRequeueFreshBudget},
		{"Resolve", testResolve},
		{"List", testList},
		{"ListLimits", testListLimits},
		{"Counts", testCounts},
		{"NextDue", testNextDue},
		{"NextDueFilter", testNextDueFilter},
		{"Notify", testNotify},
		{"ConsentRecords", testConsentRecords},
		{"Erase", testErase},
		{"Prune", testPrune},
		{"Subscriptions", testSubscriptions},
		{"SubscriptionLiftsSuppression", testSubscriptionResubscribe},
		{"EraseSubscriptions", testEraseSubscriptions},
		{"SuppressEmail", testSuppressEmail},
		{"BounceSuppressesAddress", testBounceSuppressesAddress},
		{"Close", testClose},
		{"Reopen", testReopen},
		{"SubscriptionsReopen", testSubscriptionsReopen},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
}

// fixture is one subtest's store, clock and helpers.
type fixture struct {
	t     *testing.T
	h     Harness
	ctx   context.Context
	clock *Clock
	opts  *queue.Options
	s     queue.Store
}

// setup opens a store for t with the suite's default options, changed by mods.
func setup(t *testing.T, h Harness, mods ...func(*queue.Options)) *fixture {
	t.Helper()
	clock := NewClock(T0)
	opts := &queue.Options{
		Now:     clock.Now,
		Logger:  slog.New(slog.DiscardHandler),
		Backoff: queue.Backoff{NoJitter: true, Base: time.Second},
	}
	for _, m := range mods {
		m(opts)
	}
	f := &fixture{t: t, h: h, ctx: context.Background(), clock: clock, opts: opts}
	f.s = h.Open(t, opts)
	if f.s == nil {
		t.Fatal("Harness.Open returned nil")
	}
	s := f.s
	t.Cleanup(func() { _ = s.Close() })
	return f
}

// reopen closes the store and opens it again through Harness.Reopen.
func (f *fixture) reopen() {
	f.t.Helper()
	s := f.h.Reopen(f.t, f.s, f.opts)
	if s == nil {
		f.t.Fatal("Harness.Reopen returned nil")
	}
	f.t.Cleanup(func() { _ = s.Close() })
	f.s = s
}

func (f *fixture) grant(tenant, user string) { f.t.Helper(); GrantAll(f.t, f.s, tenant, user) }

func (f *fixture) enqueue(envs ...*envelope.Envelope) []queue.EnqueueResult {
	f.t.Helper()
	res, err := f.s.Enqueue(f.ctx, envs...)
	if err != nil {
		f.t.Fatalf("Enqueue: %v", err)
	}
	if len(res) != len(envs) {
		f.t.Fatalf("Enqueue returned %d results for %d envelopes", len(res), len(envs))
	}
	return res
}

// req returns the suite's default claim request for up to limit rows.
func req(limit int, chans ...envelope.Channel) queue.ClaimRequest {
	return queue.ClaimRequest{Owner: "worker-1", Lease: DefaultLease, Limit: limit, Channels: chans}
}

func (f *fixture) claimReq(r queue.ClaimRequest) []*queue.Lease {
	f.t.Helper()
	ls, err := f.s.Claim(f.ctx, r)
	if err != nil {
		f.t.Fatalf("Claim: %v", err)
	}
	if len(ls) > max(r.Limit, 1) {
		f.t.Fatalf("Claim(limit %d) returned %d leases", r.Limit, len(ls))
	}
	return ls
}

func (f *fixture) claim(limit int, chans ...envelope.Channel) []*queue.Lease {
	f.t.Helper()
	return f.claimReq(req(limit, chans...))
}

// claimOne claims and expects exactly one lease, of envelope id.
func (f *fixture) claimOne(id string) *queue.Lease {
	f.t.Helper()
	ls := f.claim(10)
	if len(ls) != 1 || ls[0].Key.EnvelopeID != id {
		f.t.Fatalf("Claim = %v, want exactly one lease of %q", keys(ls), id)
	}
	return ls[0]
}

// noClaim expects that nothing is claimable now.
func (f *fixture) noClaim(why string) {
	f.t.Helper()
	if ls := f.claim(100); len(ls) != 0 {
		f.t.Fatalf("%s: Claim = %v, want nothing", why, keys(ls))
	}
}

func (f *fixture) recover(limit int) []*queue.Lease {
	f.t.Helper()
	ls, err := f.s.Recover(f.ctx, queue.ClaimRequest{Owner: "rescuer", Lease: DefaultLease, Limit: limit})
	if err != nil {
		f.t.Fatalf("Recover: %v", err)
	}
	return ls
}

func (f *fixture) commit(l *queue.Lease, out queue.Outcome) {
	f.t.Helper()
	if err := f.s.Commit(f.ctx, l, out); err != nil {
		f.t.Fatalf("Commit(%s, %s): %v", l.Key, out.State, err)
	}
}

func (f *fixture) get(tenant, id string) *queue.EnvelopeStatus {
	f.t.Helper()
	st, err := f.s.Get(f.ctx, tenant, id)
	if err != nil {
		f.t.Fatalf("Get(%q, %q): %v", tenant, id, err)
	}
	return st
}

func (f *fixture) seg(tenant, id string, i int) queue.SegmentStatus {
	f.t.Helper()
	st := f.get(tenant, id)
	if i >= len(st.Segments) {
		f.t.Fatalf("Get(%q, %q) has %d segments, want segment %d", tenant, id, len(st.Segments), i)
	}
	if st.Segments[i].Index != i {
		f.t.Fatalf("Get(%q, %q).Segments[%d].Index = %d", tenant, id, i, st.Segments[i].Index)
	}
	return st.Segments[i]
}

// wantState checks a segment's state and (when class is not "-") its class.
func (f *fixture) wantState(tenant, id string, i int, want envelope.State, class envelope.ErrorClass) {
	f.t.Helper()
	s := f.seg(tenant, id, i)
	if s.State != want {
		f.t.Fatalf("%s/%s#%d state = %s, want %s", tenant, id, i, s.State, want)
	}
	if class != "-" && s.Class != class {
		f.t.Fatalf("%s/%s#%d class = %q, want %q", tenant, id, i, s.Class, class)
	}
}

func (f *fixture) wantNotFound(tenant, id string) {
	f.t.Helper()
	if _, err := f.s.Get(f.ctx, tenant, id); !errors.Is(err, queue.ErrNotFound) {
		f.t.Fatalf("Get(%q, %q) error = %v, want ErrNotFound", tenant, id, err)
	}
}

func (f *fixture) nextDue() time.Time {
	f.t.Helper()
	d, err := f.s.NextDue(f.ctx, queue.DueFilter{})
	if err != nil {
		f.t.Fatalf("NextDue: %v", err)
	}
	return d
}

func (f *fixture) wantNextDue(want time.Time) {
	f.t.Helper()
	if got := f.nextDue(); !got.Equal(want) {
		f.t.Fatalf("NextDue = %v, want %v", got, want)
	}
}

func (f *fixture) counts(tenant string) queue.Counts {
	f.t.Helper()
	c, err := f.s.Counts(f.ctx, tenant)
	if err != nil {
		f.t.Fatalf("Counts(%q): %v", tenant, err)
	}
	return c
}

func (f *fixture) consent(tenant, user string) queue.Consent {
	f.t.Helper()
	c, err := f.s.Consent(f.ctx, tenant, user)
	if err != nil {
		f.t.Fatalf("Consent(%q, %q): %v", tenant, user, err)
	}
	return c
}

// drain empties the Notify channel.
func (f *fixture) drain() {
	select {
	case <-f.s.Notify():
	default:
	}
}

// wantNotify waits (bounded) for a Notify signal.
func (f *fixture) wantNotify(after string) {
	f.t.Helper()
	select {
	case <-f.s.Notify():
	case <-time.After(signalWait):
		f.t.Fatalf("no Notify signal after %s", after)
	}
}

func wantErr(t testing.TB, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error = %v, want %v", what, err, target)
	}
}

// keys lists the leases' keys as strings, for messages and comparisons.
func keys(ls []*queue.Lease) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.Key.String()
	}
	return out
}

// key is the string form of a delivery key in the default tenant.
func key(id string, seg int) string {
	return envelope.Key{Tenant: envelope.DefaultTenant, EnvelopeID: id, Segment: seg}.String()
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// jsonOf encodes an envelope for comparisons that do not depend on how a
// store keeps times or raw payload bytes.
func jsonOf(t testing.TB, e *envelope.Envelope) string {
	t.Helper()
	if e == nil {
		t.Fatal("envelope is nil")
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatalf("encode envelope: %v", err)
	}
	return string(b)
}

// withTenant returns a copy of e naming tenant.
func withTenant(e *envelope.Envelope, tenant string) *envelope.Envelope {
	c := *e
	c.TenantID = tenant
	return &c
}

const dflt = envelope.DefaultTenant
