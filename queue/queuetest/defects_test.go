package queuetest_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// flaw names the one rule a brokenStore breaks.
type flaw int

const (
	noFlaw flaw = iota // the wrapper alone: the control of the suite's check
	segmentEarly
	releaseCounts
	requeueNoSuppressed
	nextDueNoLeases
	nextDueUnfiltered // NextDue ignores its filter: another tenant's or channel's rows hide a worker's own
	countsAfterErase
	staleAccepted
	noExpireToPending
	batchDupNew
	commitNoFence        // a commit with a stale lease is applied to the row's current lease
	claimExpired         // the store never sees expires_at: Claim hands out expired rows
	requeueAllDue        // Requeue makes every requeued segment due at once, not only the first
	pruneLive            // Prune also deletes old envelopes whose rows are not all final
	eraseKeepsConsent    // Erase leaves the consent record (flags and suppressions)
	releaseRecovered     // Release of a recovery lease hands the row out for delivery again
	requeueNoBudget      // Requeue gives no fresh attempt budget
	saveKeepsSuppression // SaveSubscription does not lift the endpoint's push suppression
	saveNoReplace        // SaveSubscription of a known endpoint keeps the old keys
	deleteUnknownOK      // DeleteSubscription of an unknown endpoint succeeds
	eraseKeepsSubs       // Erase leaves the push subscriptions
	suppressEmailTenants // SuppressEmail reaches the users of every tenant
	suppressEmailUsers   // SuppressEmail suppresses the address only for the users with an envelope to it (the rule before address suppressions)
	bounceUserOnly       // a committed bounce of an e-mail suppresses the address for its user only
)

// envID names an envelope.
type envID struct{ tenant, id string }

func idOf(k envelope.Key) envID { return envID{k.Tenant, k.EnvelopeID} }

// brokenStore wraps the in-memory store and breaks one rule of the
// contract, through the Store interface only.
type brokenStore struct {
	queue.Store
	flaw flaw
	opts queue.Options // with defaults

	mu        sync.Mutex
	extra     map[envelope.Key]int         // releaseCounts: attempts not given back
	erase     int                          // countsAfterErase: erasures so far
	latest    map[envelope.Key]queue.Lease // commitNoFence: the last lease of each row
	recovered map[envelope.Key]uint64      // releaseRecovered: fences of recovery leases
	expires   map[envID]time.Time          // claimExpired: the expires_at the store did not get
	requeued  map[envID]bool               // requeueAllDue, requeueNoBudget: envelopes requeued
	hidden    map[envID]bool               // pruneLive: envelopes "pruned" with live rows
}

func broken(f flaw) queuetest.Harness {
	return queuetest.Harness{Open: func(t testing.TB, opts *queue.Options) queue.Store {
		return &brokenStore{
			Store: memstore.New(opts), flaw: f, opts: opts.WithDefaults(),
			extra: map[envelope.Key]int{}, latest: map[envelope.Key]queue.Lease{}, recovered: map[envelope.Key]uint64{},
			expires: map[envID]time.Time{}, requeued: map[envID]bool{}, hidden: map[envID]bool{},
		}
	}}
}

func (b *brokenStore) adjust(ls []*queue.Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range ls {
		l.Attempt += b.extra[l.Key]
	}
}

func (b *brokenStore) isRequeued(id envID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.requeued[id]
}

func (b *brokenStore) isHidden(id envID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hidden[id]
}

// restoreExpiry puts back the expires_at claimExpired kept from the store.
func (b *brokenStore) restoreExpiry(e *envelope.Envelope) {
	if e == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if at, ok := b.expires[envID{e.Tenant(), e.ID}]; ok {
		e.ExpiresAt = at
	}
}

// allRows pages through every row of the store.
func (b *brokenStore) allRows(ctx context.Context) ([]queue.Row, error) {
	var rows []queue.Row
	f := queue.ListFilter{Limit: 1000}
	for {
		p, err := b.Store.List(ctx, f)
		if err != nil {
			return nil, err
		}
		rows = append(rows, p.Rows...)
		if p.Next == "" {
			return rows, nil
		}
		f.Cursor = p.Next
	}
}

