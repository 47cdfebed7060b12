package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// gate holds every provider call it is set on until the test lets one go.
type gate struct {
	mu    sync.Mutex
	calls []envelope.Key
	next  chan struct{}
}

func newGate() *gate { return &gate{next: make(chan struct{})} }

func (g *gate) hold(key envelope.Key) {
	g.mu.Lock()
	g.calls = append(g.calls, key)
	g.mu.Unlock()
	<-g.next
}

func (g *gate) started() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.calls)
}

func (g *gate) order() []envelope.Key {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]envelope.Key(nil), g.calls...)
}

// pass lets the call in flight return and waits until the next one has
// started (when want more than started).
func (g *gate) pass(t *testing.T, want int) {
	t.Helper()
	g.next <- struct{}{}
	waitFor(t, fmt.Sprintf("call %d", want), func() bool { return g.started() >= want })
}

// startQuick starts a worker that has timed its provider calls as
// instant (on the test clock), so that it claims as far ahead as it may.
func startQuick(t *testing.T, cfg Config) *running {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.pace.addCall(0)
	return runWorker(t, w)
}

// leased counts the rows of envs that are sending.
func leased(t *testing.T, s queue.Store, envs []*envelope.Envelope) int {
	t.Helper()
	return inState(t, s, envs, envelope.StateSending)
}

// inState counts the envelopes of envs whose first row is in st.
func inState(t *testing.T, s queue.Store, envs []*envelope.Envelope, st envelope.State) int {
	t.Helper()
	n := 0
	for _, e := range envs {
		if segment(t, s, keyOf(e, 0)).State == st {
			n++
		}
	}
	return n
}

func nudges(prefix string, n int) []*envelope.Envelope {
	var out []*envelope.Envelope
	for i := range n {
		out = append(out, queuetest.Nudge(fmt.Sprintf("%s%d", prefix, i), fmt.Sprintf("u%s%d", prefix, i)))
	}
	return out
}

func TestWorker_ClaimsAheadForAnIdempotentChannel(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	g := newGate()
	p := te.fakes[envelope.ChannelPush]
	p.OnDeliver(g.hold)
	most := max(aheadPerSlot, aheadLeast) // of one slot
	envs := nudges("n", most+4)
	te.enqueue(t, envs...)
	cfg := te.config()
	cfg.Providers = te.providers(envelope.ChannelPush)
	cfg.Concurrency = 1
	r := startQuick(t, cfg)

	waitFor(t, "the first call", func() bool { return g.started() == 1 })
	r.sync(t)
	// One slot: the call in flight and as many rows as may wait for it.
	if n := leased(t, te.store, envs); n != 1+most {
		t.Errorf("%d rows leased with one call in flight, want %d", n, 1+most)
	}
	for i := 2; i <= len(envs); i++ {
		g.pass(t, i)
	}
	g.next <- struct{}{}
	r.idle(t)
	for _, e := range envs {
		if seg := segment(t, te.store, keyOf(e, 0)); seg.State != envelope.StateSent || seg.Attempts != 1 {
			t.Errorf("%s: %s after %d attempts, want sent after 1", e.ID, seg.State, seg.Attempts)
		}
		if d := p.Delivered(keyOf(e, 0)); d != 1 {
			t.Errorf("%s delivered %d times", e.ID, d)
		}
	}
}

