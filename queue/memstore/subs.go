package memstore

import (
	"context"
	"slices"
	"strings"

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

// SuppressEmail suppresses the address for the tenant, whether or not an
// envelope carries it yet. See queue.Store.
func (s *Store) SuppressEmail(ctx context.Context, tenant, address string, reason envelope.ErrorClass) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.suppressAddress(tenantOr(tenant), queue.EmailSuppression(address, reason, s.now().UTC()))
	return nil
}

// AddressSuppressions lists the tenant's address suppressions by target.
// See queue.Store.
func (s *Store) AddressSuppressions(ctx context.Context, tenant string) ([]queue.Suppression, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	tenant = tenantOr(tenant)
	var out []queue.Suppression
	for k, a := range s.addrs {
		if k.tenant == tenant {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b queue.Suppression) int { return strings.Compare(a.Target, b.Target) })
	return out, nil
}

// LiftAddressSuppression removes the tenant's suppression of target. See
// queue.Store.
func (s *Store) LiftAddressSuppression(ctx context.Context, tenant, target string) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	k := addrKey{tenantOr(tenant), target}
	if _, ok := s.addrs[k]; !ok {
		return queue.ErrNotFound
	}
	delete(s.addrs, k)
	return nil
}
