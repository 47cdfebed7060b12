package queuetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// flaw names the one rule a brokenStore breaks.
type flaw int

const (
	segmentEarly flaw = iota
	releaseCounts
	requeueNoSuppressed
	nextDueNoLeases
	countsAfterErase
	staleAccepted
	noExpireToPending
	batchDupNew
)

// brokenStore wraps the in-memory store and breaks one rule of the
// contract, through the Store interface only.
type brokenStore struct {
	queue.Store
	flaw  flaw
	extra map[envelope.Key]int // releaseCounts: attempts not given back
	erase int                  // countsAfterErase: erasures so far
}

func broken(f flaw) queuetest.Harness {
	return queuetest.Harness{Open: func(t testing.TB, opts *queue.Options) queue.Store {
		return &brokenStore{Store: memstore.New(opts), flaw: f, extra: map[envelope.Key]int{}}
	}}
}

func (b *brokenStore) adjust(ls []*queue.Lease) {
	for _, l := range ls {
		l.Attempt += b.extra[l.Key]
	}
}

func (b *brokenStore) Claim(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	if b.flaw == noExpireToPending {
		req.ExpireToPending = false
	}
	ls, err := b.Store.Claim(ctx, req)
	switch b.flaw {
	case releaseCounts:
		b.adjust(ls)
	case segmentEarly:
		// Hand out the next segment too, while this one is sending.
		for _, l := range ls {
			if l.Key.Segment+1 < l.Segments {
				c := *l
				c.Key.Segment++
				ls = append(ls, &c)
				break
			}
		}
	}
	return ls, err
}

func (b *brokenStore) Recover(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	ls, err := b.Store.Recover(ctx, req)
	if b.flaw == releaseCounts {
		b.adjust(ls)
	}
	return ls, err
}

func (b *brokenStore) Commit(ctx context.Context, l *queue.Lease, out queue.Outcome) error {
	err := b.Store.Commit(ctx, l, out)
	if b.flaw == staleAccepted && errors.Is(err, queue.ErrStaleFence) {
		return nil
	}
	return err
}

func (b *brokenStore) Release(ctx context.Context, l *queue.Lease) error {
	err := b.Store.Release(ctx, l)
	if b.flaw == releaseCounts && err == nil {
		b.extra[l.Key]++
	}
	return err
}

func (b *brokenStore) Get(ctx context.Context, tenant, id string) (*queue.EnvelopeStatus, error) {
	st, err := b.Store.Get(ctx, tenant, id)
	if b.flaw == releaseCounts && err == nil {
		for i := range st.Segments {
			st.Segments[i].Attempts += b.extra[envelope.Key{Tenant: st.Tenant, EnvelopeID: st.ID, Segment: i}]
		}
	}
	return st, err
}

func (b *brokenStore) List(ctx context.Context, f queue.ListFilter) (*queue.Page, error) {
	p, err := b.Store.List(ctx, f)
	if b.flaw == releaseCounts && err == nil {
		for i := range p.Rows {
			p.Rows[i].Attempts += b.extra[p.Rows[i].Key]
		}
	}
	return p, err
}

func (b *brokenStore) Requeue(ctx context.Context, tenant, id string) error {
	if b.flaw == requeueNoSuppressed {
		if st, err := b.Store.Get(ctx, tenant, id); err == nil {
			other := false
			for _, s := range st.Segments {
				other = other || s.State == envelope.StateDeadLetter || s.State == envelope.StateUnresolved || s.State == envelope.StateExpired
			}
			if !other {
				return queue.ErrInvalidTransition
			}
		}
	}
	return b.Store.Requeue(ctx, tenant, id)
}

func (b *brokenStore) NextDue(ctx context.Context) (time.Time, error) {
	if b.flaw != nextDueNoLeases {
		return b.Store.NextDue(ctx)
	}
	// The earliest due row, leases left out.
	var next time.Time
	f := queue.ListFilter{Limit: 1000}
	for {
		p, err := b.Store.List(ctx, f)
		if err != nil {
			return time.Time{}, err
		}
		for _, row := range p.Rows {
			if row.State != envelope.StatePending && row.State != envelope.StateRetryable {
				continue
			}
			st, err := b.Store.Get(ctx, row.Key.Tenant, row.Key.EnvelopeID)
			if err != nil {
				return time.Time{}, err
			}
			if at := st.Segments[row.Key.Segment].NextAt; !at.IsZero() && (next.IsZero() || at.Before(next)) {
				next = at
			}
		}
		if p.Next == "" {
			return next, nil
		}
		f.Cursor = p.Next
	}
}

func (b *brokenStore) Erase(ctx context.Context, tenant, userID string) error {
	err := b.Store.Erase(ctx, tenant, userID)
	if err == nil {
		b.erase++
	}
	return err
}

func (b *brokenStore) Counts(ctx context.Context, tenant string) (queue.Counts, error) {
	c, err := b.Store.Counts(ctx, tenant)
	if b.flaw == countsAfterErase && err == nil && b.erase > 0 {
		if c[envelope.StatePending] == nil {
			c[envelope.StatePending] = map[envelope.Channel]int{}
		}
		c[envelope.StatePending][envelope.ChannelTelegram]++
	}
	return c, err
}

func (b *brokenStore) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]queue.EnqueueResult, error) {
	res, err := b.Store.Enqueue(ctx, envs...)
	if b.flaw == batchDupNew {
		seen := map[string]bool{}
		for i := range res {
			k := res[i].Tenant + "/" + res[i].ID
			if seen[k] {
				res[i].Duplicate = false
			}
			seen[k] = true
		}
	}
	return res, err
}
