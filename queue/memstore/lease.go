package memstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Claim leases up to req.Limit eligible rows, oldest due first (then in
// enqueue order). Rows past their envelope's expires_at become expired and
// rows that current consent forbids become suppressed; neither is returned.
// See queue.Store.
func (s *Store) Claim(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	req, err := checkClaim(req)
	if err != nil {
		return nil, err
	}
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := s.now()

	// Take due rows off the schedule in order; decide first, then apply,
	// so that a failing consent source leaves every row as it was.
	type decision struct {
		r     *row
		to    envelope.State
		class envelope.ErrorClass
	}
	var (
		plan    []decision
		popped  []*entry // every entry taken off the schedule
		skipped []*entry // ... of rows outside the request's filter
		taken   int
	)
	cc := consentCache{s: s}
	for taken < req.Limit {
		ent := s.popDue(now)
		if ent == nil {
			break
		}
		popped = append(popped, ent)
		r := ent.r
		if !matches(&req, r) {
			skipped = append(skipped, ent)
			continue
		}
		e := r.env.env
		if !e.ExpiresAt.IsZero() && !now.Before(e.ExpiresAt) {
			plan = append(plan, decision{r, envelope.StateExpired, envelope.ClassExpired})
			continue
		}
		ok, class, err := cc.allows(ctx, e)
		if err != nil {
			s.pushBack(popped)
			return nil, err
		}
		if !ok {
			plan = append(plan, decision{r, envelope.StateSuppressed, class})
			continue
		}
		plan = append(plan, decision{r, envelope.StateSending, ""})
		taken++
	}
	s.pushBack(skipped)

	leases := make([]*queue.Lease, 0, taken)
	for _, d := range plan {
		r := d.r
		if d.to != envelope.StateSending {
			s.setState(r, d.to, now)
			r.class = d.class
			r.record(now, r.attempts, d.to, d.class)
			s.settleLater(r, d.to, d.class, now)
			continue
		}
		r.claimedFrom = r.state
		s.setState(r, envelope.StateSending, now)
		r.attempts++
		s.fence++
		r.fence = s.fence
		r.owner = req.Owner
		r.leaseEnd = now.Add(req.Lease)
		r.expireToPending = req.ExpireToPending
		leases = append(leases, s.lease(r))
	}
	return leases, nil
}

func (s *Store) lease(r *row) *queue.Lease {
	rec := r.env
	return &queue.Lease{
		Key:        envelope.Key{Tenant: rec.env.TenantID, EnvelopeID: rec.env.ID, Segment: r.index},
		UserID:     rec.env.UserID,
		Channel:    rec.env.Channel,
		Owner:      r.owner,
		Fence:      r.fence,
		Attempt:    r.attempts,
		ExpiresAt:  r.leaseEnd,
		Segments:   len(rec.rows),
		EnqueuedAt: rec.enqueuedAt,
		Envelope:   cloneEnvelope(rec.env),
	}
}

// holder returns the row a lease holds, or why it does not hold it.
func (s *Store) holder(l *queue.Lease) (*row, error) {
	rec, ok := s.envs[envKey{l.Key.Tenant, l.Key.EnvelopeID}]
	if !ok || l.Key.Segment < 0 || l.Key.Segment >= len(rec.rows) {
		return nil, queue.ErrLeaseLost
	}
	r := rec.rows[l.Key.Segment]
	switch {
	case r.fence != l.Fence:
		return nil, queue.ErrStaleFence
	case r.state != envelope.StateSending:
		return nil, queue.ErrLeaseLost
	case r.owner != l.Owner:
		return nil, queue.ErrStaleFence
	}
	return r, nil
}

var errNilLease = errors.New("queue: nil lease")

// Commit applies out to the leased row and its effects in one step. See
// queue.Store.
func (s *Store) Commit(ctx context.Context, lease *queue.Lease, out queue.Outcome) error {
	if lease == nil {
		return errNilLease
	}
	if !queue.ValidOutcome(out.State) {
		return fmt.Errorf("commit %q: %w", out.State, queue.ErrInvalidTransition)
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	r, err := s.holder(lease)
	if err != nil {
		return err
	}
	now := s.now()
	attempt := r.attempts
	to, due := s.backoff.Decide(out, r.attempts-r.budget, now)
	if to == envelope.StateRetryable && out.NoAttempt && r.attempts > 0 {
		r.attempts--
	}
	class := out.Class
	switch to {
	case envelope.StateSent:
		class = ""
		r.receipt = out.Receipt
	case envelope.StateBounced:
		class = cmpOr(class, envelope.ClassBounced)
	case envelope.StateComplaint:
		class = cmpOr(class, envelope.ClassComplaint)
	case envelope.StateSuppressed:
		class = cmpOr(class, envelope.ClassUnsubscribed)
	}
	s.setState(r, to, now)
	r.class = class
	r.record(now, attempt, to, class)
	switch {
	case to == envelope.StateSent:
		s.advance(r, now)
	case to == envelope.StateRetryable:
		s.setDue(r, due)
		if !due.After(now) {
			s.wake()
		}
	case queue.Suppressing(to):
		env := r.env.env
		s.addSuppression(userKey{env.TenantID, env.UserID}, queue.SuppressionFor(env, class, now), now)
		s.settleLater(r, envelope.StateSuppressed, class, now)
	case to == envelope.StateExpired:
		s.settleLater(r, envelope.StateExpired, class, now)
	}
	return nil
}

func cmpOr(c, def envelope.ErrorClass) envelope.ErrorClass {
	if c == "" {
		return def
	}
	return c
}

// Release gives back a lease whose provider call never started: the row
// returns to the state it was claimed from, due now, and the attempt is
// not counted. A lease from Recover (whose reconciliation never started)
// goes back to an expired lease, to be recovered again. See queue.Store.
func (s *Store) Release(ctx context.Context, lease *queue.Lease) error {
	if lease == nil {
		return errNilLease
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	r, err := s.holder(lease)
	if err != nil {
		return err
	}
	now := s.now()
	if r.recovered {
		r.owner = ""
		r.leaseEnd = now
		r.recovered = false
		r.updatedAt = now
		s.wake()
		return nil
	}
	if r.attempts > 0 {
		r.attempts--
	}
	s.setState(r, r.claimedFrom, now)
	s.setDue(r, now)
	s.wake()
	return nil
}

// Recover leases up to req.Limit rows whose lease expired, for
// reconciliation; rows claimed with ExpireToPending go back to pending
// instead. See queue.Store.
func (s *Store) Recover(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	req, err := checkClaim(req)
	if err != nil {
		return nil, err
	}
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := s.now()

	var exp []*row
	for r := range s.leased {
		if !r.leaseEnd.After(now) && matches(&req, r) {
			exp = append(exp, r)
		}
	}
	slices.SortFunc(exp, byTime(func(r *row) time.Time { return r.leaseEnd }))

	var leases []*queue.Lease
	for _, r := range exp {
		if r.expireToPending {
			s.setState(r, envelope.StatePending, now)
			s.setDue(r, now)
			r.record(now, r.attempts, envelope.StatePending, envelope.ClassInterrupted)
			s.wake()
			continue
		}
		if len(leases) == req.Limit {
			continue
		}
		s.fence++
		r.fence = s.fence
		r.owner = req.Owner
		r.leaseEnd = now.Add(req.Lease)
		r.recovered = true
		r.updatedAt = now
		leases = append(leases, s.lease(r))
	}
	return leases, nil
}

// NextDue returns the earliest due time of an eligible row or lease expiry
// of a sending row; the zero time when there is none. See queue.Store.
func (s *Store) NextDue(ctx context.Context) (time.Time, error) {
	if err := s.lock(ctx); err != nil {
		return time.Time{}, err
	}
	defer s.mu.Unlock()
	var next time.Time
	if e := s.top(); e != nil {
		next = e.due
	}
	for r := range s.leased {
		if next.IsZero() || r.leaseEnd.Before(next) {
			next = r.leaseEnd
		}
	}
	return next, nil
}

// Notify returns a channel (buffer 1, coalesced) that receives a value
// whenever rows may have become claimable: new rows, a release, a retry
// due at once, a sent segment unblocking the next, a requeue or resolve.
func (s *Store) Notify() <-chan struct{} { return s.notify }