func (b *brokenStore) Claim(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	if b.flaw == noExpireToPending {
		req.ExpireToPending = false
	}
	ls, err := b.Store.Claim(ctx, req)
	switch b.flaw {
	case releaseCounts:
		b.adjust(ls)
	case segmentEarly:
		// Hand out the next segment too, while this one is sending.
		for _, l := range ls {
			if l.Key.Segment+1 < l.Segments {
				c := *l
				c.Key.Segment++
				ls = append(ls, &c)
				break
			}
		}
	case commitNoFence:
		b.mu.Lock()
		for _, l := range ls {
			b.latest[l.Key] = *l
		}
		b.mu.Unlock()
	case claimExpired:
		for _, l := range ls {
			b.restoreExpiry(l.Envelope)
		}
	case requeueAllDue:
		// The later segments of a requeued envelope are due with the
		// first: they go out together.
		for _, l := range slices.Clone(ls) {
			if !b.isRequeued(idOf(l.Key)) {
				continue
			}
			st, gerr := b.Store.Get(ctx, l.Key.Tenant, l.Key.EnvelopeID)
			if gerr != nil {
				continue
			}
			for j := l.Key.Segment + 1; j < len(st.Segments) && len(ls) < max(req.Limit, 1); j++ {
				if st.Segments[j].State == envelope.StatePending {
					c := *l
					c.Key.Segment, c.Attempt = j, st.Segments[j].Attempts+1
					ls = append(ls, &c)
				}
			}
		}
	case pruneLive:
		ls = slices.DeleteFunc(ls, func(l *queue.Lease) bool {
			if !b.isHidden(idOf(l.Key)) {
				return false
			}
			_ = b.Store.Release(ctx, l)
			return true
		})
	}
	return ls, err
}

func (b *brokenStore) Recover(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	ls, err := b.Store.Recover(ctx, req)
	switch b.flaw {
	case releaseCounts:
		b.adjust(ls)
	case commitNoFence, releaseRecovered:
		b.mu.Lock()
		for _, l := range ls {
			b.latest[l.Key] = *l
			b.recovered[l.Key] = l.Fence
		}
		b.mu.Unlock()
	case claimExpired:
		for _, l := range ls {
			b.restoreExpiry(l.Envelope)
		}
	}
	return ls, err
}

func (b *brokenStore) Commit(ctx context.Context, l *queue.Lease, out queue.Outcome) error {
	if b.flaw == requeueNoBudget && l != nil && out.State == envelope.StateRetryable && !out.NoAttempt &&
		b.isRequeued(idOf(l.Key)) && l.Attempt >= b.opts.Backoff.MaxAttempts {
		// Every attempt counts against the limit, those before the requeue too.
		out = queue.Outcome{State: envelope.StateDeadLetter, Class: out.Class}
	}
	var before []queue.Suppression
	if b.flaw == bounceUserOnly && l != nil {
		before, _ = b.Store.AddressSuppressions(ctx, l.Key.Tenant)
	}
	err := b.Store.Commit(ctx, l, out)
	if b.flaw == bounceUserOnly && err == nil && l.Envelope != nil {
		t := queue.AddressTarget(l.Envelope)
		if t != "" && !slices.ContainsFunc(before, func(s queue.Suppression) bool { return s.Target == t }) {
			_ = b.Store.LiftAddressSuppression(ctx, l.Key.Tenant, t)
		}
	}
	switch {
	case b.flaw == staleAccepted && errors.Is(err, queue.ErrStaleFence):
		return nil
	case b.flaw == commitNoFence && errors.Is(err, queue.ErrStaleFence):
		b.mu.Lock()
		cur, ok := b.latest[l.Key]
		b.mu.Unlock()
		if ok {
			return b.Store.Commit(ctx, &cur, out)
		}
	}
	return err
}

func (b *brokenStore) Release(ctx context.Context, l *queue.Lease) error {
	if b.flaw == releaseRecovered && l != nil {
		b.mu.Lock()
		fence, ok := b.recovered[l.Key]
		b.mu.Unlock()
		if ok && fence == l.Fence {
			// As if the earlier call had been rejected: the row goes again.
			return b.Store.Commit(ctx, l, queue.Outcome{State: envelope.StateRetryable, NoAttempt: true})
		}
	}
	err := b.Store.Release(ctx, l)
	if b.flaw == releaseCounts && err == nil {
		b.mu.Lock()
		b.extra[l.Key]++
		b.mu.Unlock()
	}
	return err
}

func (b *brokenStore) Get(ctx context.Context, tenant, id string) (*queue.EnvelopeStatus, error) {
	if b.flaw == pruneLive && b.isHidden(envID{tenantOr(tenant), id}) {
		return nil, queue.ErrNotFound
	}
	st, err := b.Store.Get(ctx, tenant, id)
	if err != nil {
		return st, err
	}
	switch b.flaw {
	case releaseCounts:
		b.mu.Lock()
		for i := range st.Segments {
			st.Segments[i].Attempts += b.extra[envelope.Key{Tenant: st.Tenant, EnvelopeID: st.ID, Segment: i}]
		}
		b.mu.Unlock()
	case claimExpired:
		b.restoreExpiry(st.Envelope)
	case requeueAllDue:
		if b.isRequeued(envID{st.Tenant, st.ID}) {
			for i := range st.Segments {
				if s := &st.Segments[i]; s.State == envelope.StatePending && s.NextAt.IsZero() {
					s.NextAt = b.opts.Now()
				}
			}
		}
	}
	return st, err
}