func TestWorker_NoClaimAheadForAProviderThatCannotRedeliver(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	g := newGate()
	p := te.fakes[envelope.ChannelTelegram]
	p.SetIdempotent(false)
	p.OnDeliver(g.hold)
	var envs []*envelope.Envelope
	for i := range 6 {
		envs = append(envs, queuetest.Reply(fmt.Sprintf("r%d", i), fmt.Sprintf("u%d", i), "hi"))
	}
	te.enqueue(t, envs[:3]...)
	cfg := te.config()
	cfg.Providers = te.providers(envelope.ChannelTelegram)
	cfg.Concurrency = 2
	r := startQuick(t, cfg)

	waitFor(t, "two calls", func() bool { return g.started() == 2 })
	te.enqueue(t, envs[3:]...) // wakes the worker
	r.sync(t)
	if n := leased(t, te.store, envs); n != 2 {
		t.Errorf("%d rows leased with both slots busy, want 2 (a lease lost to a crash would be unresolved)", n)
	}
	for i := 3; i <= len(envs); i++ {
		g.pass(t, i)
		// The slot is freed once the call returns, before its commit lands
		// (deliverLease): until it has, the finished row is still sending.
		waitFor(t, fmt.Sprintf("%d calls committed", i-2), func() bool { return inState(t, te.store, envs, envelope.StateSent) >= i-2 })
		if n := leased(t, te.store, envs); n > 2 {
			t.Fatalf("%d rows leased by 2 slots", n)
		}
	}
	g.next <- struct{}{}
	g.next <- struct{}{}
	r.idle(t)
	for _, e := range envs {
		if seg := segment(t, te.store, keyOf(e, 0)); seg.State != envelope.StateSent {
			t.Errorf("%s: %s, want sent", e.ID, seg.State)
		}
	}
}

// A row of a channel that is not claimed ahead is not kept waiting behind
// the rows that are: it takes the next free slot.
func TestWorker_RowsClaimedAheadDoNotHoldBackOtherChannels(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	g := newGate()
	te.fakes[envelope.ChannelPush].OnDeliver(g.hold)
	tg := te.fakes[envelope.ChannelTelegram]
	tg.SetIdempotent(false)
	tg.OnDeliver(g.hold)
	push := nudges("n", 6)
	te.enqueue(t, push...)
	cfg := te.config()
	cfg.Providers = te.providers(envelope.ChannelPush, envelope.ChannelTelegram)
	cfg.Concurrency = 1
	r := startQuick(t, cfg)

	waitFor(t, "the first call", func() bool { return g.started() == 1 })
	r.sync(t)
	if n := leased(t, te.store, push); n != len(push) {
		t.Fatalf("%d push rows leased, want all %d (one in flight, the rest ahead)", n, len(push))
	}
	reply := queuetest.Reply("r", "ur", "hi")
	te.enqueue(t, reply)
	r.sync(t)
	g.pass(t, 2)
	if got := g.order()[1]; got != keyOf(reply, 0) {
		t.Errorf("second call was %s, want the reply %s (enqueued after the push rows were claimed ahead)", got, keyOf(reply, 0))
	}
	for i := 3; i <= len(push)+1; i++ {
		g.pass(t, i)
	}
	g.next <- struct{}{}
	r.idle(t)
	if seg := segment(t, te.store, keyOf(reply, 0)); seg.State != envelope.StateSent {
		t.Errorf("reply: %s, want sent", seg.State)
	}
}

