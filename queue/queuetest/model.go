package queuetest

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// model is the reference queue.Store that Differential compares stores
// with: a plain, single-threaded, map-based reading of the contract in
// queue/store.go, SPEC §4–5 and the contract suite. It is written from
// those documents, not from either store nor from the state machine of
// package queue; the choices that the differential found open are now
// written into queue/store.go, and marked "Contract choice" below.
//
// It is not safe for concurrent use; the differential drives it from one
// goroutine.
type model struct {
	now       func() time.Time
	backoff   queue.Backoff
	retention time.Duration
	notify    chan struct{}

	closed  bool
	fence   uint64 // the last fence issued
	seq     uint64 // the last enqueue sequence number
	envs    map[pair]*menv
	consent map[pair]*queue.Consent    // by (tenant, user)
	addrs   map[pair]queue.Suppression // the tenant's address suppressions, by (tenant, target)
	subs    map[pair][]queue.Subscription
}

var _ queue.Store = (*model)(nil)

// pair is a (tenant, id) or (tenant, user) key.
type pair struct{ a, b string }

// menv is one stored envelope.
type menv struct {
	seq  uint64
	env  *envelope.Envelope // private copy, TenantID set
	enq  time.Time
	rows []*mrow
}

// mrow is one delivery row.
type mrow struct {
	state    envelope.State
	attempts int
	// base is the attempt count at the last requeue: the retry budget
	// (MaxAttempts, the backoff exponent) counts from there.
	base    int
	class   envelope.ErrorClass
	receipt string
	fence   uint64
	// due is when a pending or retryable row becomes eligible; zero while
	// it waits for an earlier segment to be sent.
	due     time.Time
	updated time.Time
	history []queue.Attempt

	// While sending.
	owner     string
	leaseEnd  time.Time
	from      envelope.State // the state it was claimed from
	toPending bool           // claimed with ExpireToPending
	recovered bool           // the current lease came from Recover
}

// newModel returns an empty model configured like a store (Now, Backoff,
// Retention; a ConsentSource is not supported).
func newModel(opts *queue.Options) *model {
	o := opts.WithDefaults()
	return &model{
		now:       o.Now,
		backoff:   o.Backoff,
		retention: o.Retention,
		notify:    make(chan struct{}, 1),
		envs:      map[pair]*menv{},
		consent:   map[pair]*queue.Consent{},
		addrs:     map[pair]queue.Suppression{},
		subs:      map[pair][]queue.Subscription{},
	}
}

func tenantOf(t string) string {
	if t == "" {
		return envelope.DefaultTenant
	}
	return t
}

// sorted returns the envelopes in enqueue order.
func (m *model) sorted() []*menv {
	out := make([]*menv, 0, len(m.envs))
	for _, e := range m.envs {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *menv) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

func (m *model) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if m.closed {
		return queue.ErrClosed
	}
	return nil
}

// allows decides current consent for e from the store's own records and
// the tenant's suppression of e's address, by the rule of package queue
// (queue.Permits: the address suppression refuses whatever the user's
// consent says).
func (m *model) allows(e *envelope.Envelope) (bool, envelope.ErrorClass) {
	c, found := m.consent[pair{e.TenantID, e.UserID}]
	if !found {
		c = &queue.Consent{}
	}
	var addr *queue.Suppression
	if e.Channel == envelope.ChannelEmail {
		if a, ok := m.addrs[pair{e.TenantID, queue.TargetOf(e)}]; ok {
			addr = &a
		}
	}
	return queue.Permits(e, c, found, addr)
}

// suppressAddress stores the tenant's suppression of an address unless it
// has one already.
func (m *model) suppressAddress(tenant string, s queue.Suppression) {
	k := pair{tenant, s.Target}
	if _, ok := m.addrs[k]; !ok {
		m.addrs[k] = s
	}
}

// segmentsOf is the number of rows an envelope materialises: one per chat
// segment of a reply, one otherwise.
func segmentsOf(e *envelope.Envelope) int {
	if e.Template != envelope.TemplateReply {
		return 1
	}
	p, err := e.ReplyPayload()
	if err != nil {
		return 1
	}
	return max(len(envelope.SplitReply(p.Text)), 1)
}

