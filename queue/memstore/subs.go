package memstore

import (
	"context"
	"slices"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// SaveSubscription stores a push subscription for a user, replacing one with
// the same endpoint, and lifts a suppression of that endpoint. See
// queue.Store.
func (s *Store) SaveSubscription(ctx context.Context, tenant, user string, sub envelope.PushSubscription) error {
	if err := queue.CheckSubscription(sub); err != nil {
		return err
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	k := userKey{tenantOr(tenant), user}
	if c := s.consent[k]; c != nil {
		c.Resubscribed(sub.Endpoint)
	}
	list := slices.DeleteFunc(s.subs[k], func(x queue.Subscription) bool { return x.Sub.Endpoint == sub.Endpoint })
	s.subs[k] = append(list, queue.Subscription{Sub: sub, Created: s.now().UTC()})
	return nil
}

// DeleteSubscription removes a user's push subscription by endpoint. See
// queue.Store.
func (s *Store) DeleteSubscription(ctx context.Context, tenant, user, endpoint string) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	k := userKey{tenantOr(tenant), user}
	i := slices.IndexFunc(s.subs[k], func(x queue.Subscription) bool { return x.Sub.Endpoint == endpoint })
	if i < 0 {
		return queue.ErrNotFound
	}
	s.subs[k] = slices.Delete(s.subs[k], i, i+1)
	return nil
}

// Subscriptions lists a user's push subscriptions. See queue.Store.
func (s *Store) Subscriptions(ctx context.Context, tenant, user string) ([]queue.Subscription, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return slices.Clone(s.subs[userKey{tenantOr(tenant), user}]), nil
}

// SuppressEmail suppresses an address for every user of the tenant with an
// envelope to it. See queue.Store.
func (s *Store) SuppressEmail(ctx context.Context, tenant, address string, reason envelope.ErrorClass) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	tenant = tenantOr(tenant)
	now := s.now().UTC()
	sup := queue.EmailSuppression(address, reason, now)
	for _, rec := range s.order {
		e := rec.env
		if e.TenantID == tenant && e.Channel == envelope.ChannelEmail && queue.TargetOf(e) == sup.Target {
			s.suppress(userKey{tenant, e.UserID}, sup, now)
		}
	}
	return nil
}
