package worker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// TestSoak runs the file-backed store and the worker at a steady rate for
// OUTBOX_SOAK_DURATION (make soak: 3m) with a provider that fails 20 % of
// calls and hangs on 1 %, and a short retention. Afterwards goroutines,
// heap, open files and disk use must be back near their baseline and
// nothing may be lost. It is skipped unless the variable is set.
func TestSoak(t *testing.T) {
	dur, err := time.ParseDuration(os.Getenv("OUTBOX_SOAK_DURATION"))
	if err != nil || dur <= 0 {
		t.Skip("set OUTBOX_SOAK_DURATION (e.g. 3m) to run the soak; make soak does")
	}
	rate := 200
	dir := t.TempDir()
	q, err := filestore.Open(dir, &filestore.Options{Options: queue.Options{Logger: discard, Retention: 2 * time.Second, Backoff: queue.Backoff{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond, MaxAttempts: 12}}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	p := fake.New(envelope.ChannelTelegram)
	w, err := New(Config{Store: q, Renderer: testRenderer{}, Concurrency: 8, Lease: time.Second,
		Providers: map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: p}, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	runtime.GC()
	baseG := runtime.NumGoroutine()
	baseFDs := openFDs()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseHeap := ms.HeapAlloc

	go func() { done <- w.Run(ctx) }()
	var keys []envelope.Key
	start := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	prune := time.NewTicker(time.Second)
	pruned, peakDisk := 0, int64(0)
	for i := 0; time.Since(start) < dur; i++ {
		select {
		case <-tick.C:
		case <-prune.C:
			n, err := q.Prune(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pruned += n
			peakDisk = max(peakDisk, dirSize(dir))
			continue
		}
		id := fmt.Sprintf("s-%07d", i)
		key := envelope.Key{Tenant: envelope.DefaultTenant, EnvelopeID: id}
		switch r := rand.IntN(100); {
		case r < 20:
			p.Script(key, fake.FailRetryable)
		case r < 21:
			p.Script(key, fake.Hang)
		}
		if _, err := q.Enqueue(ctx, queuetest.Reply(id, fmt.Sprintf("u%d", i%50), "soak")); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	tick.Stop()
	prune.Stop()
	// Drain: every key delivered (hangs are reconciled after their lease).
	deadline := time.Now().Add(time.Minute)
	lost := 0
	for _, k := range keys {
		for p.Delivered(k) == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if p.Delivered(k) == 0 {
			lost++
		}
	}
	dups := 0
	for _, k := range keys {
		if p.Delivered(k) > 1 {
			dups++
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	w.Close()
	time.Sleep(2500 * time.Millisecond) // let every row pass the retention period
	n, _ := q.Prune(context.Background())
	pruned += n
	c, _ := q.Counts(context.Background(), "")
	left := 0
	for s := range c {
		left += c.Total(s)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	g, fds, disk := runtime.NumGoroutine(), openFDs(), dirSize(dir)
	t.Logf("soak: %s at %d/s: enqueued=%d delivered-lost=%d redelivered=%d pruned=%d rows-left=%d goroutines %d→%d open-files %d→%d heap %d→%d KiB disk peak %d KiB now %d KiB",
		dur, rate, len(keys), lost, dups, pruned, left, baseG, g, baseFDs, fds, baseHeap>>10, ms.HeapAlloc>>10, peakDisk>>10, disk>>10)
	fmt.Printf("soak: %s at %d/s, 20%% failures, 1%% hangs: enqueued=%d lost=%d redelivered-after-hang=%d pruned=%d rows-left=%d goroutines %d→%d open-files %d→%d heap %d→%d KiB, disk peak %d KiB, after prune %d KiB\n",
		dur, rate, len(keys), lost, dups, pruned, left, baseG, g, baseFDs, fds, baseHeap>>10, ms.HeapAlloc>>10, peakDisk>>10, disk>>10)
	if lost > 0 {
		t.Fatalf("%d envelopes never delivered", lost)
	}
	if left != 0 {
		t.Fatalf("%d rows left after retention", left)
	}
	if g > baseG+5 {
		t.Fatalf("goroutines %d → %d", baseG, g)
	}
	if fds > baseFDs+MaxOpenSlack {
		t.Fatalf("open files %d → %d", baseFDs, fds)
	}
	if ms.HeapAlloc > baseHeap+32<<20 {
		t.Fatalf("heap %d → %d", baseHeap, ms.HeapAlloc)
	}
}

// MaxOpenSlack allows the store's cached log descriptors (one per user).
const MaxOpenSlack = 64

func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}

func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}
