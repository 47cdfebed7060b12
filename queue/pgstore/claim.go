package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

func channelsOf(req *queue.ClaimRequest) []string {
	out := make([]string, len(req.Channels))
	for i, c := range req.Channels {
		out[i] = string(c)
	}
	return out
}

// candidate is a row a claim or recovery found, its envelope locked.
type candidate struct {
	key  envKey
	seg  int
	user string
}

// lockCandidates locks the envelopes of up to limit rows of lane that are
// due at now (in wake time, then enqueue order), skipping envelopes another
// transaction holds. What the rows looked like in this query's snapshot
// proves nothing (a transaction that held the lock may have changed them):
// the caller reads them again and lets the state machine decide.
func (s *Store) lockCandidates(ctx context.Context, tx dbtx, lane int16, now time.Time, req *queue.ClaimRequest, extra string, limit int) ([]candidate, error) {
	// The lane is in the text: a generic plan must see that the partial
	// index (lane > 0) applies.
	q := `SELECT d.tenant, d.env_id, d.seg, e.user_id FROM {s}.deliveries d JOIN {s}.envelopes e ON e.tenant = d.tenant AND e.id = d.env_id
		WHERE d.lane = ` + strconv.Itoa(int(lane)) + ` AND d.wake_ns <= $1 AND ($2 = '' OR d.tenant = $2) AND (cardinality($3::text[]) = 0 OR d.channel = ANY($3))` + extra + `
		ORDER BY d.wake_ns, d.env_seq, d.seg`
	args := []any{now.UnixNano(), req.Tenant, channelsOf(req)}
	if limit > 0 {
		q += ` LIMIT $4`
		args = append(args, limit)
	}
	// The due rows come from the index in its order: the claim's pipe
	// allows no sort (claimSettings).
	rows, err := tx.Query(ctx, s.sql(q+` FOR UPDATE OF e SKIP LOCKED`), args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
		var c candidate
		err := r.Scan(&c.key.tenant, &c.key.id, &c.seg, &c.user)
		return c, err
	})
}

// fences hands out fences from the sequence, fetched ahead.
type fences struct {
	s   *Store
	ctx context.Context
	tx  batcher
	buf []uint64
	err error
}

func (s *Store) fencer(ctx context.Context, tx batcher) *fences {
	return &fences{s: s, ctx: ctx, tx: tx}
}

// part fetches fences until n are at hand, as part of a batch.
func (f *fences) part(n int) batchPart {
	n = max(n-len(f.buf), 0)
	var before int64
	return batchPart{
		queue: func(b *pgx.Batch) {
			before = f.s.drawn.fence.Load()
			b.Queue(f.s.sql(`SELECT nextval('{s}.fence_seq') FROM generate_series(1, $1)`), n)
		},
		read: func(br pgx.BatchResults) error {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return err
			}
			if err := f.s.drawnOK("fence_seq", before, out); err != nil {
				return err
			}
			if p, ok := f.tx.(*pipe); ok {
				p.drawn = append(p.drawn, func() { f.s.drew("fence_seq", out) })
			}
			for _, v := range out {
				f.buf = append(f.buf, uint64(v))
			}
			slices.Sort(f.buf)
			return nil
		},
	}
}

// reserve fetches fences until n are at hand.
func (f *fences) reserve(n int) error {
	if n <= len(f.buf) {
		return nil
	}
	return sendParts(f.ctx, f.tx, f.part(n))
}

// next is the state machine's fence function.
func (f *fences) next() uint64 {
	if len(f.buf) == 0 {
		if err := f.reserve(1); err != nil {
			f.err = err
			return 0
		}
	}
	v := f.buf[0]
	f.buf = f.buf[1:]
	return v
}

func (s *Store) lease(l *loaded, seg int, d *queue.Delivery) (*queue.Lease, error) {
	e, err := l.envelope()
	if err != nil {
		return nil, err
	}
	return &queue.Lease{
		Key:        envelope.Key{Tenant: l.key.tenant, EnvelopeID: l.key.id, Segment: seg},
		UserID:     l.userID,
		Channel:    l.channel,
		Owner:      d.Owner,
		Fence:      d.Fence,
		Attempt:    d.Attempts,
		ExpiresAt:  d.LeaseEnd,
		Segments:   l.segments,
		EnqueuedAt: l.enqueued,
		Envelope:   e,
	}, nil
}

