package filestore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
)

// The tailer's events for this process's own appends cost nothing: the
// Enqueue indexes its records, the tailer sees the log as its appender left
// it and neither reads it nor writes. Another process's append is read.
func TestTailer_IgnoresOwnAppends(t *testing.T) {
	dir := t.TempDir()
	if err := Append(dir, faultEnvelope("before", "u1")); err != nil {
		t.Fatal(err)
	}
	q, err := Open(dir, &Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, RescanInterval: -1})
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
	scanned, settled := tailSignals(q)
	commits := countCommits(t, q)
	if _, err := q.Enqueue(ctx, faultEnvelope("own", "u1")); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Get(ctx, "", "own"); err != nil {
		t.Fatal(err)
	}
	wait(settled)
	if n := commits.Load(); n != 1 {
		t.Fatalf("%d transactions for one in-process enqueue, want 1 (its index update; the tailer's event is its own append)", n)
	}

	if err := Append(dir, faultEnvelope("foreign", "u1")); err != nil {
		t.Fatal(err)
	}
	wait(scanned)
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

// The store appends its records and nothing else: after each in-process
// Enqueue the log is exactly the records so far (it grows by each one, so
// a reader following its size, as tail -f does, sees the record at once).
// Older builds pre-wrote a reserve of spaces and wrote records over it.
func TestEnqueue_WritesNothingButItsRecords(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	ctx := context.Background()
	path := LogPath(dir, "", "u1")
	var size int64
	for i := range 5 {
		if _, err := q.Enqueue(ctx, faultEnvelope(fmt.Sprintf("e%d", i), "u1")); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := applog.Lines(b, 0)
		if len(lines) != i+1 || int64(len(b)) <= size || b[len(b)-1] != '\n' {
			t.Fatalf("after %d enqueues the log is %d bytes (%d before) with %d lines: %q", i+1, len(b), size, len(lines), b)
		}
		var n int64
		for _, ln := range lines {
			if ln.Off != n {
				t.Fatalf("line at %d, want %d: bytes between records in %q", ln.Off, n, b)
			}
			n += int64(len(ln.Data)) + 1
		}
		if n != int64(len(b)) {
			t.Fatalf("log of %d bytes holds %d bytes of records: %q", len(b), n, b)
		}
		size = int64(len(b))
	}
}

// Logs written by an older build end in its reserve (spaces, no newline).
// Opened by this build, such a log reads as its records, an in-process
// Enqueue appends after the padding, and Prune still removes the log once
// all its envelopes are pruned, padding and all.
func TestOldReserve_ReadAppendedAndPruned(t *testing.T) {
	dir := t.TempDir()
	pad := func(user string, n int) {
		t.Helper()
		f, err := os.OpenFile(LogPath(dir, "", user), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(bytes.Repeat([]byte(" "), n)); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for _, user := range []string{"u1", "u2"} {
		if err := Append(dir, faultEnvelope("old-"+user, user)); err != nil {
			t.Fatal(err)
		}
		pad(user, 4000)
	}
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	q, err := Open(dir, &Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now }, Retention: time.Hour}, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	// u2's log gets a new record after its padding, in process and from
	// another process.
	if _, err := q.Enqueue(ctx, faultEnvelope("new-u2", "u2")); err != nil {
		t.Fatal(err)
	}
	if err := Append(dir, faultEnvelope("foreign-u2", "u2")); err != nil {
		t.Fatal(err)
	}
	if err := q.catchUpAll(false); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"old-u1", "old-u2", "new-u2", "foreign-u2"} {
		if _, err := q.Get(ctx, "", id); err != nil {
			t.Fatalf("Get(%s): %v", id, err)
		}
	}
	if n := rows(t, q); n != 4 {
		t.Fatalf("%d rows, want 4", n)
	}
	if qr, err := q.Quarantined(); err != nil || len(qr) != 0 {
		t.Fatalf("quarantined %+v, %v; want nothing", qr, err)
	}
	b, err := os.ReadFile(LogPath(dir, "", "u2"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := applog.Lines(b, 0); len(lines) != 3 {
		t.Fatalf("u2's log reads as %d lines, want 3: %q", len(lines), b)
	}
	for {
		l, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(l) == 0 {
			break
		}
		for _, lease := range l {
			if err := q.Commit(ctx, lease, queue.Outcome{State: envelope.StateSent}); err != nil {
				t.Fatal(err)
			}
		}
	}
	now = now.Add(2 * time.Hour)
	if n, err := q.Prune(ctx); err != nil || n != 4 {
		t.Fatalf("Prune = %d, %v; want 4", n, err)
	}
	for _, user := range []string{"u1", "u2"} {
		if _, err := os.Stat(LogPath(dir, "", user)); !os.IsNotExist(err) {
			t.Fatalf("%s's log still there after its last envelope was pruned (stat: %v)", user, err)
		}
	}
	// A record appended past the indexed offset keeps the log.
	if _, err := q.Enqueue(ctx, faultEnvelope("b", "u1")); err != nil {
		t.Fatal(err)
	}
	var rel = applog.RelPath(envelope.DefaultTenant, "u1")
	q.barrier() // its catch-up reads the log, and learns its tail, first
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
	q, err := Open(dir, &Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, DisableWatcher: true, RescanInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	scanned, _ := tailSignals(q)
	select {
	case <-scanned:
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
	q, err := Open(dir, &Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, DisableWatcher: true, RescanInterval: time.Millisecond})
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
	// A bound on liveness, not a speed check: rescans back off in
	// proportion to how long they take, which a loaded machine stretches
	// (it failed once at 30 s with a load average of 20).
	deadline := time.Now().Add(2 * time.Minute)
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

// tailSignals returns channels (buffer 1, coalesced) signalled by the
// tailer's hooks: a catch-up pass finished, an event for a settled log was
// ignored.
func tailSignals(q *Queue) (scanned, settled chan struct{}) {
	scanned, settled = make(chan struct{}, 1), make(chan struct{}, 1)
	signal := func(c chan struct{}) func() {
		return func() {
			select {
			case c <- struct{}{}:
			default:
			}
		}
	}
	q.tail.hooks.Store(&tailHooks{scanned: signal(scanned), settled: signal(settled)})
	return scanned, settled
}