// Enqueue: validate every envelope, then decide duplicates and consent in
// call order, then store the new ones. Contract choice (queue/store.go): consent is checked for the
// envelopes that would be stored only; a duplicate creates nothing, so
// current consent does not refuse it (a producer's retry stays
// idempotent).
func (m *model) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]queue.EnqueueResult, error) {
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	now := m.now()
	items := make([]*envelope.Envelope, len(envs))
	segs := make([]int, len(envs))
	for i, in := range envs {
		if in == nil {
			return nil, &queue.EnqueueError{Index: i, Err: fmt.Errorf("nil envelope: %w", envelope.ErrInvalid)}
		}
		if err := envelope.Validate(in); err != nil {
			return nil, &queue.EnqueueError{Index: i, Tenant: in.Tenant(), ID: in.ID, Err: err}
		}
		e := copyEnvelope(in)
		e.TenantID = in.Tenant()
		items[i], segs[i] = e, segmentsOf(e)
	}
	res := make([]queue.EnqueueResult, len(items))
	first := map[pair]int{}
	for i, e := range items {
		k := pair{e.TenantID, e.ID}
		res[i] = queue.EnqueueResult{Tenant: k.a, ID: k.b, Segments: segs[i]}
		if old, ok := m.envs[k]; ok {
			res[i].Duplicate, res[i].Segments = true, len(old.rows)
			continue
		}
		if j, ok := first[k]; ok {
			res[i].Duplicate, res[i].Segments = true, segs[j]
			continue
		}
		first[k] = i
		if !e.ExpiresAt.IsZero() && !now.Before(e.ExpiresAt) {
			return nil, &queue.EnqueueError{Index: i, Tenant: k.a, ID: k.b, Reason: envelope.ClassExpired, Err: queue.ErrExpired}
		}
		if ok, why := m.allows(e); !ok {
			return nil, &queue.EnqueueError{Index: i, Tenant: k.a, ID: k.b, Reason: why, Err: queue.ErrConsentDenied}
		}
	}
	for i, e := range items {
		if res[i].Duplicate {
			continue
		}
		m.seq++
		me := &menv{seq: m.seq, env: e, enq: now}
		for range segs[i] {
			me.rows = append(me.rows, &mrow{state: envelope.StatePending, updated: now})
		}
		// Only the first segment is due; the others wait for their turn.
		me.rows[0].due = now
		if e.NotBefore.After(now) {
			me.rows[0].due = e.NotBefore
		}
		m.envs[pair{e.TenantID, e.ID}] = me
	}
	return res, nil
}

func checkRequest(req queue.ClaimRequest) (int, error) {
	if req.Owner == "" {
		return 0, errors.New("model: claim request needs an owner")
	}
	if req.Lease <= 0 {
		return 0, errors.New("model: claim request needs a positive lease")
	}
	return max(req.Limit, 1), nil
}

// inFilter reports whether e is within the request's tenant and channels.
func inFilter(req queue.ClaimRequest, e *envelope.Envelope) bool {
	if req.Tenant != "" && e.TenantID != req.Tenant {
		return false
	}
	return len(req.Channels) == 0 || slices.Contains(req.Channels, e.Channel)
}

// headSent reports whether every segment before i is sent (chat order).
func (e *menv) headSent(i int) bool {
	for _, r := range e.rows[:i] {
		if r.state != envelope.StateSent {
			return false
		}
	}
	return true
}

// scheduled reports whether row i is pending or retryable and waits for
// nothing but time: it has a due time and every earlier segment is sent.
func (e *menv) scheduled(i int) bool {
	r := e.rows[i]
	return (r.state == envelope.StatePending || r.state == envelope.StateRetryable) && !r.due.IsZero() && e.headSent(i)
}

// schedule makes the first segment not sent due now when it waits for its
// turn (after a segment was sent, or an operator act).
func (e *menv) schedule(now time.Time) {
	for _, r := range e.rows {
		if r.state == envelope.StateSent {
			continue
		}
		if (r.state == envelope.StatePending || r.state == envelope.StateRetryable) && r.due.IsZero() {
			r.due = now
		}
		return
	}
}

