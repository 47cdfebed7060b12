package pgstore

import (
	"context"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Enqueue validates every envelope (queue.Prepare), admits the new ones
// (queue.Admit: expiry and current consent) and stores them in one
// statement, so in one transaction: on any error nothing is stored. A
// (tenant, id) stored already, or by a concurrent call that commits first,
// is a duplicate. Concurrent calls share that statement (group commit):
// while one group's statements run, the calls that arrive wait and go
// together in the next group, each call still all or nothing. See
// queue.Store.
func (s *Store) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]queue.EnqueueResult, error) {
	prep, err := queue.Prepare(envs)
	if err != nil {
		return nil, err
	}
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	c := &enqCall{ctx: ctx, prep: prep}
	if err := s.enq.do(ctx, c); err != nil {
		c.err = err
	}
	if c.err != nil {
		var ee *queue.EnqueueError
		if !errors.As(c.err, &ee) && !errors.Is(c.err, queue.ErrClosed) && ctx.Err() == nil {
			s.metrics.EnqueueErrors.Inc()
		}
		return nil, c.err
	}
	for i, r := range c.res {
		if r.Duplicate {
			s.metrics.Duplicates.Inc()
		} else {
			s.metrics.Enqueued.WithLabelValues(string(prep[i].Env.Channel)).Inc()
		}
	}
	if c.created {
		s.wake()
	}
	return c.res, nil
}

// enqCall is one Enqueue call on its way through a group.
type enqCall struct {
	ctx     context.Context
	prep    []queue.Prepared
	res     []queue.EnqueueResult
	created bool // it stored at least one envelope
	err     error
}

// maxGroup bounds the envelopes of one group (a call larger than that goes
// alone).
const maxGroup = 1000

func (s *Store) enqueuer() *group[*enqCall] {
	return &group[*enqCall]{
		size: func(c *enqCall) int { return len(c.prep) },
		max:  maxGroup,
		run:  s.enqueueGroup,
	}
}

// enqueueGroup stores the calls of grp. When the server refuses the
// group's statement, each call is tried alone, so that no call fails for
// another's envelopes.
func (s *Store) enqueueGroup(ctx context.Context, grp []*enqCall) {
	err := safeErr("enqueue", s.enqueue(ctx, grp))
	var pe *pgconn.PgError
	if err != nil && len(grp) > 1 && errors.As(err, &pe) {
		for _, c := range grp {
			c.err = safeErr("enqueue", s.enqueue(c.ctx, []*enqCall{c}))
		}
		return
	}
	if err != nil {
		for _, c := range grp {
			c.res, c.created, c.err = nil, false, err
		}
	}
}

// entry is one envelope of a group.
type entry struct {
	call *enqCall
	i    int // its index in the call
	key  envKey
}

