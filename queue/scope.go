package queue

import (
	"context"

	"github.com/outboxhq/outbox/envelope"
)

// Tenant is a tenant-scoped handle on a Store: every call works on its
// tenant only, and a lease or envelope of another tenant fails with
// ErrCrossTenant.
type Tenant struct {
	s  Store
	id string
}

// Scope returns a handle on s for tenant ("" means envelope.DefaultTenant).
func Scope(s Store, tenant string) *Tenant {
	if tenant == "" {
		tenant = envelope.DefaultTenant
	}
	return &Tenant{s: s, id: tenant}
}

// ID returns the handle's tenant.
func (t *Tenant) ID() string { return t.id }

// Enqueue enqueues envelopes of this tenant (an envelope without tenant_id
// gets it); an envelope naming another tenant fails with ErrCrossTenant.
func (t *Tenant) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]EnqueueResult, error) {
	for i, e := range envs {
		if e.TenantID == "" {
			e.TenantID = t.id
		}
		if e.TenantID != t.id {
			return nil, &EnqueueError{Index: i, Tenant: e.TenantID, ID: e.ID, Err: ErrCrossTenant}
		}
	}
	return t.s.Enqueue(ctx, envs...)
}

// Claim leases rows of this tenant only.
func (t *Tenant) Claim(ctx context.Context, req ClaimRequest) ([]*Lease, error) {
	req.Tenant = t.id
	return t.s.Claim(ctx, req)
}

// Recover leases expired rows of this tenant only.
func (t *Tenant) Recover(ctx context.Context, req ClaimRequest) ([]*Lease, error) {
	req.Tenant = t.id
	return t.s.Recover(ctx, req)
}

func (t *Tenant) own(l *Lease) error {
	if l == nil || l.Key.Tenant != t.id {
		return ErrCrossTenant
	}
	return nil
}

// Commit commits a lease of this tenant.
func (t *Tenant) Commit(ctx context.Context, l *Lease, out Outcome) error {
	if err := t.own(l); err != nil {
		return err
	}
	return t.s.Commit(ctx, l, out)
}

// Release releases a lease of this tenant.
func (t *Tenant) Release(ctx context.Context, l *Lease) error {
	if err := t.own(l); err != nil {
		return err
	}
	return t.s.Release(ctx, l)
}

// Get returns an envelope of this tenant.
func (t *Tenant) Get(ctx context.Context, id string) (*EnvelopeStatus, error) {
	return t.s.Get(ctx, t.id, id)
}

// List lists rows of this tenant.
func (t *Tenant) List(ctx context.Context, f ListFilter) (*Page, error) {
	f.Tenant = t.id
	return t.s.List(ctx, f)
}

// Counts counts rows of this tenant.
func (t *Tenant) Counts(ctx context.Context) (Counts, error) { return t.s.Counts(ctx, t.id) }

// Requeue requeues an envelope of this tenant.
func (t *Tenant) Requeue(ctx context.Context, id string) error { return t.s.Requeue(ctx, t.id, id) }

// Resolve resolves an envelope of this tenant.
func (t *Tenant) Resolve(ctx context.Context, id string, as envelope.State) error {
	return t.s.Resolve(ctx, t.id, id, as)
}

// Consent returns a user's consent in this tenant.
func (t *Tenant) Consent(ctx context.Context, userID string) (Consent, error) {
	return t.s.Consent(ctx, t.id, userID)
}

// SetConsent sets a user's consent flags in this tenant.
func (t *Tenant) SetConsent(ctx context.Context, userID string, c ConsentFlags) error {
	return t.s.SetConsent(ctx, t.id, userID, c)
}

// Suppress adds a suppression for a user of this tenant.
func (t *Tenant) Suppress(ctx context.Context, userID string, s Suppression) error {
	return t.s.Suppress(ctx, t.id, userID, s)
}

// Erase erases a user of this tenant.
func (t *Tenant) Erase(ctx context.Context, userID string) error { return t.s.Erase(ctx, t.id, userID) }

// SuppressEmail suppresses an address for this tenant.
func (t *Tenant) SuppressEmail(ctx context.Context, address string, reason envelope.ErrorClass) error {
	return t.s.SuppressEmail(ctx, t.id, address, reason)
}

// AddressSuppressions lists this tenant's address suppressions.
func (t *Tenant) AddressSuppressions(ctx context.Context) ([]Suppression, error) {
	return t.s.AddressSuppressions(ctx, t.id)
}

// LiftAddressSuppression lifts this tenant's suppression of target.
func (t *Tenant) LiftAddressSuppression(ctx context.Context, target string) error {
	return t.s.LiftAddressSuppression(ctx, t.id, target)
}
