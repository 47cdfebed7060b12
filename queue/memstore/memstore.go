// Package memstore is the in-memory implementation of queue.Store, for tests
// and small embeddings that need no durability.
//
// It keeps every envelope, row and consent record in maps guarded by one
// mutex, so every method is safe for concurrent use and every call is
// atomic: a batch enqueue, a claim of several rows or a commit and its
// effects (the next segment becoming eligible, a suppression written back)
// happen as one step or not at all. It passes the shared contract suite in
// queue/queuetest, like the file store (queue/filestore).
//
// Nothing survives the process: the fence sequence starts again at 1 in a
// new Store.
package memstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Store is an in-memory queue.Store. The zero value is not usable: call New.
type Store struct {
	now       func() time.Time
	backoff   queue.Backoff
	retention time.Duration
	source    queue.ConsentSource
	notify    chan struct{}

	mu      sync.Mutex
	closed  bool
	fence   uint64                        // last fence issued
	seq     uint64                        // last enqueue sequence number
	envs    map[envKey]*envRec            // every envelope by (tenant, id)
	order   []*envRec                     // every envelope in enqueue order
	sched   schedule                      // pending and retryable rows by due time
	leased  map[*row]struct{}             // rows sending
	consent map[userKey]*queue.Consent    // the store's own consent records
	addrs   map[addrKey]queue.Suppression // the tenants' address suppressions
	subs    map[userKey][]queue.Subscription
}

var _ queue.Store = (*Store)(nil)

type envKey struct{ tenant, id string }

type userKey struct{ tenant, user string }

// addrKey is a tenant and an address target (queue.AddressTarget).
type addrKey struct{ tenant, target string }

// envRec is one stored envelope and its rows (segments).
type envRec struct {
	seq        uint64
	env        *envelope.Envelope // private deep copy, TenantID set
	enqueuedAt time.Time
	rows       []*row
}

func (e *envRec) key() envKey { return envKey{e.env.TenantID, e.env.ID} }

// row is one delivery (segment) of an envelope. Its queue.Delivery
// changes only through the state machine (apply).
type row struct {
	queue.Delivery
	env     *envRec
	index   int
	gen     uint64 // schedule generation (see sched.go)
	removed bool   // erased or pruned
}

// New returns an empty in-memory store configured by opts (nil means
// defaults). It uses Now, Backoff, Retention and Consent; the options that
// apply to the file-backed store only are ignored.
func New(opts *queue.Options) *Store {
	o := opts.WithDefaults()
	return &Store{
		now:       o.Now,
		backoff:   o.Backoff,
		retention: o.Retention,
		source:    o.Consent,
		notify:    make(chan struct{}, 1),
		envs:      make(map[envKey]*envRec),
		leased:    make(map[*row]struct{}),
		consent:   make(map[userKey]*queue.Consent),
		addrs:     make(map[addrKey]queue.Suppression),
		subs:      make(map[userKey][]queue.Subscription),
	}
}

// lock takes the mutex and reports ErrClosed (and the context's error)
// before any work. On error the mutex is not held.
func (s *Store) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return queue.ErrClosed
	}
	return nil
}

// wake signals Notify without blocking; signals coalesce.
func (s *Store) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func tenantOr(t string) string {
	if t == "" {
		return envelope.DefaultTenant
	}
	return t
}

// rowsOf returns the deliveries of an envelope's rows, for the state machine.
func rowsOf(rec *envRec) []queue.Delivery {
	ds := make([]queue.Delivery, len(rec.rows))
	for i, r := range rec.rows {
		ds[i] = r.Delivery
	}
	return ds
}

// apply persists a state machine step on rec: the changed rows, the set of
// leased rows, the schedule, the suppression it asks for and the wake-up.
func (s *Store) apply(rec *envRec, st *queue.Step, now time.Time) {
	for _, i := range st.Changed {
		r := rec.rows[i]
		r.Delivery = st.Rows[i]
		if r.State == envelope.StateSending {
			s.leased[r] = struct{}{}
		} else {
			delete(s.leased, r)
		}
		s.schedule(r)
	}
	if st.Suppress != "" {
		e := rec.env
		s.suppress(userKey{e.TenantID, e.UserID}, queue.SuppressionFor(e, st.Suppress, now), now)
		if a, ok := st.AddressSuppression(e, now); ok {
			s.suppressAddress(e.TenantID, a)
		}
	}
	if st.Wake {
		s.wake()
	}
}

