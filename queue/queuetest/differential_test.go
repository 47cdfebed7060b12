package queuetest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// recorder is a testing.TB that records failures instead of failing the
// test, so that a check can assert that Differential fails. Fatal ends
// the goroutine it is called on (run Differential on its own, see
// recordRun).
type recorder struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Helper() {}
func (r *recorder) fail(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msg)
}
func (r *recorder) Error(args ...any)                 { r.fail(fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }
func (r *recorder) Fail()                             { r.fail("Fail") }
func (r *recorder) FailNow()                          { r.fail("FailNow"); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)                 { r.fail(fmt.Sprint(args...)); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs) > 0
}
func (r *recorder) Log(...any)            {}
func (r *recorder) Logf(string, ...any)   {}
func (r *recorder) failures() []string    { r.mu.Lock(); defer r.mu.Unlock(); return slices.Clone(r.msgs) }
func (r *recorder) Skip(...any)           { r.fail("Skip"); runtime.Goexit() }
func (r *recorder) Skipf(string, ...any)  { r.fail("Skip"); runtime.Goexit() }
func (r *recorder) SkipNow()              { r.fail("Skip"); runtime.Goexit() }
func (r *recorder) Setenv(string, string) { panic("recorder: Setenv") }

// recordRun runs Differential on a recorder and returns its failures.
func recordRun(t *testing.T, cfg queuetest.DiffConfig) []string {
	t.Helper()
	rec := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		queuetest.Differential(rec, cfg)
	}()
	<-done
	return rec.failures()
}

func memHarness(mod func(*queue.Options)) queuetest.Harness {
	return queuetest.Harness{Open: func(t testing.TB, opts *queue.Options) queue.Store {
		o := *opts
		if mod != nil {
			mod(&o)
		}
		return memstore.New(&o)
	}}
}

// fixedBudget keeps the check's budget whatever OUTBOX_DIFF_* variables
// say (an empty value counts as unset).
func fixedBudget(t *testing.T) {
	for _, v := range []string{"OUTBOX_DIFF_SEED", "OUTBOX_DIFF_SEEDS", "OUTBOX_DIFF_STEPS", "OUTBOX_DIFF_REPORTS"} {
		t.Setenv(v, "")
	}
}

// defectConfig is the budget the check gives each defect.
func defectConfig(stores ...queuetest.DiffStore) queuetest.DiffConfig {
	return queuetest.DiffConfig{Stores: stores, Seeds: 20, Steps: 100, MaxReports: 1, ShrinkRuns: -1}
}

// TestDifferential_Memstore runs the in-memory store alone against the
// model: the baseline of the seeded-defect check below.
func TestDifferential_Memstore(t *testing.T) {
	fixedBudget(t)
	queuetest.Differential(t, defectConfig(queuetest.DiffStore{Name: "memstore", Harness: memHarness(nil)}))
}

// TestDifferential_Catches seeds one defect at a time into the in-memory
// store and checks that Differential reports it, and names the broken
// store (the check itself passes).
func TestDifferential_Catches(t *testing.T) {
	fixedBudget(t) // before the parallel subtests, which run once this returns
	defects := []struct {
		name string
		h    queuetest.Harness
	}{
		// A retryable failure never becomes dead_letter.
		{"retry ignores MaxAttempts", memHarness(func(o *queue.Options) { o.Backoff.MaxAttempts = 1000 })},
		{"claim hands out segment i+1 before i is sent", broken(segmentEarly)},
		{"release counts the attempt", broken(releaseCounts)},
		{"requeue forgets suppressed rows", broken(requeueNoSuppressed)},
		{"NextDue ignores lease expiry", broken(nextDueNoLeases)},
		{"Counts off by one after Erase", broken(countsAfterErase)},
		{"a stale commit reports success", broken(staleAccepted)},
		{"ExpireToPending ignored", broken(noExpireToPending)},
		{"a duplicate within a batch reported new", broken(batchDupNew)},
	}
	for _, d := range defects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			got := recordRun(t, defectConfig(queuetest.DiffStore{Name: "broken", Harness: d.h}))
			if len(got) == 0 {
				t.Fatalf("Differential did not report the defect %q", d.name)
			}
			if !strings.Contains(got[0], "broken differs from model") {
				t.Fatalf("Differential reported, but not the broken store:\n%s", got[0])
			}
		})
	}

	// And without the model: the broken store against a correct one.
	t.Run("NoModel", func(t *testing.T) {
		t.Parallel()
		cfg := defectConfig(
			queuetest.DiffStore{Name: "memstore", Harness: memHarness(nil)},
			queuetest.DiffStore{Name: "broken", Harness: broken(releaseCounts)},
		)
		cfg.NoModel = true
		if got := recordRun(t, cfg); len(got) == 0 || !strings.Contains(got[0], "broken differs from memstore") {
			t.Fatalf("Differential without the model reported %q", got)
		}
	})
	t.Run("NoDefect", func(t *testing.T) {
		t.Parallel()
		cfg := defectConfig(
			queuetest.DiffStore{Name: "memstore", Harness: memHarness(nil)},
			queuetest.DiffStore{Name: "again", Harness: memHarness(nil)},
		)
		cfg.NoModel = true
		cfg.Seeds = 8
		if got := recordRun(t, cfg); len(got) != 0 {
			t.Fatalf("two correct stores reported as diverging:\n%s", got[0])
		}
	})
}

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
