package queue

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/internal/applog"
)

func offerReq() ClaimRequest {
	return ClaimRequest{Owner: "w1", Lease: time.Minute, Lazy: true, Channels: []envelope.Channel{envelope.ChannelTelegram}}
}

func handed(t *testing.T, o *Offer) *Lease {
	t.Helper()
	select {
	case l := <-o.C:
		return l
	default:
		t.Fatal("the Enqueue handed nothing to the offer")
		return nil
	}
}

// An Enqueue leases a new envelope to an idle worker's offer before
// appending it: the lease is durable-waitable, then indexed as a claim
// would be (sending, one attempt, a fence), and commits like one.
func TestHandOff_LeasesTheEnvelopeBeforeItIsIndexed(t *testing.T) {
	q := openFault(t, t.TempDir())
	ctx := context.Background()
	o, err := q.Offer(offerReq())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, faultEnvelope("e1", "u1")); err != nil {
		t.Fatal(err)
	}
	l := handed(t, o)
	if !l.HandedOff() || l.Owner != "w1" || l.Attempt != 1 || l.Key.EnvelopeID != "e1" || l.Envelope == nil || l.Segments != 1 {
		t.Fatalf("lease = %+v", l)
	}
	if err := l.WaitDurable(ctx); err != nil {
		t.Fatal(err)
	}
	if o.Withdraw() {
		t.Fatal("Withdraw after a hand-off reported the offer still open")
	}
	// No claim finds it: it is leased already.
	if ls, err := q.Claim(ctx, ClaimRequest{Owner: "w2", Lease: time.Minute}); err != nil || len(ls) != 0 {
		t.Fatalf("Claim = %v, %v; want nothing (the row is leased to the offer)", ls, err)
	}
	st, err := q.Get(ctx, "", "e1")
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Segments[0]; s.State != envelope.StateSending || s.Attempts != 1 {
		t.Fatalf("row = %+v, want sending with one attempt", s)
	}
	if err := q.Commit(ctx, l, Outcome{State: envelope.StateSent, Receipt: "r1"}); err != nil {
		t.Fatal(err)
	}
	if st, _ := q.Get(ctx, "", "e1"); st.Status != StatusDelivered {
		t.Fatalf("status = %s, want delivered", st.Status)
	}
	if rep, err := q.Check(); err != nil || !rep.OK() {
		t.Fatalf("Check = %+v, %v", rep, err)
	}
	// A second commit of the same lease is stale, as for a claim.
	if err := q.Commit(ctx, l, Outcome{State: envelope.StateSent}); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("second Commit = %v, want ErrLeaseLost", err)
	}
}

// What an offer does not take: another channel or tenant, an envelope not
// due yet or expired, a batch, a duplicate; and nothing after Withdraw.
func TestHandOff_OnlyWhatTheOfferMatches(t *testing.T) {
	q := openFault(t, t.TempDir())
	ctx := context.Background()
	now := time.Now()
	later := faultEnvelope("later", "u1")
	later.NotBefore = now.Add(time.Hour)
	expired := faultEnvelope("expired", "u1")
	expired.ExpiresAt = now.Add(-time.Second)
	other := faultEnvelope("other", "u1")
	other.TenantID = "acme"
	req := offerReq()
	req.Tenant = envelope.DefaultTenant
	o, err := q.Offer(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, faultEnvelope("dup", "u1")); err != nil {
		t.Fatal(err)
	}
	handed(t, o) // the first one
	o, _ = q.Offer(req)
	for _, e := range []*envelope.Envelope{later, expired, other} {
		if _, err := q.Enqueue(ctx, e); err != nil {
			t.Fatalf("%s: %v", e.ID, err)
		}
	}
	if _, err := q.Enqueue(ctx, faultEnvelope("b1", "u1"), faultEnvelope("b2", "u2")); err != nil {
		t.Fatal(err)
	}
	if res, err := q.Enqueue(ctx, faultEnvelope("dup", "u1")); err != nil || !res[0].Duplicate {
		t.Fatalf("duplicate enqueue: %v, %v", res, err)
	}
	select {
	case l := <-o.C:
		t.Fatalf("handed %s, want nothing", l.Key.EnvelopeID)
	default:
	}
	if !o.Withdraw() {
		t.Fatal("Withdraw of an untaken offer reported a hand-off")
	}
	// An offer for e-mail only takes no chat reply.
	emailOnly := offerReq()
	emailOnly.Channels = []envelope.Channel{envelope.ChannelEmail}
	eo, _ := q.Offer(emailOnly)
	if _, err := q.Enqueue(ctx, faultEnvelope("chat", "u1")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-eo.C:
		t.Fatal("an e-mail offer was handed a chat reply")
	default:
	}
	eo.Withdraw()
	if _, err := q.Enqueue(ctx, faultEnvelope("after", "u1")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-o.C:
		t.Fatal("a withdrawn offer was handed an envelope")
	default:
	}
	if _, err := q.Offer(ClaimRequest{Owner: "w", Lease: time.Minute}); err == nil {
		t.Fatal("Offer accepted a claimer that is not lazy (providers not idempotent)")
	}
}

// The enqueue fails after the hand-off (the log's fsync fails): the worker
// learns there is nothing to deliver, and nothing is indexed.
func TestHandOff_FailedAppendLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	ctx := context.Background()
	o, _ := q.Offer(offerReq())
	q.app = applog.NewAppender(dir, func(*os.File) error { return syscall.EIO })
	if _, err := q.Enqueue(ctx, faultEnvelope("lost", "u1")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Enqueue = %v, want EIO", err)
	}
	l := handed(t, o)
	if err := l.WaitDurable(ctx); !errors.Is(err, ErrNotStored) {
		t.Fatalf("WaitDurable = %v, want ErrNotStored", err)
	}
	if err := q.Commit(ctx, l, Outcome{State: envelope.StateSent}); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Commit = %v, want ErrLeaseLost", err)
	}
	if n := rows(t, q); n != 0 {
		t.Fatalf("%d rows, want none", n)
	}
}

// A worker that stops before calling gives the lease back: the row is
// pending and claimable again, its attempt returned.
func TestHandOff_ReleaseMakesTheRowClaimable(t *testing.T) {
	q := openFault(t, t.TempDir())
	ctx := context.Background()
	o, _ := q.Offer(offerReq())
	if _, err := q.Enqueue(ctx, faultEnvelope("e1", "u1")); err != nil {
		t.Fatal(err)
	}
	l := handed(t, o)
	if err := q.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	ls, err := q.Claim(ctx, ClaimRequest{Owner: "w2", Lease: time.Minute})
	if err != nil || len(ls) != 1 || ls[0].Attempt != 1 {
		t.Fatalf("Claim after Release = %v, %v; want the row, attempt 1", ls, err)
	}
}
