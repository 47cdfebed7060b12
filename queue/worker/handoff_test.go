package worker

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// An idle worker on the file store stands ready for the next envelope
// (queue.Offer) when its provider redelivers idempotently: the envelope is
// handed to it by its Enqueue, and the provider's call is marked as a
// hand-off. With a provider that does not redeliver idempotently, or with
// NoHandOff, the worker makes no offer and claims as before.
func TestWorker_HandOffToAnIdleWorker(t *testing.T) {
	for _, tc := range []struct {
		name       string
		idempotent bool
		noHandOff  bool
		want       bool
	}{
		{"idempotent provider", true, false, true},
		{"provider not idempotent", false, false, false},
		{"NoHandOff", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := queuetest.NewClock(t0)
			s, err := queue.Open(t.TempDir(), &queue.Options{Now: clock.Now, Logger: discard, DisableWatcher: true, RescanInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			p := fake.New(envelope.ChannelTelegram)
			p.SetIdempotent(tc.idempotent)
			r := startWorker(t, Config{Store: s, Providers: map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: p},
				Renderer: testRenderer{}, Now: clock.Now, Logger: discard, NoHandOff: tc.noHandOff})
			r.idle(t)
			if tc.want {
				waitFor(t, "an offer", func() bool { return r.offers.Load() > 0 })
			}
			e := queuetest.Reply("r1", "u1", "hello")
			mustEnqueue(t, s, e)
			r.waitEvent(t, "the delivery", is("deliver", keyOf(e, 0), "sent"))
			cs := calls(p, fake.OpDeliver, keyOf(e, 0))
			if len(cs) != 1 || cs[0].HandOff != tc.want {
				t.Fatalf("calls = %+v, want one with HandOff %v", cs, tc.want)
			}
			if !tc.want && r.offers.Load() != 0 {
				t.Fatalf("%d offers, want none", r.offers.Load())
			}
			if st, err := s.Get(t.Context(), "", "r1"); err != nil || st.Status != queue.StatusDelivered || st.Segments[0].Attempts != 1 {
				t.Fatalf("status = %+v, %v; want delivered in one attempt", st, err)
			}
		})
	}
}

// The producer lets the worker it handed an envelope to run first: once
// the record is durable, Enqueue yields, and the worker, woken on the
// producer's own CPU, calls the provider before Enqueue returns instead of
// waiting for another CPU to wake. With one P (GOMAXPROCS=1) that order is
// exact but for the scheduler's occasional look at its global queue, and
// without the yield it never happens.
func TestWorker_HandOffRunsBeforeEnqueueReturns(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	s, err := queue.Open(t.TempDir(), &queue.Options{Logger: discard, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p := fake.New(envelope.ChannelTelegram)
	r := startWorker(t, Config{Store: s, Providers: map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: p},
		Renderer: testRenderer{}, Logger: discard})
	const n = 20
	first := 0
	for i := range n {
		waitFor(t, "an offer", func() bool { return r.offers.Load() > int64(i) })
		e := queuetest.Reply(fmt.Sprintf("r%d", i), "u1", "hello")
		mustEnqueue(t, s, e)
		if cs := calls(p, fake.OpDeliver, keyOf(e, 0)); len(cs) == 1 && cs[0].HandOff {
			first++
		}
		r.waitEvent(t, "the delivery", is("deliver", keyOf(e, 0), "sent"))
	}
	if first < n*3/4 {
		t.Fatalf("the provider was called before Enqueue returned for %d of %d handed-off envelopes, want at least %d", first, n, n*3/4)
	}
}

// Hand-offs racing claims: two workers on one file store, producers
// enqueuing one envelope at a time (so the workers keep going idle and
// offering) while some envelopes arrive in batches (claimed, never handed
// off). Every envelope is delivered exactly once, by one call, and the
// store checks clean.
func TestWorker_HandOffsRacingClaims(t *testing.T) {
	s, err := queue.Open(t.TempDir(), &queue.Options{Logger: discard, DisableWatcher: true, RescanInterval: -1})
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
	handed := 0
	for _, k := range keys {
		cs := calls(p, fake.OpDeliver, k)
		if len(cs) != 1 {
			t.Fatalf("%s: %d calls, want 1", k.EnvelopeID, len(cs))
		}
		if cs[0].HandOff {
			handed++
		}
	}
	if rep, err := s.Check(); err != nil || !rep.OK() {
		t.Fatalf("Check = %+v, %v", rep, err)
	}
	t.Logf("%d envelopes, %d handed off", len(keys), handed)
}
