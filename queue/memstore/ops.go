package memstore

import (
	"context"
	"slices"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Get returns one envelope of tenant ("" means the default tenant) with
// its segments and their history. The result is a copy. See queue.Store.
func (s *Store) Get(ctx context.Context, tenant, id string) (*queue.EnvelopeStatus, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	rec, ok := s.envs[envKey{tenantOr(tenant), id}]
	if !ok {
		return nil, queue.ErrNotFound
	}
	st := &queue.EnvelopeStatus{
		Tenant:     rec.env.TenantID,
		ID:         rec.env.ID,
		UserID:     rec.env.UserID,
		Channel:    rec.env.Channel,
		Template:   rec.env.Template,
		EnqueuedAt: rec.enqueuedAt,
		Segments:   make([]queue.SegmentStatus, len(rec.rows)),
		Envelope:   rec.env.Clone(),
	}
	for i, r := range rec.rows {
		st.Segments[i] = r.Segment(r.index)
	}
	st.Status = queue.Aggregate(st.Segments)
	return st, nil
}

// List returns the rows matching f in enqueue order (then segment order),
// at most f.Limit (default 50, at most 1000) per page. See queue.Store.
func (s *Store) List(ctx context.Context, f queue.ListFilter) (*queue.Page, error) {
	var (
		cseq uint64
		cseg = -1
	)
	if f.Cursor != "" {
		var err error
		if cseq, cseg, err = queue.DecodeCursor(f.Cursor); err != nil {
			return nil, err
		}
	}
	limit := queue.PageLimit(f)

	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	start, _ := slices.BinarySearchFunc(s.order, cseq, func(e *envRec, seq uint64) int {
		switch {
		case e.seq < seq:
			return -1
		case e.seq > seq:
			return 1
		}
		return 0
	})
	page := &queue.Page{Rows: []queue.Row{}}
	for _, rec := range s.order[start:] {
		e := rec.env
		if (f.Tenant != "" && e.TenantID != f.Tenant) || (f.Channel != "" && e.Channel != f.Channel) {
			continue
		}
		for _, r := range rec.rows {
			if rec.seq == cseq && r.index <= cseg {
				continue
			}
			if f.State != "" && r.State != f.State {
				continue
			}
			if len(page.Rows) == limit {
				last := page.Rows[limit-1]
				lastRec := s.envs[envKey{last.Key.Tenant, last.Key.EnvelopeID}]
				page.Next = queue.EncodeCursor(lastRec.seq, last.Key.Segment)
				return page, nil
			}
			page.Rows = append(page.Rows, queue.Row{
				Key:       envelope.Key{Tenant: e.TenantID, EnvelopeID: e.ID, Segment: r.index},
				UserID:    e.UserID,
				Channel:   e.Channel,
				State:     r.State,
				Attempts:  r.Attempts,
				Class:     r.Class,
				UpdatedAt: r.Updated,
			})
		}
	}
	return page, nil
}

// Counts returns the number of rows per state and channel of tenant ("" =
// every tenant). See queue.Store.
func (s *Store) Counts(ctx context.Context, tenant string) (queue.Counts, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	c := queue.Counts{}
	for _, rec := range s.order {
		if tenant != "" && rec.env.TenantID != tenant {
			continue
		}
		for _, r := range rec.rows {
			m := c[r.State]
			if m == nil {
				m = map[envelope.Channel]int{}
				c[r.State] = m
			}
			m[rec.env.Channel]++
		}
	}
	return c, nil
}

// Requeue returns the envelope's dead_letter, unresolved, expired and
// suppressed segments to pending (queue.Requeue). See queue.Store.
func (s *Store) Requeue(ctx context.Context, tenant, id string) error {
	return s.operatorEnv(ctx, tenant, id, func(rec *envRec, rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		c, found, err := s.consentOf(ctx, rec.env.TenantID, rec.env.UserID)
		if err != nil {
			return nil, err
		}
		return queue.Requeue(rows, queue.Judge(rec.env, c, found, s.addressOf(rec.env), now), now)
	})
}

// Resolve settles the envelope's unresolved segments as sent or retryable
// (queue.Resolve). See queue.Store.
func (s *Store) Resolve(ctx context.Context, tenant, id string, as envelope.State) error {
	if err := queue.CheckResolve(as); err != nil {
		return err
	}
	return s.operator(ctx, tenant, id, func(rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		return queue.Resolve(rows, as, now)
	})
}

func (s *Store) operator(ctx context.Context, tenant, id string, step func([]queue.Delivery, time.Time) (*queue.Step, error)) error {
	return s.operatorEnv(ctx, tenant, id, func(_ *envRec, rows []queue.Delivery, now time.Time) (*queue.Step, error) { return step(rows, now) })
}

func (s *Store) operatorEnv(ctx context.Context, tenant, id string, step func(*envRec, []queue.Delivery, time.Time) (*queue.Step, error)) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	rec, ok := s.envs[envKey{tenantOr(tenant), id}]
	if !ok {
		return queue.ErrNotFound
	}
	now := s.now()
	st, err := step(rec, rowsOf(rec), now)
	if err != nil {
		return err
	}
	s.apply(rec, st, now)
	return nil
}