// enqueue stores the calls' envelopes in one statement. A call refused by
// queue.Admit gets its error and stores nothing; the others go on. The
// reads need no transaction (READ COMMITTED gives each statement its own
// snapshot either way, and the insert's ON CONFLICT settles a race with
// another call); the one INSERT statement is atomic. It returns an error
// that fails every call of the group.
func (s *Store) enqueue(ctx context.Context, grp []*enqCall) error {
	now := s.now()
	var (
		all     []entry
		users   []userKey
		targets []envKey // (tenant, address target)
	)
	for _, c := range grp {
		c.res, c.created, c.err = make([]queue.EnqueueResult, len(c.prep)), false, nil
		for i, p := range c.prep {
			e := p.Env
			k := envKey{e.TenantID, e.ID}
			all = append(all, entry{c, i, k})
			c.res[i] = queue.EnqueueResult{Tenant: k.tenant, ID: k.id, Segments: p.Segments}
			users = append(users, userKey{e.TenantID, e.UserID})
			if t := queue.AddressTarget(e); t != "" {
				targets = append(targets, envKey{e.TenantID, t})
			}
		}
	}
	keys := make([]envKey, len(all))
	for n, en := range all {
		keys[n] = en.key
	}

	// One round trip: what is stored already, the consent the envelopes
	// need (read for all, used for the new ones only), and sequence
	// numbers for enqueue order (taken for all, given out in the group's
	// order to the new ones).
	stored := map[envKey]int{}
	addrs := map[envKey]queue.Suppression{}
	var seqs []int64
	cc := s.newConsents()
	var before int64
	parts := []batchPart{s.segmentsPart(keys, stored), s.addressPart(targets, addrs), {
		queue: func(b *pgx.Batch) {
			before = s.drawn.envelope.Load()
			b.Queue(s.sql(`SELECT nextval('{s}.envelope_seq') FROM generate_series(1, $1)`), len(all))
		},
		read: func(br pgx.BatchResults) error {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			if seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				return err
			}
			slices.Sort(seqs)
			return s.drawnOK("envelope_seq", before, seqs)
		},
	}}
	if p, ok := cc.part(users); ok {
		parts = append(parts, p)
	}
	if err := s.readParts(ctx, parts...); err != nil {
		return err
	}
	s.drew("envelope_seq", seqs) // committed: readParts is a transaction

	// Call by call, in order: an envelope stored already, or earlier in
	// the call or in an admitted call before it, is a duplicate; the new
	// ones must pass queue.Admit, or the call fails alone.
	seen := map[envKey]bool{}
	var fresh []entry
	for _, c := range grp {
		mine := map[envKey]bool{}
		var add []entry
		for i, p := range c.prep {
			k := envKey{p.Env.TenantID, p.Env.ID}
			if _, ok := stored[k]; ok || seen[k] || mine[k] {
				c.res[i].Duplicate = true
				continue
			}
			mine[k] = true
			e := p.Env
			con, found, err := cc.get(ctx, s.pool, e.TenantID, e.UserID)
			if err != nil {
				c.err = &queue.EnqueueError{Index: i, Tenant: e.TenantID, ID: e.ID, Err: err}
				break
			}
			var addr *queue.Suppression
			if a, ok := addrs[envKey{e.TenantID, queue.AddressTarget(e)}]; ok {
				addr = &a
			}
			if err := queue.Admit(i, e, con, found, addr, now); err != nil {
				c.err = err
				break
			}
			add = append(add, entry{c, i, k})
		}
		if c.err != nil {
			c.res = nil
			continue
		}
		for k := range mine {
			seen[k] = true
		}
		fresh = append(fresh, add...)
	}

	// The envelopes and their rows in one statement: the rows of an
	// envelope that a concurrent call stored first are not inserted.
	inserted := map[envKey]bool{}
	if len(fresh) > 0 {
		var (
			ts, ids, us, chs, tpls, addrT []string
			segs                          []int32
			sq                            []int64
			bodies                        [][]byte
			b                             rowBatch
		)
		for n, en := range fresh {
			p := en.call.prep[en.i]
			e := p.Env
			ts, ids, us = append(ts, e.TenantID), append(ids, e.ID), append(us, e.UserID)
			chs, tpls, addrT = append(chs, string(e.Channel)), append(tpls, string(e.Template)), append(addrT, queue.AddressTarget(e))
			segs, sq, bodies = append(segs, int32(p.Segments)), append(sq, seqs[n]), append(bodies, p.Line)
			for seg, d := range queue.NewRows(e, p.Segments, now) {
				if err := b.add(en.key, seg, seqs[n], e.Channel, &d, nil); err != nil {
					return err
				}
			}
		}
		args := append(b.args(), ts, ids, sq, us, chs, tpls, addrT, segs, now.UnixNano(), bodies)
		rows, err := s.pool.Query(ctx, s.sql(`WITH ins AS (
				INSERT INTO {s}.envelopes (tenant, id, seq, user_id, channel, template, addr_target, segments, enqueued_ns, body)
				SELECT t, i, sq, u, ch, tp, ad, sg, $30, b
				FROM unnest($22::text[], $23::text[], $24::bigint[], $25::text[], $26::text[], $27::text[], $28::text[], $29::int[], $31::bytea[])
					AS x(t, i, sq, u, ch, tp, ad, sg, b)
				ON CONFLICT (tenant, id) DO NOTHING
				RETURNING tenant, id
			), rows AS (
				INSERT INTO {s}.deliveries (`+rowColumns+`)
				SELECT u.t, u.i, sg, sq, ch, st, at, bu, cl, rc, du, ow, fe, le, fr, tp, up, hi::jsonb, ln, wk, te
				FROM `+unnestRows+`) AS u(t, i, sg, sq, ch, st, at, bu, cl, rc, du, ow, fe, le, fr, tp, up, hi, ln, wk, te)
				JOIN ins ON ins.tenant = u.t AND ins.id = u.i
			)
			SELECT tenant, id FROM ins`), args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k envKey
			if err := rows.Scan(&k.tenant, &k.id); err != nil {
				rows.Close()
				return err
			}
			inserted[k] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}

	// The segment counts of the duplicates: stored already, stored by
	// this group, or by a concurrent call that committed first.
	segments := stored
	var lost []envKey
	for _, en := range fresh {
		if inserted[en.key] {
			segments[en.key] = en.call.prep[en.i].Segments
			en.call.created = true
		} else {
			en.call.res[en.i].Duplicate = true
			lost = append(lost, en.key)
		}
	}
	if len(lost) > 0 {
		if err := s.readParts(ctx, s.segmentsPart(lost, segments)); err != nil {
			return err
		}
	}
	for _, en := range all {
		if r := en.call.res; r != nil && r[en.i].Duplicate {
			r[en.i].Segments = segments[en.key]
		}
	}
	return nil
}

// segmentsPart reads into out the segment counts of the stored envelopes
// among keys.
func (s *Store) segmentsPart(keys []envKey, out map[envKey]int) batchPart {
	ts, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ts[i], ids[i] = k.tenant, k.id
	}
	return batchPart{
		queue: func(b *pgx.Batch) {
			b.Queue(s.sql(`SELECT tenant, id, segments FROM {s}.envelopes
				WHERE (tenant, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`), ts, ids)
		},
		read: func(br pgx.BatchResults) error {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var (
					k envKey
					n int
				)
				if err := rows.Scan(&k.tenant, &k.id, &n); err != nil {
					return err
				}
				out[k] = n
			}
			return rows.Err()
		},
	}
}

// addressPart reads into out the tenants' suppressions of the given
// (tenant, target) pairs.
func (s *Store) addressPart(targets []envKey, out map[envKey]queue.Suppression) batchPart {
	ts, gs := make([]string, len(targets)), make([]string, len(targets))
	for i, k := range targets {
		ts[i], gs[i] = k.tenant, k.id
	}
	return batchPart{
		queue: func(b *pgx.Batch) {
			b.Queue(s.sql(`SELECT tenant, target, channel, reason, at_ns FROM {s}.address_suppressions
				WHERE (tenant, target) IN (SELECT * FROM unnest($1::text[], $2::text[]))`), ts, gs)
		},
		read: func(br pgx.BatchResults) error {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var (
					k      envKey
					a      queue.Suppression
					ch, rs string
					at     int64
				)
				if err := rows.Scan(&k.tenant, &k.id, &ch, &rs, &at); err != nil {
					return err
				}
				a.Channel, a.Target, a.Reason, a.At = envelope.Channel(ch), k.id, envelope.ErrorClass(rs), timeNs(at)
				out[k] = a
			}
			return rows.Err()
		},
	}
}
