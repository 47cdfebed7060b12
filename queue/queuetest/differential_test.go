package queuetest_test

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

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
		// "requeue forgets suppressed rows" is left to the contract suite
		// (TestExercise_Catches): a requeue of a suppressed envelope now
		// goes through only once its suppression is lifted, which random
		// sequences seldom reach.
		{"NextDue ignores lease expiry", broken(nextDueNoLeases)},
		{"NextDue ignores its filter", broken(nextDueUnfiltered)},
		{"Counts off by one after Erase", broken(countsAfterErase)},
		{"a stale commit reports success", broken(staleAccepted)},
		{"ExpireToPending ignored", broken(noExpireToPending)},
		{"a duplicate within a batch reported new", broken(batchDupNew)},
		{"SuppressEmail suppresses only the users with an envelope to the address", broken(suppressEmailUsers)},
		{"a bounce of an e-mail suppresses the address for its user only", broken(bounceUserOnly)},
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
