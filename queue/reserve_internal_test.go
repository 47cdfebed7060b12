package queue

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/internal/applog"
)

// The tailer's events for this process's own appends cost nothing: the
// Enqueue indexes its records, the tailer sees the log as its appender left
// it and neither reads it nor writes. Another process's append is read.
func TestTailer_IgnoresOwnAppends(t *testing.T) {
	dir := t.TempDir()
	if err := Append(dir, faultEnvelope("before", "u1")); err != nil {
		t.Fatal(err)
	}
	q, err := Open(dir, &Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	wait := func(c chan struct{}) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(20 * time.Second):
			t.Fatal("the tailer saw no event for an append")
		}
	}
	for _, c := range []chan struct{}{q.tail.scanned, q.tail.settled} {
		select {
		case <-c:
		default:
		}
	}
	commits := countCommits(t, q)
	if _, err := q.Enqueue(ctx, faultEnvelope("own", "u1")); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Get(ctx, "", "own"); err != nil {
		t.Fatal(err)
	}
	wait(q.tail.settled)
	if n := commits.Load(); n != 1 {
		t.Fatalf("%d transactions for one in-process enqueue, want 1 (its index update; the tailer's event is its own append)", n)
	}

	if err := Append(dir, faultEnvelope("foreign", "u1")); err != nil {
		t.Fatal(err)
	}
	wait(q.tail.scanned)
	if _, err := q.Get(ctx, "", "foreign"); err != nil {
		t.Fatalf("foreign append not indexed by the tailer: %v", err)
	}
	if n := commits.Load(); n != 2 {
		t.Fatalf("%d transactions, want 2 (the tailer indexed the foreign append)", n)
	}
	if got := rows(t, q); got != 3 {
		t.Fatalf("%d rows, want 3", got)
	}
}

// Prune removes an emptied log although its file ends in the reserve.
func TestPrune_RemovesALogThatEndsInItsReserve(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	q, err := Open(dir, &Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), DisableWatcher: true, RescanInterval: -1,
		Now: func() time.Time { return now }, Retention: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, faultEnvelope("a", "u1")); err != nil {
		t.Fatal(err)
	}
	path := LogPath(dir, "", "u1")
	b, err := os.ReadFile(path)
	if err != nil || b[len(b)-1] != ' ' {
		t.Fatalf("log %q, %v: want it to end in its reserve", b, err)
	}
	l, err := q.Claim(ctx, ClaimRequest{Owner: "w", Lease: time.Minute})
	if err != nil || len(l) != 1 {
		t.Fatalf("claim = %v, %v", l, err)
	}
	if err := q.Commit(ctx, l[0], Outcome{State: envelope.StateSent}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Hour)
	if n, err := q.Prune(ctx); err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v", n, err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("log still there after its last envelope was pruned (stat: %v)", err)
	}
	// A record appended past the indexed offset keeps the log.
	if _, err := q.Enqueue(ctx, faultEnvelope("b", "u1")); err != nil {
		t.Fatal(err)
	}
	var rel = applog.RelPath(envelope.DefaultTenant, "u1")
	q.app.Exclusive(rel, func() {})
	if ok := q.app.Settled(rel); ok {
		t.Fatal("Settled after Exclusive (the file may have been replaced)")
	}
}

func TestRescanWait(t *testing.T) {
	for _, c := range []struct{ interval, took, want time.Duration }{
		{30 * time.Second, 50 * time.Millisecond, 30 * time.Second},
		{30 * time.Second, 2 * time.Second, 200 * time.Second},
		{time.Millisecond, time.Millisecond, 100 * time.Millisecond},
	} {
		if got := rescanWait(c.interval, c.took); got != c.want {
			t.Errorf("rescanWait(%s, %s) = %s, want %s", c.interval, c.took, got, c.want)
		}
	}
}

// Periodic rescans take at most about 1 % of the time: the wait after a
// pass grows with what the pass took.
func TestTailer_RescanBacksOffWithItsCost(t *testing.T) {
	dir := t.TempDir()
	for i := range 200 {
		if err := Append(dir, faultEnvelope(fmt.Sprintf("e%d", i), fmt.Sprintf("u%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	q, err := Open(dir, &Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), DisableWatcher: true, RescanInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	select {
	case <-q.tail.scanned:
	case <-time.After(20 * time.Second):
		t.Fatal("no periodic rescan")
	}
	q.tail.mu.Lock()
	took, wait := q.tail.took, q.tail.wait
	q.tail.mu.Unlock()
	if took <= 0 || wait != rescanWait(time.Millisecond, took) || wait < 100*took {
		t.Fatalf("a rescan of 200 logs took %s and set a wait of %s, want 100× (at least the interval)", took, wait)
	}
}

// Another process appends while periodic rescans run: every line is indexed
// by some rescan (the parallel look for logs with news skips none).
func TestTailer_RescansIndexEveryForeignAppend(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(dir, &Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), DisableWatcher: true, RescanInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	const n = 300
	for i := range n {
		if err := Append(dir, faultEnvelope(fmt.Sprintf("f%d", i), fmt.Sprintf("u%d", i%10))); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < n; {
		if _, err := q.Get(ctx, "", fmt.Sprintf("f%d", i)); err == nil {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("f%d not indexed by the rescans", i)
		}
		time.Sleep(time.Millisecond)
	}
}