func TestWorker_StopGivesBackTheRowsClaimedAhead(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	p := te.fakes[envelope.ChannelPush]
	p.Default(fake.Hang) // until Run is stopped
	envs := nudges("n", 5)
	te.enqueue(t, envs...)
	cfg := te.config()
	cfg.Providers = te.providers(envelope.ChannelPush)
	cfg.Concurrency = 1
	r := startQuick(t, cfg)
	waitFor(t, "the first call", func() bool { return len(p.Calls()) == 1 })
	r.sync(t)
	if n := leased(t, te.store, envs); n != len(envs) {
		t.Fatalf("%d rows leased, want %d", n, len(envs))
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var sending, pending int
	for _, e := range envs {
		switch seg := segment(t, te.store, keyOf(e, 0)); {
		case seg.State == envelope.StateSending && seg.Attempts == 1:
			sending++ // the call interrupted: reconciled when its lease ends
		case seg.State == envelope.StatePending && seg.Attempts == 0:
			pending++
		default:
			t.Errorf("%s after stop: %s, %d attempts", e.ID, seg.State, seg.Attempts)
		}
	}
	if sending != 1 || pending != len(envs)-1 {
		t.Errorf("%d sending and %d pending after stop, want 1 and %d", sending, pending, len(envs)-1)
	}
}

// A lease waiting ahead is given back while its call could still fit in it.
func TestWorker_RowsClaimedAheadAreGivenBackBeforeTheirLeaseRunsOut(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	g := newGate()
	p := te.fakes[envelope.ChannelPush]
	p.OnDeliver(g.hold)
	envs := nudges("n", 4)
	te.enqueue(t, envs...)
	cfg := te.config()
	cfg.Providers = te.providers(envelope.ChannelPush)
	cfg.Concurrency = 1
	cfg.Lease = 10 * time.Second
	r := startQuick(t, cfg)
	waitFor(t, "the first call", func() bool { return g.started() == 1 })
	r.sync(t)
	first := segment(t, te.store, g.order()[0])
	waiting := map[envelope.Key]uint64{} // the fences claimed ahead
	for _, e := range envs {
		if seg := segment(t, te.store, keyOf(e, 0)); seg.State == envelope.StateSending && seg.Fence != first.Fence {
			waiting[keyOf(e, 0)] = seg.Fence
		}
	}
	if len(waiting) != len(envs)-1 {
		t.Fatalf("%d rows waiting ahead, want %d", len(waiting), len(envs)-1)
	}

	te.clock.Advance(6 * time.Second) // past half of the waiting leases
	r.sync(t)
	if released := int(testutil.ToFloat64(r.w.metrics.deliveries.WithLabelValues("push", outcomeReleased))); released != len(waiting) {
		t.Errorf("%d leases given back, want %d", released, len(waiting))
	}
	for key, fence := range waiting {
		seg := segment(t, te.store, key)
		if seg.State == envelope.StateSending && seg.Fence == fence {
			t.Errorf("%s still under the lease it was claimed ahead with", key)
		}
		if seg.Attempts > 1 {
			t.Errorf("%s: %d attempts, want the given-back one not counted", key, seg.Attempts)
		}
	}
	for i := 2; i <= len(envs); i++ {
		g.pass(t, i)
	}
	g.next <- struct{}{}
	r.idle(t)
	for _, e := range envs {
		if d := p.Delivered(keyOf(e, 0)); d != 1 {
			t.Errorf("%s delivered %d times", e.ID, d)
		}
	}
}

// Rows waiting ahead for a channel whose service refused the credentials
// are given back, not sent into the refusal.
func TestWorker_RowsClaimedAheadOfAPausedChannelAreGivenBack(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	g := newGate()
	te.fakes[envelope.ChannelEmail].SetOneService(true)
	te.fakes[envelope.ChannelEmail].OnDeliver(g.hold)
	p := &scriptedProvider{Provider: te.fakes[envelope.ChannelEmail], deliverCtx: func(context.Context) (channels.Receipt, error) {
		return channels.Receipt{}, envelope.Permanent(envelope.ClassAuthFailed, errors.New("401 Unauthorized"))
	}}
	var envs []*envelope.Envelope
	for i := range 4 {
		envs = append(envs, queuetest.Digest(fmt.Sprintf("d%d", i), fmt.Sprintf("u%d", i)))
	}
	te.enqueue(t, envs...)
	cfg := te.config()
	cfg.Providers = map[envelope.Channel]channels.Provider{envelope.ChannelEmail: p}
	cfg.Concurrency = 1
	r := startQuick(t, cfg)
	waitFor(t, "the first call", func() bool { return g.started() == 1 })
	r.sync(t)
	if n := leased(t, te.store, envs); n != len(envs) {
		t.Fatalf("%d rows leased, want %d", n, len(envs))
	}
	g.next <- struct{}{} // auth_failed: the channel pauses
	r.idle(t)
	if n := g.started(); n != 1 {
		t.Errorf("%d calls after the credentials were refused, want 1", n)
	}
	if n := leased(t, te.store, envs); n != 0 {
		t.Errorf("%d rows still leased while the channel is paused", n)
	}
	for _, e := range envs[1:] {
		if seg := segment(t, te.store, keyOf(e, 0)); seg.Attempts != 0 {
			t.Errorf("%s: %d attempts, want 0 (given back unused)", e.ID, seg.Attempts)
		}
	}
}

// Leases that ran out while they waited ahead (the store's clock went past
// them) are recovered by the store: the loop drops them without a store
// call, and each row is delivered once.
func TestWorker_RowsClaimedAheadThatRanOutAreLeftToRecovery(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	g := newGate()
	p := te.fakes[envelope.ChannelPush]
	p.OnDeliver(g.hold)
	envs := nudges("n", 3)
	te.enqueue(t, envs...)
	var logs syncBuf
	cfg := te.config()
	cfg.Providers = te.providers(envelope.ChannelPush)
	cfg.Concurrency = 1
	cfg.Lease = 10 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := startQuick(t, cfg)
	waitFor(t, "the first call", func() bool { return g.started() == 1 })
	r.sync(t)
	te.clock.Advance(11 * time.Second) // every lease has run out
	g.pass(t, 2)
	g.pass(t, 3)
	g.next <- struct{}{}
	r.idle(t)
	for _, e := range envs {
		if seg := segment(t, te.store, keyOf(e, 0)); seg.State != envelope.StateSent {
			t.Errorf("%s: %s, want sent", e.ID, seg.State)
		}
		if d := p.Delivered(keyOf(e, 0)); d != 1 {
			t.Errorf("%s delivered %d times", e.ID, d)
		}
	}
	// The call in flight outlived its lease too: when recovery takes its
	// row before the call returns, its commit meets a newer fence (and the
	// row is reconciled). Any other failed store call is the defect: a
	// waiting lease that ran out used or released instead of dropped.
	failed := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "store call failed") {
			if failed++; failed > 1 || !strings.Contains(line, "operation=commit") || !strings.Contains(line, "stale_fence") {
				t.Errorf("a store call failed:\n%s", logs.String())
				break
			}
		}
	}
}