func (r *mrow) record(now time.Time, attempt int, st envelope.State, class envelope.ErrorClass) {
	r.history = append(r.history, queue.Attempt{Attempt: attempt, At: now, State: st, Class: class})
}

// settle moves row r to st (not leased, not due) and records it.
func (r *mrow) settle(now time.Time, st envelope.State, class envelope.ErrorClass) {
	r.state, r.class, r.updated = st, class, now
	r.due, r.owner, r.leaseEnd, r.from, r.toPending, r.recovered = time.Time{}, "", time.Time{}, "", false, false
	r.record(now, r.attempts, st, class)
}

// settleRest moves the segments after i that have not been delivered and
// wait for their turn (pending or retryable) to st: an envelope that
// expired, lost consent or whose recipient is gone delivers none of its
// remaining segments.
func (e *menv) settleRest(i int, now time.Time, st envelope.State, class envelope.ErrorClass) {
	for _, r := range e.rows[i+1:] {
		if r.state == envelope.StatePending || r.state == envelope.StateRetryable {
			r.settle(now, st, class)
		}
	}
}

type cand struct {
	e   *menv
	i   int
	due time.Time
}

// Claim scans the rows that are due now (pending and retryable, chat
// order respected) oldest due first, then in enqueue order, then by
// segment, within the request's filter. Each row it meets is expired (past
// expires_at), suppressed (consent forbids) or leased, until Limit rows are
// leased. Contract choice (queue/store.go): rows past expires_at or refused by consent are settled only
// when the scan meets them (not every such row of the store).
func (m *model) Claim(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	limit, err := checkRequest(req)
	if err != nil {
		return nil, err
	}
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	now := m.now()
	var cands []cand
	for _, e := range m.sorted() {
		if !inFilter(req, e.env) {
			continue
		}
		for i, r := range e.rows {
			if e.scheduled(i) && !r.due.After(now) {
				cands = append(cands, cand{e, i, r.due})
			}
		}
	}
	slices.SortStableFunc(cands, func(a, b cand) int { return a.due.Compare(b.due) })
	var out []*queue.Lease
	for _, c := range cands {
		if len(out) == limit {
			break
		}
		e, r := c.e, c.e.rows[c.i]
		if x := e.env.ExpiresAt; !x.IsZero() && !now.Before(x) {
			r.settle(now, envelope.StateExpired, envelope.ClassExpired)
			e.settleRest(c.i, now, envelope.StateExpired, envelope.ClassExpired)
			continue
		}
		if ok, why := m.allows(e.env); !ok {
			r.settle(now, envelope.StateSuppressed, why)
			e.settleRest(c.i, now, envelope.StateSuppressed, why)
			continue
		}
		r.from = r.state
		r.state = envelope.StateSending
		r.attempts++
		m.fence++
		r.fence = m.fence
		r.owner = req.Owner
		r.leaseEnd = now.Add(req.Lease)
		r.toPending = req.ExpireToPending
		r.recovered = false
		r.due = time.Time{}
		r.updated = now
		out = append(out, m.lease(e, c.i))
	}
	return out, nil
}

func (m *model) lease(e *menv, i int) *queue.Lease {
	r := e.rows[i]
	return &queue.Lease{
		Key:        envelope.Key{Tenant: e.env.TenantID, EnvelopeID: e.env.ID, Segment: i},
		UserID:     e.env.UserID,
		Channel:    e.env.Channel,
		Owner:      r.owner,
		Fence:      r.fence,
		Attempt:    r.attempts,
		ExpiresAt:  r.leaseEnd,
		Segments:   len(e.rows),
		EnqueuedAt: e.enq,
		Envelope:   copyEnvelope(e.env),
	}
}

// holder returns the row a lease holds. Contract choice (queue/store.go): the fence is compared
// before the state, so a lease whose row was leased again reports
// ErrStaleFence even when that newer lease has ended since.
func (m *model) holder(l *queue.Lease) (*menv, *mrow, error) {
	e, ok := m.envs[pair{l.Key.Tenant, l.Key.EnvelopeID}]
	if !ok || l.Key.Segment < 0 || l.Key.Segment >= len(e.rows) {
		return nil, nil, queue.ErrLeaseLost
	}
	r := e.rows[l.Key.Segment]
	switch {
	case r.fence > l.Fence:
		return nil, nil, queue.ErrStaleFence
	case r.fence < l.Fence, r.state != envelope.StateSending:
		return nil, nil, queue.ErrLeaseLost
	case r.owner != l.Owner:
		return nil, nil, queue.ErrStaleFence
	}
	return e, r, nil
}

