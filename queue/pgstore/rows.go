package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Times are stored as Unix nanoseconds; the zero time as NULL.
func nsOf(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	n := t.UnixNano()
	return &n
}

func timeOf(n *int64) time.Time {
	if n == nil {
		return time.Time{}
	}
	return time.Unix(0, *n).UTC()
}

func timeNs(n int64) time.Time { return time.Unix(0, n).UTC() }

type envKey struct{ tenant, id string }

// loaded is one envelope read under its lock, with its rows.
type loaded struct {
	key      envKey
	seq      int64
	userID   string
	channel  envelope.Channel
	segments int
	enqueued time.Time
	body     []byte
	addr     *queue.Suppression // the tenant's suppression of its address
	rows     []queue.Delivery
}

// envelope decodes the stored envelope (a fresh copy each call).
func (l *loaded) envelope() (*envelope.Envelope, error) {
	var e envelope.Envelope
	if err := json.Unmarshal(l.body, &e); err != nil {
		return nil, fmt.Errorf("pgstore: stored envelope does not decode: %w", err)
	}
	e.TenantID = l.key.tenant
	return &e, nil
}

// Lanes: how a row waits (derived from its Delivery by laneOf).
const (
	laneNone   = 0 // nothing happens to it by itself
	laneDue    = 1 // pending or retryable with a due time: a claim takes it once due
	laneLeased = 2 // sending: a recovery takes it once its lease ends
)

// laneOf returns the row's lane and its wake time (queue.Delivery.WakeAt).
func laneOf(d *queue.Delivery) (int16, *int64) {
	w := d.WakeAt()
	switch {
	case w.IsZero():
		return laneNone, nil
	case d.State == envelope.StateSending:
		return laneLeased, nsOf(w)
	}
	return laneDue, nsOf(w)
}

const deliveryCols = `seg, state, attempts, budget, class, receipt, due_ns, owner, fence, lease_end_ns, from_state, to_pending, updated_ns, history`

// scanDelivery reads the columns pre point to, then deliveryCols.
func scanDelivery(r pgx.Row, pre ...any) (int, queue.Delivery, error) {
	var (
		d                  queue.Delivery
		seg                int
		state, class, from string
		due, leaseEnd      *int64
		fence, updated     int64
		hist               []byte
	)
	err := r.Scan(append(pre, &seg, &state, &d.Attempts, &d.Budget, &class, &d.Receipt, &due, &d.Owner, &fence, &leaseEnd,
		&from, &d.ToPending, &updated, &hist)...)
	if err != nil {
		return 0, d, err
	}
	d.State, d.Class, d.From = envelope.State(state), envelope.ErrorClass(class), envelope.State(from)
	d.Due, d.LeaseEnd, d.Updated = timeOf(due), timeOf(leaseEnd), timeNs(updated)
	d.Fence = uint64(fence)
	if len(hist) > 0 {
		if err := json.Unmarshal(hist, &d.History); err != nil {
			return 0, d, fmt.Errorf("pgstore: stored history does not decode: %w", err)
		}
	}
	return seg, d, nil
}

// rowBatch collects rows to insert or update in one statement (unnest of
// one array per column).
type rowBatch struct {
	tenant, envID    []string
	seg              []int32
	envSeq           []int64
	channel          []string
	state            []string
	attempts, budget []int32
	class, receipt   []string
	due              []*int64
	owner            []string
	fence            []int64
	leaseEnd         []*int64
	from             []string
	toPending        []bool
	updated          []int64
	history          []*string
	lane             []int16
	wake             []*int64
	terminal         []bool
	oldState         []string // updates: the state and fence read under the lock
	oldFence         []int64
}

func (b *rowBatch) len() int { return len(b.tenant) }

func (b *rowBatch) add(k envKey, seg int, envSeq int64, ch envelope.Channel, d *queue.Delivery, old *queue.Delivery) error {
	var hist *string
	if len(d.History) > 0 {
		j, err := json.Marshal(d.History)
		if err != nil {
			return err
		}
		h := string(j)
		hist = &h
	}
	lane, wake := laneOf(d)
	b.tenant = append(b.tenant, k.tenant)
	b.envID = append(b.envID, k.id)
	b.seg = append(b.seg, int32(seg))
	b.envSeq = append(b.envSeq, envSeq)
	b.channel = append(b.channel, string(ch))
	b.state = append(b.state, string(d.State))
	b.attempts = append(b.attempts, int32(d.Attempts))
	b.budget = append(b.budget, int32(d.Budget))
	b.class = append(b.class, string(d.Class))
	b.receipt = append(b.receipt, d.Receipt)
	b.due = append(b.due, nsOf(d.Due))
	b.owner = append(b.owner, d.Owner)
	b.fence = append(b.fence, int64(d.Fence))
	b.leaseEnd = append(b.leaseEnd, nsOf(d.LeaseEnd))
	b.from = append(b.from, string(d.From))
	b.toPending = append(b.toPending, d.ToPending)
	b.updated = append(b.updated, d.Updated.UnixNano())
	b.history = append(b.history, hist)
	b.lane = append(b.lane, lane)
	b.wake = append(b.wake, wake)
	b.terminal = append(b.terminal, d.State.Terminal())
	if old != nil {
		b.oldState = append(b.oldState, string(old.State))
		b.oldFence = append(b.oldFence, int64(old.Fence))
	}
	return nil
}

