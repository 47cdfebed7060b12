package filestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// filesHolding returns the files under dir whose bytes contain canary.
func filesHolding(t *testing.T, dir string, canary string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte(canary)) || bytes.Contains([]byte(d.Name()), []byte(canary)) {
			rel, _ := filepath.Rel(dir, path)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// seedUser gives user consent, a push subscription and an envelope of
// each channel, and returns the canaries of its personal data: its id,
// its e-mail address and its push endpoint.
func seedUser(t *testing.T, q *Queue, user string) []string {
	t.Helper()
	ctx := context.Background()
	queuetest.GrantAll(t, q, "", user)
	nudge := queuetest.Nudge(user+"-n1", user)
	if err := q.SaveSubscription(ctx, "", user, *nudge.Recipient.PushSubscription); err != nil {
		t.Fatal(err)
	}
	if err := q.Suppress(ctx, "", user, queue.Suppression{Channel: envelope.ChannelPush, Reason: envelope.ClassUnsubscribed, Target: queue.TargetOfValue("push:" + queuetest.EndpointOf(user) + "/old")}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, queuetest.Digest(user+"-d1", user), nudge, queuetest.Reply(user+"-r1", user, "hello "+user)); err != nil {
		t.Fatal(err)
	}
	return []string{user, queuetest.EmailOf(user), queuetest.EndpointOf(user)}
}

// Erase removes the user's data from the index file itself when it
// returns, not only from what bbolt reads: no file of the data directory
// holds the user's id, e-mail address or push endpoint any more (bbolt
// keeps the old contents of the pages it frees), while the other users'
// data is intact and the store keeps working.
func TestErase_ScrubsTheIndexFile(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	ctx := context.Background()
	const victim, other = "victim-7f3a9c", "keeper-51d2e8"
	canaries := seedUser(t, q, victim)
	seedUser(t, q, other)
	// History: every row claimed, the victim's sent, the other's retried.
	leases, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 100})
	if err != nil || len(leases) != 6 {
		t.Fatalf("claimed %d rows, %v; want 6", len(leases), err)
	}
	for _, l := range leases {
		out := queue.Outcome{State: envelope.StateSent}
		if l.UserID == other {
			out = queue.Outcome{State: envelope.StateRetryable, RetryAfter: time.Hour}
		}
		if err := q.Commit(ctx, l, out); err != nil {
			t.Fatal(err)
		}
	}
	q.barrier()
	// The test can fail: the index holds them before the erase.
	for _, c := range []string{victim, canaries[2]} {
		if got := filesHolding(t, dir, c); !contains(got, IndexFile) {
			t.Fatalf("before Erase, %q is not in the index (files holding it: %v): the test proves nothing", c, got)
		}
	}
	if err := q.Erase(ctx, "", victim); err != nil {
		t.Fatal(err)
	}
	for _, c := range canaries {
		if got := filesHolding(t, dir, c); len(got) > 0 {
			t.Errorf("after Erase, %q is still in %v", c, got)
		}
	}
	if got := filesHolding(t, dir, other); !contains(got, IndexFile) {
		t.Errorf("the other user's data left the index: %v", got)
	}
	// The store keeps working on the rewritten file.
	for _, id := range []string{other + "-d1", other + "-n1", other + "-r1"} {
		if st, err := q.Get(ctx, "", id); err != nil || st.Segments[0].Attempts != 1 {
			t.Fatalf("%s after Erase: %+v, %v", id, st, err)
		}
	}
	if _, err := q.Get(ctx, "", victim+"-d1"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("erased envelope: %v", err)
	}
	if subs, err := q.Subscriptions(ctx, "", other); err != nil || len(subs) != 1 {
		t.Fatalf("the other user's subscriptions: %v, %v", subs, err)
	}
	if _, err := q.Enqueue(ctx, queuetest.Reply("after-erase", other, "again")); err != nil {
		t.Fatal(err)
	}
	leases, err = q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 100})
	if err != nil || len(leases) != 1 || leases[0].Key.EnvelopeID != "after-erase" {
		t.Fatalf("claimed %d rows after Erase, %v; want after-erase's", len(leases), err)
	}
	q = reopen(t, q, dir)
	if rep, err := q.Check(); err != nil || !rep.OK() {
		t.Fatalf("Check after Erase and reopen: %+v, %v", rep, err)
	}
	if _, err := q.Get(ctx, "", "after-erase"); err != nil {
		t.Fatal(err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Erases (each rewriting the index file) while other goroutines enqueue,
// claim, commit and read: no read or write fails or is lost across the
// swap of the file (run with -race), and the store is consistent after.
func TestErase_ScrubUnderLoad(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	enqueued := make([]int, 2)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					enqueued[w] = i
					return
				default:
				}
				id := fmt.Sprintf("k%d-%d", w, i)
				if _, err := q.Enqueue(ctx, queuetest.Reply(id, fmt.Sprintf("keep%d", w), "hi")); err != nil {
					fail(fmt.Errorf("enqueue %s: %w", id, err))
					return
				}
				if _, err := q.Get(ctx, "", id); err != nil {
					fail(fmt.Errorf("get %s right after its enqueue: %w", id, err))
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 10})
			if err != nil {
				fail(fmt.Errorf("claim: %w", err))
				return
			}
			for _, l := range ls {
				err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent})
				if errors.Is(err, queue.ErrLeaseLost) && strings.HasPrefix(l.Key.EnvelopeID, "gone-") {
					continue // its user was erased while it was leased
				}
				if err != nil {
					fail(fmt.Errorf("commit %s: %w", l.Key, err))
					return
				}
			}
			if _, err := q.List(ctx, queue.ListFilter{Limit: 20}); err != nil {
				fail(fmt.Errorf("list: %w", err))
				return
			}
			if _, err := q.Counts(ctx, ""); err != nil {
				fail(fmt.Errorf("counts: %w", err))
				return
			}
		}
	}()
	for i := range 20 {
		victim := fmt.Sprintf("gone-%d", i)
		if _, err := q.Enqueue(ctx, queuetest.Reply(victim+"-r", victim, "bye")); err != nil {
			t.Fatal(err)
		}
		if err := q.Erase(ctx, "", victim); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for w, n := range enqueued {
		for i := range n {
			if _, err := q.Get(ctx, "", fmt.Sprintf("k%d-%d", w, i)); err != nil {
				t.Fatalf("k%d-%d: %v", w, i, err)
			}
		}
	}
	if got := filesHolding(t, dir, "gone-"); len(got) > 0 {
		t.Errorf("erased users still in %v", got)
	}
	if rep, err := q.Check(); err != nil || !rep.OK() {
		t.Fatalf("Check: %+v, %v", rep, err)
	}
}
