package filestore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

var bktSubs = []byte("subs")

func init() { allBuckets = append(allBuckets, bktSubs) }

func subKey(tenant, user, endpoint string) []byte {
	return []byte(tenant + "\x00" + user + "\x00" + queue.TargetOfValue("push:"+endpoint))
}

// SaveSubscription stores a push subscription for a user (replacing one with
// the same endpoint) and lifts a suppression of that endpoint left by an
// earlier 404/410: the browser subscribed again.
func (q *Queue) SaveSubscription(ctx context.Context, tenant, user string, sub envelope.PushSubscription) error {
	if err := queue.CheckSubscription(sub); err != nil {
		return err
	}
	tenant = tenantOr(tenant)
	return q.write(ctx, false, func(tx *bolt.Tx) error {
		s := queue.Subscription{Sub: sub, Created: q.opts.Now().UTC()}
		c, found, err := getConsent(tx, tenant, user)
		if err != nil {
			return err
		}
		if found && c.Resubscribed(sub.Endpoint) {
			if err := q.record(tx, jrec{Op: jConsent, Tenant: tenant, User: user, Consent: &c}); err != nil {
				return err
			}
		}
		return q.record(tx, jrec{Op: jSubscribe, Tenant: tenant, User: user, Sub: &s})
	})
}

// DeleteSubscription removes a user's push subscription by endpoint. It
// returns ErrNotFound when there is none.
func (q *Queue) DeleteSubscription(ctx context.Context, tenant, user, endpoint string) error {
	tenant = tenantOr(tenant)
	return q.write(ctx, false, func(tx *bolt.Tx) error {
		k := subKey(tenant, user, endpoint)
		if tx.Bucket(bktSubs).Get(k) == nil {
			return queue.ErrNotFound
		}
		return q.record(tx, jrec{Op: jUnsubscribe, Tenant: tenant, User: user, Target: queue.TargetOfValue("push:" + endpoint)})
	})
}

// Subscriptions lists a user's push subscriptions.
func (q *Queue) Subscriptions(ctx context.Context, tenant, user string) ([]queue.Subscription, error) {
	tenant = tenantOr(tenant)
	var out []queue.Subscription
	err := q.view(func(tx *bolt.Tx) error {
		prefix := []byte(tenant + "\x00" + user + "\x00")
		c := tx.Bucket(bktSubs).Cursor()
		for k, v := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, v = c.Next() {
			var s queue.Subscription
			if err := json.Unmarshal(v, &s); err != nil {
				return err
			}
			out = append(out, s)
		}
		return nil
	})
	return out, err
}

// eraseSubscriptions deletes every subscription of a user (inside Erase).
func eraseSubscriptions(tx *bolt.Tx, tenant, user string) error {
	prefix := []byte(tenant + "\x00" + user + "\x00")
	var keys [][]byte
	c := tx.Bucket(bktSubs).Cursor()
	for k, _ := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, _ = c.Next() {
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, k := range keys {
		if err := tx.Bucket(bktSubs).Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// The tenants' address suppressions (queue.Permits): one key per
// (tenant, address target), never the address in clear.
//
//	addrsup  tenant 0 target → Suppression (JSON)
var bktAddrSup = []byte("addrsup")

func init() { allBuckets = append(allBuckets, bktAddrSup) }

// addedLater reports whether bucket b may be missing from a sound index
// written before it existed (Open creates it; a read-only check must not
// call such an index damaged).
func addedLater(b []byte) bool { return bytes.Equal(b, bktAddrSup) || bytes.Equal(b, bktPruned) }

func addrSupKey(tenant, target string) []byte { return []byte(tenant + "\x00" + target) }

// getAddressSup returns the tenant's suppression of target, or nil.
func getAddressSup(tx *bolt.Tx, tenant, target string) (*queue.Suppression, error) {
	b := tx.Bucket(bktAddrSup)
	if b == nil {
		return nil, nil // an index from before address suppressions, opened read-only
	}
	v := b.Get(addrSupKey(tenant, target))
	if v == nil {
		return nil, nil
	}
	var s queue.Suppression
	if err := json.Unmarshal(v, &s); err != nil {
		return nil, fmt.Errorf("queue: an address suppression in the index is damaged (run \"outbox doctor\"): %w", err)
	}
	return &s, nil
}

// addressSupOf returns the tenant's suppression of env's address, or nil
// (env has no address target, or it is not suppressed).
func addressSupOf(tx *bolt.Tx, env *envelope.Envelope) (*queue.Suppression, error) {
	t := queue.AddressTarget(env)
	if t == "" {
		return nil, nil
	}
	return getAddressSup(tx, env.Tenant(), t)
}

// putAddressSup stores the tenant's suppression a unless its target is
// suppressed already (the first one stays).
func (q *Queue) putAddressSup(tx *bolt.Tx, tenant string, a queue.Suppression) error {
	if tx.Bucket(bktAddrSup).Get(addrSupKey(tenant, a.Target)) != nil {
		return nil
	}
	return q.record(tx, jrec{Op: jSuppressAdr, Tenant: tenant, Suppression: &a})
}

// SuppressEmail implements channels.Suppressor and queue.Store: a bounce or
// complaint that came back from the e-mail service (webhook or poller)
// suppresses the address for the tenant, one key written, whether or not
// an envelope carries the address yet. No envelope is read.
func (q *Queue) SuppressEmail(ctx context.Context, tenant, address string, reason envelope.ErrorClass) error {
	tenant = tenantOr(tenant)
	return q.write(ctx, false, func(tx *bolt.Tx) error {
		return q.putAddressSup(tx, tenant, queue.EmailSuppression(address, reason, q.opts.Now().UTC()))
	})
}

// AddressSuppressions implements queue.Store.
func (q *Queue) AddressSuppressions(ctx context.Context, tenant string) ([]queue.Suppression, error) {
	prefix := []byte(tenantOr(tenant) + "\x00")
	var out []queue.Suppression
	err := q.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktAddrSup)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			var s queue.Suppression
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("queue: an address suppression in the index is damaged (run \"outbox doctor\"): %w", err)
			}
			out = append(out, s)
		}
		return nil
	})
	return out, err
}

// LiftAddressSuppression implements queue.Store.
func (q *Queue) LiftAddressSuppression(ctx context.Context, tenant, target string) error {
	tenant = tenantOr(tenant)
	return q.write(ctx, false, func(tx *bolt.Tx) error {
		if tx.Bucket(bktAddrSup).Get(addrSupKey(tenant, target)) == nil {
			return queue.ErrNotFound
		}
		return q.record(tx, jrec{Op: jLiftAdr, Tenant: tenant, Target: target})
	})
}