// In front of calls slower than claims the worker claims nothing ahead: a
// crash leaves no more leases to reconcile than it had calls in flight.
func TestWorker_NoClaimAheadInFrontOfSlowCalls(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	g := newGate()
	p := te.fakes[envelope.ChannelPush]
	var calls int
	p.OnDeliver(func(key envelope.Key) {
		te.clock.Advance(50 * time.Millisecond) // a call takes 50 ms, a claim 0
		if calls++; calls > 2 {
			g.hold(key)
		}
	})
	envs := nudges("n", 8)
	te.enqueue(t, envs...)
	cfg := te.config()
	cfg.Providers = te.providers(envelope.ChannelPush)
	cfg.Concurrency = 1
	r := startWorker(t, cfg)
	waitFor(t, "the third call", func() bool { return g.started() == 1 })
	r.sync(t)
	if n := leased(t, te.store, envs); n != 1 {
		t.Errorf("%d rows leased by one slot in front of 50 ms calls, want 1", n)
	}
	for i := 2; i <= len(envs)-2; i++ {
		g.pass(t, i)
	}
	g.next <- struct{}{}
	r.idle(t)
}

func TestAheadTarget(t *testing.T) {
	ms := time.Millisecond
	for _, tt := range []struct {
		slots, most int
		claim, call time.Duration
		calls       bool
		want        int
	}{
		{4, 32, ms, 0, false, 0}, // nothing timed yet
		{4, 32, ms, 0, true, 32}, // instant calls
		{4, 32, ms, 10 * time.Microsecond, true, 32},
		{4, 32, 2 * ms, 8 * ms, true, 2},  // four slots finish 1 row per claim
		{4, 32, 2 * ms, 50 * ms, true, 0}, // a real provider
		{1, 8, 0, 50 * ms, true, 0},       // claims take no time
	} {
		if got := aheadTarget(tt.slots, tt.most, tt.claim, tt.call, tt.calls); got != tt.want {
			t.Errorf("aheadTarget(%d, %d, %v, %v, %v) = %d, want %d", tt.slots, tt.most, tt.claim, tt.call, tt.calls, got, tt.want)
		}
	}
}

// claimHook runs before its store's next Claim, once.
type claimHook struct {
	*memstore.Store
	mu     sync.Mutex
	before func()
}