// defaultClass is the class (and suppression reason) of a
// recipient-gone outcome committed without one. (unsubscribed for suppressed).
func defaultClass(st envelope.State) envelope.ErrorClass {
	switch st {
	case envelope.StateBounced:
		return envelope.ClassBounced
	case envelope.StateComplaint:
		return envelope.ClassComplaint
	case envelope.StateSuppressed:
		return envelope.ClassUnsubscribed
	case envelope.StateExpired:
		return envelope.ClassExpired
	}
	return ""
}

// Commit applies an outcome. The retry budget and backoff count the
// attempts since the last requeue. Contract choice (queue/store.go): an expired outcome settles the
// envelope's remaining segments as expired too (nothing is delivered after
// expires_at), like a claim that finds the envelope expired.
func (m *model) Commit(ctx context.Context, l *queue.Lease, out queue.Outcome) error {
	if l == nil {
		return fmt.Errorf("model: nil lease: %w", queue.ErrLeaseLost)
	}
	if !queue.ValidOutcome(out.State) {
		return fmt.Errorf("model: commit %q: %w", out.State, queue.ErrInvalidTransition)
	}
	if err := m.check(ctx); err != nil {
		return err
	}
	e, r, err := m.holder(l)
	if err != nil {
		return err
	}
	now := m.now()
	attempt := r.attempts
	to, due := m.backoff.Decide(out, r.attempts-r.base, now)
	if to == envelope.StateRetryable && out.NoAttempt && r.attempts > 0 {
		r.attempts--
	}
	class := out.Class
	switch {
	case to == envelope.StateSent:
		class = ""
		r.receipt = out.Receipt
	case class == "":
		class = defaultClass(to)
	}
	r.state, r.class, r.updated = to, class, now
	r.owner, r.leaseEnd, r.from, r.toPending, r.recovered = "", time.Time{}, "", false, false
	r.due = time.Time{}
	if to == envelope.StateRetryable {
		r.due = due
	}
	r.record(now, attempt, to, class)
	switch {
	case to == envelope.StateSent:
		e.schedule(now)
	case queue.Suppressing(to):
		m.suppress(pair{e.env.TenantID, e.env.UserID}, queue.SuppressionFor(e.env, class, now), now)
		// A bounce or complaint of an e-mail: the address is gone for
		// every user of the tenant.
		if (to == envelope.StateBounced || to == envelope.StateComplaint) && e.env.Channel == envelope.ChannelEmail {
			m.suppressAddress(e.env.TenantID, queue.Suppression{Channel: envelope.ChannelEmail, Target: queue.TargetOf(e.env), Reason: class, At: now})
		}
		e.settleRest(l.Key.Segment, now, envelope.StateSuppressed, class)
	case to == envelope.StateExpired, to == envelope.StateDeadLetter:
		e.settleRest(l.Key.Segment, now, to, class)
	}
	return nil
}

// Release returns a leased row to the state it was claimed from, due now,
// the attempt given back. Contract choice (queue/store.go): a lease from Recover was "claimed from"
// sending: the row stays sending with its lease ended now (no owner), to be
// recovered again, and its attempt count is unchanged.
func (m *model) Release(ctx context.Context, l *queue.Lease) error {
	if l == nil {
		return fmt.Errorf("model: nil lease: %w", queue.ErrLeaseLost)
	}
	if err := m.check(ctx); err != nil {
		return err
	}
	_, r, err := m.holder(l)
	if err != nil {
		return err
	}
	now := m.now()
	r.updated = now
	if r.recovered {
		r.owner, r.leaseEnd, r.recovered = "", now, false
		return nil
	}
	if r.attempts > 0 {
		r.attempts--
	}
	r.state = r.from
	r.owner, r.leaseEnd, r.from, r.toPending = "", time.Time{}, "", false
	r.due = now
	return nil
}

