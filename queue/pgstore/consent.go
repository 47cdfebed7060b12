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

type userKey struct{ tenant, user string }

func tenantOr(t string) string {
	if t == "" {
		return envelope.DefaultTenant
	}
	return t
}

type consentEntry struct {
	c     queue.Consent
	found bool
}

// consents memoises the consent of the users one call looks at: the
// configured ConsentSource, or the store's own records (read in one query
// by preload).
type consents struct {
	s *Store
	m map[userKey]consentEntry
}

func (s *Store) newConsents() *consents { return &consents{s: s, m: map[userKey]consentEntry{}} }

// part reads the store's own records of users (nothing with a source) as
// part of a batch; false when there is nothing to read.
func (cc *consents) part(users []userKey) (batchPart, bool) {
	if cc.s.source != nil || len(users) == 0 {
		return batchPart{}, false
	}
	ts, us := make([]string, 0, len(users)), make([]string, 0, len(users))
	for _, k := range users {
		if _, ok := cc.m[k]; !ok {
			ts, us = append(ts, k.tenant), append(us, k.user)
			cc.m[k] = consentEntry{}
		}
	}
	if len(ts) == 0 {
		return batchPart{}, false
	}
	return batchPart{
		queue: func(b *pgx.Batch) {
			b.Queue(cc.s.sql(`SELECT tenant, user_id, `+consentCols+` FROM {s}.consents
				WHERE (tenant, user_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`), ts, us)
		},
		read: func(br pgx.BatchResults) error {
			rows, err := br.Query()
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var k userKey
				c, err := scanConsent(rows, &k.tenant, &k.user)
				if err != nil {
					return err
				}
				cc.m[k] = consentEntry{c, true}
			}
			return rows.Err()
		},
	}, true
}

func (cc *consents) get(ctx context.Context, tx querier, tenant, user string) (queue.Consent, bool, error) {
	k := userKey{tenant, user}
	if e, ok := cc.m[k]; ok {
		return e.c, e.found, nil
	}
	var (
		c     queue.Consent
		found bool
		err   error
	)
	if cc.s.source != nil {
		c, found, err = cc.s.source.Consent(ctx, tenant, user)
		if err != nil {
			return queue.Consent{}, false, fmt.Errorf("consent source: %w", err)
		}
	} else {
		c, found, err = cc.s.readConsent(ctx, tx, k, false)
		if err != nil {
			return queue.Consent{}, false, err
		}
	}
	cc.m[k] = consentEntry{c, found}
	return c, found, nil
}

const consentCols = `digest_enabled, push_enabled, email_verified, cadence, suppressions, updated_ns, set_by, history`

func scanConsent(r pgx.Row, pre ...any) (queue.Consent, error) {
	var (
		c         queue.Consent
		sup, hist []byte
		upd       int64
	)
	if err := r.Scan(append(pre, &c.DigestEnabled, &c.PushEnabled, &c.EmailVerified, &c.Cadence, &sup, &upd, &c.By, &hist)...); err != nil {
		return c, err
	}
	if err := json.Unmarshal(sup, &c.Suppressions); err != nil {
		return c, fmt.Errorf("pgstore: stored suppressions do not decode: %w", err)
	}
	if err := json.Unmarshal(hist, &c.History); err != nil {
		return c, fmt.Errorf("pgstore: stored consent history does not decode: %w", err)
	}
	c.UpdatedAt = timeNs(upd)
	return c, nil
}

// readConsent reads a user's consent record (locked FOR UPDATE when lock).
func (s *Store) readConsent(ctx context.Context, tx querier, k userKey, lock bool) (queue.Consent, bool, error) {
	q := `SELECT ` + consentCols + ` FROM {s}.consents WHERE tenant = $1 AND user_id = $2`
	if lock {
		q += ` FOR UPDATE`
	}
	c, err := scanConsent(tx.QueryRow(ctx, s.sql(q), k.tenant, k.user))
	if errors.Is(err, pgx.ErrNoRows) {
		return queue.Consent{}, false, nil
	}
	return c, err == nil, err
}

// changeConsent locks a user's consent record (creating an empty one),
// lets change modify it and writes it back with its history entry.
func (s *Store) changeConsent(ctx context.Context, tx dbtx, k userKey, now time.Time, change func(*queue.Consent) bool) error {
	if _, err := tx.Exec(ctx, s.sql(`INSERT INTO {s}.consents (tenant, user_id, digest_enabled, push_enabled, email_verified, cadence, suppressions, updated_ns)
		VALUES ($1, $2, false, false, false, '', '[]', $3) ON CONFLICT DO NOTHING`), k.tenant, k.user, now.UnixNano()); err != nil {
		return err
	}
	c, _, err := s.readConsent(ctx, tx, k, true)
	if err != nil {
		return err
	}
	if !change(&c) {
		return nil
	}
	return s.writeConsent(ctx, tx, k, &c)
}

