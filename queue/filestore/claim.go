package filestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sort"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

type claimed struct {
	lease *queue.Lease
	env   *envRec
}

// Claim implements Store.
func (q *Queue) Claim(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	req, err := req.Checked()
	if err != nil {
		return nil, err
	}
	limit := req.Limit
	// Most claims of an idle worker find nothing: look in a read
	// transaction first, so that they cost no write (and no fsync).
	if due, err := q.anyDue(req); err != nil || !due {
		return nil, err
	}
	var out []claimed
	err = q.write(ctx, q.unsyncedClaim(req), func(tx *bolt.Tx) error {
		out = out[:0]
		now := q.opts.Now()
		nowN := now.UnixNano()
		users := map[string]consentAt{}
		type cand struct {
			key []byte // due key
			ek  []byte
			bkt []byte
		}
		seen := map[string]bool{}
	rounds:
		for len(out) < limit {
			// Read up to the rows still wanted from each bucket and take
			// them in due order, but only up to the first bucket's cut:
			// past it, a row of that bucket not read yet may be due
			// earlier (a row read may end without a lease).
			var cands []cand
			var horizon []byte // the smallest last key of a bucket read to its cut
			want := limit - len(out)
			err := q.dueBuckets(tx, req.Tenant, req.Channels, func(name []byte, b *bolt.Bucket) {
				c := b.Cursor()
				n := 0
				var last []byte
				for k, v := c.First(); k != nil && n < want; k, v = c.Next() {
					if int64(beUint64(k[:8])) > nowN {
						break
					}
					last = append([]byte(nil), k...)
					cands = append(cands, cand{last, append([]byte(nil), v...), name})
					n++
				}
				if n == want && (horizon == nil || bytes.Compare(last, horizon) < 0) {
					horizon = last
				}
			})
			if err != nil {
				return err
			}
			if len(cands) == 0 {
				break
			}
			sort.Slice(cands, func(i, j int) bool { return bytes.Compare(cands[i].key, cands[j].key) < 0 })
			fresh := 0
			for _, c := range cands {
				if len(out) >= limit || (horizon != nil && bytes.Compare(c.key, horizon) > 0) {
					break
				}
				if seen[string(c.key)] {
					continue // an index entry without its envelope: left to doctor
				}
				seen[string(c.key)] = true
				fresh++
				if len(c.key) != 20 {
					continue // a damaged entry is left to doctor
				}
				seg := int(beUint32(c.key[16:20]))
				l, e, err := q.claimRow(ctx, tx, c.ek, seg, req, now, users)
				if err != nil && len(out) > 0 {
					// The leases taken are written in this transaction,
					// which commits: they go back to the caller, and the
					// failing row waits for the next claim.
					break rounds
				}
				if err != nil {
					return err
				}
				if l != nil {
					out = append(out, claimed{l, e})
				}
			}
			if fresh == 0 {
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	leases := make([]*queue.Lease, 0, len(out))
	for _, c := range out {
		leases = append(leases, c.lease)
	}
	return leases, nil
}

// unsyncedClaim reports whether req's claim may skip fsync: every channel
// it asks for is in Options.UnsyncedClaims (see there).
func (q *Queue) unsyncedClaim(req queue.ClaimRequest) bool {
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
	c     queue.Consent
	found bool
}

// claimRow leases one due row, or ends it (expired, suppressed, or
// dead_letter when its record is lost) as the state machine judges.
func (q *Queue) claimRow(ctx context.Context, tx *bolt.Tx, ek []byte, seg int, req queue.ClaimRequest, now time.Time, users map[string]consentAt) (*queue.Lease, *envRec, error) {
	tenant, id := splitEnvKey(ek)
	e, err := getEnv(tx, ek)
	if err != nil || e == nil || seg >= e.Segs {
		return nil, nil, err // a due entry without its envelope or segment: left to doctor
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
	// The verdict needs the recipient (suppressions target one address or
	// subscription), so read the record.
	env, err := q.readEnvelope(ek, e)
	if passing(err) {
		return nil, nil, fmt.Errorf("claim: %w", err) // not lost: the claim is tried again
	}
	v := queue.RecordLost
	if err == nil {
		addr, err := addressSupOf(tx, env)
		if err != nil {
			return nil, nil, fmt.Errorf("claim: %w", err)
		}
		v = queue.Judge(env, ca.c, ca.found, addr, now)
	} else {
		// The log (or its record) is gone: this row can never be sent.
		// Dead-letter it instead of failing every claim behind it.
		q.log.Error("envelope record unreadable; row dead-lettered", "operation", "claim", "status", "error", "error_class", string(envelope.ClassRecordLost))
	}
	fence := func() uint64 { return nextCounter(tx, keyFence) }
	st, err := q.step(tx, ek, e, now, func(rows []queue.Delivery) (*queue.Step, error) {
		return queue.Claim(rows, seg, v, req, fence, now)
	})
	if err != nil || v.State != envelope.StateSending {
		return nil, nil, err
	}
	d := &st.Rows[seg]
	return &queue.Lease{
		Envelope:   env,
		Key:        envelope.Key{Tenant: tenant, EnvelopeID: id, Segment: seg},
		UserID:     e.User,
		Channel:    e.Channel,
		Owner:      d.Owner,
		Fence:      d.Fence,
		Attempt:    d.Attempts,
		ExpiresAt:  d.LeaseEnd,
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

// leasedEnv loads the envelope a lease names, or ErrLeaseLost.
func leasedEnv(tx *bolt.Tx, l *queue.Lease) ([]byte, *envRec, error) {
	ek := envKey(l.Key.Tenant, l.Key.EnvelopeID)
	e, err := getEnv(tx, ek)
	if err != nil {
		return nil, nil, err
	}
	if e == nil || l.Key.Segment < 0 || l.Key.Segment >= e.Segs {
		return nil, nil, queue.ErrLeaseLost
	}
	return ek, e, nil
}

// withLease runs a state machine step on the envelope of lease l.
func (q *Queue) withLease(ctx context.Context, l *queue.Lease, f func(rows []queue.Delivery, now time.Time) (*queue.Step, error)) error {
	if l == nil {
		return queue.ErrLeaseLost
	}
	wake := false
	// A commit or release may skip fsync: if it is lost in a machine
	// crash the row is back to sending, and its expired lease is
	// reconciled with the provider, never redelivered blindly.
	err := q.write(ctx, true, func(tx *bolt.Tx) error {
		ek, e, err := leasedEnv(tx, l)
		if err != nil {
			return err
		}
		now := q.opts.Now()
		st, err := q.step(tx, ek, e, now, func(rows []queue.Delivery) (*queue.Step, error) { return f(rows, now) })
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

// Commit implements Store.
func (q *Queue) Commit(ctx context.Context, l *queue.Lease, out queue.Outcome) error {
	if !queue.ValidOutcome(out.State) {
		return fmt.Errorf("%w: cannot commit %q", queue.ErrInvalidTransition, out.State)
	}
	return q.withLease(ctx, l, func(rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		return queue.Commit(q.opts.Backoff, rows, l, out, now)
	})
}

// Release implements Store.
func (q *Queue) Release(ctx context.Context, l *queue.Lease) error {
	return q.withLease(ctx, l, func(rows []queue.Delivery, now time.Time) (*queue.Step, error) {
		return queue.Release(rows, l, now)
	})
}

// Recover implements Store.
func (q *Queue) Recover(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	req, err := req.Checked()
	if err != nil {
		return nil, err
	}
	limit := req.Limit
	if expired, err := q.anyLeaseExpired(); err != nil || !expired {
		return nil, err
	}
	var out []claimed
	wake := false
	err = q.write(ctx, false, func(tx *bolt.Tx) error {
		out = out[:0]
		now := q.opts.Now()
		nowN := now.UnixNano()
		// Expired leases, oldest lease end first, then in enqueue order.
		type cand struct {
			end int64
			e   *envRec
			ek  []byte
			seg int
			rk  []byte
		}
		var cands []cand
		c := tx.Bucket(bktLeases).Cursor()
		for k, _ := c.First(); k != nil && int64(beUint64(k[:8])) <= nowN; k, _ = c.Next() {
			rk := append([]byte(nil), k[8:]...)
			ek, seg := splitRowKey(rk)
			tenant, _ := splitEnvKey(ek)
			if req.Tenant != "" && tenant != req.Tenant {
				continue
			}
			e, err := getEnv(tx, ek)
			if err != nil {
				return err
			}
			if e == nil || seg < 0 || seg >= e.Segs || (len(req.Channels) > 0 && !containsChannel(req.Channels, e.Channel)) {
				continue // a damaged entry is left to doctor
			}
			cands = append(cands, cand{int64(beUint64(k[:8])), e, ek, seg, rk})
		}
		sort.SliceStable(cands, func(i, j int) bool {
			a, b := cands[i], cands[j]
			if a.end != b.end {
				return a.end < b.end
			}
			if a.e.Seq != b.e.Seq {
				return a.e.Seq < b.e.Seq
			}
			return a.seg < b.seg
		})
		for _, cd := range cands {
			e, ek, seg, rk := cd.e, cd.ek, cd.seg, cd.rk
			tenant, id := splitEnvKey(ek)
			r, err := getRow(tx, rk)
			if err != nil {
				return err
			}
			if r == nil || !queue.LeaseExpired(ptr(toDelivery(r)), now) || (!r.ToPending && len(out) >= limit) {
				continue
			}
			fence := func() uint64 { return nextCounter(tx, keyFence) }
			if _, rerr := q.readEnvelope(ek, e); passing(rerr) {
				if len(out) > 0 {
					break // as Claim: what is leased goes back, the rest waits
				}
				return fmt.Errorf("recover: %w", rerr)
			} else if rerr != nil {
				// The record is gone: nothing to reconcile with, and a
				// lease would fail every recover behind it.
				q.log.Error("envelope record unreadable at recovery; row unresolved", "operation", "recover", "status", "error", "error_class", string(envelope.ClassRecordLost))
				if _, err := q.step(tx, ek, e, now, func(rows []queue.Delivery) (*queue.Step, error) {
					return queue.RecordGone(rows, seg, now)
				}); err != nil {
					return err
				}
				wake = true
				continue
			}
			var leased bool
			st, err := q.step(tx, ek, e, now, func(rows []queue.Delivery) (*queue.Step, error) {
				st, l, err := queue.Recover(rows, seg, req, fence, now)
				leased = l
				return st, err
			})
			if err != nil {
				return err
			}
			if !leased {
				q.m.SeamExpired.Inc()
				wake = true
				continue
			}
			d := &st.Rows[seg]
			out = append(out, claimed{&queue.Lease{
				Key:    envelope.Key{Tenant: tenant, EnvelopeID: id, Segment: seg},
				UserID: e.User, Channel: e.Channel, Owner: d.Owner, Fence: d.Fence,
				Attempt: d.Attempts, ExpiresAt: d.LeaseEnd, Segments: e.Segs,
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
	leases := make([]*queue.Lease, 0, len(out))
	for _, c := range out {
		env, err := q.readEnvelope(envKey(c.lease.Key.Tenant, c.lease.Key.EnvelopeID), c.env)
		if err != nil {
			// Gone since the transaction read it: its lease expires, and
			// the next recover settles it (RecordGone).
			continue
		}
		c.lease.Envelope = env
		leases = append(leases, c.lease)
	}
	return leases, nil
}

// NextDue implements Store.
func (q *Queue) NextDue(ctx context.Context, f queue.DueFilter) (time.Time, error) {
	var min int64
	err := q.view(func(tx *bolt.Tx) error {
		if err := q.dueBuckets(tx, f.Tenant, f.Channels, func(_ []byte, b *bolt.Bucket) {
			if k, _ := b.Cursor().First(); k != nil {
				if v := int64(beUint64(k[:8])); min == 0 || v < min {
					min = v
				}
			}
		}); err != nil {
			return err
		}
		// Leases in lease-end order: the first one f admits.
		c := tx.Bucket(bktLeases).Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			v := int64(beUint64(k[:8]))
			if min != 0 && v >= min {
				break
			}
			ok, err := admits(tx, f, k[8:])
			if err != nil {
				return err
			}
			if ok {
				min = v
				break
			}
		}
		return nil
	})
	return fromNano(min), err
}

// admits reports whether the row keyed rk is of f's tenant and channels.
func admits(tx *bolt.Tx, f queue.DueFilter, rk []byte) (bool, error) {
	if f.Tenant == "" && len(f.Channels) == 0 {
		return true, nil
	}
	ek, _ := splitRowKey(rk)
	if tenant, _ := splitEnvKey(ek); f.Tenant != "" && tenant != f.Tenant {
		return false, nil
	}
	if len(f.Channels) == 0 {
		return true, nil
	}
	e, err := getEnv(tx, ek)
	if err != nil || e == nil {
		return false, err
	}
	return containsChannel(f.Channels, e.Channel), nil
}

// anyDue reports whether a row matching req is due now (read only).
func (q *Queue) anyDue(req queue.ClaimRequest) (bool, error) {
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
		now := q.opts.Now()
		nowN := now.UnixNano()
		var keys [][]byte
		c := tx.Bucket(bktLeases).Cursor()
		for k, _ := c.First(); k != nil && int64(beUint64(k[:8])) <= nowN; k, _ = c.Next() {
			keys = append(keys, append([]byte(nil), k[8:]...))
		}
		for _, rk := range keys {
			ek, seg := splitRowKey(rk)
			e, err := getEnv(tx, ek)
			if err != nil {
				return err
			}
			r, err := getRow(tx, rk)
			if err != nil {
				return err
			}
			if e == nil || r == nil || seg < 0 || seg >= e.Segs || !r.ToPending || !queue.LeaseExpired(ptr(toDelivery(r)), now) {
				continue
			}
			if _, err := q.step(tx, ek, e, now, func(rows []queue.Delivery) (*queue.Step, error) { return queue.ExpireLease(rows, seg, now) }); err != nil {
				return err
			}
			q.m.SeamExpired.Inc()
			n++
		}
		return nil
	})
	if n > 0 {
		q.wake()
	}
	return n, err
}

func ptr[T any](v T) *T { return &v }