// Recover leases rows still sending after their lease ended, oldest lease
// end first, then in enqueue order, then by segment. Rows claimed with
// ExpireToPending go back to pending (attempt kept, due now) whether or not
// the limit is reached: they are not leased. Contract choice (queue/store.go): that return is recorded
// in the history (a claim's end) with class interrupted.
func (m *model) Recover(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	limit, err := checkRequest(req)
	if err != nil {
		return nil, err
	}
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	now := m.now()
	var cands []cand
	for _, e := range m.sorted() {
		if !inFilter(req, e.env) {
			continue
		}
		for i, r := range e.rows {
			if r.state == envelope.StateSending && !r.leaseEnd.After(now) {
				cands = append(cands, cand{e, i, r.leaseEnd})
			}
		}
	}
	slices.SortStableFunc(cands, func(a, b cand) int { return a.due.Compare(b.due) })
	var out []*queue.Lease
	for _, c := range cands {
		r := c.e.rows[c.i]
		if r.toPending {
			r.state, r.updated, r.due = envelope.StatePending, now, now
			r.owner, r.leaseEnd, r.from, r.toPending = "", time.Time{}, "", false
			r.record(now, r.attempts, envelope.StatePending, envelope.ClassInterrupted)
			continue
		}
		if len(out) == limit {
			continue
		}
		m.fence++
		r.fence = m.fence
		r.owner = req.Owner
		r.leaseEnd = now.Add(req.Lease)
		r.recovered = true
		r.updated = now
		out = append(out, m.lease(c.e, c.i))
	}
	return out, nil
}

// NextDue is the earliest due time of a row f admits that waits for
// nothing but time, or lease end of such a sending row.
func (m *model) NextDue(ctx context.Context, f queue.DueFilter) (time.Time, error) {
	if err := m.check(ctx); err != nil {
		return time.Time{}, err
	}
	var next time.Time
	earlier := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, e := range m.envs {
		if (f.Tenant != "" && e.env.TenantID != f.Tenant) || (len(f.Channels) > 0 && !slices.Contains(f.Channels, e.env.Channel)) {
			continue
		}
		for i, r := range e.rows {
			switch {
			case e.scheduled(i):
				earlier(r.due)
			case r.state == envelope.StateSending:
				earlier(r.leaseEnd)
			}
		}
	}
	return next, nil
}

func (m *model) Notify() <-chan struct{} { return m.notify }

func (m *model) Get(ctx context.Context, tenant, id string) (*queue.EnvelopeStatus, error) {
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	e, ok := m.envs[pair{tenantOf(tenant), id}]
	if !ok {
		return nil, queue.ErrNotFound
	}
	st := &queue.EnvelopeStatus{
		Tenant: e.env.TenantID, ID: e.env.ID, UserID: e.env.UserID, Channel: e.env.Channel,
		Template: e.env.Template, Status: queue.StatusDelivered, EnqueuedAt: e.enq,
		Envelope: copyEnvelope(e.env),
	}
	for i, r := range e.rows {
		if r.state != envelope.StateSent && st.Status == queue.StatusDelivered {
			st.Status = string(r.state)
		}
		st.Segments = append(st.Segments, queue.SegmentStatus{
			Index: i, State: r.state, Attempts: r.attempts, Class: r.class, Receipt: r.receipt,
			Fence: r.fence, NextAt: r.due, LeaseEnd: r.leaseEnd, UpdatedAt: r.updated,
			History: slices.Clone(r.history),
		})
	}
	return st, nil
}

func modelCursor(seq uint64, seg int) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatUint(seq, 10) + "." + strconv.Itoa(seg)))
}

func parseModelCursor(c string) (uint64, int, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err == nil {
		a, z, ok := strings.Cut(string(b), ".")
		seq, err1 := strconv.ParseUint(a, 10, 64)
		seg, err2 := strconv.Atoi(z)
		if ok && err1 == nil && err2 == nil {
			return seq, seg, nil
		}
	}
	return 0, 0, fmt.Errorf("model: %w", queue.ErrBadCursor)
}