func (b *rowBatch) args() []any {
	return []any{b.tenant, b.envID, b.seg, b.envSeq, b.channel, b.state, b.attempts, b.budget, b.class, b.receipt,
		b.due, b.owner, b.fence, b.leaseEnd, b.from, b.toPending, b.updated, b.history, b.lane, b.wake, b.terminal}
}

const unnestRows = `unnest($1::text[], $2::text[], $3::int[], $4::bigint[], $5::text[], $6::text[], $7::int[], $8::int[],
	$9::text[], $10::text[], $11::bigint[], $12::text[], $13::bigint[], $14::bigint[], $15::text[], $16::boolean[],
	$17::bigint[], $18::text[], $19::smallint[], $20::bigint[], $21::boolean[]`

const rowColumns = `tenant, env_id, seg, env_seq, channel, state, attempts, budget, class, receipt, due_ns, owner, fence,
	lease_end_ns, from_state, to_pending, updated_ns, history, lane, wake_ns, terminal`

// errChanged means a row changed although its envelope was locked: a
// writer that does not lock the envelope, which would be a defect.
var errChanged = errors.New("pgstore: a row changed under its envelope's lock")

// updateRows writes changed rows, each only if it still has the state and
// fence it was read with.
func (s *Store) updateRows(ctx context.Context, tx batcher, b *rowBatch) error {
	if b.len() == 0 {
		return nil
	}
	return sendParts(ctx, tx, s.updatePart(b))
}

// updatePart is updateRows as part of a batch (b not empty). All or
// nothing: when a row no longer has the state and fence it was read with,
// no row is written, so that a COMMIT in the same round trip commits
// none of them.
//
// Every lookup of deliveries names its envelope's sequence number too, so
// that each index of the table matches it exactly: a generic plan made
// while the table was small took whichever index seemed as cheap, and
// kept it (deliveries_tenant_order on the tenant alone: a scan of every
// row of the tenant per statement once the table had grown).
func (s *Store) updatePart(b *rowBatch) batchPart {
	args := append(b.args(), b.oldState, b.oldFence, b.len())
	return batchPart{
		queue: func(q *pgx.Batch) {
			q.Queue(s.sql(`WITH u AS (
					SELECT * FROM `+unnestRows+`, $22::text[], $23::bigint[])
						AS u(t, i, sg, sq, ch, st, at, bu, cl, rc, du, ow, fe, le, fr, tp, up, hi, ln, wk, te, os, of)
				), ok AS MATERIALIZED ( -- once, not per row
					SELECT count(*) = $24 AS ok FROM {s}.deliveries d JOIN u
						ON d.tenant = u.t AND d.env_id = u.i AND d.seg = u.sg AND d.env_seq = u.sq AND d.state = u.os AND d.fence = u.of
				)
				UPDATE {s}.deliveries d SET
				state = u.st, attempts = u.at, budget = u.bu, class = u.cl, receipt = u.rc, due_ns = u.du, owner = u.ow,
				fence = u.fe, lease_end_ns = u.le, from_state = u.fr, to_pending = u.tp, updated_ns = u.up,
				history = u.hi::jsonb, lane = u.ln, wake_ns = u.wk, terminal = u.te
				FROM u, ok
				WHERE ok.ok AND d.tenant = u.t AND d.env_id = u.i AND d.seg = u.sg AND d.env_seq = u.sq AND d.state = u.os AND d.fence = u.of`), args...)
		},
		read: func(br pgx.BatchResults) error {
			tag, err := br.Exec()
			if err != nil {
				return err
			}
			if int(tag.RowsAffected()) != b.len() {
				return errChanged
			}
			return nil
		},
	}
}

// addStep adds the rows a step changed to b.
func addStep(b *rowBatch, l *loaded, st *queue.Step) error {
	for _, i := range st.Changed {
		if err := b.add(l.key, i, l.seq, l.channel, &st.Rows[i], &l.rows[i]); err != nil {
			return err
		}
	}
	return nil
}

const envCols = `e.tenant, e.id, e.seq, e.user_id, e.channel, e.segments, e.enqueued_ns, e.body,
	a.channel, a.target, a.reason, a.at_ns`

const envFrom = `{s}.envelopes e LEFT JOIN {s}.address_suppressions a ON a.tenant = e.tenant AND a.target = e.addr_target AND e.addr_target <> ''`

func scanEnv(r pgx.Row) (*loaded, error) {
	var (
		l              loaded
		ch             string
		enq            int64
		ach, atg, arsn *string
		aat            *int64
	)
	if err := r.Scan(&l.key.tenant, &l.key.id, &l.seq, &l.userID, &ch, &l.segments, &enq, &l.body, &ach, &atg, &arsn, &aat); err != nil {
		return nil, err
	}
	l.channel = envelope.Channel(ch)
	l.enqueued = timeNs(enq)
	if atg != nil {
		l.addr = &queue.Suppression{Channel: envelope.Channel(*ach), Target: *atg, Reason: envelope.ErrorClass(*arsn), At: timeOf(aat)}
	}
	return &l, nil
}

