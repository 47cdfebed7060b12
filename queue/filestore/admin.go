package filestore

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// Get implements Store.
func (q *Queue) Get(ctx context.Context, tenant, id string) (*queue.EnvelopeStatus, error) {
	if tenant == "" {
		tenant = envelope.DefaultTenant
	}
	var st *queue.EnvelopeStatus
	var rec *envRec
	err := q.view(func(tx *bolt.Tx) error {
		ek := envKey(tenant, id)
		e, err := getEnv(tx, ek)
		if err != nil {
			return err
		}
		if e == nil {
			return queue.ErrNotFound
		}
		rec = e
		st = &queue.EnvelopeStatus{Tenant: tenant, ID: id, UserID: e.User, Channel: e.Channel, Template: e.Template, EnqueuedAt: fromNano(e.Enq)}
		for seg := 0; seg < e.Segs; seg++ {
			r, err := getRow(tx, rowKey(ek, seg))
			if err != nil {
				return err
			}
			if r == nil {
				continue
			}
			st.Segments = append(st.Segments, segmentStatus(seg, r))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	st.Status = queue.Aggregate(st.Segments)
	if env, err := q.readEnvelope(envKey(tenant, id), rec); err == nil {
		st.Envelope = env
	}
	return st, nil
}

func segmentStatus(seg int, r *rowRec) queue.SegmentStatus {
	d := toDelivery(r)
	return d.Segment(seg)
}

// List implements Store.
func (q *Queue) List(ctx context.Context, f queue.ListFilter) (*queue.Page, error) {
	limit := queue.PageLimit(f)
	var after []byte
	if f.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(f.Cursor)
		if err != nil || len(b) != 12 {
			return nil, queue.ErrBadCursor
		}
		after = b
	}
	page := &queue.Page{}
	err := q.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bktOrder).Cursor()
		var k, v []byte
		startSeg := 0
		if after != nil {
			k, v = c.Seek(after[:8])
			startSeg = int(beUint32(after[8:])) + 1
			if k != nil && !bytes.Equal(k, after[:8]) {
				startSeg = 0
			}
		} else {
			k, v = c.First()
		}
		for ; k != nil; k, v = c.Next() {
			tenant, id := splitEnvKey(v)
			if f.Tenant != "" && tenant != f.Tenant {
				startSeg = 0
				continue
			}
			e, err := getEnv(tx, v)
			if err != nil {
				return err
			}
			if e == nil || (f.Channel != "" && e.Channel != f.Channel) {
				startSeg = 0
				continue
			}
			for seg := startSeg; seg < e.Segs; seg++ {
				r, err := getRow(tx, rowKey(v, seg))
				if err != nil {
					return err
				}
				if r == nil || (f.State != "" && r.State != f.State) {
					continue
				}
				if len(page.Rows) == limit {
					page.Next = base64.RawURLEncoding.EncodeToString(q.cursor(page, tx))
					return nil
				}
				page.Rows = append(page.Rows, queue.Row{
					Key:    envelope.Key{Tenant: tenant, EnvelopeID: id, Segment: seg},
					UserID: e.User, Channel: e.Channel, State: r.State, Attempts: r.Attempts,
					Class: r.Class, UpdatedAt: fromNano(r.Updated),
				})
			}
			startSeg = 0
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return page, nil
}

// cursor encodes the position of the page's last row: its seq and segment.
func (q *Queue) cursor(p *queue.Page, tx *bolt.Tx) []byte {
	last := p.Rows[len(p.Rows)-1]
	e, _ := getEnv(tx, envKey(last.Key.Tenant, last.Key.EnvelopeID))
	b := u64(e.Seq)
	b = append(b, byte(last.Key.Segment>>24), byte(last.Key.Segment>>16), byte(last.Key.Segment>>8), byte(last.Key.Segment))
	return b
}

// operator applies fn to every segment of an envelope in an operator
// transaction; fn returns whether it changed the row.
func (q *Queue) operator(ctx context.Context, tenant, id string, f func(rows []queue.Delivery, now time.Time) (*queue.Step, error)) error {
	return q.operatorTx(ctx, tenant, id, func(_ *bolt.Tx, _ []byte, _ *envRec, rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		return f(rows, now)
	})
}

func (q *Queue) operatorTx(ctx context.Context, tenant, id string, f func(tx *bolt.Tx, ek []byte, e *envRec, rows []queue.Delivery, now time.Time) (*queue.Step, error)) error {
	if tenant == "" {
		tenant = envelope.DefaultTenant
	}
	wake := false
	err := q.write(ctx, false, func(tx *bolt.Tx) error {
		ek := envKey(tenant, id)
		e, err := getEnv(tx, ek)
		if err != nil {
			return err
		}
		if e == nil {
			return queue.ErrNotFound
		}
		now := q.opts.Now()
		st, err := q.step(tx, ek, e, now, func(rows []queue.Delivery) (*queue.Step, error) { return f(tx, ek, e, rows, now) })
		if err == nil {
			wake = st.Wake
		}
		return err
	})
	if err == nil && wake {
		q.wake()
	}
	return err
}

// Requeue implements Store.
func (q *Queue) Requeue(ctx context.Context, tenant, id string) error {
	return q.operatorTx(ctx, tenant, id, func(tx *bolt.Tx, ek []byte, e *envRec, rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		v := queue.RecordLost
		if env, err := q.readEnvelope(ek, e); passing(err) {
			return nil, fmt.Errorf("requeue: %w", err)
		} else if err == nil {
			t, _ := splitEnvKey(ek)
			c, found, err := q.consentFor(ctx, tx, t, e.User)
			if err != nil {
				return nil, err
			}
			addr, err := addressSupOf(tx, env)
			if err != nil {
				return nil, err
			}
			v = queue.Judge(env, c, found, addr, now)
		}
		return queue.Requeue(rows, v, now)
	})
}

// Resolve implements Store.
func (q *Queue) Resolve(ctx context.Context, tenant, id string, as envelope.State) error {
	if err := queue.CheckResolve(as); err != nil {
		return err
	}
	return q.operator(ctx, tenant, id, func(rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		return queue.Resolve(rows, as, now)
	})
}

// Consent implements Store.
func (q *Queue) Consent(ctx context.Context, tenant, userID string) (queue.Consent, error) {
	var c queue.Consent
	err := q.view(func(tx *bolt.Tx) error {
		var err error
		c, _, err = getConsent(tx, tenantOr(tenant), userID)
		return err
	})
	return c, err
}

// SetConsent implements Store.
func (q *Queue) SetConsent(ctx context.Context, tenant, userID string, f queue.ConsentFlags) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	return q.write(ctx, false, func(tx *bolt.Tx) error {
		c, _, err := getConsent(tx, tenantOr(tenant), userID)
		if err != nil {
			return err
		}
		c.Set(f, q.opts.Now().UTC())
		return q.record(tx, jrec{Op: jConsent, Tenant: tenantOr(tenant), User: userID, Consent: &c})
	})
}

// LiftSuppression implements Store.
func (q *Queue) LiftSuppression(ctx context.Context, tenant, userID string, ch envelope.Channel, target string) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	return q.write(ctx, false, func(tx *bolt.Tx) error {
		c, _, err := getConsent(tx, tenantOr(tenant), userID)
		if err != nil {
			return err
		}
		if !c.Lift(ch, target, "operator", q.opts.Now().UTC()) {
			return queue.ErrNotFound
		}
		return q.record(tx, jrec{Op: jConsent, Tenant: tenantOr(tenant), User: userID, Consent: &c})
	})
}

