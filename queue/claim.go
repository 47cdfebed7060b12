package queue

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/outboxhq/outbox/envelope"
	bolt "go.etcd.io/bbolt"
)

type claimed struct {
	lease *Lease
	env   *envRec
}

// Claim implements Store.
func (q *Queue) Claim(ctx context.Context, req ClaimRequest) ([]*Lease, error) {
	if req.Owner == "" || req.Lease <= 0 {
		return nil, errors.New("queue: claim needs an owner and a lease duration")
	}
	limit := req.Limit
	if limit <= 0 {
		limit = 1
	}
	// Most claims of an idle worker find nothing: look in a read
	// transaction first, so that they cost no write (and no fsync).
	if due, err := q.anyDue(req); err != nil || !due {
		return nil, err
	}
	var out []claimed
	err := q.write(ctx, q.unsyncedClaim(req), func(tx *bolt.Tx) error {
		out = out[:0]
		now := q.opts.Now()
		nowN := now.UnixNano()
		users := map[string]consentAt{}
		type cand struct {
			key []byte // due key
			ek  []byte
			bkt []byte
		}
		for len(out) < limit {
			var cands []cand
			err := q.dueBuckets(tx, req.Tenant, req.Channels, func(name []byte, b *bolt.Bucket) {
				c := b.Cursor()
				n := 0
				for k, v := c.First(); k != nil && n < limit-len(out); k, v = c.Next() {
					if int64(beUint64(k[:8])) > nowN {
						break
					}
					cands = append(cands, cand{append([]byte(nil), k...), append([]byte(nil), v...), name})
					n++
				}
			})
			if err != nil {
				return err
			}
			if len(cands) == 0 {
				break
			}
			sort.Slice(cands, func(i, j int) bool { return bytes.Compare(cands[i].key, cands[j].key) < 0 })
			for _, c := range cands {
				if len(out) >= limit {
					break
				}
				seg := int(beUint32(c.key[16:20]))
				l, e, err := q.claimRow(ctx, tx, c.ek, seg, req, now, users)
				if err != nil {
					return err
				}
				if l != nil {
					out = append(out, claimed{l, e})
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	leases := make([]*Lease, 0, len(out))
	for _, c := range out {
		leases = append(leases, c.lease)
	}
	return leases, nil
}

// unsyncedClaim reports whether req's claim may skip fsync: every channel
// it asks for is in Options.UnsyncedClaims (see there).
func (q *Queue) unsyncedClaim(req ClaimRequest) bool {
	if req.ExpireToPending || len(q.opts.UnsyncedClaims) == 0 {
		return false
	}
	chans := req.Channels
	if len(chans) == 0 {
		chans = envelope.Channels
	}
	for _, ch := range chans {
		if !containsChannel(q.opts.UnsyncedClaims, ch) {
			return false
		}
	}
	return true
}

type consentAt struct {
	c     Consent
	found bool
}

// claimRow leases one due row, or moves it to expired/suppressed.
func (q *Queue) claimRow(ctx context.Context, tx *bolt.Tx, ek []byte, seg int, req ClaimRequest, now time.Time, users map[string]consentAt) (*Lease, *envRec, error) {
	tenant, id := splitEnvKey(ek)
	e, err := getEnv(tx, ek)
	if err != nil || e == nil {
		return nil, nil, err
	}
	rk := rowKey(ek, seg)
	r, err := getRow(tx, rk)
	if err != nil || r == nil {
		return nil, nil, err
	}
	old := *r
	nowN := now.UnixNano()
	if e.Exp > 0 && nowN >= e.Exp {
		r.State, r.Class, r.Due, r.Updated = envelope.StateExpired, envelope.ClassExpired, 0, nowN
		r.History = append(r.History, Attempt{Attempt: r.Attempts, At: now, State: r.State, Class: r.Class})
		if err := q.putRow(tx, ek, seg, e, tenant, &old, r); err != nil {
			return nil, nil, err
		}
		return nil, nil, q.settleRest(tx, ek, e, seg, envelope.StateExpired, envelope.ClassExpired, now)
	}
	ck := tenant + "\x00" + e.User
	ca, ok := users[ck]
	if !ok {
		c, found, err := q.consentFor(ctx, tx, tenant, e.User)
		if err != nil {
			return nil, nil, fmt.Errorf("claim: consent: %w", err)
		}
		ca = consentAt{c, found}
		users[ck] = ca
	}
	// The consent decision needs the recipient (suppressions target one
	// address or subscription), so read the record.
	env, err := q.readEnvelope(e)
	if err != nil {
		// The log (or its record) is gone: this row can never be sent.
		// Dead-letter it instead of failing every claim behind it.
		q.log.Error("envelope record unreadable; row dead-lettered", "operation", "claim", "status", "error", "error_class", string(envelope.ClassRecordLost))
		r.State, r.Class, r.Due, r.Updated = envelope.StateDeadLetter, envelope.ClassRecordLost, 0, nowN
		r.History = append(r.History, Attempt{Attempt: r.Attempts, At: now, State: r.State, Class: r.Class})
		if err := q.putRow(tx, ek, seg, e, tenant, &old, r); err != nil {
			return nil, nil, err
		}
		return nil, nil, q.settleRest(tx, ek, e, seg, envelope.StateDeadLetter, envelope.ClassRecordLost, now)
	}
	if allowed, why := ca.c.Allows(ca.found, env); !allowed {
		r.State, r.Class, r.Due, r.Updated = envelope.StateSuppressed, why, 0, nowN
		r.History = append(r.History, Attempt{Attempt: r.Attempts, At: now, State: r.State, Class: r.Class})
		if err := q.putRow(tx, ek, seg, e, tenant, &old, r); err != nil {
			return nil, nil, err
		}
		return nil, nil, q.settleRest(tx, ek, e, seg, envelope.StateSuppressed, why, now)
	}
	r.Prev = r.State
	r.State = envelope.StateSending
	r.Attempts++
	r.Owner = req.Owner
	r.Fence = nextCounter(tx, keyFence)
	r.LeaseEnd = now.Add(req.Lease).UnixNano()
	r.Due = 0
	r.ToPending = req.ExpireToPending
	r.Updated = nowN
	if err := q.putRow(tx, ek, seg, e, tenant, &old, r); err != nil {
		return nil, nil, err
	}
	return &Lease{
		Envelope:   env,
		Key:        envelope.Key{Tenant: tenant, EnvelopeID: id, Segment: seg},
		UserID:     e.User,
		Channel:    e.Channel,
		Owner:      req.Owner,
		Fence:      r.Fence,
		Attempt:    r.Attempts,
		ExpiresAt:  fromNano(r.LeaseEnd),
		Segments:   e.Segs,
		EnqueuedAt: fromNano(e.Enq),
	}, e, nil
}

// dueBuckets calls fn for each due sub-bucket matching tenant and channels.
func (q *Queue) dueBuckets(tx *bolt.Tx, tenant string, chans []envelope.Channel, fn func(name []byte, b *bolt.Bucket)) error {
	due := tx.Bucket(bktDue)
	if tenant != "" {
		list := chans
		if len(list) == 0 {
			list = envelope.Channels
		}
		for _, ch := range list {
			name := dueBucketName(tenant, ch)
			if b := due.Bucket(name); b != nil {
				fn(name, b)
			}
		}
		return nil
	}
	return due.ForEachBucket(func(name []byte) error {
		i := bytes.IndexByte(name, 0)
		ch := envelope.Channel(name[i+1:])
		if len(chans) > 0 && !containsChannel(chans, ch) {
			return nil
		}
		fn(append([]byte(nil), name...), due.Bucket(name))
		return nil
	})
}

func containsChannel(list []envelope.Channel, c envelope.Channel) bool {
	for _, x := range list {
		if x == c {
			return true
		}
	}
	return false
}

func beUint32(b []byte) uint32 { return binary.BigEndian.Uint32(b[:4]) }

// leased loads a lease's row for a transition, checking owner and fence.
func leased(tx *bolt.Tx, l *Lease) (ek []byte, e *envRec, r *rowRec, err error) {
	ek = envKey(l.Key.Tenant, l.Key.EnvelopeID)
	e, err = getEnv(tx, ek)
	if err != nil {
		return nil, nil, nil, err
	}
	if e == nil {
		return nil, nil, nil, ErrLeaseLost
	}
	r, err = getRow(tx, rowKey(ek, l.Key.Segment))
	if err != nil {
		return nil, nil, nil, err
	}
	if r == nil {
		return nil, nil, nil, ErrLeaseLost
	}
	if r.Fence != l.Fence {
		return nil, nil, nil, ErrStaleFence
	}
	if r.State != envelope.StateSending {
		return nil, nil, nil, ErrLeaseLost
	}
	if r.Owner != l.Owner {
		return nil, nil, nil, ErrStaleFence
	}
	return ek, e, r, nil
}

// Commit implements Store.
func (q *Queue) Commit(ctx context.Context, l *Lease, out Outcome) error {
	if l == nil {
		return ErrLeaseLost
	}
	if !ValidOutcome(out.State) {
		return fmt.Errorf("%w: cannot commit %q", ErrInvalidTransition, out.State)
	}
	wake := false
	// A commit may skip fsync: if it is lost in a machine crash the row is
	// back to sending, and its expired lease is reconciled with the
	// provider, never redelivered blindly.
	err := q.write(ctx, true, func(tx *bolt.Tx) error {
		ek, e, r, err := leased(tx, l)
		if err != nil {
			return err
		}
		now := q.opts.Now()
		tenant := l.Key.Tenant
		old := *r
		attempts := r.Attempts
		if out.State == envelope.StateRetryable && out.NoAttempt && r.Attempts > 0 {
			r.Attempts--
		}
		state, next := q.opts.Backoff.Decide(out, attempts-r.Base, now)
		r.State = state
		r.Owner, r.LeaseEnd, r.ToPending, r.Prev = "", 0, false, ""
		r.Due = nano(next)
		if state == envelope.StateRetryable && r.Due == 0 {
			r.Due = now.UnixNano()
		}
		r.Class = out.Class
		if state == envelope.StateSent {
			r.Class = ""
			r.Receipt = out.Receipt
		}
		r.Updated = now.UnixNano()
		r.History = append(r.History, Attempt{Attempt: attempts, At: now, State: state, Class: r.Class})
		if err := q.putRow(tx, ek, l.Key.Segment, e, tenant, &old, r); err != nil {
			return err
		}
		switch {
		case state == envelope.StateSent && l.Key.Segment+1 < e.Segs:
			// The next chat segment may go now.
			nk := rowKey(ek, l.Key.Segment+1)
			nr, err := getRow(tx, nk)
			if err != nil || nr == nil {
				return err
			}
			if nr.State == envelope.StatePending && nr.Due == 0 {
				o2 := *nr
				nr.Due = now.UnixNano()
				if err := q.putRow(tx, ek, l.Key.Segment+1, e, tenant, &o2, nr); err != nil {
					return err
				}
				wake = true
			}
		case Suppressing(state):
			reason := out.Class
			if reason == "" {
				reason = envelope.ErrorClass(state)
			}
			if err := q.suppressRest(tx, ek, e, l.Key.Segment, reason, now); err != nil {
				return err
			}
		}
		if state == envelope.StateRetryable && r.Due <= now.UnixNano() {
			wake = true
		}
		return nil
	})
	if err == nil && wake {
		q.wake()
	}
	return err
}

// suppressRest writes the suppression of a dead recipient and suppresses
// the envelope's later segments, in the committing transaction.
func (q *Queue) suppressRest(tx *bolt.Tx, ek []byte, e *envRec, seg int, reason envelope.ErrorClass, now time.Time) error {
	tenant, _ := splitEnvKey(ek)
	env, err := q.readEnvelope(e)
	if err != nil {
		return err
	}
	c, _, err := getConsent(tx, tenant, e.User)
	if err != nil {
		return err
	}
	c.Suppressions = addSuppression(c.Suppressions, SuppressionFor(env, reason, now))
	c.UpdatedAt = now
	if err := putConsent(tx, tenant, e.User, c); err != nil {
		return err
	}
	return q.settleRest(tx, ek, e, seg, envelope.StateSuppressed, reason, now)
}

// settleRest moves an envelope's segments after seg that are still waiting
// (pending, not yet due) to state: they can never go once seg did not.
func (q *Queue) settleRest(tx *bolt.Tx, ek []byte, e *envRec, seg int, state envelope.State, class envelope.ErrorClass, now time.Time) error {
	tenant, _ := splitEnvKey(ek)
	for s := seg + 1; s < e.Segs; s++ {
		r, err := getRow(tx, rowKey(ek, s))
		if err != nil || r == nil {
			return err
		}
		if r.State != envelope.StatePending {
			continue
		}
		old := *r
		r.State, r.Class, r.Due, r.Updated = state, class, 0, now.UnixNano()
		r.History = append(r.History, Attempt{Attempt: r.Attempts, At: now, State: state, Class: class})
		if err := q.putRow(tx, ek, s, e, tenant, &old, r); err != nil {
			return err
		}
	}
	return nil
}

func addSuppression(list []Suppression, s Suppression) []Suppression {
	for _, x := range list {
		if x.Channel == s.Channel && x.Target == s.Target {
			return list
		}
	}
	return append(list, s)
}

// Release implements Store.
func (q *Queue) Release(ctx context.Context, l *Lease) error {
	if l == nil {
		return ErrLeaseLost
	}
	// Unsynced like Commit: a lost release leaves the row sending, to be
	// reconciled.
	err := q.write(ctx, true, func(tx *bolt.Tx) error {
		ek, e, r, err := leased(tx, l)
		if err != nil {
			return err
		}
		now := q.opts.Now()
		old := *r
		if r.Prev == envelope.StateSending {
			// A recovery lease: the earlier call's outcome is still
			// unknown, so the row stays sending with an expired lease and
			// is reconciled again, never redelivered blindly.
			r.Owner, r.LeaseEnd = "", now.UnixNano()
			r.Updated = now.UnixNano()
			return q.putRow(tx, ek, l.Key.Segment, e, l.Key.Tenant, &old, r)
		}
		r.State = r.Prev
		if r.State == "" {
			r.State = envelope.StatePending
		}
		if r.Attempts > 0 {
			r.Attempts--
		}
		r.Owner, r.LeaseEnd, r.ToPending, r.Prev = "", 0, false, ""
		r.Due = now.UnixNano()
		r.Updated = now.UnixNano()
		return q.putRow(tx, ek, l.Key.Segment, e, l.Key.Tenant, &old, r)
	})
	if err == nil {
		q.wake()
	}
	return err
}

// Recover implements Store.
func (q *Queue) Recover(ctx context.Context, req ClaimRequest) ([]*Lease, error) {
	if req.Owner == "" || req.Lease <= 0 {
		return nil, errors.New("queue: recover needs an owner and a lease duration")
	}
	limit := req.Limit
	if limit <= 0 {
		limit = 1
	}
	if expired, err := q.anyLeaseExpired(); err != nil || !expired {
		return nil, err
	}
	var out []claimed
	wake := false
	err := q.write(ctx, false, func(tx *bolt.Tx) error {
		out = out[:0]
		now := q.opts.Now()
		nowN := now.UnixNano()
		var keys [][]byte
		c := tx.Bucket(bktLeases).Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if int64(beUint64(k[:8])) > nowN {
				break
			}
			keys = append(keys, append([]byte(nil), k[8:]...))
		}
		for _, rk := range keys {
			if len(out) >= limit {
				break
			}
			ek, seg := splitRowKey(rk)
			tenant, id := splitEnvKey(ek)
			if req.Tenant != "" && tenant != req.Tenant {
				continue
			}
			e, err := getEnv(tx, ek)
			if err != nil {
				return err
			}
			r, err := getRow(tx, rk)
			if err != nil {
				return err
			}
			if e == nil || r == nil || r.State != envelope.StateSending {
				continue
			}
			if len(req.Channels) > 0 && !containsChannel(req.Channels, e.Channel) {
				continue
			}
			old := *r
			if r.ToPending {
				r.State = envelope.StatePending
				r.Owner, r.LeaseEnd, r.ToPending, r.Prev = "", 0, false, ""
				r.Due, r.Updated = nowN, nowN
				if err := q.putRow(tx, ek, seg, e, tenant, &old, r); err != nil {
					return err
				}
				q.m.seamExpired.Inc()
				wake = true
				continue
			}
			r.Owner = req.Owner
			r.Prev = envelope.StateSending // marks a recovery lease (see Release)
			r.Fence = nextCounter(tx, keyFence)
			r.LeaseEnd = now.Add(req.Lease).UnixNano()
			r.Updated = nowN
			if err := q.putRow(tx, ek, seg, e, tenant, &old, r); err != nil {
				return err
			}
			out = append(out, claimed{&Lease{
				Key:    envelope.Key{Tenant: tenant, EnvelopeID: id, Segment: seg},
				UserID: e.User, Channel: e.Channel, Owner: req.Owner, Fence: r.Fence,
				Attempt: r.Attempts, ExpiresAt: fromNano(r.LeaseEnd), Segments: e.Segs,
				EnqueuedAt: fromNano(e.Enq),
			}, e})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if wake {
		q.wake()
	}
	leases := make([]*Lease, 0, len(out))
	for _, c := range out {
		env, err := q.readEnvelope(c.env)
		if err != nil {
			return nil, err
		}
		c.lease.Envelope = env
		leases = append(leases, c.lease)
	}
	return leases, nil
}

// NextDue implements Store.
func (q *Queue) NextDue(ctx context.Context) (time.Time, error) {
	var min int64
	err := q.view(func(tx *bolt.Tx) error {
		_ = tx.Bucket(bktDue).ForEachBucket(func(name []byte) error {
			if k, _ := tx.Bucket(bktDue).Bucket(name).Cursor().First(); k != nil {
				if v := int64(beUint64(k[:8])); min == 0 || v < min {
					min = v
				}
			}
			return nil
		})
		if k, _ := tx.Bucket(bktLeases).Cursor().First(); k != nil {
			if v := int64(beUint64(k[:8])); min == 0 || v < min {
				min = v
			}
		}
		return nil
	})
	return fromNano(min), err
}

// anyDue reports whether a row matching req is due now (read only).
func (q *Queue) anyDue(req ClaimRequest) (bool, error) {
	found := false
	err := q.view(func(tx *bolt.Tx) error {
		nowN := q.opts.Now().UnixNano()
		return q.dueBuckets(tx, req.Tenant, req.Channels, func(_ []byte, b *bolt.Bucket) {
			if k, _ := b.Cursor().First(); k != nil && int64(beUint64(k[:8])) <= nowN {
				found = true
			}
		})
	})
	return found, err
}

// anyLeaseExpired reports whether some lease has expired (read only).
func (q *Queue) anyLeaseExpired() (bool, error) {
	found := false
	err := q.view(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket(bktLeases).Cursor().First()
		found = k != nil && int64(beUint64(k[:8])) <= q.opts.Now().UnixNano()
		return nil
	})
	return found, err
}

// ReturnExpiredSeam returns rows whose ExpireToPending lease (the HTTP
// seam's) has expired to pending, and leaves every other expired lease for
// a worker to reconcile. Recover does the same as a side effect; this is
// for a daemon that runs no worker. It returns how many rows went back.
func (q *Queue) ReturnExpiredSeam(ctx context.Context) (int, error) {
	if expired, err := q.anyLeaseExpired(); err != nil || !expired {
		return 0, err
	}
	n := 0
	err := q.write(ctx, false, func(tx *bolt.Tx) error {
		n = 0
		nowN := q.opts.Now().UnixNano()
		var keys [][]byte
		c := tx.Bucket(bktLeases).Cursor()
		for k, _ := c.First(); k != nil && int64(beUint64(k[:8])) <= nowN; k, _ = c.Next() {
			keys = append(keys, append([]byte(nil), k[8:]...))
		}
		for _, rk := range keys {
			ek, seg := splitRowKey(rk)
			tenant, _ := splitEnvKey(ek)
			e, err := getEnv(tx, ek)
			if err != nil {
				return err
			}
			r, err := getRow(tx, rk)
			if err != nil {
				return err
			}
			if e == nil || r == nil || r.State != envelope.StateSending || !r.ToPending {
				continue
			}
			old := *r
			r.State = envelope.StatePending
			r.Owner, r.LeaseEnd, r.ToPending, r.Prev = "", 0, false, ""
			r.Due, r.Updated = nowN, nowN
			if err := q.putRow(tx, ek, seg, e, tenant, &old, r); err != nil {
				return err
			}
			q.m.seamExpired.Inc()
			n++
		}
		return nil
	})
	if n > 0 {
		q.wake()
	}
	return n, err
}