// lockOne locks one envelope and reads it and its rows (after the lock);
// nil when there is none.
func (s *Store) lockOne(ctx context.Context, tx batcher, k envKey) (*loaded, error) {
	var b pgx.Batch
	// A locked row is read as it is once locked (its newest version).
	b.Queue(s.sql(`SELECT `+envCols+` FROM `+envFrom+` WHERE e.tenant = $1 AND e.id = $2 FOR UPDATE OF e`), k.tenant, k.id)
	b.Queue(s.sql(`SELECT `+deliveryCols+` FROM {s}.envelopes e, LATERAL (SELECT * FROM {s}.deliveries d
		WHERE d.tenant = e.tenant AND d.env_id = e.id AND d.env_seq = e.seq OFFSET 0) d
		WHERE e.tenant = $1 AND e.id = $2 ORDER BY seg`), k.tenant, k.id)
	br := tx.SendBatch(ctx, &b)
	defer br.Close()
	l, err := scanEnv(br.QueryRow())
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, br.Close()
	}
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		_, d, err := scanDelivery(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		l.rows = append(l.rows, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := checkRows(l); err != nil {
		return nil, err
	}
	return l, br.Close()
}

func checkRows(l *loaded) error {
	n := 0
	for _, d := range l.rows {
		if d.State != "" {
			n++
		}
	}
	if n != l.segments || len(l.rows) != l.segments {
		return fmt.Errorf("pgstore: an envelope has %d rows, want %d", n, l.segments)
	}
	return nil
}

// batchPart is a query sent in the same round trip as another's, read
// after it.
type batchPart struct {
	queue func(*pgx.Batch)
	read  func(pgx.BatchResults) error
}

// batcher sends batches: a transaction, or the pool (each batch then runs
// as one implicit transaction).
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// sendParts sends parts in one round trip and reads them in order.
func sendParts(ctx context.Context, tx batcher, parts ...batchPart) error {
	var b pgx.Batch
	for _, p := range parts {
		p.queue(&b)
	}
	br := tx.SendBatch(ctx, &b)
	for _, p := range parts {
		if err := p.read(br); err != nil {
			br.Close()
			return err
		}
	}
	return br.Close()
}

// loadMany reads envelopes and their rows (the caller locked them), and
// the parts in the same round trip.
func (s *Store) loadMany(ctx context.Context, tx batcher, keys []envKey, parts ...batchPart) (map[envKey]*loaded, error) {
	return s.load(ctx, tx, keys, false, parts...)
}

// lockMany is loadMany that locks the envelopes first, skipping those
// another transaction holds (they are not in the map).
func (s *Store) lockMany(ctx context.Context, tx batcher, keys []envKey) (map[envKey]*loaded, error) {
	return s.load(ctx, tx, keys, true)
}

func (s *Store) load(ctx context.Context, tx batcher, keys []envKey, lock bool, parts ...batchPart) (map[envKey]*loaded, error) {
	ts, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ts[i], ids[i] = k.tenant, k.id
	}
	q := `SELECT ` + envCols + ` FROM ` + envFrom + `
		WHERE (e.tenant, e.id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`
	if lock {
		// A locked row is read as it is once locked; the rows, in the
		// next statement, after the lock.
		q += ` FOR UPDATE OF e SKIP LOCKED`
	}
	var b pgx.Batch
	b.Queue(s.sql(q), ts, ids)
	// In no order: a claim's pipe allows no sort (each row goes to its place).
	// OFFSET 0 keeps the subquery apart: the planner starts from the
	// envelopes then (see updatePart).
	b.Queue(s.sql(`SELECT d.tenant, d.env_id, `+deliveryCols+` FROM {s}.envelopes e, LATERAL (SELECT * FROM {s}.deliveries d
		WHERE d.tenant = e.tenant AND d.env_id = e.id AND d.env_seq = e.seq OFFSET 0) d
		WHERE (e.tenant, e.id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`), ts, ids)
	for _, p := range parts {
		p.queue(&b)
	}
	br := tx.SendBatch(ctx, &b)
	defer br.Close()
	out := make(map[envKey]*loaded, len(keys))
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		l, err := scanEnv(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		l.rows = make([]queue.Delivery, l.segments)
		out[l.key] = l
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = br.Query()
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var k envKey
		seg, d, err := scanDelivery(rows, &k.tenant, &k.id)
		if err != nil {
			rows.Close()
			return nil, err
		}
		l := out[k]
		if l == nil && lock {
			continue // its envelope was skipped
		}
		if l == nil || seg < 0 || seg >= l.segments || l.rows[seg].State != "" {
			rows.Close()
			return nil, fmt.Errorf("pgstore: a row without its envelope, or twice")
		}
		l.rows[seg] = d
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, l := range out {
		if err := checkRows(l); err != nil {
			return nil, err
		}
	}
	for _, p := range parts {
		if err := p.read(br); err != nil {
			return nil, err
		}
	}
	return out, br.Close()
}