// List pages through the rows in enqueue order, then segment order.
func (m *model) List(ctx context.Context, f queue.ListFilter) (*queue.Page, error) {
	var cseq uint64
	cseg := -1
	if f.Cursor != "" {
		var err error
		if cseq, cseg, err = parseModelCursor(f.Cursor); err != nil {
			return nil, err
		}
	}
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, 1000)
	page := &queue.Page{}
	type pos struct {
		seq uint64
		seg int
	}
	var last pos
	for _, e := range m.sorted() {
		if e.seq < cseq || (f.Tenant != "" && e.env.TenantID != f.Tenant) || (f.Channel != "" && e.env.Channel != f.Channel) {
			continue
		}
		for i, r := range e.rows {
			if (e.seq == cseq && i <= cseg) || (f.State != "" && r.state != f.State) {
				continue
			}
			if len(page.Rows) == limit {
				page.Next = modelCursor(last.seq, last.seg)
				return page, nil
			}
			page.Rows = append(page.Rows, queue.Row{
				Key:    envelope.Key{Tenant: e.env.TenantID, EnvelopeID: e.env.ID, Segment: i},
				UserID: e.env.UserID, Channel: e.env.Channel, State: r.state, Attempts: r.attempts,
				Class: r.class, UpdatedAt: r.updated,
			})
			last = pos{e.seq, i}
		}
	}
	return page, nil
}

func (m *model) Counts(ctx context.Context, tenant string) (queue.Counts, error) {
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	c := queue.Counts{}
	for _, e := range m.envs {
		if tenant != "" && e.env.TenantID != tenant {
			continue
		}
		for _, r := range e.rows {
			if c[r.state] == nil {
				c[r.state] = map[envelope.Channel]int{}
			}
			c[r.state][e.env.Channel]++
		}
	}
	return c, nil
}

// Requeue returns the dead_letter, unresolved, expired and suppressed
// segments to pending with a fresh retry budget (attempts and history
// kept); the first segment not sent is due now, later ones wait for their
// turn. Contract choice (queue/store.go): the row's last error class is kept (the requeue is recorded
// in the history with class operator).
func (m *model) Requeue(ctx context.Context, tenant, id string) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	e, ok := m.envs[pair{tenantOf(tenant), id}]
	if !ok {
		return queue.ErrNotFound
	}
	now := m.now()
	first := 0
	for first < len(e.rows) && e.rows[first].state == envelope.StateSent {
		first++
	}
	if first == len(e.rows) || !requeueable(e.rows[first].state) {
		return fmt.Errorf("model: requeue: %w", queue.ErrInvalidTransition)
	}
	// Refused when a claim now would only end it again.
	if x := e.env.ExpiresAt; !x.IsZero() && !now.Before(x) {
		return fmt.Errorf("model: requeue of an expired envelope: %w", queue.ErrInvalidTransition)
	}
	if ok, _ := m.allows(e.env); !ok {
		return fmt.Errorf("model: requeue refused by consent: %w", queue.ErrInvalidTransition)
	}
	for _, r := range e.rows[first:] {
		if requeueable(r.state) {
			r.state, r.updated, r.due, r.base = envelope.StatePending, now, time.Time{}, r.attempts
			r.record(now, r.attempts, envelope.StatePending, envelope.ClassOperator)
		}
	}
	e.schedule(now)
	return nil
}

func requeueable(st envelope.State) bool {
	switch st {
	case envelope.StateDeadLetter, envelope.StateUnresolved, envelope.StateExpired, envelope.StateSuppressed:
		return true
	}
	return false
}

// Resolve settles the unresolved segments as sent or retryable (due now,
// chat order kept); as is checked before the id.
func (m *model) Resolve(ctx context.Context, tenant, id string, as envelope.State) error {
	if as != envelope.StateSent && as != envelope.StateRetryable {
		return fmt.Errorf("model: resolve as %q: %w", as, queue.ErrInvalidTransition)
	}
	if err := m.check(ctx); err != nil {
		return err
	}
	e, ok := m.envs[pair{tenantOf(tenant), id}]
	if !ok {
		return queue.ErrNotFound
	}
	now := m.now()
	n := 0
	for _, r := range e.rows {
		if r.state != envelope.StateUnresolved {
			continue
		}
		r.state, r.updated, r.due = as, now, time.Time{}
		if as == envelope.StateSent {
			r.class = ""
		}
		r.record(now, r.attempts, as, envelope.ClassOperator)
		n++
	}
	if n == 0 {
		return fmt.Errorf("model: resolve: %w", queue.ErrInvalidTransition)
	}
	e.schedule(now)
	return nil
}

