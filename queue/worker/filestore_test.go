package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/outboxhq/outbox/render"
)

// TestWorker_FileStoreWithRenderer runs the worker end to end on the
// file-backed store (queue.Open in a temp dir) with the real renderer:
// a digest, a nudge and a three-segment reply are each delivered once, a
// lost receipt is reconciled after its lease, and a worker restarted on a
// reopened store finishes what the first left.
func TestWorker_FileStoreWithRenderer(t *testing.T) {
	dir := t.TempDir()
	clock := queuetest.NewClock(t0)
	opts := &queue.Options{Now: clock.Now, Logger: discard, DisableWatcher: true, RescanInterval: -1,
		Backoff: queue.Backoff{Base: time.Second, NoJitter: true}}
	s, err := queue.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // after the workers' cleanups (LIFO)
	rnd, err := render.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	fakes := map[envelope.Channel]*fake.Provider{}
	providers := map[envelope.Channel]channels.Provider{}
	for _, ch := range envelope.Channels {
		fakes[ch] = fake.New(ch)
		providers[ch] = fakes[ch]
	}
	digest := queuetest.Digest("d1", "u1")
	nudge := queuetest.Nudge("n1", "u1")
	reply := queuetest.Reply("r1", "u1", threeSegmentText())
	lost := queuetest.Nudge("n2", "u2")
	fakes[envelope.ChannelPush].Script(keyOf(lost, 0), fake.LoseReceipt)
	fakes[envelope.ChannelTelegram].Script(keyOf(reply, 1), fake.FailRetryable)
	mustEnqueue(t, s, digest, nudge, reply, lost)
	segs := map[*envelope.Envelope]int{digest: 1, nudge: 1, reply: 3, lost: 1}

	cfg := Config{Store: s, Providers: providers, Renderer: rnd, Now: clock.Now, Logger: discard}
	first := startWorker(t, cfg)
	first.waitEvent(t, "the lost receipt", is("deliver", keyOf(lost, 0), callLost))
	first.waitEvent(t, "the first reply segment", is("deliver", keyOf(reply, 0), "sent"))
	first.waitEvent(t, "the failing reply segment", is("deliver", keyOf(reply, 1), "retryable"))
	first.idle(t)
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}

	// Reopen the store: the lost lease and the pending retry survive.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = queue.Open(dir, opts); err != nil {
		t.Fatal(err)
	}
	cfg.Store = s
	clock.Advance(DefaultLease + time.Second)
	second := startWorker(t, cfg)
	for _, e := range []*envelope.Envelope{digest, nudge, reply, lost} {
		waitFor(t, e.ID+" delivered", func() bool {
			st, err := s.Get(context.Background(), e.Tenant(), e.ID)
			return err == nil && st.Status == queue.StatusDelivered
		})
	}
	second.idle(t)
	if n := second.count(is("reconcile", keyOf(lost, 0), "sent")); n != 1 {
		t.Errorf("%d reconciliations of the lost receipt, want 1", n)
	}
	for e, n := range segs {
		for seg := range n {
			k := keyOf(e, seg)
			if got := fakes[e.Channel].Delivered(k); got != 1 {
				t.Errorf("%s delivered %d times, want 1", k, got)
			}
		}
	}
	// The real renderer made real messages.
	for _, c := range fakes[envelope.ChannelEmail].Calls() {
		if m := c.Message; m == nil || m.Email == nil || m.Email.To != queuetest.EmailOf("u1") || m.Email.Subject == "" || m.Email.HTML == "" {
			t.Errorf("email rendered as %+v", m)
		}
	}
	var order []string
	for _, c := range fakes[envelope.ChannelTelegram].Calls() {
		order = append(order, fmt.Sprint(c.Key.Segment))
	}
	if fmt.Sprint(order) != "[0 1 1 2]" {
		t.Errorf("telegram segments called in order %v, want [0 1 1 2]", order)
	}
}
