package queue

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
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

// Enqueue's index updates share a transaction while nobody reads them, and
// the first read commits them at once (it does not wait out the delay).
func TestIndex_UpdatesShareATransactionUntilARead(t *testing.T) {
	q := openFault(t, t.TempDir())
	q.indexDelay.Store(int64(time.Hour))
	commits := countCommits(t, q)
	ctx := context.Background()
	for i := range 5 {
		if _, err := q.Enqueue(ctx, faultEnvelope(string(rune('a'+i)), "u1")); err != nil {
			t.Fatal(err)
		}
	}
	if n := commits.Load(); n != 0 {
		t.Fatalf("%d transactions before any read, want the 5 index updates still gathered", n)
	}
	done := make(chan error, 1)
	go func() {
		_, err := q.Get(ctx, "", "e")
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Get after Enqueue: %v (read-your-writes)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a read waited for the gathering delay instead of flushing it")
	}
	if n := commits.Load(); n != 1 {
		t.Fatalf("%d transactions for 5 gathered index updates, want 1", n)
	}
	if got := rows(t, q); got != 5 {
		t.Fatalf("%d rows, want 5", got)
	}
}

// A claim right after an enqueue joins the enqueue's index transaction:
// one transaction indexes the row and leases it.
func TestIndex_ClaimJoinsThePendingIndexTransaction(t *testing.T) {
	q := openFault(t, t.TempDir())
	q.indexDelay.Store(int64(time.Hour))
	commits := countCommits(t, q)
	ctx := context.Background()
	select {
	case <-q.Notify(): // a wake left by Open
	default:
	}
	if _, err := q.Enqueue(ctx, faultEnvelope("r-1", "u1")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-q.Notify():
	default:
		t.Fatal("Enqueue did not wake the worker when it submitted the index update")
	}
	leases, err := q.Claim(ctx, ClaimRequest{Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "w", Lease: time.Minute, Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 1 {
		t.Fatalf("claimed %d rows, want the enqueued one", len(leases))
	}
	if n := commits.Load(); n != 1 {
		t.Fatalf("%d transactions for an enqueue and its claim, want 1", n)
	}
}

// Close does not wait out the gathering delay, and what was gathered is
// indexed (or, at worst, re-indexed from the logs on the next Open).
func TestIndex_CloseCommitsGatheredUpdates(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	q.indexDelay.Store(int64(time.Hour))
	ctx := context.Background()
	for i := range 3 {
		if _, err := q.Enqueue(ctx, faultEnvelope(string(rune('a'+i)), "u1")); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- q.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for the gathering delay")
	}
	q = openFault(t, dir)
	if got := rows(t, q); got != 3 {
		t.Fatalf("%d rows after reopen, want 3", got)
	}
}

// While the writer gathers, Enqueue leaves its index update for it to take
// instead of waking it; a claim that ends the gathering still sees the rows
// those updates index (they go first in the transaction).
func TestIndex_GatheredUpdatesDoNotWakeTheWriter(t *testing.T) {
	q := openFault(t, t.TempDir())
	q.indexDelay.Store(int64(time.Hour))
	commits := countCommits(t, q)
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, faultEnvelope("r-0", "u1")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		q.idxMu.Lock()
		g := q.gathering
		q.idxMu.Unlock()
		if g {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer does not gather the first index update")
		}
		time.Sleep(time.Millisecond)
	}
	for i := 1; i <= 4; i++ {
		// Other users' logs: the first update's catch-up of u1's log
		// cannot index them on the way.
		if _, err := q.Enqueue(ctx, faultEnvelope(fmt.Sprintf("r-%d", i), fmt.Sprintf("u%d", i+1))); err != nil {
			t.Fatal(err)
		}
	}
	q.idxMu.Lock()
	quiet := len(q.quiet)
	q.idxMu.Unlock()
	if quiet != 4 || len(q.ops) != 0 {
		t.Fatalf("%d updates left for the gathering writer, %d sent to it; want 4 and 0", quiet, len(q.ops))
	}
	leases, err := q.Claim(ctx, ClaimRequest{Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "w", Lease: time.Minute, Limit: 10, Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 5 {
		t.Fatalf("the claim that ended the gathering leased %d rows, want all 5", len(leases))
	}
	if n := commits.Load(); n != 1 {
		t.Fatalf("%d transactions, want 1 (5 index updates and the claim)", n)
	}
}

// Many enqueues, reads of what was just enqueued, and claims at once, with
// the writer gathering: every read sees its own write, no index update is
// left behind, and every row is claimed exactly once.
func TestIndex_GatheringUnderLoad(t *testing.T) {
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
			leases, err := q.Claim(ctx, ClaimRequest{Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "w", Lease: time.Minute, Limit: 16, Lazy: true})
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
	// Whatever is still gathered is committed by the next read.
	if _, err := q.Counts(ctx, ""); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-claimer
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	leases, err := q.Claim(ctx, ClaimRequest{Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "w", Lease: time.Minute, Limit: 1000, Lazy: true})
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
