package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
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
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is where every fake clock starts.
var t0 = time.Date(2026, time.March, 2, 9, 0, 0, 0, time.UTC)

// waitTimeout bounds every wait for a condition.
const waitTimeout = 15 * time.Second

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// testRenderer renders deterministic messages that carry the envelope's
// recipient and payload (so redaction tests see them flow to providers).
// An envelope whose id starts with "render-fail" fails to render, with
// the payload in the error text.
type testRenderer struct{}

func (testRenderer) Render(e *envelope.Envelope, segment int, now time.Time) (*envelope.Message, error) {
	if len(e.ID) >= 11 && e.ID[:11] == "render-fail" {
		return nil, errors.New("render: template failed on " + string(e.Payload) + " for " + e.ID)
	}
	switch e.Channel {
	case envelope.ChannelEmail:
		return &envelope.Message{Channel: e.Channel, Email: &envelope.EmailMessage{
			To: e.Recipient.Email, Subject: "Your week", Text: string(e.Payload), HTML: "<p>" + string(e.Payload) + "</p>",
		}}, nil
	case envelope.ChannelPush:
		return &envelope.Message{Channel: e.Channel, Push: &envelope.PushMessage{
			Subscription: *e.Recipient.PushSubscription, Payload: e.Payload, TTL: time.Hour, Urgency: envelope.UrgencyNormal,
		}}, nil
	case envelope.ChannelTelegram:
		p, err := e.ReplyPayload()
		if err != nil {
			return nil, err
		}
		segs := envelope.SplitReply(p.Text)
		if segment < 0 || segment >= len(segs) {
			return nil, errors.New("render: no segment " + strconv.Itoa(segment))
		}
		return &envelope.Message{Channel: e.Channel, Chat: &envelope.ChatMessage{
			ChatID: e.Recipient.ChatID, Text: segs[segment], Segment: segment, Segments: len(segs),
		}}, nil
	}
	return nil, errors.New("render: unknown channel")
}

// testEnv is a memstore on a fake clock with a fake provider per channel.
type testEnv struct {
	clock *queuetest.Clock
	store *memstore.Store
	fakes map[envelope.Channel]*fake.Provider
}

func newTestEnv(t testing.TB, b queue.Backoff) *testEnv {
	t.Helper()
	clock := queuetest.NewClock(t0)
	s := memstore.New(&queue.Options{Now: clock.Now, Backoff: b, Logger: discard})
	t.Cleanup(func() { s.Close() })
	e := &testEnv{clock: clock, store: s, fakes: map[envelope.Channel]*fake.Provider{}}
	for _, ch := range envelope.Channels {
		e.fakes[ch] = fake.New(ch)
	}
	return e
}

// providers returns the fakes of chs (every channel when none is given).
func (e *testEnv) providers(chs ...envelope.Channel) map[envelope.Channel]channels.Provider {
	if len(chs) == 0 {
		chs = envelope.Channels
	}
	m := make(map[envelope.Channel]channels.Provider, len(chs))
	for _, ch := range chs {
		m[ch] = e.fakes[ch]
	}
	return m
}

// config returns a worker config on e with every fake provider.
func (e *testEnv) config() Config {
	return Config{
		Store:     e.store,
		Providers: e.providers(),
		Renderer:  testRenderer{},
		Now:       e.clock.Now,
		Logger:    discard,
	}
}

// enqueue grants consent to each envelope's user and enqueues them.
func (e *testEnv) enqueue(t testing.TB, envs ...*envelope.Envelope) {
	t.Helper()
	mustEnqueue(t, e.store, envs...)
}

func mustEnqueue(t testing.TB, s queue.Store, envs ...*envelope.Envelope) {
	t.Helper()
	for _, env := range envs {
		queuetest.GrantAll(t, s, env.Tenant(), env.UserID)
	}
	if _, err := s.Enqueue(context.Background(), envs...); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
}

// segment returns one row of an envelope.
func segment(t testing.TB, s queue.Store, key envelope.Key) queue.SegmentStatus {
	t.Helper()
	st, err := s.Get(context.Background(), key.Tenant, key.EnvelopeID)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	for _, seg := range st.Segments {
		if seg.Index == key.Segment {
			return seg
		}
	}
	t.Fatalf("get %s: no such segment", key)
	return queue.SegmentStatus{}
}