func (m *model) Consent(ctx context.Context, tenant, userID string) (queue.Consent, error) {
	if err := m.check(ctx); err != nil {
		return queue.Consent{}, err
	}
	c, ok := m.consent[pair{tenantOf(tenant), userID}]
	if !ok {
		return queue.Consent{}, nil
	}
	out := *c
	out.Suppressions = slices.Clone(c.Suppressions)
	return out, nil
}

var errModelNoUser = errors.New("model: user id is required")

// SetConsent replaces the flags. Contract choice (queue/store.go): an empty user id is refused (no
// envelope can name it).
func (m *model) SetConsent(ctx context.Context, tenant, userID string, f queue.ConsentFlags) error {
	if userID == "" {
		return errModelNoUser
	}
	if err := m.check(ctx); err != nil {
		return err
	}
	c := m.record(pair{tenantOf(tenant), userID})
	c.ConsentFlags, c.UpdatedAt = f, m.now()
	// An explicit opt-in lifts that channel's unsubscribes (the rest stay).
	var kept []queue.Suppression
	for _, s := range c.Suppressions {
		reOpt := s.Reason == envelope.ClassUnsubscribed &&
			((s.Channel == envelope.ChannelEmail || s.Channel == envelope.ChannelWeCom) && f.DigestEnabled || s.Channel == envelope.ChannelPush && f.PushEnabled)
		if !reOpt {
			kept = append(kept, s)
		}
	}
	c.Suppressions = kept
	return nil
}

// LiftSuppression removes the user's suppressions of ch (of target when
// given); ErrNotFound when none matched.
func (m *model) LiftSuppression(ctx context.Context, tenant, userID string, ch envelope.Channel, target string) error {
	if userID == "" {
		return errModelNoUser
	}
	if err := m.check(ctx); err != nil {
		return err
	}
	c := m.consent[pair{tenantOf(tenant), userID}]
	if c == nil {
		return queue.ErrNotFound
	}
	var kept []queue.Suppression
	for _, s := range c.Suppressions {
		if s.Channel != ch || (target != "" && s.Target != target) {
			kept = append(kept, s)
		}
	}
	if len(kept) == len(c.Suppressions) {
		return queue.ErrNotFound
	}
	c.Suppressions, c.UpdatedAt = kept, m.now()
	return nil
}

func (m *model) record(k pair) *queue.Consent {
	c := m.consent[k]
	if c == nil {
		c = &queue.Consent{}
		m.consent[k] = c
	}
	return c
}

// suppress adds s unless the channel and target are suppressed already
// (the record's update time moves either way).
func (m *model) suppress(k pair, s queue.Suppression, now time.Time) {
	c := m.record(k)
	c.UpdatedAt = now
	for _, x := range c.Suppressions {
		if x.Channel == s.Channel && x.Target == s.Target {
			return
		}
	}
	c.Suppressions = append(c.Suppressions, s)
}

// Suppress adds a suppression (At defaults to now). Contract choice (queue/store.go): an empty user id
// and an unknown channel are refused.
func (m *model) Suppress(ctx context.Context, tenant, userID string, s queue.Suppression) error {
	if userID == "" {
		return errModelNoUser
	}
	if !s.Channel.Valid() {
		return fmt.Errorf("model: suppression channel %q is unknown", s.Channel)
	}
	if err := m.check(ctx); err != nil {
		return err
	}
	now := m.now()
	if s.At.IsZero() {
		s.At = now
	}
	m.suppress(pair{tenantOf(tenant), userID}, s, now)
	return nil
}