// Claim leases up to req.Limit eligible rows, oldest due first (then in
// enqueue order); rows past their envelope's expires_at become expired and
// rows current consent forbids suppressed (neither counts or is returned).
// See queue.Store.
func (s *Store) Claim(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	req, err := req.Checked()
	if err != nil {
		return nil, err
	}
	var leases []*queue.Lease
	err = s.inPipe(ctx, "claim", claimSettings, func(tx *pipe) error {
		now := s.now()
		fs := s.fencer(ctx, tx)
		cc := s.newConsents()
		seen := map[candidate]bool{}
		for len(leases) < req.Limit {
			ask := req.Limit - len(leases)
			cands, err := s.lockCandidates(ctx, tx, laneDue, now, &req, "", ask)
			if err != nil {
				return err
			}
			// Fewer than asked: no other row is due unless one became so
			// since, and this pass is the last.
			last := len(cands) < ask
			cands = slices.DeleteFunc(cands, func(c candidate) bool { return seen[c] })
			if len(cands) == 0 {
				break
			}
			users := make([]userKey, 0, len(cands))
			for _, c := range cands {
				seen[c] = true
				users = append(users, userKey{c.key.tenant, c.user})
			}
			parts := []batchPart{fs.part(len(cands))}
			if p, ok := cc.part(users); ok {
				parts = append(parts, p)
			}
			envs, err := s.loadMany(ctx, tx, keysOf(cands), parts...)
			if err != nil {
				return err
			}
			var r round
			for _, c := range cands {
				l := envs[c.key]
				if l == nil || c.seg >= len(l.rows) || !l.rows[c.seg].Eligible(now) {
					continue // changed since the candidates' snapshot: no longer due
				}
				if len(r.took) == req.Limit-len(leases) {
					break
				}
				e, err := l.envelope()
				if err != nil {
					return err
				}
				con, found, err := cc.get(ctx, tx, l.key.tenant, l.userID)
				if err != nil {
					return err
				}
				v := queue.Judge(e, con, found, l.addr, now)
				st, err := queue.Claim(l.rows, c.seg, v, req, fs.next, now)
				if err != nil {
					return err
				}
				if err := r.add(l, c.seg, st, v.State == envelope.StateSending, fs.err); err != nil {
					return err
				}
			}
			if last || len(leases)+len(r.took) == req.Limit {
				return s.finish(ctx, tx, &r, &leases)
			}
			if leases, err = s.write(ctx, tx, &r, leases); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return leases, nil
}

// round collects the row changes of one pass of a claim or recovery and
// the rows it leased.
type round struct {
	b    rowBatch
	took []taken
}

type taken struct {
	l   *loaded
	seg int
}

// add takes a step of the state machine on l (fenceErr: the fence
// function's error, if it failed).
func (r *round) add(l *loaded, seg int, st *queue.Step, leased bool, fenceErr error) error {
	if fenceErr != nil {
		return fenceErr
	}
	if err := addStep(&r.b, l, st); err != nil {
		return err
	}
	l.rows = st.Rows
	if leased {
		r.took = append(r.took, taken{l, seg})
	}
	return nil
}

// write persists a round and appends its leases to leases.
func (s *Store) write(ctx context.Context, tx batcher, r *round, leases []*queue.Lease) ([]*queue.Lease, error) {
	if err := s.updateRows(ctx, tx, &r.b); err != nil {
		return nil, err
	}
	return s.leasesOf(r, leases)
}

// finish persists a round and commits in one round trip, and appends its
// leases to *leases.
func (s *Store) finish(ctx context.Context, tx *pipe, r *round, leases *[]*queue.Lease) error {
	var parts []batchPart
	if r.b.len() > 0 {
		parts = append(parts, s.updatePart(&r.b))
	}
	if err := tx.commitWith(ctx, parts...); err != nil {
		return err
	}
	ls, err := s.leasesOf(r, *leases)
	*leases = ls
	return err
}

func (s *Store) leasesOf(r *round, leases []*queue.Lease) ([]*queue.Lease, error) {
	for _, t := range r.took {
		ls, err := s.lease(t.l, t.seg, &t.l.rows[t.seg])
		if err != nil {
			return nil, err
		}
		leases = append(leases, ls)
	}
	return leases, nil
}

func keysOf(cs []candidate) []envKey {
	out := make([]envKey, 0, len(cs))
	for _, c := range cs {
		if !slices.Contains(out, c.key) {
			out = append(out, c.key)
		}
	}
	return out
}

var errNilLease = fmt.Errorf("queue: nil lease: %w", queue.ErrLeaseLost)

// Commit applies out to the leased row and its effects in one transaction.
// Concurrent commits share it (group commit), each still all or nothing: a
// commit refused by the state machine fails alone. See queue.Store.
func (s *Store) Commit(ctx context.Context, lease *queue.Lease, out queue.Outcome) error {
	if !queue.ValidOutcome(out.State) {
		return fmt.Errorf("%w: cannot commit %q", queue.ErrInvalidTransition, out.State)
	}
	if lease == nil {
		if err := s.check(ctx); err != nil {
			return err
		}
		return errNilLease
	}
	if err := s.check(ctx); err != nil {
		return err
	}
	c := &commitCall{ctx: ctx, lease: lease, out: out}
	if err := s.commits.do(ctx, c); err != nil {
		return err
	}
	if c.wake {
		s.wake()
	}
	return c.err
}

// commitCall is one Commit call on its way through a group.
type commitCall struct {
	ctx   context.Context
	lease *queue.Lease
	out   queue.Outcome
	wake  bool // its step made a row claimable (a group's commit signals Notify here)
	err   error
}

func (c *commitCall) key() envKey { return envKey{c.lease.Key.Tenant, c.lease.Key.EnvelopeID} }

func (s *Store) committer() *group[*commitCall] {
	return &group[*commitCall]{size: func(*commitCall) int { return 1 }, max: maxGroup, run: s.commitGroup}
}

// commitAlone commits one call in a transaction of its own.
func (s *Store) commitAlone(c *commitCall) {
	c.err = s.withLease(c.ctx, "commit", c.lease, func(rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		return queue.Commit(s.backoff, rows, c.lease, c.out, now)
	})
}

// commitGroup commits the calls of grp in one transaction: it locks their
// envelopes (skipping those another transaction holds), steps the state
// machine for each and writes every changed row in one statement, with the
// COMMIT. A call whose envelope it could not lock, or whose envelope is
// another call's already, goes alone after it; when the server refuses the
// group's statements, every call goes alone.
func (s *Store) commitGroup(ctx context.Context, grp []*commitCall) {
	if len(grp) == 1 {
		s.commitAlone(grp[0])
		return
	}
	seen := map[envKey]bool{}
	var here, after []*commitCall
	for _, c := range grp {
		if seen[c.key()] {
			after = append(after, c)
			continue
		}
		seen[c.key()] = true
		here = append(here, c)
	}
	type result struct {
		err  error
		wake bool
	}
	res := make([]result, len(here))
	var skipped []*commitCall
	err := s.inPipe(ctx, "commit", pipeSettings, func(tx *pipe) error {
		keys := make([]envKey, len(here))
		for i, c := range here {
			keys[i] = c.key()
		}
		envs, err := s.lockMany(ctx, tx, keys)
		if err != nil {
			return err
		}
		now := s.now()
		var b rowBatch
		for i, c := range here {
			l := envs[c.key()]
			if l == nil {
				skipped = append(skipped, c) // held by another transaction, or gone: alone tells which
				continue
			}
			st, err := queue.Commit(s.backoff, l.rows, c.lease, c.out, now)
			if err != nil {
				res[i].err = err
				continue
			}
			if err := addStep(&b, l, st); err != nil {
				return err
			}
			if st.Suppress != "" {
				if err := s.suppressFor(ctx, tx, l, st, now); err != nil {
					return err
				}
			}
			res[i].wake = st.Wake
		}
		var parts []batchPart
		if b.len() > 0 {
			parts = append(parts, s.updatePart(&b))
		}
		return tx.commitWith(ctx, parts...)
	})
	var pe *pgconn.PgError
	switch {
	case err == nil:
		for i, c := range here {
			if !slices.Contains(skipped, c) {
				c.err, c.wake = res[i].err, res[i].wake
			}
		}
		after = append(skipped, after...)
	case errors.As(err, &pe):
		after = append(here, after...)
	default:
		for _, c := range here {
			c.err = err
		}
	}
	for _, c := range after {
		s.commitAlone(c)
	}
}

// Release gives back a lease whose provider call never started. See
// queue.Store.
func (s *Store) Release(ctx context.Context, lease *queue.Lease) error {
	return s.withLease(ctx, "release", lease, func(rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		return queue.Release(rows, lease, now)
	})
}

func (s *Store) withLease(ctx context.Context, op string, lease *queue.Lease, step func([]queue.Delivery, time.Time) (*queue.Step, error)) error {
	if lease == nil {
		if err := s.check(ctx); err != nil {
			return err
		}
		return errNilLease
	}
	return s.change(ctx, op, envKey{lease.Key.Tenant, lease.Key.EnvelopeID}, queue.ErrLeaseLost, step)
}

// change locks one envelope, applies a state machine step to its rows and
// its effects, and signals Notify when the step says so; missing is the
// error for an envelope that is not there.
func (s *Store) change(ctx context.Context, op string, k envKey, missing error, step func([]queue.Delivery, time.Time) (*queue.Step, error)) error {
	return s.changeLoaded(ctx, op, k, missing, func(_ dbtx, l *loaded, now time.Time) (*queue.Step, error) { return step(l.rows, now) })
}

// changeLoaded is change for a step that needs the envelope (l) and the
// transaction.
func (s *Store) changeLoaded(ctx context.Context, op string, k envKey, missing error, step func(dbtx, *loaded, time.Time) (*queue.Step, error)) error {
	wake := false
	err := s.inPipe(ctx, op, pipeSettings, func(tx *pipe) error {
		l, err := s.lockOne(ctx, tx, k)
		if err != nil {
			return err
		}
		if l == nil {
			return missing
		}
		now := s.now()
		st, err := step(tx, l, now)
		if err != nil {
			return err
		}
		var b rowBatch
		if err := addStep(&b, l, st); err != nil {
			return err
		}
		wake = st.Wake
		if st.Suppress == "" {
			var parts []batchPart
			if b.len() > 0 {
				parts = append(parts, s.updatePart(&b))
			}
			return tx.commitWith(ctx, parts...)
		}
		if err := s.updateRows(ctx, tx, &b); err != nil {
			return err
		}
		return s.suppressFor(ctx, tx, l, st, now)
	})
	if err != nil {
		return err
	}
	if wake {
		s.wake()
	}
	return nil
}

// suppressFor writes the suppressions a step asks for (st.Suppress).
func (s *Store) suppressFor(ctx context.Context, tx dbtx, l *loaded, st *queue.Step, now time.Time) error {
	e, err := l.envelope()
	if err != nil {
		return err
	}
	if err := s.suppress(ctx, tx, userKey{l.key.tenant, l.userID}, queue.SuppressionFor(e, st.Suppress, now), now); err != nil {
		return err
	}
	if a, ok := st.AddressSuppression(e, now); ok {
		return s.suppressAddress(ctx, tx, l.key.tenant, a)
	}
	return nil
}

// Recover leases up to req.Limit rows whose lease expired, for
// reconciliation, oldest lease end first; rows claimed with ExpireToPending
// go back to pending instead, whatever the limit. See queue.Store.
func (s *Store) Recover(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	leases, _, err := s.recover(ctx, req, 2)
	return leases, err
}

// ReturnExpiredSeam returns the rows whose ExpireToPending lease (the HTTP
// seam's) expired to pending, and nothing else: what a serve without a
// built-in worker runs, where no one reconciles the other leases. It
// returns how many rows it returned.
func (s *Store) ReturnExpiredSeam(ctx context.Context) (int, error) {
	_, n, err := s.recover(ctx, queue.ClaimRequest{Owner: "seam", Lease: time.Second}, 1)
	return n, err
}

// recover is Recover's pass over the seam's leases, then (passes 2) the others.
func (s *Store) recover(ctx context.Context, req queue.ClaimRequest, passes int) ([]*queue.Lease, int, error) {
	req, err := req.Checked()
	if err != nil {
		return nil, 0, err
	}
	now := s.now()
	if due, err := s.leaseEnded(ctx, now, &req); err != nil || !due {
		return nil, 0, err
	}
	var leases []*queue.Lease
	wake, expired := false, 0
	err = s.inPipe(ctx, "recover", claimSettings, func(tx *pipe) error {
		fs := s.fencer(ctx, tx)
		seen := map[candidate]bool{}
		// The seam's leases first, all of them; then up to the limit.
		for pass := 0; pass < passes; pass++ {
			for {
				var (
					cands []candidate
					err   error
				)
				if pass == 0 {
					cands, err = s.lockCandidates(ctx, tx, laneLeased, now, &req, ` AND d.to_pending`, 0)
				} else {
					if len(leases) >= req.Limit {
						break
					}
					cands, err = s.lockCandidates(ctx, tx, laneLeased, now, &req, ` AND NOT d.to_pending`, req.Limit-len(leases))
				}
				if err != nil {
					return err
				}
				cands = slices.DeleteFunc(cands, func(c candidate) bool { return seen[c] })
				if len(cands) == 0 {
					break
				}
				var parts []batchPart
				if pass == 1 {
					parts = append(parts, fs.part(len(cands)))
				}
				envs, err := s.loadMany(ctx, tx, keysOf(cands), parts...)
				if err != nil {
					return err
				}
				var r round
				for _, c := range cands {
					seen[c] = true
					l := envs[c.key]
					if l == nil || c.seg >= len(l.rows) || !queue.LeaseExpired(&l.rows[c.seg], now) {
						continue
					}
					if !l.rows[c.seg].ToPending && len(leases)+len(r.took) >= req.Limit {
						continue
					}
					st, leased, err := queue.Recover(l.rows, c.seg, req, fs.next, now)
					if err != nil {
						return err
					}
					if err := r.add(l, c.seg, st, leased, fs.err); err != nil {
						return err
					}
					wake = wake || st.Wake
					if !leased {
						expired++
					}
				}
				if leases, err = s.write(ctx, tx, &r, leases); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	if expired > 0 {
		s.metrics.SeamExpired.Add(float64(expired))
	}
	if wake {
		s.wake()
	}
	return leases, expired, nil
}

// leaseEnded reports whether a row's lease has ended by now (one query,
// outside a transaction: most recoveries find none).
func (s *Store) leaseEnded(ctx context.Context, now time.Time, req *queue.ClaimRequest) (bool, error) {
	if err := s.check(ctx); err != nil {
		return false, err
	}
	var due bool
	err := s.readParts(ctx, batchPart{
		queue: func(b *pgx.Batch) {
			b.Queue(s.sql(`SELECT EXISTS (SELECT 1 FROM {s}.deliveries d
				WHERE d.lane = `+strconv.Itoa(laneLeased)+` AND d.wake_ns <= $1 AND ($2 = '' OR d.tenant = $2)
				AND (cardinality($3::text[]) = 0 OR d.channel = ANY($3)))`), now.UnixNano(), req.Tenant, channelsOf(req))
		},
		read: func(br pgx.BatchResults) error { return br.QueryRow().Scan(&due) },
	})
	return due, safeErr("recover", err)
}

// NextDue returns the earliest due time of a row f admits waiting to be
// claimed, or lease end of such a sending row; the zero time when there is
// none.
func (s *Store) NextDue(ctx context.Context, f queue.DueFilter) (time.Time, error) {
	if err := s.check(ctx); err != nil {
		return time.Time{}, err
	}
	var n *int64
	err := s.readParts(ctx, batchPart{
		queue: func(b *pgx.Batch) {
			b.Queue(s.sql(`SELECT least(
				(SELECT min(wake_ns) FROM {s}.deliveries WHERE lane = 1 AND ($1 = '' OR tenant = $1) AND (cardinality($2::text[]) = 0 OR channel = ANY($2))),
				(SELECT min(wake_ns) FROM {s}.deliveries WHERE lane = 2 AND ($1 = '' OR tenant = $1) AND (cardinality($2::text[]) = 0 OR channel = ANY($2))))`),
				f.Tenant, channelsOf(&queue.ClaimRequest{Channels: f.Channels}))
		},
		read: func(br pgx.BatchResults) error { return br.QueryRow().Scan(&n) },
	})
	if err != nil {
		return time.Time{}, safeErr("next due", err)
	}
	return timeOf(n), nil
}
