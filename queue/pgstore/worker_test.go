package pgstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/outboxhq/outbox/queue/worker"
	"github.com/outboxhq/outbox/render"
)

// TestWorkers_TwoStores runs a worker on each of two stores of one schema
// (two processes' worth) while envelopes are enqueued through one of
// them: every segment is delivered once, by one of the two providers.
func TestWorkers_TwoStores(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	schema := pgtest.Schema(t)
	discard := slog.New(slog.DiscardHandler)
	rnd, err := render.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		stores []*pgstore.Store
		fakes  []*fake.Provider
		done   []chan error
	)
	for i := range 2 {
		s, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, Options: queue.Options{Logger: discard}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		p := fake.New(envelope.ChannelTelegram)
		w, err := worker.New(worker.Config{
			Store: s, Renderer: rnd, Logger: discard, Owner: fmt.Sprintf("w%d", i),
			Providers: map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: p},
		})
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan error, 1)
		go func() { ch <- w.Run(ctx) }()
		stores, fakes, done = append(stores, s), append(fakes, p), append(done, ch)
	}

	var keys []envelope.Key
	for b := range 10 {
		var envs []*envelope.Envelope
		for i := range 15 {
			id, text := fmt.Sprintf("r%d-%d", b, i), "hi"
			if i%5 == 0 {
				text = queuetest.ReplyText(3)
			}
			envs = append(envs, queuetest.Reply(id, fmt.Sprintf("u-%d", i%4), text))
		}
		res, err := stores[0].Enqueue(ctx, envs...)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			for seg := range r.Segments {
				keys = append(keys, envelope.Key{Tenant: r.Tenant, EnvelopeID: r.ID, Segment: seg})
			}
		}
	}
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		c, err := stores[1].Counts(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if c.Total(envelope.StateSent) == len(keys) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("not every row sent: %v", c)
		}
	}
	cancel()
	for _, ch := range done {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	per := [2]int{}
	for _, k := range keys {
		n := 0
		for i, p := range fakes {
			n += p.Delivered(k)
			per[i] += p.Delivered(k)
		}
		if n != 1 {
			t.Errorf("%v delivered %d times, want once", k, n)
		}
	}
	t.Logf("%d segments: %d by the first worker, %d by the second", len(keys), per[0], per[1])
}
