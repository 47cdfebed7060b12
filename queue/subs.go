package queue

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/outboxhq/outbox/envelope"
	bolt "go.etcd.io/bbolt"
)

var bktSubs = []byte("subs")

func init() { allBuckets = append(allBuckets, bktSubs) }

// Subscription is a browser push subscription saved for a user.
type Subscription struct {
	Sub     envelope.PushSubscription `json:"subscription"`
	Created time.Time                 `json:"created_at"`
}

func subKey(tenant, user, endpoint string) []byte {
	return []byte(tenant + "\x00" + user + "\x00" + TargetOfValue("push:"+endpoint))
}

// SaveSubscription stores a push subscription for a user (replacing one with
// the same endpoint) and lifts a suppression of that endpoint left by an
// earlier 404/410: the browser subscribed again.
func (q *Queue) SaveSubscription(ctx context.Context, tenant, user string, sub envelope.PushSubscription) error {
	if sub.Endpoint == "" || sub.Keys.P256dh == "" || sub.Keys.Auth == "" {
		return errors.New("queue: push subscription needs endpoint, keys.p256dh and keys.auth")
	}
	tenant = tenantOr(tenant)
	return q.write(ctx, false, func(tx *bolt.Tx) error {
		v, err := json.Marshal(Subscription{Sub: sub, Created: q.opts.Now().UTC()})
		if err != nil {
			return err
		}
		c, found, err := getConsent(tx, tenant, user)
		if err != nil {
			return err
		}
		if found {
			target := TargetOfValue("push:" + sub.Endpoint)
			kept := c.Suppressions[:0]
			for _, s := range c.Suppressions {
				if !(s.Channel == envelope.ChannelPush && s.Target == target) {
					kept = append(kept, s)
				}
			}
			c.Suppressions = kept
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
			return ErrNotFound
		}
		return tx.Bucket(bktSubs).Delete(k)
	})
}

// Subscriptions lists a user's push subscriptions.
func (q *Queue) Subscriptions(ctx context.Context, tenant, user string) ([]Subscription, error) {
	tenant = tenantOr(tenant)
	var out []Subscription
	err := q.view(func(tx *bolt.Tx) error {
		prefix := []byte(tenant + "\x00" + user + "\x00")
		c := tx.Bucket(bktSubs).Cursor()
		for k, v := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, v = c.Next() {
			var s Subscription
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
	target := TargetOfValue("email:" + address)
	return q.write(ctx, false, func(tx *bolt.Tx) error {
		users := map[string]bool{}
		prefix := []byte(tenant + "\x00")
		c := tx.Bucket(bktEnv).Cursor()
		for k, v := c.Seek(prefix); k != nil && len(k) >= len(prefix) && string(k[:len(prefix)]) == string(prefix); k, v = c.Next() {
			var e envRec
			if json.Unmarshal(v, &e) != nil || e.Channel != envelope.ChannelEmail || users[e.User] {
				continue
			}
			env, err := q.readEnvelope(&e)
			if err == nil && TargetOf(env) == target {
				users[e.User] = true
			}
		}
		now := q.opts.Now().UTC()
		for u := range users {
			cs, _, err := getConsent(tx, tenant, u)
			if err != nil {
				return err
			}
			cs.Suppressions = addSuppression(cs.Suppressions, Suppression{Channel: envelope.ChannelEmail, Target: target, Reason: reason, At: now})
			cs.UpdatedAt = now
			if err := putConsent(tx, tenant, u, cs); err != nil {
				return err
			}
		}
		return nil
	})
}
