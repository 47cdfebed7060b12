package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// The tests in this file check that the loop's timer keeps its word: a
// retry is claimed when its due time arrives, by the loop's own timer,
// whatever else the worker is doing. None of them wakes the loop by hand
// (running.sync): the injected clock is moved to the due time, and the
// timer, armed for that time, must fire.

// timerStores are the stores the timer tests run on: the in-memory store
// and the file store, both on the injected clock.
var timerStores = []struct {
	name string
	open func(t testing.TB, clock *queuetest.Clock, b queue.Backoff) queue.Store
}{
	{"memstore", func(t testing.TB, clock *queuetest.Clock, b queue.Backoff) queue.Store {
		s := memstore.New(&queue.Options{Now: clock.Now, Backoff: b, Logger: discard})
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"filestore", func(t testing.TB, clock *queuetest.Clock, b queue.Backoff) queue.Store {
		s, err := filestore.Open(t.TempDir(), &filestore.Options{Options: queue.Options{Now: clock.Now, Backoff: b, Logger: discard}, DisableWatcher: true, RescanInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}},
}

// watchedStore wraps a store for the timer tests. It counts the leases it
// hands out (so that a test knows when no task is in flight), and it holds
// each retryable commit until the worker's loop has computed its wait and
// is about to sleep: the retry's due time reaches the store after the loop
// looked at the store (the interleaving that a slot freed before the
// commit allows). afterClaim, when set, runs once after the next claim.
type watchedStore struct {
	queue.Store
	t      testing.TB
	leased atomic.Int64

	mu         sync.Mutex
	held       []heldCommit
	afterClaim func()
}

// heldCommit is a retryable commit waiting for release to be closed.
type heldCommit struct {
	key     envelope.Key
	release chan struct{}
}

func (s *watchedStore) Claim(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	ls, err := s.Store.Claim(ctx, req)
	s.leased.Add(int64(len(ls)))
	s.mu.Lock()
	f := s.afterClaim
	s.afterClaim = nil
	s.mu.Unlock()
	if f != nil {
		f()
	}
	return ls, err
}

func (s *watchedStore) Recover(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	ls, err := s.Store.Recover(ctx, req)
	s.leased.Add(int64(len(ls)))
	return ls, err
}

func (s *watchedStore) Commit(ctx context.Context, l *queue.Lease, out queue.Outcome) error {
	if out.State == envelope.StateRetryable {
		h := heldCommit{key: l.Key, release: make(chan struct{})}
		s.mu.Lock()
		s.held = append(s.held, h)
		s.mu.Unlock()
		select {
		case <-h.release:
		case <-time.After(waitTimeout):
			s.t.Errorf("commit of %s: the loop never went to sleep", l.Key)
		}
	}
	return s.Store.Commit(ctx, l, out)
}

// takeHeld returns the commits held so far and forgets them.
func (s *watchedStore) takeHeld() []heldCommit {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.held
	s.held = nil
	return h
}

// flaky answers the first fails[key] Deliver calls of a key with a
// network error (as the Web Push provider does when the push service
// cannot be reached), and then lets the fake answer.
type flaky struct {
	*fake.Provider
	mu    sync.Mutex
	fails map[envelope.Key]int
}

func (p *flaky) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	p.mu.Lock()
	fail := p.fails[key] > 0
	p.fails[key]--
	p.mu.Unlock()
	if fail {
		return channels.Receipt{}, envelope.Retryable(envelope.ClassNetwork, errors.New("dial tcp: connection refused"))
	}
	return p.Provider.Deliver(ctx, key, msg)
}

// timerRun is a worker on a watched store, for the timer tests.
type timerRun struct {
	*running
	t     testing.TB
	clock *queuetest.Clock
	store *watchedStore
	chans []envelope.Channel // the channels the worker has a provider for

	mu   sync.Mutex
	last sleep // the loop's last sleep
}

// sleep is what the loop armed its timer for, seen from its sleep hook.
type sleep struct {
	turns    int64     // turns ended by then
	deadline time.Time // on the injected clock
	// quiet says that no task was in flight and no kick, task signal or
	// store notification was waiting: only the timer (or the test) can
	// wake the loop from this sleep.
	quiet bool
}

func startTimerRun(t testing.TB, clock *queuetest.Clock, s queue.Store, providers map[envelope.Channel]channels.Provider) *timerRun {
	t.Helper()
	ws := &watchedStore{Store: s, t: t}
	tr := &timerRun{t: t, clock: clock, store: ws}
	for _, ch := range envelope.Channels {
		if providers[ch] != nil {
			tr.chans = append(tr.chans, ch)
		}
	}
	w, err := New(Config{Store: ws, Providers: providers, Renderer: testRenderer{}, Now: clock.Now, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	runWorkerWith(t, w, func(r *running, h *hooks) {
		tr.running = r // before Run starts: the hook uses it
		h.sleep = tr.sleeping
	})
	return tr
}

// sleeping is the loop's sleep hook; it runs on the loop's goroutine after
// the loop computed its wait, before it sleeps. When nothing would wake
// the loop, it waits for the tasks that already freed their slots to end
// (they do not need the loop), then lets the held retryable commits through
// and waits for their tasks to end too: their due times reach the store
// after the loop looked at it. Then it records the sleep.
func (tr *timerRun) sleeping(wait time.Duration) {
	w, s := tr.w, tr.store
	pending := func() bool { return len(w.kick) > 0 || len(w.tasks) > 0 || len(w.store.Notify()) > 0 }
	done := func() int64 { return int64(tr.count(func(event) bool { return true })) }
	held := func() int64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return int64(len(s.held))
	}
	deadline := time.Now().Add(waitTimeout)
	for !pending() && done()+held() < s.leased.Load() {
		if time.Now().After(deadline) {
			tr.t.Errorf("tasks in flight did not end")
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	if !pending() {
		for _, h := range s.takeHeld() {
			n := tr.count(is("deliver", h.key, ""))
			close(h.release)
			for tr.count(is("deliver", h.key, "")) == n {
				if time.Now().After(deadline) {
					tr.t.Errorf("the task of %s did not end after its commit", h.key)
					break
				}
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	rec := sleep{turns: tr.ends.Load(), deadline: w.now().Add(wait),
		quiet: !pending() && done() == s.leased.Load()}
	tr.mu.Lock()
	tr.last = rec
	tr.mu.Unlock()
}

// quiet waits until the loop sleeps with no task in flight and nothing but
// its timer to wake it, and returns the time of the injected clock its
// timer is armed for.
func (tr *timerRun) quiet(t testing.TB) time.Time {
	t.Helper()
	var s sleep
	waitFor(t, "the worker to be quiet", func() bool {
		tr.mu.Lock()
		s = tr.last
		tr.mu.Unlock()
		return s.quiet && tr.starts.Load() == s.turns // no turn since
	})
	return s.deadline
}

// earliestDue returns the earliest due time of the pending and retryable
// rows of the worker's channels (zero when there is none).
func (tr *timerRun) earliestDue(t testing.TB) (time.Time, envelope.Key) {
	t.Helper()
	ctx := context.Background()
	var due time.Time
	var key envelope.Key
	for _, ch := range tr.chans {
		for _, state := range []envelope.State{envelope.StatePending, envelope.StateRetryable} {
			page, err := tr.store.List(ctx, queue.ListFilter{State: state, Channel: ch, Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			for _, row := range page.Rows {
				seg := segment(t, tr.store, row.Key)
				if seg.NextAt.IsZero() {
					continue // a segment waiting for the one before it
				}
				if due.IsZero() || seg.NextAt.Before(due) {
					due, key = seg.NextAt, row.Key
				}
			}
		}
	}
	return due, key
}

// checkTimer waits until the worker is quiet and fails the test when the
// loop's timer is armed past the earliest due time of a row the worker
// can claim. It returns that due time (zero when nothing is waiting).
func (tr *timerRun) checkTimer(t testing.TB, what string) time.Time {
	t.Helper()
	deadline := tr.quiet(t)
	due, key := tr.earliestDue(t)
	if !due.IsZero() && deadline.After(due) {
		now := tr.clock.Now()
		t.Fatalf("%s: %s is due at now%+v, but the loop sleeps until now%+v", what, key, due.Sub(now), deadline.Sub(now))
	}
	return due
}

// claimEachWhenDue moves the clock from one due time to the next until
// nothing is waiting: at each step the loop's timer must be armed for the
// due time at the latest, and must then claim the row by itself.
func (tr *timerRun) claimEachWhenDue(t testing.TB) {
	t.Helper()
	for step := 0; ; step++ {
		due := tr.checkTimer(t, fmt.Sprintf("step %d", step))
		if due.IsZero() {
			return
		}
		if step > 100 {
			t.Fatal("still retrying after 100 steps")
		}
		n := tr.count(func(event) bool { return true })
		if due.After(tr.clock.Now()) {
			tr.clock.Set(due)
		}
		waitFor(t, "the loop's timer to claim the due row", func() bool {
			return tr.count(func(event) bool { return true }) > n
		})
	}
}

// A single push whose first two attempts fail with network errors: each
// retry is claimed by the loop's timer when its backoff is due.
func TestWorker_RetryClaimedWhenDue(t *testing.T) {
	for _, st := range timerStores {
		t.Run(st.name, func(t *testing.T) {
			clock := queuetest.NewClock(t0)
			s := st.open(t, clock, queue.Backoff{Base: 200 * time.Millisecond, NoJitter: true})
			env := queuetest.Nudge("n1", "u1")
			key := keyOf(env, 0)
			push := &flaky{Provider: fake.New(envelope.ChannelPush), fails: map[envelope.Key]int{key: 2}}
			mustEnqueue(t, s, env)
			tr := startTimerRun(t, clock, s, map[envelope.Channel]channels.Provider{envelope.ChannelPush: push})

			tr.claimEachWhenDue(t)
			if n := tr.count(is("deliver", key, "retryable")); n != 2 {
				t.Errorf("%d retryable attempts, want 2", n)
			}
			if seg := segment(t, s, key); seg.State != envelope.StateSent || seg.Attempts != 3 {
				t.Errorf("row: %s after %d attempts, want sent after 3", seg.State, seg.Attempts)
			}
			if want := t0.Add((200 + 400) * time.Millisecond); !clock.Now().Equal(want) {
				t.Errorf("delivered at t0%+v, want t0%+v", clock.Now().Sub(t0), want.Sub(t0))
			}
		})
	}
}

// A burst of Telegram replies (sent at once, some in three segments) and
// push nudges that fail with network errors once or twice (backoff
// base 200 ms): every push retry is claimed by the loop's timer when it is
// due, while the Telegram sends go on.
func TestWorker_MixedBurstRetriesClaimedWhenDue(t *testing.T) {
	for _, st := range timerStores {
		t.Run(st.name, func(t *testing.T) {
			clock := queuetest.NewClock(t0)
			s := st.open(t, clock, queue.Backoff{Base: 200 * time.Millisecond, NoJitter: true})
			push := &flaky{Provider: fake.New(envelope.ChannelPush), fails: map[envelope.Key]int{}}
			tg := fake.New(envelope.ChannelTelegram)
			var envs []*envelope.Envelope
			for i := range 6 {
				n := queuetest.Nudge(fmt.Sprintf("n%d", i), fmt.Sprintf("u%d", i))
				push.fails[keyOf(n, 0)] = 1 + i%2
				text := "hello"
				if i%2 == 0 {
					text = threeSegmentText()
				}
				envs = append(envs, n, queuetest.Reply(fmt.Sprintf("r%d", i), fmt.Sprintf("u%d", i), text))
			}
			mustEnqueue(t, s, envs...)
			tr := startTimerRun(t, clock, s, map[envelope.Channel]channels.Provider{
				envelope.ChannelPush: push, envelope.ChannelTelegram: tg})

			tr.claimEachWhenDue(t)
			for _, e := range envs {
				st, err := s.Get(context.Background(), e.Tenant(), e.ID)
				if err != nil || st.Status != queue.StatusDelivered {
					t.Errorf("%s: %+v, %v; want delivered", e.ID, st, err)
				}
			}
			for i, e := range envs {
				if e.Channel != envelope.ChannelPush {
					continue
				}
				if n := tr.count(is("deliver", keyOf(e, 0), "retryable")); n != 1+i/2%2 {
					t.Errorf("%s: %d retryable attempts, want %d", e.ID, n, 1+i/2%2)
				}
			}
		})
	}
}

// A pending row of a channel without a provider is due for ever: the
// store's next due time is in the past, and the loop backs off from it. It
// must not hide the worker's own retry (a 50 ms backoff, shorter than the
// least back-off).
func TestWorker_RetryClaimedWhenDueBesideUnclaimableRow(t *testing.T) {
	for _, st := range timerStores {
		t.Run(st.name, func(t *testing.T) {
			clock := queuetest.NewClock(t0)
			s := st.open(t, clock, queue.Backoff{Base: 50 * time.Millisecond, NoJitter: true})
			email, nudge := queuetest.Digest("d1", "u1"), queuetest.Nudge("n1", "u1")
			key := keyOf(nudge, 0)
			push := &flaky{Provider: fake.New(envelope.ChannelPush), fails: map[envelope.Key]int{key: 3}}
			mustEnqueue(t, s, email, nudge)
			tr := startTimerRun(t, clock, s, map[envelope.Channel]channels.Provider{envelope.ChannelPush: push})

			tr.claimEachWhenDue(t)
			if seg := segment(t, s, key); seg.State != envelope.StateSent || seg.Attempts != 4 {
				t.Errorf("push row: %s after %d attempts, want sent after 4", seg.State, seg.Attempts)
			}
			if seg := segment(t, s, keyOf(email, 0)); seg.State != envelope.StatePending {
				t.Errorf("email row without provider: %s, want pending", seg.State)
			}
		})
	}
}

// A retry that becomes due while the loop is in a turn woken by something
// else (here a kick, as a new enqueue would) is claimed at once: it is not
// mistaken for a row of someone else's and backed off from.
func TestWorker_RetryDueDuringTurnClaimedAtOnce(t *testing.T) {
	for _, st := range timerStores {
		t.Run(st.name, func(t *testing.T) {
			clock := queuetest.NewClock(t0)
			s := st.open(t, clock, queue.Backoff{Base: time.Second, NoJitter: true})
			env := queuetest.Nudge("n1", "u1")
			key := keyOf(env, 0)
			push := &flaky{Provider: fake.New(envelope.ChannelPush), fails: map[envelope.Key]int{key: 1}}
			mustEnqueue(t, s, env)
			tr := startTimerRun(t, clock, s, map[envelope.Channel]channels.Provider{envelope.ChannelPush: push})

			due := tr.checkTimer(t, "after the failed attempt")
			if want := t0.Add(time.Second); !due.Equal(want) {
				t.Fatalf("retry due at %v, want %v", due, want)
			}
			// Just before the retry is due, something wakes the loop; its
			// claim finds nothing due, and the retry's due time passes
			// before the turn ends.
			clock.Set(due.Add(-time.Millisecond))
			tr.store.mu.Lock()
			tr.store.afterClaim = func() { clock.Set(due) }
			tr.store.mu.Unlock()
			tr.sync(t) // the turn of the kick
			tr.claimEachWhenDue(t)
			if seg := segment(t, s, key); seg.State != envelope.StateSent || seg.Attempts != 2 {
				t.Errorf("row: %s after %d attempts, want sent after 2", seg.State, seg.Attempts)
			}
		})
	}
}

// A row scheduled for later (not_before) beside a row no worker here can
// claim (an e-mail without provider, due for ever): the loop's timer must
// be armed for the scheduled row's due time at the latest, not for a
// back-off from the unclaimable row that grows past it.
func TestWorker_ScheduledRowClaimedWhenDueBesideUnclaimableRow(t *testing.T) {
	for _, st := range timerStores {
		t.Run(st.name, func(t *testing.T) {
			clock := queuetest.NewClock(t0)
			s := st.open(t, clock, queue.Backoff{Base: time.Second, NoJitter: true})
			email, nudge := queuetest.Digest("d1", "u1"), queuetest.Nudge("n1", "u1")
			// Between two of the back-off's steps (100, 300, 700 ms).
			nudge.NotBefore = t0.Add(650 * time.Millisecond)
			mustEnqueue(t, s, email, nudge)
			tr := startTimerRun(t, clock, s, map[envelope.Channel]channels.Provider{envelope.ChannelPush: fake.New(envelope.ChannelPush)})

			for step := 0; ; step++ {
				if tr.checkTimer(t, fmt.Sprintf("step %d", step)).IsZero() {
					break
				}
				if step > 20 {
					t.Fatal("not claimed after 20 steps")
				}
				// The timer fires at what it is armed for; the turn then
				// sees the clock there.
				n := tr.starts.Load()
				tr.clock.Set(tr.quiet(t))
				waitFor(t, "the loop's timer to fire", func() bool { return tr.starts.Load() > n })
			}
			if seg := segment(t, s, keyOf(nudge, 0)); seg.State != envelope.StateSent {
				t.Errorf("scheduled push row: %s, want sent", seg.State)
			}
		})
	}
}
