package memstore

import (
	"context"
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
	req, err := req.Checked()
	if err != nil {
		return nil, err
	}
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := s.now()

	// Take due rows off the schedule in order and judge them all first, so
	// that a failing consent source leaves every row as it was.
	type decision struct {
		r *row
		v queue.Verdict
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
		c, found, err := cc.get(ctx, r.env.env)
		if err != nil {
			s.pushBack(popped)
			return nil, err
		}
		v := queue.Judge(r.env.env, c, found, s.addressOf(r.env.env), now)
		plan = append(plan, decision{r, v})
		if v.State == envelope.StateSending {
			taken++
		}
	}
	s.pushBack(skipped)

	leases := make([]*queue.Lease, 0, taken)
	for _, d := range plan {
		r := d.r
		st, err := queue.Claim(rowsOf(r.env), r.index, d.v, req, s.nextFence, now)
		if err != nil {
			return nil, err
		}
		s.apply(r.env, st, now)
		if d.v.State == envelope.StateSending {
			leases = append(leases, s.lease(r))
		}
	}
	return leases, nil
}

func (s *Store) nextFence() uint64 {
	s.fence++
	return s.fence
}

func (s *Store) lease(r *row) *queue.Lease {
	rec := r.env
	return &queue.Lease{
		Key:        envelope.Key{Tenant: rec.env.TenantID, EnvelopeID: rec.env.ID, Segment: r.index},
		UserID:     rec.env.UserID,
		Channel:    rec.env.Channel,
		Owner:      r.Owner,
		Fence:      r.Fence,
		Attempt:    r.Attempts,
		ExpiresAt:  r.LeaseEnd,
		Segments:   len(rec.rows),
		EnqueuedAt: rec.enqueuedAt,
		Envelope:   rec.env.Clone(),
	}
}

// envOf returns the envelope a lease names, or ErrLeaseLost.
func (s *Store) envOf(l *queue.Lease) (*envRec, error) {
	rec, ok := s.envs[envKey{l.Key.Tenant, l.Key.EnvelopeID}]
	if !ok || l.Key.Segment < 0 || l.Key.Segment >= len(rec.rows) {
		return nil, queue.ErrLeaseLost
	}
	return rec, nil
}

var errNilLease = fmt.Errorf("queue: nil lease: %w", queue.ErrLeaseLost)

// Commit applies out to the leased row and its effects in one step. See
// queue.Store.
func (s *Store) Commit(ctx context.Context, lease *queue.Lease, out queue.Outcome) error {
	if !queue.ValidOutcome(out.State) {
		return fmt.Errorf("%w: cannot commit %q", queue.ErrInvalidTransition, out.State)
	}
	return s.withLease(ctx, lease, func(rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		return queue.Commit(s.backoff, rows, lease, out, now)
	})
}

// Release gives back a lease whose provider call never started. See
// queue.Store.
func (s *Store) Release(ctx context.Context, lease *queue.Lease) error {
	return s.withLease(ctx, lease, func(rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		return queue.Release(rows, lease, now)
	})
}

func (s *Store) withLease(ctx context.Context, lease *queue.Lease, step func([]queue.Delivery, time.Time) (*queue.Step, error)) error {
	if lease == nil {
		return errNilLease
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	rec, err := s.envOf(lease)
	if err != nil {
		return err
	}
	now := s.now()
	st, err := step(rowsOf(rec), now)
	if err != nil {
		return err
	}
	s.apply(rec, st, now)
	return nil
}

// Recover leases up to req.Limit rows whose lease expired, for
// reconciliation; rows claimed with ExpireToPending go back to pending
// instead. See queue.Store.
func (s *Store) Recover(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	req, err := req.Checked()
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
		if queue.LeaseExpired(&r.Delivery, now) && matches(&req, r) {
			exp = append(exp, r)
		}
	}
	slices.SortFunc(exp, byTime(func(r *row) time.Time { return r.LeaseEnd }))

	var leases []*queue.Lease
	for _, r := range exp {
		if !r.ToPending && len(leases) == req.Limit {
			continue
		}
		st, leased, err := queue.Recover(rowsOf(r.env), r.index, req, s.nextFence, now)
		if err != nil {
			return nil, err
		}
		s.apply(r.env, st, now)
		if leased {
			leases = append(leases, s.lease(r))
		}
	}
	return leases, nil
}

// NextDue returns the earliest due time of an eligible row or lease expiry
// of a sending row; the zero time when there is none. See queue.Store.
func (s *Store) NextDue(ctx context.Context, f queue.DueFilter) (time.Time, error) {
	if err := s.lock(ctx); err != nil {
		return time.Time{}, err
	}
	defer s.mu.Unlock()
	req := queue.ClaimRequest{Tenant: f.Tenant, Channels: f.Channels}
	var next time.Time
	earlier := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	if e := s.top(); e != nil && matches(&req, e.r) {
		next = e.due
	} else if e != nil {
		for _, e := range s.sched { // a filter the earliest row fails: look at them all
			if e.valid() && matches(&req, e.r) {
				earlier(e.due)
			}
		}
	}
	for r := range s.leased {
		if matches(&req, r) {
			earlier(r.LeaseEnd)
		}
	}
	return next, nil
}

// Notify returns a channel (buffer 1, coalesced) that receives a value
// whenever rows may have become claimable: new rows, a release, a retry
// due at once, a sent segment unblocking the next, a requeue or resolve.
func (s *Store) Notify() <-chan struct{} { return s.notify }