func keyOf(e *envelope.Envelope, seg int) envelope.Key {
	return envelope.Key{Tenant: e.Tenant(), EnvelopeID: e.ID, Segment: seg}
}

// waitFor polls cond (which must not depend on the fake clock) until it
// holds, failing the test after waitTimeout.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// event is one finished task, seen through the worker's test hook.
type event struct {
	op  string
	key envelope.Key
	r   result
}

// running is a worker started by startWorker.
type running struct {
	w      *Worker
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error

	starts, ends atomic.Int64
	tasks        atomic.Int64 // tasks started

	mu     sync.Mutex
	events []event
}

// startWorker builds a worker from cfg, runs it, and stops it when the test
// ends (failing the test when Run returns an error then).
func startWorker(t testing.TB, cfg Config) *running {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return runWorker(t, w)
}

func runWorker(t testing.TB, w *Worker) *running {
	t.Helper()
	return runWorkerWith(t, w, nil)
}

// runWorkerWith is runWorker; more, when not nil, may add to the hooks
// before Run starts.
func runWorkerWith(t testing.TB, w *Worker, more func(r *running, h *hooks)) *running {
	t.Helper()
	r := &running{w: w, done: make(chan error, 1)}
	w.hooks = &hooks{
		taskStart: func(string, envelope.Key) { r.tasks.Add(1) },
		taskDone: func(op string, key envelope.Key, res result) {
			r.mu.Lock()
			r.events = append(r.events, event{op, key, res})
			r.mu.Unlock()
		},
		turnStart: func() { r.starts.Add(1) },
		turnEnd:   func() { r.ends.Add(1) },
	}
	if more != nil {
		more(r, w.hooks)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() {
		if err := r.stop(t); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// stop cancels Run's context and returns Run's error.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(waitTimeout):
			t.Fatalf("Run did not return after cancel")
		}
	})
	return r.err
}

// sync wakes the loop and waits for a turn that started after the call.
func (r *running) sync(t testing.TB) {
	t.Helper()
	s := r.starts.Load()
	r.w.wake()
	waitFor(t, "a loop turn", func() bool { return r.ends.Load() > s })
}

// idle waits until the worker has settled: every task it started has
// ended, its commit written (a slot is free again before that), and a
// loop turn that started afterwards started none.
func (r *running) idle(t testing.TB) {
	t.Helper()
	ended := func() (int64, bool) {
		n := r.tasks.Load()
		return n, int64(r.count(func(event) bool { return true })) == n
	}
	waitFor(t, "the worker to settle", func() bool {
		n, ok := ended()
		if !ok {
			return false
		}
		r.sync(t)
		m, ok := ended()
		return ok && m == n
	})
}

// advance moves the clock by d, runs a turn and waits for its tasks.
func (r *running) advance(t testing.TB, clock *queuetest.Clock, d time.Duration) {
	t.Helper()
	clock.Advance(d)
	r.sync(t)
	r.idle(t)
}

// count returns the number of finished tasks matching pred.
func (r *running) count(pred func(event) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if pred(e) {
			n++
		}
	}
	return n
}

// waitEvent waits for a finished task matching pred and returns it.
func (r *running) waitEvent(t testing.TB, what string, pred func(event) bool) event {
	t.Helper()
	var got event
	waitFor(t, what, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, e := range r.events {
			if pred(e) {
				got = e
				return true
			}
		}
		return false
	})
	return got
}

// is matches events by op, key and status ("" matches any).
func is(op string, key envelope.Key, status string) func(event) bool {
	return func(e event) bool {
		return (op == "" || e.op == op) && e.key == key && (status == "" || e.r.status == status)
	}
}

// calls returns the fake's calls of op for key.
func calls(p *fake.Provider, op string, key envelope.Key) []fake.Call {
	var out []fake.Call
	for _, c := range p.Calls() {
		if c.Op == op && c.Key == key {
			out = append(out, c)
		}
	}
	return out
}
