package worker

import (
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// A step of the wall clock past a lease while its provider call runs (an
// NTP step at boot on a host without a hardware clock, a VM resumed and
// set right) makes the store see that lease as expired, and the worker's
// next turn recovers it. The call is still this worker's, and it ends: its
// answer settles the row, under the recovered lease. Without that the
// recovered lease would be reconciled with a provider that cannot tell
// (Telegram: unresolved, for the operator), and the call's own commit,
// fenced out, would be lost. A call that ends without an answer (a lost
// receipt) is reconciled as usual, but only once it has ended: asked
// during the call, the provider could not see it yet and would answer
// "rejected", and the row would be sent again.
func TestWorker_ClockStepDuringACall(t *testing.T) {
	cases := []struct {
		name       string
		step       fake.Step
		reconciles int
	}{
		{"answered", fake.Succeed, 0},
		{"receipt lost", fake.LoseReceipt, 1},
	}
	for _, st := range timerStores {
		for _, c := range cases {
			t.Run(st.name+"/"+c.name, func(t *testing.T) {
				clock := queuetest.NewClock(t0)
				s := st.open(t, clock, queue.Backoff{Base: time.Second, NoJitter: true})
				tg := fake.New(envelope.ChannelTelegram)
				tg.Default(c.step)
				inCall, release := make(chan struct{}), make(chan struct{})
				var once sync.Once
				tg.OnDeliver(func(envelope.Key) {
					once.Do(func() { close(inCall) })
					<-release
				})
				reply := queuetest.Reply("r1", "u1", "hello")
				mustEnqueue(t, s, reply)
				cfg := Config{Store: s, Providers: map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: tg}, Renderer: testRenderer{},
					Now: clock.Now, Logger: discard, Lease: time.Minute}
				r := startWorker(t, cfg)
				r.sync(t)
				select {
				case <-inCall:
				case <-time.After(waitTimeout):
					t.Fatal("the provider was never called")
				}
				clock.Advance(time.Hour) // the wall clock steps past the lease
				r.sync(t)                // a turn recovers the lease
				close(release)
				r.idle(t)

				key := keyOf(reply, 0)
				if got := segment(t, s, key); got.State != envelope.StateSent {
					t.Errorf("row %s after the step: %s (%s), want sent", key, got.State, got.Class)
				}
				if n := len(calls(tg, "deliver", key)); n != 1 {
					t.Errorf("Deliver calls: %d, want 1", n)
				}
				if n := len(calls(tg, "reconcile", key)); n != c.reconciles {
					t.Errorf("Reconcile calls: %d, want %d", n, c.reconciles)
				}
			})
		}
	}
}

// A call that ignores its context and outlives its lease keeps the
// recovered lease waiting only for half of that lease: then the row is
// reconciled as before, and no slot stays held for ever by the wait.
func TestWorker_ClockStepDuringAStuckCall(t *testing.T) {
	for _, st := range timerStores {
		t.Run(st.name, func(t *testing.T) {
			clock := queuetest.NewClock(t0)
			s := st.open(t, clock, queue.Backoff{Base: time.Second, NoJitter: true})
			tg := fake.New(envelope.ChannelTelegram)
			inCall, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			tg.OnDeliver(func(envelope.Key) {
				once.Do(func() { close(inCall) })
				<-release // not the call's context
			})
			defer close(release)
			tg.SetReconcile(func(envelope.Key) (channels.Reconciliation, error) {
				return channels.Reconciliation{Outcome: channels.Unknown}, nil
			})
			reply := queuetest.Reply("r1", "u1", "hello")
			mustEnqueue(t, s, reply)
			r := startWorker(t, Config{Store: s, Providers: map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: tg},
				Renderer: testRenderer{}, Now: clock.Now, Logger: discard, Lease: 2 * time.Second, Concurrency: 2})
			r.sync(t)
			select {
			case <-inCall:
			case <-time.After(waitTimeout):
				t.Fatal("the provider was never called")
			}
			clock.Advance(time.Hour)
			r.sync(t)
			key := keyOf(reply, 0)
			r.waitEvent(t, "the recovered lease reconciled", is("reconcile", key, string(envelope.StateUnresolved)))
			if n := len(calls(tg, "reconcile", key)); n != 1 {
				t.Errorf("Reconcile calls: %d, want 1", n)
			}
		})
	}
}

// The orders in which a recovery can meet its row's delivery task, on
// flights alone: what the recovery finds once the task has ended decides
// whether it commits the task's outcome, gives the lease back (no call
// was made) or asks the provider.
func TestFlights_RecoveryMeetsTheTask(t *testing.T) {
	l := &queue.Lease{Key: envelope.Key{Tenant: "t", EnvelopeID: "e"}, Fence: 7}
	rec := &queue.Lease{Key: l.Key, Fence: 8}
	sent := queue.Outcome{State: envelope.StateSent, Receipt: "r-1"}

	t.Run("before the call", func(t *testing.T) {
		var fs flights
		fs.start(l)
		f := fs.take(rec)
		if !fs.note(l, true, nil, false) {
			t.Fatal("the task may call after its lease was recovered")
		}
		fs.end(l)
		<-f.done
		if f.called || f.out != nil {
			t.Fatalf("called %v, out %v: want no call noted (the recovery gives the lease back)", f.called, f.out)
		}
	})
	t.Run("during the call", func(t *testing.T) {
		var fs flights
		fs.start(l)
		if fs.note(l, true, nil, false) {
			t.Fatal("taken before any recovery")
		}
		f := fs.take(rec)
		if !fs.note(l, false, &sent, false) {
			t.Fatal("the task may commit after its lease was recovered")
		}
		fs.end(l)
		<-f.done
		if !f.called || f.out == nil || *f.out != sent {
			t.Fatalf("called %v, out %v: want the call and its outcome", f.called, f.out)
		}
	})
	t.Run("while the task commits", func(t *testing.T) {
		var fs flights
		fs.start(l)
		fs.note(l, true, nil, false)
		if fs.note(l, false, &sent, false) {
			t.Fatal("taken before any recovery")
		}
		f := fs.take(rec) // the task's commit, fenced out, fails
		fs.end(l)
		<-f.done
		if f.out == nil || *f.out != sent {
			t.Fatalf("out %v: want the outcome the task committed", f.out)
		}
	})
	t.Run("no task", func(t *testing.T) {
		var fs flights
		fs.start(l)
		fs.end(l)
		if fs.take(rec) != nil {
			t.Fatal("a recovery found a task that had ended")
		}
		fs.start(rec)
		if fs.take(rec) != nil {
			t.Fatal("a lease found itself as its own task")
		}
	})
}
