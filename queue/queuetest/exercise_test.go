package queuetest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// defectEnv names the defect TestSuiteOnDefect runs the suite against.
const defectEnv = "OUTBOX_SUITE_DEFECT"

// suiteDefects are the seeded defects the contract suite must catch, each
// with the suite's subtest that must fail on it.
var suiteDefects = []struct {
	name  string
	h     queuetest.Harness
	catch string // a subtest of Exercise
}{
	{"retry-ignores-max-attempts", memHarness(func(o *queue.Options) { o.Backoff.MaxAttempts = 1000 }), "CommitMaxAttempts"},
	{"segment-early", broken(segmentEarly), "ReplySegments"},
	{"release-counts", broken(releaseCounts), "Release"},
	{"requeue-no-suppressed", broken(requeueNoSuppressed), "Requeue"},
	{"nextdue-no-leases", broken(nextDueNoLeases), "NextDue"},
	{"nextdue-unfiltered", broken(nextDueUnfiltered), "NextDueFilter"},
	{"counts-after-erase", broken(countsAfterErase), "Erase"},
	{"stale-accepted", broken(staleAccepted), "StaleFence"},
	{"no-expire-to-pending", broken(noExpireToPending), "ExpireToPending"},
	{"batch-dup-new", broken(batchDupNew), "EnqueueDuplicate"},
	{"commit-no-fence", broken(commitNoFence), "StaleFence"},
	{"claim-expired", broken(claimExpired), "ExpiresAt"},
	{"requeue-all-due", broken(requeueAllDue), "Requeue"},
	{"prune-live", broken(pruneLive), "Prune"},
	{"erase-keeps-consent", broken(eraseKeepsConsent), "Erase"},
	{"release-recovered", broken(releaseRecovered), "ReleaseRecovered"},
	{"requeue-no-budget", broken(requeueNoBudget), "RequeueFreshBudget"},
	{"save-keeps-suppression", broken(saveKeepsSuppression), "SubscriptionLiftsSuppression"},
	{"save-no-replace", broken(saveNoReplace), "Subscriptions"},
	{"delete-unknown-ok", broken(deleteUnknownOK), "Subscriptions"},
	{"erase-keeps-subs", broken(eraseKeepsSubs), "EraseSubscriptions"},
	{"suppress-email-tenants", broken(suppressEmailTenants), "SuppressEmail"},
	{"suppress-email-users", broken(suppressEmailUsers), "SuppressEmail"},
	{"bounce-user-only", broken(bounceUserOnly), "BounceSuppressesAddress"},
}

// TestSuiteOnDefect runs the contract suite against the in-memory store
// with one seeded defect; it is meant to fail, and only runs in the child
// processes TestExercise_Catches starts.
func TestSuiteOnDefect(t *testing.T) {
	name := os.Getenv(defectEnv)
	if name == "" {
		t.Skip("runs only as a child of TestExercise_Catches")
	}
	for _, d := range suiteDefects {
		if d.name == name {
			queuetest.Exercise(t, d.h)
			return
		}
	}
	t.Fatalf("%s=%q names no defect", defectEnv, name)
}

// childSkip leaves out of the child runs the two load subtests (thousands
// of rows; most of a run's time with -race), which no seeded defect is
// aimed at. The NoDefect control runs them.
const childSkip = "^TestSuiteOnDefect$/^(ConcurrentClaims|ListLimits)$"

// TestExercise_Catches proves the contract suite catches each seeded
// defect: the suite, run in a child process against the in-memory store
// with that defect, must fail, and fail in the subtest meant to catch it.
// The same wrapper without a defect passes the suite.
func TestExercise_Catches(t *testing.T) {
	t.Run("NoDefect", func(t *testing.T) {
		t.Parallel()
		queuetest.Exercise(t, broken(noFlaw))
	})
	for _, d := range suiteDefects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSuiteOnDefect$", "-test.skip="+childSkip, "-test.timeout=90s")
			// A race-enabled child would wait a second before it exits.
			race := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
			cmd.Env = append(os.Environ(), defectEnv+"="+d.name, "GORACE="+race)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("the suite passed (or did not run: %v) against defect %q; output:\n%s", err, d.name, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestSuiteOnDefect ") {
				t.Fatalf("defect %q: TestSuiteOnDefect did not fail:\n%s", d.name, out)
			}
			if want := "--- FAIL: TestSuiteOnDefect/" + d.catch + " "; !strings.Contains(string(out), want) {
				t.Errorf("defect %q: subtest %s did not fail:\n%s", d.name, d.catch, out)
			}
		})
	}
}
