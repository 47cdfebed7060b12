package filestore_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/outboxhq/outbox/queue/worker"
	"github.com/outboxhq/outbox/render"
)

// TestScale fills a store with OUTBOX_SCALE_ROWS pending rows over
// OUTBOX_SCALE_USERS users (make scale: 1,000,000 over 1,000 users), then reopens it and checks that Open takes
// under 2 s, that the Go heap stays under 64 MiB, and that an idle store
// (nothing due) uses no CPU. It is skipped unless the variable is set.
func TestScale(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("OUTBOX_SCALE_ROWS"))
	if err != nil || n <= 0 {
		t.Skip("set OUTBOX_SCALE_ROWS (e.g. 1000000) to run the scale test; make scale does")
	}
	users := 1000
	if v := os.Getenv("OUTBOX_SCALE_USERS"); v != "" {
		if users, err = strconv.Atoi(v); err != nil || users <= 0 {
			t.Fatalf("OUTBOX_SCALE_USERS=%q: want a positive number", v)
		}
	}
	dir := os.Getenv("OUTBOX_SCALE_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	// Fill (relaxed mode: this test is about size, not durability). Rows are
	// not due for a day so the idle measurement has nothing to claim.
	q, err := filestore.Open(dir, &filestore.Options{NoSync: true, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	fill := time.Now()
	const batch = 500
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := w * batch; start < n; start += 2 * batch {
				envs := make([]*envelope.Envelope, 0, batch)
				for i := start; i < min(start+batch, n); i++ {
					e := queuetest.Reply(fmt.Sprintf("scale-%08d", i), fmt.Sprintf("u%07d", i%users), "hello")
					e.NotBefore = time.Now().Add(24 * time.Hour)
					envs = append(envs, e)
				}
				if _, err := q.Enqueue(context.Background(), envs...); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	t.Logf("filled %d rows in %s", n, time.Since(fill).Round(time.Second))
	q.Close()

	runtime.GC()
	t0 := time.Now()
	q, err = filestore.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	open := time.Since(t0)
	var ms runtime.MemStats
	// Return the fill's garbage to the OS now, or the runtime's background
	// scavenger does it during the idle window below.
	debug.FreeOSMemory()
	runtime.ReadMemStats(&ms)

	// Idle: nothing is due; neither the store's goroutines nor a running
	// worker may spin.
	r, err := render.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{Store: q, Renderer: r,
		Providers: map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: fake.New(envelope.ChannelTelegram)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	time.Sleep(500 * time.Millisecond) // the worker's first turn
	cpu0 := cpuTime()
	time.Sleep(2 * time.Second)
	idle := cpuTime() - cpu0
	cancel()
	<-done
	c, err := q.Counts(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(dir + "/" + filestore.IndexFile)
	msg := fmt.Sprintf("scale: %d pending rows over %d users: Open %s, heap %d MiB, idle CPU %s over 2s, index %d MiB",
		c.Total(envelope.StatePending), users, open.Round(time.Millisecond), ms.HeapAlloc>>20, idle, fi.Size()>>20)
	t.Log(msg)
	fmt.Println(msg)
	if c.Total(envelope.StatePending) != n {
		t.Fatalf("pending = %d, want %d", c.Total(envelope.StatePending), n)
	}
	if open > 2*time.Second {
		t.Errorf("Open took %s, want < 2s", open)
	}
	if ms.HeapAlloc > 64<<20 {
		t.Errorf("heap %d MiB, want < 64 MiB", ms.HeapAlloc>>20)
	}
	if idle > 20*time.Millisecond {
		t.Errorf("idle CPU %s over 2s", idle)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