func tenantOr(t string) string {
	if t == "" {
		return envelope.DefaultTenant
	}
	return t
}

func (b *brokenStore) List(ctx context.Context, f queue.ListFilter) (*queue.Page, error) {
	p, err := b.Store.List(ctx, f)
	if err != nil {
		return p, err
	}
	switch b.flaw {
	case releaseCounts:
		b.mu.Lock()
		for i := range p.Rows {
			p.Rows[i].Attempts += b.extra[p.Rows[i].Key]
		}
		b.mu.Unlock()
	case pruneLive:
		p.Rows = slices.DeleteFunc(p.Rows, func(r queue.Row) bool { return b.isHidden(idOf(r.Key)) })
	}
	return p, err
}

func (b *brokenStore) Requeue(ctx context.Context, tenant, id string) error {
	if b.flaw == requeueNoSuppressed {
		if st, err := b.Store.Get(ctx, tenant, id); err == nil {
			other := false
			for _, s := range st.Segments {
				other = other || s.State == envelope.StateDeadLetter || s.State == envelope.StateUnresolved || s.State == envelope.StateExpired
			}
			if !other {
				return queue.ErrInvalidTransition
			}
		}
	}
	err := b.Store.Requeue(ctx, tenant, id)
	if err == nil {
		b.mu.Lock()
		b.requeued[envID{tenantOr(tenant), id}] = true
		b.mu.Unlock()
	}
	return err
}

func (b *brokenStore) NextDue(ctx context.Context, flt queue.DueFilter) (time.Time, error) {
	switch b.flaw {
	case nextDueUnfiltered:
		return b.Store.NextDue(ctx, queue.DueFilter{})
	case nextDueNoLeases:
	default:
		return b.Store.NextDue(ctx, flt)
	}
	// The earliest due row, leases left out.
	var next time.Time
	f := queue.ListFilter{Limit: 1000}
	for {
		p, err := b.Store.List(ctx, f)
		if err != nil {
			return time.Time{}, err
		}
		for _, row := range p.Rows {
			if row.State != envelope.StatePending && row.State != envelope.StateRetryable {
				continue
			}
			st, err := b.Store.Get(ctx, row.Key.Tenant, row.Key.EnvelopeID)
			if err != nil {
				return time.Time{}, err
			}
			if at := st.Segments[row.Key.Segment].NextAt; !at.IsZero() && (next.IsZero() || at.Before(next)) {
				next = at
			}
		}
		if p.Next == "" {
			return next, nil
		}
		f.Cursor = p.Next
	}
}

func (b *brokenStore) Erase(ctx context.Context, tenant, userID string) error {
	var (
		consent queue.Consent
		subs    []queue.Subscription
	)
	switch b.flaw {
	case eraseKeepsConsent:
		consent, _ = b.Store.Consent(ctx, tenant, userID)
	case eraseKeepsSubs:
		subs, _ = b.Store.Subscriptions(ctx, tenant, userID)
	}
	err := b.Store.Erase(ctx, tenant, userID)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.erase++
	b.mu.Unlock()
	if b.flaw == eraseKeepsConsent && (consent.ConsentFlags != (queue.ConsentFlags{}) || len(consent.Suppressions) > 0) {
		_ = b.Store.SetConsent(ctx, tenant, userID, consent.ConsentFlags)
		for _, s := range consent.Suppressions {
			_ = b.Store.Suppress(ctx, tenant, userID, s)
		}
	}
	for _, s := range subs {
		_ = b.Store.SaveSubscription(ctx, tenant, userID, s.Sub)
	}
	return nil
}

func (b *brokenStore) Counts(ctx context.Context, tenant string) (queue.Counts, error) {
	c, err := b.Store.Counts(ctx, tenant)
	b.mu.Lock()
	erased := b.erase
	b.mu.Unlock()
	if b.flaw == countsAfterErase && err == nil && erased > 0 {
		if c[envelope.StatePending] == nil {
			c[envelope.StatePending] = map[envelope.Channel]int{}
		}
		c[envelope.StatePending][envelope.ChannelTelegram]++
	}
	return c, err
}

func (b *brokenStore) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]queue.EnqueueResult, error) {
	if b.flaw == claimExpired {
		return b.enqueueNoExpiry(ctx, envs)
	}
	res, err := b.Store.Enqueue(ctx, envs...)
	if b.flaw == batchDupNew {
		seen := map[string]bool{}
		for i := range res {
			k := res[i].Tenant + "/" + res[i].ID
			if seen[k] {
				res[i].Duplicate = false
			}
			seen[k] = true
		}
	}
	return res, err
}