func (c *claimHook) Claim(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error) {
	c.mu.Lock()
	f := c.before
	c.before = nil
	c.mu.Unlock()
	if f != nil {
		f()
	}
	return c.Store.Claim(ctx, req)
}

// oneSlotBehindAClaimHook starts a quick worker with one slot on n push
// rows whose calls wait for g, its store's claims behind hook.
func oneSlotBehindAClaimHook(t *testing.T, n int) (*testEnv, *gate, *claimHook, []*envelope.Envelope, *running) {
	t.Helper()
	te := newTestEnv(t, queue.Backoff{})
	g := newGate()
	te.fakes[envelope.ChannelPush].OnDeliver(g.hold)
	envs := nudges("n", n)
	te.enqueue(t, envs...)
	hook := &claimHook{Store: te.store}
	cfg := te.config()
	cfg.Store = hook
	cfg.Providers = te.providers(envelope.ChannelPush)
	cfg.Concurrency = 1
	return te, g, hook, envs, startQuick(t, cfg)
}

// A row claimed while others wait ahead for a slot goes behind them, even
// when a slot frees while the claim is under way (a claim on PostgreSQL
// takes longer than a quick provider call): rows of a channel are started
// in the order they were claimed, oldest due first.
func TestWorker_RowsWaitingAheadStartBeforeLaterClaims(t *testing.T) {
	te, g, hook, envs, r := oneSlotBehindAClaimHook(t, 4)

	waitFor(t, "the first call", func() bool { return g.started() == 1 })
	r.sync(t)
	if n := leased(t, te.store, envs); n != len(envs) {
		t.Fatalf("%d rows leased, want all %d (one in flight, the rest ahead)", n, len(envs))
	}
	// The next claim finds no free slot; while it runs, the call in
	// flight returns and passes its slot on to the rows waiting, until
	// none is left and it frees it.
	hook.mu.Lock()
	hook.before = func() {
		g.next <- struct{}{}
		waitFor(t, "the slot to free", func() bool { return r.w.free() == 1 })
	}
	hook.mu.Unlock()
	late := queuetest.Nudge("late", "ulate")
	te.enqueue(t, late) // wakes the worker
	waitFor(t, "the second call", func() bool { return g.started() == 2 })
	for i := 3; i <= len(envs)+1; i++ {
		g.pass(t, i)
	}
	g.next <- struct{}{}
	r.idle(t)
	want := []envelope.Key{keyOf(envs[0], 0), keyOf(envs[1], 0), keyOf(envs[2], 0), keyOf(envs[3], 0), keyOf(late, 0)}
	if got := g.order(); !slices.Equal(got, want) {
		t.Errorf("calls in the order %v, want %v", got, want)
	}
}

// A task whose call returns while the loop's claim is under way starts the
// next lease waiting ahead itself: on PostgreSQL a claim takes longer than
// a quick call, and one slot would otherwise sit idle through each claim.
func TestWorker_AFreedSlotStartsAWaitingLeaseDuringAClaim(t *testing.T) {
	te, g, hook, envs, r := oneSlotBehindAClaimHook(t, 3)
	inClaim, release := make(chan struct{}), make(chan struct{})
	let := sync.OnceFunc(func() { close(release) })
	t.Cleanup(let) // before the worker stops

	waitFor(t, "the first call", func() bool { return g.started() == 1 })
	r.sync(t)
	hook.mu.Lock()
	hook.before = func() {
		close(inClaim)
		<-release
	}
	hook.mu.Unlock()
	late := queuetest.Nudge("late", "ulate")
	te.enqueue(t, late) // wakes the worker, which claims ahead
	select {
	case <-inClaim:
	case <-time.After(waitTimeout):
		t.Fatal("no claim after the enqueue")
	}
	g.next <- struct{}{}
	waitFor(t, "the second call while the claim is under way", func() bool { return g.started() == 2 })
	let()
	for i := 3; i <= len(envs)+1; i++ {
		g.pass(t, i)
	}
	g.next <- struct{}{}
	r.idle(t)
	want := []envelope.Key{keyOf(envs[0], 0), keyOf(envs[1], 0), keyOf(envs[2], 0), keyOf(late, 0)}
	if got := g.order(); !slices.Equal(got, want) {
		t.Errorf("calls in the order %v, want %v", got, want)
	}
}

