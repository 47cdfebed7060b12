package queue

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// openTailed opens a store whose tailer pauses for pause after a second
// own append in a row to one log (no periodic rescan: only events count).
func openTailed(t *testing.T, dir string, pause time.Duration) *Queue {
	t.Helper()
	// The logs exist: a new tenant directory is watched only once it is
	// seen, and a rescan, not an event, finds what it first holds.
	for _, u := range []string{"u1", "u2"} {
		if err := Append(dir, faultEnvelope("before-"+u, u)); err != nil {
			t.Fatal(err)
		}
	}
	q, err := Open(dir, &Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	q.tail.pause.Store(int64(pause))
	return q
}

// waitSignal waits for one signal on c, failing the test after a long
// while.
func waitSignal(t *testing.T, c chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s", what)
	}
}

// A busy log's own appends cost about one file event per pause: while the
// watcher pauses, the kernel folds their events into one. An append by
// another process during the pause is still indexed, after it.
func TestTailer_PausesOnABusyLog(t *testing.T) {
	dir := t.TempDir()
	q := openTailed(t, dir, time.Second) // ten fsynced appends take far less
	defer q.Close()
	ctx := context.Background()
	enqueue := func(id, user string) {
		t.Helper()
		if _, err := q.Enqueue(ctx, faultEnvelope(id, user)); err != nil {
			t.Fatal(err)
		}
	}
	// Two own appends in a row, each seen: the watcher pauses.
	enqueue("a1", "u1")
	waitSignal(t, q.tail.settled, "event for the first append")
	enqueue("a2", "u1")
	waitSignal(t, q.tail.settled, "event for the second append")
	before := q.tail.owned.Load()

	// Ten more while it pauses, then another process's append to another
	// log (queued after them, so read after them).
	for i := 3; i <= 12; i++ {
		enqueue("a"+string(rune('a'+i)), "u1")
	}
	if err := Append(dir, faultEnvelope("foreign", "u2")); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, q.tail.scanned, "catch-up of the foreign append")
	if _, err := q.Get(ctx, "", "foreign"); err != nil {
		t.Fatalf("foreign append not indexed: %v", err)
	}
	// The first of the ten may have been read before the pause held the
	// reader, the rest fold into one queued event.
	if n := q.tail.owned.Load() - before; n > 3 {
		t.Fatalf("%d events read for 10 own appends to one log during a pause, want at most 3", n)
	}
	if got := rows(t, q); got != 15 {
		t.Fatalf("%d rows, want 15", got)
	}
}

// Events that alternate between logs do not fold: the watcher reads them
// without pausing. And Close ends a pause at once.
func TestTailer_NoPauseForAlternatingLogs(t *testing.T) {
	dir := t.TempDir()
	q := openTailed(t, dir, time.Hour)
	ctx := context.Background()
	for i, user := range []string{"u1", "u2", "u1", "u2", "u1", "u2"} {
		if _, err := q.Enqueue(ctx, faultEnvelope("e"+string(rune('a'+i)), user)); err != nil {
			t.Fatal(err)
		}
		waitSignal(t, q.tail.settled, "event for an append (the watcher paused)")
	}
	// Now pause for an hour: Close must not wait for it.
	if _, err := q.Enqueue(ctx, faultEnvelope("p", "u2")); err != nil {
		t.Fatal(err)
	}
	waitSignal(t, q.tail.settled, "event for the append that pauses")
	done := make(chan error, 1)
	go func() { done <- q.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close waited for the watcher's pause")
	}
}