func (s *Store) writeConsent(ctx context.Context, tx dbtx, k userKey, c *queue.Consent) error {
	sups := c.Suppressions
	if sups == nil {
		sups = []queue.Suppression{}
	}
	sj, err := json.Marshal(sups)
	if err != nil {
		return err
	}
	rec, err := json.Marshal(c)
	if err != nil {
		return err
	}
	hist := c.History
	if hist == nil {
		hist = []queue.ConsentChange{}
	}
	hj, err := json.Marshal(hist)
	if err != nil {
		return err
	}
	var b pgx.Batch
	b.Queue(s.sql(`UPDATE {s}.consents SET digest_enabled = $3, push_enabled = $4, email_verified = $5, cadence = $6,
		suppressions = $7, updated_ns = $8, set_by = $9, history = $10 WHERE tenant = $1 AND user_id = $2`),
		k.tenant, k.user, c.DigestEnabled, c.PushEnabled, c.EmailVerified, c.Cadence, string(sj), c.UpdatedAt.UnixNano(), c.By, string(hj))
	b.Queue(s.sql(`INSERT INTO {s}.consent_history (tenant, user_id, at_ns, record) VALUES ($1, $2, $3, $4)`),
		k.tenant, k.user, c.UpdatedAt.UnixNano(), string(rec))
	return tx.SendBatch(ctx, &b).Close()
}

// suppress adds sup to a user's consent record (queue.Consent.Add).
func (s *Store) suppress(ctx context.Context, tx dbtx, k userKey, sup queue.Suppression, now time.Time) error {
	return s.changeConsent(ctx, tx, k, now, func(c *queue.Consent) bool {
		c.UpdatedAt = now
		c.Add(sup)
		return true
	})
}

// suppressAddress stores the tenant's suppression of an address unless
// one is stored already (the first one stays).
func (s *Store) suppressAddress(ctx context.Context, tx dbtx, tenant string, a queue.Suppression) error {
	_, err := tx.Exec(ctx, s.sql(`INSERT INTO {s}.address_suppressions (tenant, target, channel, reason, at_ns)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`), tenant, a.Target, string(a.Channel), string(a.Reason), a.At.UnixNano())
	return err
}

// Consent returns the user's consent record in tenant (the zero Consent
// when there is none). See queue.Store.
func (s *Store) Consent(ctx context.Context, tenant, userID string) (queue.Consent, error) {
	var c queue.Consent
	err := s.inTx(ctx, "consent", func(tx pgx.Tx) error {
		var err error
		c, _, err = s.readConsent(ctx, tx, userKey{tenantOr(tenant), userID}, false)
		return err
	})
	if err != nil {
		return queue.Consent{}, err
	}
	return c, nil
}

// SetConsent replaces the user's consent flags, keeping the suppressions.
func (s *Store) SetConsent(ctx context.Context, tenant, userID string, f queue.ConsentFlags) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	return s.inTx(ctx, "set consent", func(tx pgx.Tx) error {
		now := s.now()
		return s.changeConsent(ctx, tx, userKey{tenantOr(tenant), userID}, now, func(c *queue.Consent) bool {
			c.Set(f, now)
			return true
		})
	})
}

// LiftSuppression lifts the user's suppressions of ch (and target). See
// queue.Store.
func (s *Store) LiftSuppression(ctx context.Context, tenant, userID string, ch envelope.Channel, target string) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	return s.inTx(ctx, "lift suppression", func(tx pgx.Tx) error {
		k := userKey{tenantOr(tenant), userID}
		if _, found, err := s.readConsent(ctx, tx, k, true); err != nil {
			return err
		} else if !found {
			return queue.ErrNotFound
		}
		lifted := false
		err := s.changeConsent(ctx, tx, k, s.now(), func(c *queue.Consent) bool {
			lifted = c.Lift(ch, target, "operator", s.now())
			return lifted
		})
		if err == nil && !lifted {
			err = queue.ErrNotFound
		}
		return err
	})
}

// Suppress adds a suppression to the user's consent record; one that
// repeats a channel and target already suppressed is not added again.
func (s *Store) Suppress(ctx context.Context, tenant, userID string, sup queue.Suppression) error {
	if userID == "" {
		return queue.ErrNoUser
	}
	if err := queue.CheckSuppression(sup); err != nil {
		return err
	}
	return s.inTx(ctx, "suppress", func(tx pgx.Tx) error {
		now := s.now()
		if sup.At.IsZero() {
			sup.At = now
		}
		return s.suppress(ctx, tx, userKey{tenantOr(tenant), userID}, sup, now)
	})
}

