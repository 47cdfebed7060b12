package filestore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// countCommits counts the writer's transactions from now on.
func countCommits(t *testing.T, q *Queue) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	fn := func() error { n.Add(1); return nil }
	q.beforeCommit.Store(&fn)
	t.Cleanup(func() { q.beforeCommit.Store(nil) })
	return &n
}

// Many enqueues, reads of what was just enqueued, and claims at once,
// sharing the writer's transactions: every read sees its own write, no
// index update is left behind, and every row is claimed exactly once.
func TestIndex_EnqueuesReadsAndClaimsUnderLoad(t *testing.T) {
	q := openFault(t, t.TempDir())
	ctx := context.Background()
	const producers, each = 6, 80
	var wg sync.WaitGroup
	errs := make(chan error, producers+1)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("p%d-%d", p, i)
				if _, err := q.Enqueue(ctx, faultEnvelope(id, fmt.Sprintf("u%d", (p+i)%5))); err != nil {
					errs <- err
					return
				}
				if i%3 == 0 {
					if _, err := q.Get(ctx, "", id); err != nil {
						errs <- fmt.Errorf("get %s right after its enqueue: %w", id, err)
						return
					}
				}
			}
		}()
	}
	claimed := map[string]int{}
	stop := make(chan struct{})
	claimer := make(chan struct{})
	go func() {
		defer close(claimer)
		for {
			leases, err := q.Claim(ctx, queue.ClaimRequest{Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "w", Lease: time.Minute, Limit: 16})
			if err != nil {
				errs <- err
				return
			}
			for _, l := range leases {
				claimed[l.Key.EnvelopeID]++
			}
			if len(leases) == 0 {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}
	}()
	wg.Wait()
	// Every index update submitted so far is committed before the next read.
	if _, err := q.Counts(ctx, ""); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-claimer
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	leases, err := q.Claim(ctx, queue.ClaimRequest{Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "w", Lease: time.Minute, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		claimed[l.Key.EnvelopeID]++
	}
	if len(claimed) != producers*each {
		t.Fatalf("%d envelopes claimed, want %d", len(claimed), producers*each)
	}
	for id, n := range claimed {
		if n != 1 {
			t.Fatalf("%s claimed %d times", id, n)
		}
	}
}
