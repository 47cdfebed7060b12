package queue

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// Hand-off: an idle worker whose providers redeliver idempotently may
// stand ready for the next envelope. An in-process Enqueue that the offer
// matches then leases the envelope's first row to it before appending, so
// that the worker renders while the record is synced and calls the
// provider as soon as the record is durable, while the writer indexes the
// row (already leased to the worker). A crash between that call and the
// index commit loses the lease: the row is indexed pending on the next
// Open and delivered again under the same key, which the provider
// deduplicates, as it does for a lazy claim lost to a machine crash.

// An Offer is an idle worker's standing claim (see Queue.Offer).
type Offer struct {
	q   *Queue
	req ClaimRequest
	// C receives at most one lease.
	C chan *Lease
}

// handoff is the state a handed-off lease shares with its Enqueue and
// the writer.
type handoff struct {
	durable chan struct{} // closed once the record is durable, or failed (durErr)
	durErr  error
	indexed chan struct{} // closed once the index update committed, or failed (idxErr)
	idxErr  error
}

// ErrNotStored is Lease.WaitDurable's error when the Enqueue that handed
// the lease over failed: there is nothing to deliver, commit or release.
var ErrNotStored = errors.New("queue: the handed-off envelope was not stored")

// Offer registers req (owner, lease, channels, tenant; Lazy must be set:
// its providers redeliver idempotently) as standing ready for the next
// envelope an in-process Enqueue appends that it matches: due now, one of
// req.Channels, req.Tenant's. The lease arrives on the offer's C; Withdraw
// ends the offer. A worker makes at most one offer at a time.
func (q *Queue) Offer(req ClaimRequest) (*Offer, error) {
	if req.Owner == "" || req.Lease <= 0 {
		return nil, errors.New("queue: an offer needs an owner and a lease duration")
	}
	if !req.Lazy || req.ExpireToPending {
		return nil, errors.New("queue: only a lazy claimer (idempotent providers) can take hand-offs")
	}
	if q.isClosed() {
		return nil, ErrClosed
	}
	o := &Offer{q: q, req: req, C: make(chan *Lease, 1)}
	q.offerMu.Lock()
	q.offers = append(q.offers, o)
	q.offerMu.Unlock()
	return o, nil
}

// Withdraw ends the offer. It reports false when a lease was handed over
// first: it is then in C, and the caller owns it (deliver it, or Release
// it).
func (o *Offer) Withdraw() bool {
	q := o.q
	q.offerMu.Lock()
	defer q.offerMu.Unlock()
	i := slices.Index(q.offers, o)
	if i < 0 {
		return false
	}
	q.offers = slices.Delete(q.offers, i, i+1)
	return true
}

// handOff leases it to a matching offer, if any, before it is appended.
func (q *Queue) handOff(it *prepared, now time.Time) {
	e := it.env
	if e.NotBefore.After(now) || (!e.ExpiresAt.IsZero() && !now.Before(e.ExpiresAt)) {
		return
	}
	q.offerMu.Lock()
	defer q.offerMu.Unlock()
	for i, o := range q.offers {
		if (o.req.Tenant != "" && o.req.Tenant != e.TenantID) || (len(o.req.Channels) > 0 && !containsChannel(o.req.Channels, e.Channel)) {
			continue
		}
		q.offers = slices.Delete(q.offers, i, i+1)
		l := &Lease{
			Envelope:   cloneEnvelope(e),
			Key:        envelope.Key{Tenant: e.TenantID, EnvelopeID: e.ID},
			UserID:     e.UserID,
			Channel:    e.Channel,
			Owner:      o.req.Owner,
			Attempt:    1,
			ExpiresAt:  now.Add(o.req.Lease),
			Segments:   it.segs,
			EnqueuedAt: now,
			ho:         &handoff{durable: make(chan struct{}), indexed: make(chan struct{})},
		}
		it.lease = l
		o.C <- l // buffered, and an offer is handed one lease at most
		q.m.handoffs.Inc()
		return
	}
}

// stored settles a handed-off lease's durability: err is the append's.
func (l *Lease) stored(err error) {
	l.ho.durErr = err
	close(l.ho.durable)
}

// settle ends a handed-off lease's wait for its index update (err: the
// update's, or the append's when there is none).
func (l *Lease) settle(err error) {
	l.ho.idxErr = err
	close(l.ho.indexed)
}

// WaitDurable returns once the envelope of a handed-off lease is on
// stable storage; an error means its Enqueue failed and there is nothing
// to deliver, commit or release. For any other lease it returns nil at
// once. Call it before the provider.
func (l *Lease) WaitDurable(ctx context.Context) error {
	if l.ho == nil {
		return nil
	}
	select {
	case <-l.ho.durable:
		if l.ho.durErr != nil {
			return ErrNotStored
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// HandedOff reports whether l was handed over by an Enqueue (Offer)
// rather than claimed.
func (l *Lease) HandedOff() bool { return l.ho != nil }

// awaitIndexed waits, for a handed-off lease, until the writer has indexed
// its row (and so issued its fence).
func (q *Queue) awaitIndexed(ctx context.Context, l *Lease) error {
	if l.ho == nil {
		return nil
	}
	select {
	case <-l.ho.indexed:
	default:
		q.flushIndex()
		select {
		case <-l.ho.indexed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if l.ho.idxErr != nil || l.Fence == 0 {
		return ErrLeaseLost
	}
	return nil
}