// Tasks that pass their slots on to leases waiting ahead let one go free
// within recoverEvery, so that a lease another process left to expire is
// reconciled even while a steady flow keeps every slot busy.
func TestWorker_PassingSlotsOnLeavesRoomForRecovery(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	g := newGate()
	lost := queuetest.Nudge("lost", "ulost")
	var r *running
	var before atomic.Int64 // reconciliations ended when the second call started
	te.fakes[envelope.ChannelPush].OnDeliver(func(k envelope.Key) {
		if g.started() == 1 {
			before.Store(int64(r.count(is("reconcile", keyOf(lost, 0), ""))))
		}
		g.hold(k)
	})
	te.enqueue(t, lost)
	if _, err := te.store.Claim(context.Background(), queue.ClaimRequest{Owner: "crashed", Lease: time.Second, Limit: 1}); err != nil {
		t.Fatal(err)
	}
	envs := nudges("n", 4)
	te.enqueue(t, envs...)
	cfg := te.config()
	cfg.Providers = te.providers(envelope.ChannelPush)
	cfg.Concurrency = 1
	cfg.Lease = time.Minute
	r = startQuick(t, cfg)

	waitFor(t, "the first call", func() bool { return g.started() == 1 })
	r.sync(t)
	te.clock.Advance(2 * time.Second) // the crashed owner's lease has run out
	r.sync(t)
	g.pass(t, 2)
	if n := before.Load(); n != 1 {
		t.Errorf("the second call started after %d reconciliations of the expired lease, want 1", n)
	}
	// The lost row, never delivered, is resent after the four.
	for i := 3; i <= len(envs)+1; i++ {
		g.pass(t, i)
	}
	g.next <- struct{}{}
	r.idle(t)
	for _, e := range append(envs, lost) {
		if seg := segment(t, te.store, keyOf(e, 0)); seg.State != envelope.StateSent {
			t.Errorf("%s: %s, want sent", e.ID, seg.State)
		}
	}
}

// A claim under way when its channel pauses (the call in flight had its
// credentials refused) does not start the rows it returns: they are given
// back, unused, and wait for the pause.
func TestWorker_RowsClaimedWhileTheirChannelPausesAreGivenBack(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	te.fakes[envelope.ChannelPush].SetOneService(true)
	answer := make(chan struct{})
	p := &scriptedProvider{Provider: te.fakes[envelope.ChannelPush], deliverCtx: func(context.Context) (channels.Receipt, error) {
		<-answer
		return channels.Receipt{}, envelope.Permanent(envelope.ClassAuthFailed, errors.New("401"))
	}}
	first := queuetest.Nudge("first", "u-first")
	te.enqueue(t, first)
	hook := &claimHook{Store: te.store}
	cfg := te.config()
	cfg.Store = hook
	cfg.Providers = map[envelope.Channel]channels.Provider{envelope.ChannelPush: p}
	cfg.Concurrency = 1
	r := startQuick(t, cfg)
	waitFor(t, "the first call", func() bool { return len(p.Calls()) == 1 })
	r.sync(t)

	// The next claim starts before the pause and returns after it, with
	// the slot free.
	hook.mu.Lock()
	hook.before = func() {
		close(answer)
		waitFor(t, "the pause", func() bool { return r.w.free() == 1 })
	}
	hook.mu.Unlock()
	late := queuetest.Nudge("late", "u-late")
	te.enqueue(t, late) // wakes the worker, which claims ahead
	r.idle(t)
	if n := len(p.Calls()); n != 1 {
		t.Errorf("%d calls, want 1: a row of the paused channel was started", n)
	}
	if seg := segment(t, te.store, keyOf(late, 0)); seg.State != envelope.StatePending || seg.Attempts != 0 {
		t.Errorf("the row claimed as the pause began: %s after %d attempts, want pending after none", seg.State, seg.Attempts)
	}
}