// SuppressEmail suppresses the address for the tenant, whether or not an
// envelope carries it yet. See queue.Store.
func (s *Store) SuppressEmail(ctx context.Context, tenant, address string, reason envelope.ErrorClass) error {
	return s.inTx(ctx, "suppress email", func(tx pgx.Tx) error {
		return s.suppressAddress(ctx, tx, tenantOr(tenant), queue.EmailSuppression(address, reason, s.now().UTC()))
	})
}

// AddressSuppressions lists the tenant's address suppressions by target.
func (s *Store) AddressSuppressions(ctx context.Context, tenant string) ([]queue.Suppression, error) {
	var out []queue.Suppression
	err := s.inTx(ctx, "address suppressions", func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.sql(`SELECT channel, target, reason, at_ns FROM {s}.address_suppressions
			WHERE tenant = $1 ORDER BY target COLLATE "C"`), tenantOr(tenant))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				a      queue.Suppression
				ch, rs string
				at     int64
			)
			if err := rows.Scan(&ch, &a.Target, &rs, &at); err != nil {
				return err
			}
			a.Channel, a.Reason, a.At = envelope.Channel(ch), envelope.ErrorClass(rs), timeNs(at)
			out = append(out, a)
		}
		return rows.Err()
	})
	return out, err
}

// LiftAddressSuppression removes the tenant's suppression of target.
func (s *Store) LiftAddressSuppression(ctx context.Context, tenant, target string) error {
	return s.inTx(ctx, "lift address suppression", func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, s.sql(`DELETE FROM {s}.address_suppressions WHERE tenant = $1 AND target = $2`), tenantOr(tenant), target)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return queue.ErrNotFound
		}
		return nil
	})
}

// SaveSubscription stores a push subscription for a user, replacing one
// with the same endpoint, and lifts a suppression of that endpoint.
func (s *Store) SaveSubscription(ctx context.Context, tenant, user string, sub envelope.PushSubscription) error {
	if err := queue.CheckSubscription(sub); err != nil {
		return err
	}
	j, err := json.Marshal(sub)
	if err != nil {
		return err
	}
	return s.inTx(ctx, "save subscription", func(tx pgx.Tx) error {
		k := userKey{tenantOr(tenant), user}
		now := s.now()
		c, found, err := s.readConsent(ctx, tx, k, true)
		if err != nil {
			return err
		}
		if found && c.Resubscribed(sub.Endpoint) {
			if err := s.writeConsent(ctx, tx, k, &c); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, s.sql(`INSERT INTO {s}.subscriptions (tenant, user_id, endpoint, seq, sub, created_ns)
			VALUES ($1, $2, $3, nextval('{s}.subscription_seq'), $4, $5)
			ON CONFLICT (tenant, user_id, endpoint) DO UPDATE SET seq = excluded.seq, sub = excluded.sub, created_ns = excluded.created_ns`),
			k.tenant, k.user, sub.Endpoint, string(j), now.UnixNano())
		return err
	})
}

// DeleteSubscription removes a user's push subscription by endpoint.
func (s *Store) DeleteSubscription(ctx context.Context, tenant, user, endpoint string) error {
	return s.inTx(ctx, "delete subscription", func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, s.sql(`DELETE FROM {s}.subscriptions WHERE tenant = $1 AND user_id = $2 AND endpoint = $3`),
			tenantOr(tenant), user, endpoint)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return queue.ErrNotFound
		}
		return nil
	})
}

// Subscriptions lists a user's push subscriptions, oldest saved first.
func (s *Store) Subscriptions(ctx context.Context, tenant, user string) ([]queue.Subscription, error) {
	var out []queue.Subscription
	err := s.inTx(ctx, "subscriptions", func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.sql(`SELECT sub, created_ns FROM {s}.subscriptions WHERE tenant = $1 AND user_id = $2 ORDER BY seq`),
			tenantOr(tenant), user)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				j  []byte
				at int64
				x  queue.Subscription
			)
			if err := rows.Scan(&j, &at); err != nil {
				return err
			}
			if err := json.Unmarshal(j, &x.Sub); err != nil {
				return fmt.Errorf("pgstore: stored subscription does not decode: %w", err)
			}
			x.Created = timeNs(at)
			out = append(out, x)
		}
		return rows.Err()
	})
	return out, err
}