// consentOf returns the current consent for a user: from the configured
// ConsentSource, or else the store's own records.
func (s *Store) consentOf(ctx context.Context, tenant, user string) (queue.Consent, bool, error) {
	if s.source != nil {
		c, found, err := s.source.Consent(ctx, tenant, user)
		if err != nil {
			return queue.Consent{}, false, fmt.Errorf("consent source: %w", err)
		}
		return c, found, nil
	}
	c, ok := s.consent[userKey{tenant, user}]
	if !ok {
		return queue.Consent{}, false, nil
	}
	return *c, true, nil
}

// consentCache memoises consent lookups within one call.
type consentCache struct {
	s *Store
	m map[userKey]consentEntry
}

type consentEntry struct {
	c     queue.Consent
	found bool
}

func (cc *consentCache) get(ctx context.Context, e *envelope.Envelope) (queue.Consent, bool, error) {
	k := userKey{e.TenantID, e.UserID}
	ent, ok := cc.m[k]
	if !ok {
		c, found, err := cc.s.consentOf(ctx, k.tenant, k.user)
		if err != nil {
			return queue.Consent{}, false, err
		}
		ent = consentEntry{c, found}
		if cc.m == nil {
			cc.m = make(map[userKey]consentEntry)
		}
		cc.m[k] = ent
	}
	return ent.c, ent.found, nil
}

// addressOf returns the tenant's suppression of e's address, or nil.
func (s *Store) addressOf(e *envelope.Envelope) *queue.Suppression {
	t := queue.AddressTarget(e)
	if t == "" {
		return nil
	}
	a, ok := s.addrs[addrKey{e.TenantID, t}]
	if !ok {
		return nil
	}
	return &a
}

// suppressAddress stores the tenant's suppression of an address unless
// one is stored already.
func (s *Store) suppressAddress(tenant string, a queue.Suppression) {
	k := addrKey{tenant, a.Target}
	if _, ok := s.addrs[k]; !ok {
		s.addrs[k] = a
	}
}

// Enqueue validates every envelope, checks current consent and stores the
// new ones as one step: on any error nothing is stored. See queue.Store.
// The caller's envelopes are not modified; the store keeps deep copies.
func (s *Store) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]queue.EnqueueResult, error) {
	type prepared struct {
		env  *envelope.Envelope
		segs int
	}
	checked, err := queue.Prepare(envs)
	if err != nil {
		return nil, err
	}
	prep := make([]prepared, len(checked))
	for i, c := range checked {
		prep[i] = prepared{c.Env, c.Segments}
	}

	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := s.now()

	res := make([]queue.EnqueueResult, len(prep))
	seen := make(map[envKey]int, len(prep))
	cc := consentCache{s: s}
	for i, p := range prep {
		k := envKey{p.env.TenantID, p.env.ID}
		res[i] = queue.EnqueueResult{Tenant: k.tenant, ID: k.id, Segments: p.segs}
		if rec, ok := s.envs[k]; ok {
			res[i].Duplicate = true
			res[i].Segments = len(rec.rows)
			continue
		}
		if j, ok := seen[k]; ok {
			res[i].Duplicate = true
			res[i].Segments = prep[j].segs
			continue
		}
		seen[k] = i
		c, found, err := cc.get(ctx, p.env)
		if err != nil {
			return nil, &queue.EnqueueError{Index: i, Tenant: k.tenant, ID: k.id, Err: err}
		}
		if err := queue.Admit(i, p.env, c, found, s.addressOf(p.env), now); err != nil {
			return nil, err
		}
	}

	created := false
	for i, p := range prep {
		if res[i].Duplicate {
			continue
		}
		s.seq++
		rec := &envRec{seq: s.seq, env: p.env, enqueuedAt: now}
		for j, d := range queue.NewRows(p.env, p.segs, now) {
			r := &row{Delivery: d, env: rec, index: j}
			rec.rows = append(rec.rows, r)
			s.schedule(r)
		}
		s.envs[rec.key()] = rec
		s.order = append(s.order, rec)
		created = true
	}
	if created {
		s.wake()
	}
	return res, nil
}

// matches reports whether r is within the request's tenant and channels.
func matches(req *queue.ClaimRequest, r *row) bool {
	if req.Tenant != "" && r.env.env.TenantID != req.Tenant {
		return false
	}
	return len(req.Channels) == 0 || slices.Contains(req.Channels, r.env.env.Channel)
}

// byTime orders rows by a time, then enqueue order, then segment.
func byTime(at func(*row) time.Time) func(a, b *row) int {
	return func(a, b *row) int {
		if c := at(a).Compare(at(b)); c != 0 {
			return c
		}
		if c := cmp.Compare(a.env.seq, b.env.seq); c != 0 {
			return c
		}
		return cmp.Compare(a.index, b.index)
	}
}
