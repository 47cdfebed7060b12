package worker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/outboxhq/outbox/render"
)

// TestWorker_FileStoreWithRenderer runs the worker end to end on the
// file store (filestore.Open in a temp dir) with the real renderer:
// a digest, a nudge and a three-segment reply are each delivered once, a
// lost receipt is reconciled after its lease, and a worker restarted on a
// reopened store finishes what the first left.
func TestWorker_FileStoreWithRenderer(t *testing.T) {
	dir := t.TempDir()
	clock := queuetest.NewClock(t0)
	opts := &filestore.Options{Options: queue.Options{Now: clock.Now, Logger: discard, Backoff: queue.Backoff{Base: time.Second, NoJitter: true}}, DisableWatcher: true, RescanInterval: -1}
	s, err := filestore.Open(dir, opts)
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
	if s, err = filestore.Open(dir, opts); err != nil {
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

// Two workers claim from one file store while producers enqueue, most
// envelopes one at a time (the workers keep going idle and are woken) and
// some in batches. Every envelope is delivered exactly once, by one call,
// and the store checks clean.
func TestWorker_TwoWorkersOnOneFileStore(t *testing.T) {
	s, err := filestore.Open(t.TempDir(), &filestore.Options{Options: queue.Options{Logger: discard}, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p := fake.New(envelope.ChannelTelegram)
	providers := map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: p}
	var runs []*running
	for i := 0; i < 2; i++ {
		runs = append(runs, startWorker(t, Config{Store: s, Providers: providers, Renderer: testRenderer{},
			Logger: discard, Concurrency: 2, Owner: fmt.Sprintf("w%d", i)}))
	}
	const producers, each = 4, 60
	var wg sync.WaitGroup
	var keys []envelope.Key
	var mu sync.Mutex
	for g := 0; g < producers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				e := queuetest.Reply(fmt.Sprintf("p%d-%d", g, i), fmt.Sprintf("u%d", i%7), "hello")
				envs := []*envelope.Envelope{e}
				if i%10 == 9 {
					envs = append(envs, queuetest.Reply(fmt.Sprintf("p%d-%d-b", g, i), "ub", "batch"))
				}
				if _, err := s.Enqueue(context.Background(), envs...); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, e := range envs {
					keys = append(keys, keyOf(e, 0))
				}
				mu.Unlock()
				time.Sleep(time.Duration(i%3) * time.Millisecond) // let the workers go idle
			}
		}()
	}
	wg.Wait()
	for _, k := range keys {
		waitFor(t, k.EnvelopeID+" delivered", func() bool {
			st, err := s.Get(context.Background(), k.Tenant, k.EnvelopeID)
			return err == nil && st.Status == queue.StatusDelivered
		})
	}
	for _, r := range runs {
		r.idle(t)
	}
	for _, k := range keys {
		if cs := calls(p, fake.OpDeliver, k); len(cs) != 1 {
			t.Fatalf("%s: %d calls, want 1", k.EnvelopeID, len(cs))
		}
	}
	if rep, err := s.Check(); err != nil || !rep.OK() {
		t.Fatalf("Check = %+v, %v", rep, err)
	}
}