// Consent returns the user's consent record in tenant (the zero Consent
// when there is none), as a copy. See queue.Store.
func (s *Store) Consent(ctx context.Context, tenant, userID string) (queue.Consent, error) {
	if err := s.lock(ctx); err != nil {
		return queue.Consent{}, err
	}
	defer s.mu.Unlock()
	c, ok := s.consent[userKey{tenantOr(tenant), userID}]
	if !ok {
		return queue.Consent{}, nil
	}
	out := *c
	out.Suppressions = slices.Clone(c.Suppressions)
	return out, nil
}

// SetConsent replaces the user's consent flags, keeping the suppressions.
func (s *Store) SetConsent(ctx context.Context, tenant, userID string, f queue.ConsentFlags) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	k := userKey{tenantOr(tenant), userID}
	c := s.consent[k]
	if c == nil {
		c = &queue.Consent{}
		s.consent[k] = c
	}
	c.Set(f, s.now())
	return nil
}

// LiftSuppression lifts the user's suppressions of ch (and target). See
// queue.Store.
func (s *Store) LiftSuppression(ctx context.Context, tenant, userID string, ch envelope.Channel, target string) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	c := s.consent[userKey{tenantOr(tenant), userID}]
	if c == nil || !c.Lift(ch, target, "operator", s.now()) {
		return queue.ErrNotFound
	}
	return nil
}

// Suppress adds a suppression to the user's consent record; one that
// repeats a channel and target already suppressed is not added again.
func (s *Store) Suppress(ctx context.Context, tenant, userID string, sup queue.Suppression) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	if err := queue.CheckSuppression(sup); err != nil {
		return err
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	now := s.now()
	if sup.At.IsZero() {
		sup.At = now
	}
	s.suppress(userKey{tenantOr(tenant), userID}, sup, now)
	return nil
}

func (s *Store) suppress(k userKey, sup queue.Suppression, now time.Time) {
	c := s.consent[k]
	if c == nil {
		c = &queue.Consent{}
		s.consent[k] = c
	}
	c.UpdatedAt = now
	c.Add(sup)
}

// Erase deletes the user's envelopes, rows and consent record in tenant.
// Leases on erased rows can no longer commit (ErrLeaseLost).
func (s *Store) Erase(ctx context.Context, tenant, userID string) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	tenant = tenantOr(tenant)
	s.remove(func(rec *envRec) bool { return rec.env.TenantID == tenant && rec.env.UserID == userID })
	delete(s.consent, userKey{tenant, userID})
	delete(s.subs, userKey{tenant, userID})
	return nil
}

// remove deletes every envelope for which drop is true and returns how
// many it deleted.
func (s *Store) remove(drop func(*envRec) bool) int {
	n := 0
	s.order = slices.DeleteFunc(s.order, func(rec *envRec) bool {
		if !drop(rec) {
			return false
		}
		for _, r := range rec.rows {
			r.removed = true
			delete(s.leased, r)
		}
		delete(s.envs, rec.key())
		n++
		return true
	})
	return n
}

// Prune deletes the envelopes whose rows are all terminal and were last
// updated at least the retention period ago. See queue.Store.
func (s *Store) Prune(ctx context.Context) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	cutoff := s.now().Add(-s.retention)
	return s.remove(func(rec *envRec) bool {
		for _, r := range rec.rows {
			if !r.State.Terminal() || r.Updated.After(cutoff) {
				return false
			}
		}
		return true
	}), nil
}

// Close releases the store; every later call returns queue.ErrClosed.
// Closing again returns nil.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
