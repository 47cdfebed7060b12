package pgstore

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Enqueue validates every envelope (queue.Prepare), checks current consent
// and stores the new ones in one transaction: on any error nothing is
// stored. A (tenant, id) stored already, or by a concurrent call that
// commits first, is a duplicate. See queue.Store.
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
		return nil, err
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
	for i, p := range prep {
		keys[i] = envKey{p.Env.TenantID, p.Env.ID}
		res[i] = queue.EnqueueResult{Tenant: keys[i].tenant, ID: keys[i].id, Segments: p.Segments}
	}
	stored, err := s.segmentsOf(ctx, tx, keys)
	if err != nil {
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

	// Consent, for the envelopes the call would store only.
	users := make([]userKey, 0, len(fresh))
	var targets []envKey // (tenant, address target)
	for _, i := range fresh {
		e := prep[i].Env
		users = append(users, userKey{e.TenantID, e.UserID})
		if t := queue.AddressTarget(e); t != "" {
			targets = append(targets, envKey{e.TenantID, t})
		}
	}
	cc := s.newConsents()
	if err := cc.preload(ctx, tx, users); err != nil {
		return nil, false, err
	}
	addrs, err := s.addressSuppressions(ctx, tx, targets)
	if err != nil {
		return nil, false, err
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
		if ok, class := queue.Permits(e, &c, found, addr); !ok {
			return nil, false, &queue.EnqueueError{Index: i, Tenant: e.TenantID, ID: e.ID, Reason: class, Err: queue.ErrConsentDenied}
		}
	}

	// Enqueue order: sequence numbers taken in one query, given out in the call's order.
	seqs := make([]int64, 0, len(fresh))
	rows, err := tx.Query(ctx, s.sql(`SELECT nextval('{s}.envelope_seq') FROM generate_series(1, $1)`), len(fresh))
	if err != nil {
		return nil, false, err
	}
	seqs, err = pgx.AppendRows(seqs, rows, pgx.RowTo[int64])
	if err != nil {
		return nil, false, err
	}
	slices.Sort(seqs)

	var (
		ts, ids, us, chs, tpls, addrT []string
		segs                          []int32
		sq                            []int64
		bodies                        [][]byte
	)
	for n, i := range fresh {
		e := prep[i].Env
		ts, ids, us = append(ts, e.TenantID), append(ids, e.ID), append(us, e.UserID)
		chs, tpls, addrT = append(chs, string(e.Channel)), append(tpls, string(e.Template)), append(addrT, queue.AddressTarget(e))
		segs, sq, bodies = append(segs, int32(prep[i].Segments)), append(sq, seqs[n]), append(bodies, prep[i].Line)
	}
	rows, err = tx.Query(ctx, s.sql(`INSERT INTO {s}.envelopes (tenant, id, seq, user_id, channel, template, addr_target, segments, enqueued_ns, body)
		SELECT t, i, sq, u, ch, tp, ad, sg, $9, b
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int[], $10::bytea[])
			AS x(t, i, sq, u, ch, tp, ad, sg, b)
		ON CONFLICT (tenant, id) DO NOTHING
		RETURNING tenant, id`), ts, ids, sq, us, chs, tpls, addrT, segs, now.UnixNano(), bodies)
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
		won, err := s.segmentsOf(ctx, tx, lost)
		if err != nil {
			return nil, false, err
		}
		for _, i := range fresh {
			if n, ok := won[keys[i]]; ok && !inserted[keys[i]] {
				res[i].Duplicate, res[i].Segments = true, n
			}
		}
	}

	var b rowBatch
	for n, i := range fresh {
		if !inserted[keys[i]] {
			continue
		}
		e := prep[i].Env
		for seg, d := range queue.NewRows(e, prep[i].Segments, now) {
			if err := b.add(keys[i], seg, seqs[n], e.Channel, &d, nil); err != nil {
				return nil, false, err
			}
		}
	}
	if err := s.insertRows(ctx, tx, &b); err != nil {
		return nil, false, err
	}
	return res, len(inserted) > 0, nil
}

// segmentsOf returns the segment counts of the stored envelopes among keys.
func (s *Store) segmentsOf(ctx context.Context, tx pgx.Tx, keys []envKey) (map[envKey]int, error) {
	ts, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ts[i], ids[i] = k.tenant, k.id
	}
	rows, err := tx.Query(ctx, s.sql(`SELECT tenant, id, segments FROM {s}.envelopes
		WHERE (tenant, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`), ts, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[envKey]int{}
	for rows.Next() {
		var (
			k envKey
			n int
		)
		if err := rows.Scan(&k.tenant, &k.id, &n); err != nil {
			return nil, err
		}
		out[k] = n
	}
	return out, rows.Err()
}

// addressSuppressions reads the tenants' suppressions of the given
// (tenant, target) pairs.
func (s *Store) addressSuppressions(ctx context.Context, tx pgx.Tx, targets []envKey) (map[envKey]queue.Suppression, error) {
	out := map[envKey]queue.Suppression{}
	if len(targets) == 0 {
		return out, nil
	}
	ts, gs := make([]string, len(targets)), make([]string, len(targets))
	for i, k := range targets {
		ts[i], gs[i] = k.tenant, k.id
	}
	rows, err := tx.Query(ctx, s.sql(`SELECT tenant, target, channel, reason, at_ns FROM {s}.address_suppressions
		WHERE (tenant, target) IN (SELECT * FROM unnest($1::text[], $2::text[]))`), ts, gs)
	if err != nil {
		return nil, err
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
			return nil, err
		}
		a.Channel, a.Target, a.Reason, a.At = envelope.Channel(ch), k.id, envelope.ErrorClass(rs), timeNs(at)
		out[k] = a
	}
	return out, rows.Err()
}
