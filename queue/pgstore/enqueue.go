package pgstore

import (
	"context"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Enqueue validates every envelope (queue.Prepare), admits the new ones
// (queue.Admit: expiry and current consent) and stores them in one
// transaction: on any error nothing is stored. A (tenant, id) stored
// already, or by a concurrent call that commits first, is a duplicate. See
// queue.Store.
func (s *Store) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]queue.EnqueueResult, error) {
	prep, err := queue.Prepare(envs)
	if err != nil {
		return nil, err
	}
	var (
		res     []queue.EnqueueResult
		created bool
	)
	err = s.inTx(ctx, "enqueue", func(tx pgx.Tx) error {
		var err error
		res, created, err = s.enqueue(ctx, tx, prep)
		return err
	})
	if err != nil {
		var ee *queue.EnqueueError
		if !errors.As(err, &ee) && !errors.Is(err, queue.ErrClosed) {
			s.metrics.EnqueueErrors.Inc()
		}
		return nil, err
	}
	for i, r := range res {
		if r.Duplicate {
			s.metrics.Duplicates.Inc()
		} else {
			s.metrics.Enqueued.WithLabelValues(string(prep[i].Env.Channel)).Inc()
		}
	}
	if created {
		s.wake()
	}
	return res, nil
}

func (s *Store) enqueue(ctx context.Context, tx pgx.Tx, prep []queue.Prepared) ([]queue.EnqueueResult, bool, error) {
	now := s.now()
	res := make([]queue.EnqueueResult, len(prep))
	keys := make([]envKey, len(prep))
	users := make([]userKey, 0, len(prep))
	var targets []envKey // (tenant, address target)
	for i, p := range prep {
		e := p.Env
		keys[i] = envKey{e.TenantID, e.ID}
		res[i] = queue.EnqueueResult{Tenant: keys[i].tenant, ID: keys[i].id, Segments: p.Segments}
		users = append(users, userKey{e.TenantID, e.UserID})
		if t := queue.AddressTarget(e); t != "" {
			targets = append(targets, envKey{e.TenantID, t})
		}
	}

	// One round trip: what is stored already, the consent the envelopes
	// need (read for all, used for the new ones only), and sequence
	// numbers for enqueue order (taken for all, given out in the call's
	// order to the new ones).
	stored := map[envKey]int{}
	addrs := map[envKey]queue.Suppression{}
	var seqs []int64
	cc := s.newConsents()
	parts := []batchPart{s.segmentsPart(keys, stored), s.addressPart(targets, addrs), {
		queue: func(b *pgx.Batch) {
			b.Queue(s.sql(`SELECT nextval('{s}.envelope_seq') FROM generate_series(1, $1)`), len(prep))
		},
		read: func(br pgx.BatchResults) error {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			slices.Sort(seqs)
			return err
		},
	}}
	if p, ok := cc.part(users); ok {
		parts = append(parts, p)
	}
	if err := sendParts(ctx, tx, parts...); err != nil {
		return nil, false, err
	}

	seen := make(map[envKey]int, len(prep))
	var fresh []int // indexes of the envelopes to store
	for i := range prep {
		k := keys[i]
		if n, ok := stored[k]; ok {
			res[i].Duplicate, res[i].Segments = true, n
			continue
		}
		if j, ok := seen[k]; ok {
			res[i].Duplicate, res[i].Segments = true, prep[j].Segments
			continue
		}
		seen[k] = i
		fresh = append(fresh, i)
	}
	if len(fresh) == 0 {
		return res, false, nil
	}
	for _, i := range fresh {
		e := prep[i].Env
		c, found, err := cc.get(ctx, tx, e.TenantID, e.UserID)
		if err != nil {
			return nil, false, &queue.EnqueueError{Index: i, Tenant: e.TenantID, ID: e.ID, Err: err}
		}
		var addr *queue.Suppression
		if a, ok := addrs[envKey{e.TenantID, queue.AddressTarget(e)}]; ok {
			addr = &a
		}
		if err := queue.Admit(i, e, c, found, addr, now); err != nil {
			return nil, false, err
		}
	}

	// The envelopes and their rows in one statement: the rows of an
	// envelope that a concurrent call stored first are not inserted.
	var (
		ts, ids, us, chs, tpls, addrT []string
		segs                          []int32
		sq                            []int64
		bodies                        [][]byte
		b                             rowBatch
	)
	for n, i := range fresh {
		e := prep[i].Env
		ts, ids, us = append(ts, e.TenantID), append(ids, e.ID), append(us, e.UserID)
		chs, tpls, addrT = append(chs, string(e.Channel)), append(tpls, string(e.Template)), append(addrT, queue.AddressTarget(e))
		segs, sq, bodies = append(segs, int32(prep[i].Segments)), append(sq, seqs[n]), append(bodies, prep[i].Line)
		for seg, d := range queue.NewRows(e, prep[i].Segments, now) {
			if err := b.add(keys[i], seg, seqs[n], e.Channel, &d, nil); err != nil {
				return nil, false, err
			}
		}
	}
	args := append(b.args(), ts, ids, sq, us, chs, tpls, addrT, segs, now.UnixNano(), bodies)
	rows, err := tx.Query(ctx, s.sql(`WITH ins AS (
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
		return nil, false, err
	}
	inserted := map[envKey]bool{}
	for rows.Next() {
		var k envKey
		if err := rows.Scan(&k.tenant, &k.id); err != nil {
			rows.Close()
			return nil, false, err
		}
		inserted[k] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, err
	}

	// A concurrent call stored some first: they are duplicates.
	var lost []envKey
	for _, i := range fresh {
		if !inserted[keys[i]] {
			lost = append(lost, keys[i])
		}
	}
	if len(lost) > 0 {
		won := map[envKey]int{}
		if err := sendParts(ctx, tx, s.segmentsPart(lost, won)); err != nil {
			return nil, false, err
		}
		for _, i := range fresh {
			if n, ok := won[keys[i]]; ok && !inserted[keys[i]] {
				res[i].Duplicate, res[i].Segments = true, n
			}
		}
	}
	return res, len(inserted) > 0, nil
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
