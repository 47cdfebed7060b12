package worker

import (
	"testing"

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
