package filestore

import (
	"context"
	"encoding/json"

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
		v, err := json.Marshal(queue.Subscription{Sub: sub, Created: q.opts.Now().UTC()})
		if err != nil {
			return err
		}
		c, found, err := getConsent(tx, tenant, user)
		if err != nil {
			return err
		}
		if found && c.Resubscribed(sub.Endpoint) {
			if err := putConsent(tx, tenant, user, c); err != nil {
				return err
			}
		}
		return tx.Bucket(bktSubs).Put(subKey(tenant, user, sub.Endpoint), v)
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
		return tx.Bucket(bktSubs).Delete(k)
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

// SuppressEmail implements channels.Suppressor: a bounce or complaint that
// came back from the email service (webhook or poller) suppresses the
// address for every user of the tenant that has it. The address is matched
// by its hash; users are found through their consent records and envelopes.
func (q *Queue) SuppressEmail(ctx context.Context, tenant, address string, reason envelope.ErrorClass) error {
	tenant = tenantOr(tenant)
	target := queue.TargetOfValue("email:" + address)
	return q.write(ctx, false, func(tx *bolt.Tx) error {
		users := map[string]bool{}
		prefix := []byte(tenant + "\x00")
		c := tx.Bucket(bktEnv).Cursor()
		for k, v := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, v = c.Next() {
			var e envRec
			if json.Unmarshal(v, &e) != nil || e.Channel != envelope.ChannelEmail || users[e.User] {
				continue
			}
			env, err := q.readEnvelope(k, &e)
			if err == nil && queue.TargetOf(env) == target {
				users[e.User] = true
			}
		}
		now := q.opts.Now().UTC()
		for u := range users {
			cs, _, err := getConsent(tx, tenant, u)
			if err != nil {
				return err
			}
			cs.Add(queue.EmailSuppression(address, reason, now))
			cs.UpdatedAt = now
			if err := putConsent(tx, tenant, u, cs); err != nil {
				return err
			}
		}
		return nil
	})
}