// Suppress implements Store.
func (q *Queue) Suppress(ctx context.Context, tenant, userID string, s queue.Suppression) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	if err := queue.CheckSuppression(s); err != nil {
		return err
	}
	return q.write(ctx, false, func(tx *bolt.Tx) error {
		c, _, err := getConsent(tx, tenantOr(tenant), userID)
		if err != nil {
			return err
		}
		if s.At.IsZero() {
			s.At = q.opts.Now().UTC()
		}
		c.Add(s)
		c.UpdatedAt = q.opts.Now().UTC()
		return q.record(tx, jrec{Op: jConsent, Tenant: tenantOr(tenant), User: userID, Consent: &c})
	})
}

func tenantOr(t string) string {
	if t == "" {
		return envelope.DefaultTenant
	}
	return t
}

// Erase implements Store.
func (q *Queue) Erase(ctx context.Context, tenant, userID string) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	tenant = tenantOr(tenant)
	err := q.write(ctx, false, func(tx *bolt.Tx) error {
		prefix := []byte(tenant + "\x00" + userID + "\x00")
		var ids, logs []string
		c := tx.Bucket(bktUsers).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			ids = append(ids, string(k[len(prefix):]))
		}
		for _, id := range ids {
			rel, err := q.deleteEnvelope(tx, tenant, id)
			if err != nil {
				return err
			}
			if rel != "" {
				logs = append(logs, rel)
			}
		}
		for _, id := range ids {
			_ = tx.Bucket(bktUsers).Delete(append(append([]byte(nil), prefix...), id...))
		}
		if err := tx.Bucket(bktConsent).Delete(consentKey(tenant, userID)); err != nil {
			return err
		}
		if err := eraseSubscriptions(tx, tenant, userID); err != nil {
			return err
		}
		if err := q.record(tx, jrec{Op: jErase, Tenant: tenant, User: userID}); err != nil {
			return err
		}
		rel := logRel(tenant, userID)
		_ = tx.Bucket(bktLogs).Delete([]byte(rel))
		if err := dropSkips(tx, rel); err != nil {
			return err
		}
		logs = append(logs, rel)
		for _, rel := range uniq(logs) {
			if err := dropPruned(tx, rel); err != nil {
				return err
			}
		}
		// The files go inside the transaction: a catch-up (the tailer's)
		// runs in a transaction of its own, before or after this one, and
		// so never reads a log whose offset this transaction deleted.
		var dirs []string
		for _, rel := range uniq(logs) {
			p := filepath.Join(q.dir, rel)
			q.app.Exclusive(rel, func() {
				_ = os.Remove(p)
				_ = os.Remove(p + quarantineExt)
				q.forgetLog(rel)
			})
			dirs = append(dirs, filepath.Dir(p))
		}
		// The removals are durable before the commit that forgets the
		// logs: a machine crash that undid them would bring the files
		// back, and the catch-up would index the user's envelopes again
		// as new ones, to be delivered again.
		if !q.opts.NoSync {
			for _, d := range uniq(dirs) {
				if err := syncDir(d); err != nil && !isNotExist(err) {
					return fmt.Errorf("erase: sync the log directory: %w", err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The journal holds the user's consent and push endpoints: rewritten
	// without them (the next Open does it if this fails or is cut short).
	if err := q.forgetErased(); err != nil {
		return fmt.Errorf("erase: %w (the next open of the store retries)", err)
	}
	// Out of the index file too, not only out of what bbolt reads.
	return q.scrubIndex(ctx)
}

// deleteEnvelope removes an envelope's entry, rows and index entries. It
// returns the envelope's log.
func (q *Queue) deleteEnvelope(tx *bolt.Tx, tenant, id string) (string, error) {
	ek := envKey(tenant, id)
	e, err := getEnv(tx, ek)
	if err != nil || e == nil {
		return "", err
	}
	for seg := 0; seg < e.Segs; seg++ {
		rk := rowKey(ek, seg)
		r, err := getRow(tx, rk)
		if err != nil {
			return "", err
		}
		if r != nil {
			if err := q.putRow(tx, ek, seg, e, tenant, r, &rowRec{}); err != nil {
				return "", err
			}
			if err := tx.Bucket(bktRows).Delete(rk); err != nil {
				return "", err
			}
		}
	}
	if err := tx.Bucket(bktOrder).Delete(u64(e.Seq)); err != nil {
		return "", err
	}
	if err := tx.Bucket(bktUsers).Delete(userKey(tenant, e.User, id)); err != nil {
		return "", err
	}
	return e.Log, tx.Bucket(bktEnv).Delete(ek)
}

func uniq(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// Prune implements Store. Logs whose records were all pruned are removed
// inside its transaction (removeEmptiedLog), before it commits: a process
// that dies before the commit leaves their envelopes indexed, and the next
// Prune deletes them again; none that dies after it leaves a log that no
// envelope points at. Such a log left by an older build (which removed
// the files after its commit) is removed too. Then logs that pruned
// records fill for the most part are rewritten without them (compactLogs).
func (q *Queue) Prune(ctx context.Context) (int, error) {
	n := 0
	var rewrite []string
	err := q.write(ctx, false, func(tx *bolt.Tx) error {
		rewrite = rewrite[:0] // a retried transaction starts again
		cutoff := q.opts.Now().Add(-q.opts.Retention).UnixNano()
		type victim struct {
			tenant, id string
			rec        envRec
		}
		var victims []victim
		logsLeft := map[string]int{}
		live := map[string]int64{} // bytes of the records kept, by log
		err := tx.Bucket(bktEnv).ForEach(func(k, v []byte) error {
			var e envRec
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			logsLeft[e.Log]++
			prune := true
			for seg := 0; seg < e.Segs && prune; seg++ {
				r, err := getRow(tx, rowKey(k, seg))
				if err != nil {
					return err
				}
				if r == nil || !r.State.Terminal() || r.Updated > cutoff {
					prune = false
				}
			}
			if prune {
				t, id := splitEnvKey(k)
				victims = append(victims, victim{t, id, e})
				logsLeft[e.Log]--
			} else {
				live[e.Log] += int64(e.Len) + 1
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, v := range victims {
			if _, err := q.deleteEnvelope(tx, v.tenant, v.id); err != nil {
				return err
			}
			// Its record stays in the log until the log is rewritten or
			// removed (pruned.go).
			if err := putPruned(tx, v.rec.Log, envKey(v.tenant, v.id), v.rec.Off, v.rec.Len); err != nil {
				return err
			}
			n++
		}
		// Every indexed log that no envelope points at any more: emptied
		// now, or by a prune that died before removing it.
		var empty []string
		orphan := map[string]bool{}
		_ = tx.Bucket(bktLogs).ForEach(func(k, v []byte) error {
			if left, ok := logsLeft[string(k)]; !ok || left == 0 {
				empty = append(empty, string(k))
				orphan[string(k)] = !ok
			} else if q.worthRewriting(v, live[string(k)]) {
				rewrite = append(rewrite, string(k))
			}
			return nil
		})
		for _, rel := range empty {
			q.removeEmptiedLog(tx, rel, orphan[rel])
		}
		faultAt("prune-removed")
		return nil
	})
	if err != nil {
		return 0, err
	}
	faultAt("prune-committed")
	if _, err := q.compactLogs(ctx, rewrite); err != nil {
		return n, err
	}
	return n, nil
}