// Erase deletes the user's envelopes and consent. Contract choice (queue/store.go): an empty user id
// is refused.
func (m *model) Erase(ctx context.Context, tenant, userID string) error {
	if userID == "" {
		return errModelNoUser
	}
	if err := m.check(ctx); err != nil {
		return err
	}
	tenant = tenantOf(tenant)
	for k, e := range m.envs {
		if e.env.TenantID == tenant && e.env.UserID == userID {
			delete(m.envs, k)
		}
	}
	delete(m.consent, pair{tenant, userID})
	delete(m.subs, pair{tenant, userID})
	return nil
}

// Prune deletes envelopes whose rows are all terminal and were last
// updated at least the retention period ago.
func (m *model) Prune(ctx context.Context) (int, error) {
	if err := m.check(ctx); err != nil {
		return 0, err
	}
	cutoff := m.now().Add(-m.retention)
	n := 0
	for k, e := range m.envs {
		old := true
		for _, r := range e.rows {
			old = old && r.state.Terminal() && !r.updated.After(cutoff)
		}
		if old {
			delete(m.envs, k)
			n++
		}
	}
	return n, nil
}

// SaveSubscription keeps one subscription per endpoint and lifts that
// endpoint's push suppression.
func (m *model) SaveSubscription(ctx context.Context, tenant, user string, sub envelope.PushSubscription) error {
	if err := queue.CheckSubscription(sub); err != nil {
		return err
	}
	if err := m.check(ctx); err != nil {
		return err
	}
	k := pair{tenantOf(tenant), user}
	if c := m.consent[k]; c != nil {
		c.Resubscribed(sub.Endpoint)
	}
	var kept []queue.Subscription
	for _, x := range m.subs[k] {
		if x.Sub.Endpoint != sub.Endpoint {
			kept = append(kept, x)
		}
	}
	m.subs[k] = append(kept, queue.Subscription{Sub: sub, Created: m.now().UTC()})
	return nil
}

func (m *model) DeleteSubscription(ctx context.Context, tenant, user, endpoint string) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	k := pair{tenantOf(tenant), user}
	for i, x := range m.subs[k] {
		if x.Sub.Endpoint == endpoint {
			m.subs[k] = append(m.subs[k][:i:i], m.subs[k][i+1:]...)
			return nil
		}
	}
	return queue.ErrNotFound
}

func (m *model) Subscriptions(ctx context.Context, tenant, user string) ([]queue.Subscription, error) {
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	return append([]queue.Subscription(nil), m.subs[pair{tenantOf(tenant), user}]...), nil
}

// SuppressEmail suppresses the address for the tenant, envelopes or not;
// the first suppression of an address stays. No consent record changes.
func (m *model) SuppressEmail(ctx context.Context, tenant, address string, reason envelope.ErrorClass) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	m.suppressAddress(tenantOf(tenant), queue.EmailSuppression(address, reason, m.now().UTC()))
	return nil
}

// AddressSuppressions lists the tenant's address suppressions by target.
func (m *model) AddressSuppressions(ctx context.Context, tenant string) ([]queue.Suppression, error) {
	if err := m.check(ctx); err != nil {
		return nil, err
	}
	var out []queue.Suppression
	for k, s := range m.addrs {
		if k.a == tenantOf(tenant) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b queue.Suppression) int { return strings.Compare(a.Target, b.Target) })
	return out, nil
}

// LiftAddressSuppression removes the tenant's suppression of target.
func (m *model) LiftAddressSuppression(ctx context.Context, tenant, target string) error {
	if err := m.check(ctx); err != nil {
		return err
	}
	k := pair{tenantOf(tenant), target}
	if _, ok := m.addrs[k]; !ok {
		return queue.ErrNotFound
	}
	delete(m.addrs, k)
	return nil
}

func (m *model) Close() error {
	m.closed = true
	return nil
}

// copyEnvelope returns a deep copy of e.
func copyEnvelope(e *envelope.Envelope) *envelope.Envelope {
	c := *e
	c.Payload = slices.Clone(e.Payload)
	if p := e.Recipient.PushSubscription; p != nil {
		ps := *p
		if p.ExpirationTime != nil {
			v := *p.ExpirationTime
			ps.ExpirationTime = &v
		}
		c.Recipient.PushSubscription = &ps
	}
	return &c
}
