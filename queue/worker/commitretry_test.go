package worker

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// refusingStore fails the first fails[key] commits of a key with err.
type refusingStore struct {
	queue.Store
	err     error
	mu      sync.Mutex
	fails   map[envelope.Key]int
	commits map[envelope.Key]int
}

func (s *refusingStore) Commit(ctx context.Context, l *queue.Lease, out queue.Outcome) error {
	s.mu.Lock()
	s.commits[l.Key]++
	fail := s.fails[l.Key] > 0
	s.fails[l.Key]--
	s.mu.Unlock()
	if fail {
		return s.err
	}
	return s.Store.Commit(ctx, l, out)
}

// A commit the store refuses for a passing condition (out of open files, as
// a serve with a low LimitNOFILE meets in a burst; the store unreachable
// for a moment) is tried again while the lease holds: the worker knows
// the answer, and a row left to its lease's expiry is reconciled instead
// (Telegram's would become unresolved, though it was sent). A refusal that
// another try cannot change (a stale fence) is not tried again.
func TestWorker_CommitRefusedForAPassingConditionIsTriedAgain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		fails   int
		commits int
		state   envelope.State
	}{
		{"out of files", &os.PathError{Op: "open", Path: "index.db", Err: syscall.EMFILE}, 3, 4, envelope.StateSent},
		{"unavailable", fmt.Errorf("commit: %w", queue.ErrUnavailable), 2, 3, envelope.StateSent},
		{"stale fence", queue.ErrStaleFence, 1, 1, envelope.StateSending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := newTestEnv(t, queue.Backoff{})
			env := queuetest.Reply("r1", "u1", "hello")
			key := envelope.Key{Tenant: envelope.DefaultTenant, EnvelopeID: "r1"}
			te.enqueue(t, env)
			rs := &refusingStore{Store: te.store, err: tc.err, fails: map[envelope.Key]int{key: tc.fails}, commits: map[envelope.Key]int{}}
			cfg := te.config()
			cfg.Store = rs
			cfg.Providers = te.providers(envelope.ChannelTelegram)
			r := startWorker(t, cfg)
			r.waitEvent(t, "the delivery", is("deliver", key, ""))
			rs.mu.Lock()
			commits := rs.commits[key]
			rs.mu.Unlock()
			if commits != tc.commits {
				t.Errorf("%d commits, want %d", commits, tc.commits)
			}
			if seg := segment(t, te.store, key); seg.State != tc.state {
				t.Errorf("the row is %s, want %s", seg.State, tc.state)
			}
			if n := te.fakes[envelope.ChannelTelegram].Delivered(key); n != 1 {
				t.Errorf("delivered %d times, want 1", n)
			}
		})
	}
}
