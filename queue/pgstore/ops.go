package pgstore

import (
	"context"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Get returns one envelope of tenant ("" means the default tenant) with
// its segments and their history. See queue.Store.
func (s *Store) Get(ctx context.Context, tenant, id string) (*queue.EnvelopeStatus, error) {
	var st *queue.EnvelopeStatus
	err := s.inPipe(ctx, "get", pipeSettings, func(tx *pipe) error {
		m, err := s.loadMany(ctx, tx, []envKey{{tenantOr(tenant), id}})
		if err != nil {
			return err
		}
		l := m[envKey{tenantOr(tenant), id}]
		if l == nil {
			return queue.ErrNotFound
		}
		e, err := l.envelope()
		if err != nil {
			return err
		}
		st = &queue.EnvelopeStatus{
			Tenant:     l.key.tenant,
			ID:         l.key.id,
			UserID:     l.userID,
			Channel:    l.channel,
			Template:   e.Template,
			EnqueuedAt: l.enqueued,
			Segments:   make([]queue.SegmentStatus, len(l.rows)),
			Envelope:   e,
		}
		for i, r := range l.rows {
			st.Segments[i] = r.Segment(i)
		}
		st.Status = queue.Aggregate(st.Segments)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// List returns the rows matching f in enqueue order (then segment order),
// at most f.Limit (default 50, at most 1000) per page. See queue.Store.
func (s *Store) List(ctx context.Context, f queue.ListFilter) (*queue.Page, error) {
	var (
		cseq int64
		cseg = -1
	)
	if f.Cursor != "" {
		u, seg, err := queue.DecodeCursor(f.Cursor)
		if err != nil || u > math.MaxInt64 {
			return nil, queue.ErrBadCursor
		}
		cseq, cseg = int64(u), seg
	}
	limit := queue.PageLimit(f)
	page := &queue.Page{Rows: []queue.Row{}}
	err := s.inTx(ctx, "list", func(tx pgx.Tx) error {
		page.Rows, page.Next = page.Rows[:0], ""
		rows, err := tx.Query(ctx, s.sql(`SELECT d.tenant, d.env_id, d.seg, d.env_seq, e.user_id, d.channel, d.state, d.attempts, d.class, d.updated_ns
			FROM {s}.deliveries d JOIN {s}.envelopes e ON e.tenant = d.tenant AND e.id = d.env_id
			WHERE (d.env_seq, d.seg) > ($1, $2) AND ($3 = '' OR d.tenant = $3) AND ($4 = '' OR d.state = $4) AND ($5 = '' OR d.channel = $5)
			ORDER BY d.env_seq, d.seg LIMIT $6`), cseq, cseg, f.Tenant, string(f.State), string(f.Channel), limit+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		var lastSeq int64
		for rows.Next() {
			var (
				r                queue.Row
				seq, upd         int64
				ch, state, class string
			)
			if err := rows.Scan(&r.Key.Tenant, &r.Key.EnvelopeID, &r.Key.Segment, &seq, &r.UserID, &ch, &state, &r.Attempts, &class, &upd); err != nil {
				return err
			}
			if len(page.Rows) == limit {
				last := page.Rows[limit-1]
				page.Next = queue.EncodeCursor(uint64(lastSeq), last.Key.Segment)
				break
			}
			r.Channel, r.State, r.Class, r.UpdatedAt = envelope.Channel(ch), envelope.State(state), envelope.ErrorClass(class), timeNs(upd)
			page.Rows = append(page.Rows, r)
			lastSeq = seq
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

// Counts returns the number of rows per state and channel of tenant ("" =
// every tenant). See queue.Store.
func (s *Store) Counts(ctx context.Context, tenant string) (queue.Counts, error) {
	c := queue.Counts{}
	err := s.inTx(ctx, "counts", func(tx pgx.Tx) error {
		clear(c)
		rows, err := tx.Query(ctx, s.sql(`SELECT state, channel, count(*) FROM {s}.deliveries
			WHERE $1 = '' OR tenant = $1 GROUP BY state, channel`), tenant)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				st, ch string
				n      int
			)
			if err := rows.Scan(&st, &ch, &n); err != nil {
				return err
			}
			m := c[envelope.State(st)]
			if m == nil {
				m = map[envelope.Channel]int{}
				c[envelope.State(st)] = m
			}
			m[envelope.Channel(ch)] = n
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Requeue returns the envelope's dead_letter, unresolved, expired and
// suppressed segments to pending (queue.Requeue). See queue.Store.
func (s *Store) Requeue(ctx context.Context, tenant, id string) error {
	return s.changeLoaded(ctx, "requeue", envKey{tenantOr(tenant), id}, queue.ErrNotFound, func(tx dbtx, l *loaded, now time.Time) (*queue.Step, error) {
		e, err := l.envelope()
		if err != nil {
			return nil, err
		}
		c, found, err := s.newConsents().get(ctx, tx, l.key.tenant, l.userID)
		if err != nil {
			return nil, err
		}
		return queue.Requeue(l.rows, queue.Judge(e, c, found, l.addr, now), now)
	})
}

// Resolve settles the envelope's unresolved segments as sent or retryable
// (queue.Resolve). See queue.Store.
func (s *Store) Resolve(ctx context.Context, tenant, id string, as envelope.State) error {
	if err := queue.CheckResolve(as); err != nil {
		return err
	}
	return s.change(ctx, "resolve", envKey{tenantOr(tenant), id}, queue.ErrNotFound, func(rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		return queue.Resolve(rows, as, now)
	})
}

// Erase deletes the user's envelopes, rows, consent record and its
// history, and push subscriptions in tenant (the tenant's address
// suppressions stay). Leases on erased rows can no longer commit
// (ErrLeaseLost).
func (s *Store) Erase(ctx context.Context, tenant, userID string) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	return s.inTx(ctx, "erase", func(tx pgx.Tx) error {
		t := tenantOr(tenant)
		var b pgx.Batch
		for _, q := range []string{
			`DELETE FROM {s}.envelopes WHERE tenant = $1 AND user_id = $2`,
			`DELETE FROM {s}.consents WHERE tenant = $1 AND user_id = $2`,
			`DELETE FROM {s}.consent_history WHERE tenant = $1 AND user_id = $2`,
			`DELETE FROM {s}.subscriptions WHERE tenant = $1 AND user_id = $2`,
		} {
			b.Queue(s.sql(q), t, userID)
		}
		return tx.SendBatch(ctx, &b).Close()
	})
}

// Prune deletes the envelopes whose rows are all terminal and were last
// updated at least the retention period ago. See queue.Store.
func (s *Store) Prune(ctx context.Context) (int, error) {
	n := 0
	err := s.inTx(ctx, "prune", func(tx pgx.Tx) error {
		cutoff := s.now().Add(-s.retention).UnixNano()
		// Lock the candidates, then delete them in a new statement (a
		// snapshot after the locks) only if they still qualify.
		const old = `NOT EXISTS (SELECT 1 FROM {s}.deliveries d WHERE d.tenant = e.tenant AND d.env_id = e.id
			AND (NOT d.terminal OR d.updated_ns > $1))`
		rows, err := tx.Query(ctx, s.sql(`SELECT e.tenant, e.id FROM {s}.envelopes e WHERE `+old+` FOR UPDATE SKIP LOCKED`), cutoff)
		if err != nil {
			return err
		}
		keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (envKey, error) {
			var k envKey
			return k, r.Scan(&k.tenant, &k.id)
		})
		if err != nil || len(keys) == 0 {
			return err
		}
		ts, ids := make([]string, len(keys)), make([]string, len(keys))
		for i, k := range keys {
			ts[i], ids[i] = k.tenant, k.id
		}
		tag, err := tx.Exec(ctx, s.sql(`DELETE FROM {s}.envelopes e
			WHERE (e.tenant, e.id) IN (SELECT * FROM unnest($2::text[], $3::text[])) AND `+old), cutoff, ts, ids)
		if err != nil {
			return err
		}
		n = int(tag.RowsAffected())
		return nil
	})
	return n, err
}

// ExpiredLeases counts the rows still sending after their lease ended: a
// worker that stopped or died, until a Recover (any process's) takes them.
func (s *Store) ExpiredLeases(ctx context.Context) (int, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	var n int
	err := s.pool.QueryRow(ctx, s.sql(`SELECT count(*) FROM {s}.deliveries WHERE lane = 2 AND wake_ns <= $1`), s.now().UnixNano()).Scan(&n)
	return n, safeErr("expired leases", err)
}