// enqueueNoExpiry validates the envelopes as given and stores them without
// expires_at, which it keeps to itself.
func (b *brokenStore) enqueueNoExpiry(ctx context.Context, envs []*envelope.Envelope) ([]queue.EnqueueResult, error) {
	if _, err := queue.Prepare(envs); err != nil {
		return nil, err
	}
	in := make([]*envelope.Envelope, len(envs))
	for i, e := range envs {
		in[i] = e.Clone()
		in[i].ExpiresAt = time.Time{}
	}
	res, err := b.Store.Enqueue(ctx, in...)
	if err != nil {
		return res, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, r := range res {
		if !r.Duplicate && !envs[i].ExpiresAt.IsZero() {
			b.expires[envID{r.Tenant, r.ID}] = envs[i].ExpiresAt
		}
	}
	return res, nil
}

func (b *brokenStore) Prune(ctx context.Context) (int, error) {
	n, err := b.Store.Prune(ctx)
	if err != nil || b.flaw != pruneLive {
		return n, err
	}
	// Every envelope none of whose rows changed within the retention
	// period goes, final or not.
	rows, err := b.allRows(ctx)
	if err != nil {
		return n, err
	}
	cutoff := b.opts.Now().Add(-b.opts.Retention)
	old := map[envID]bool{}
	var order []envID
	for _, r := range rows {
		id := idOf(r.Key)
		if _, seen := old[id]; !seen {
			order = append(order, id)
			old[id] = true
		}
		old[id] = old[id] && !r.UpdatedAt.After(cutoff)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range order {
		if old[id] && !b.hidden[id] {
			b.hidden[id] = true
			n++
		}
	}
	return n, nil
}

func (b *brokenStore) SaveSubscription(ctx context.Context, tenant, user string, sub envelope.PushSubscription) error {
	var kept []queue.Suppression
	switch b.flaw {
	case saveKeepsSuppression:
		c, _ := b.Store.Consent(ctx, tenant, user)
		target := queue.TargetOfValue("push:" + sub.Endpoint)
		for _, s := range c.Suppressions {
			if s.Channel == envelope.ChannelPush && s.Target == target {
				kept = append(kept, s)
			}
		}
	case saveNoReplace:
		if queue.CheckSubscription(sub) == nil {
			list, _ := b.Store.Subscriptions(ctx, tenant, user)
			for _, s := range list {
				if s.Sub.Endpoint == sub.Endpoint {
					sub = s.Sub
				}
			}
		}
	}
	err := b.Store.SaveSubscription(ctx, tenant, user, sub)
	if err == nil {
		for _, s := range kept {
			_ = b.Store.Suppress(ctx, tenant, user, s)
		}
	}
	return err
}

func (b *brokenStore) DeleteSubscription(ctx context.Context, tenant, user, endpoint string) error {
	err := b.Store.DeleteSubscription(ctx, tenant, user, endpoint)
	if b.flaw == deleteUnknownOK && errors.Is(err, queue.ErrNotFound) {
		return nil
	}
	return err
}

func (b *brokenStore) SuppressEmail(ctx context.Context, tenant, address string, reason envelope.ErrorClass) error {
	if b.flaw == suppressEmailUsers {
		// Each user with an envelope to the address gets a suppression of
		// it in their consent record; the tenant keeps none.
		rows, err := b.allRows(ctx)
		if err != nil {
			return err
		}
		sup := queue.EmailSuppression(address, reason, b.opts.Now().UTC())
		for _, r := range rows {
			if r.Key.Tenant != tenantOr(tenant) || r.Channel != envelope.ChannelEmail {
				continue
			}
			st, err := b.Store.Get(ctx, r.Key.Tenant, r.Key.EnvelopeID)
			if err != nil {
				return err
			}
			if queue.TargetOf(st.Envelope) == sup.Target {
				if err := b.Store.Suppress(ctx, r.Key.Tenant, r.UserID, sup); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if b.flaw != suppressEmailTenants {
		return b.Store.SuppressEmail(ctx, tenant, address, reason)
	}
	rows, err := b.allRows(ctx)
	if err != nil {
		return err
	}
	tenants := []string{tenantOr(tenant)}
	for _, r := range rows {
		if !slices.Contains(tenants, r.Key.Tenant) {
			tenants = append(tenants, r.Key.Tenant)
		}
	}
	for _, t := range tenants {
		if err := b.Store.SuppressEmail(ctx, t, address, reason); err != nil {
			return err
		}
	}
	return nil
}
