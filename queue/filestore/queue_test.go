package filestore_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// TestMain lets tests re-execute this binary as a child process (a foreign
// appender, a process that is killed mid-write).
func TestMain(m *testing.M) {
	if mode := os.Getenv("OUTBOX_TEST_CHILD"); mode != "" {
		os.Exit(runChild(mode, os.Getenv("OUTBOX_TEST_DIR"), os.Getenv("OUTBOX_TEST_ARG")))
	}
	goleak.VerifyTestMain(m) // the writer and the tailer end with Close
}

func child(t testing.TB, mode, dir, arg string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "OUTBOX_TEST_CHILD="+mode, "OUTBOX_TEST_DIR="+dir, "OUTBOX_TEST_ARG="+arg)
	cmd.Stderr = os.Stderr
	return cmd
}

func runChild(mode, dir, arg string) int {
	switch mode {
	case "journal-crash":
		return journalCrash(dir)
	case "append": // arg: "prefix:count:users"
		parts := strings.Split(arg, ":")
		n, _ := strconv.Atoi(parts[1])
		users, _ := strconv.Atoi(parts[2])
		for i := 0; i < n; i++ {
			e := queuetest.Reply(fmt.Sprintf("%s-%d", parts[0], i), fmt.Sprintf("u%d", i%users), "hello")
			if err := filestore.Append(dir, e); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return 0
	case "prune-killed", "compact-killed": // prune 48 hours from now (compact: logs rewritten from 1 KiB), killed at fault point arg
		filestore.KillAt(arg)
		o := pruneOptions()
		if mode == "compact-killed" {
			o.LogRewriteMin = 1024
		}
		q, err := filestore.Open(dir, o)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := q.Prune(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 3 // never killed
	case "open-count": // open, print how many envelopes are pending, close
		q, err := filestore.Open(dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer q.Close()
		c, err := q.Counts(context.Background(), "")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(c.Total(envelope.StatePending))
		return 0
	case "index-cut": // arg: "read" or "write", the first call after index.db is emptied
		return indexCut(dir, arg)
	case "enqueue-loop": // enqueue until killed; print each acknowledged id
		q, err := filestore.Open(dir, &filestore.Options{RescanInterval: -1})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		w := bufio.NewWriter(os.Stdout)
		for i := 0; ; i++ {
			id := fmt.Sprintf("%s-%d", arg, i)
			e := queuetest.Reply(id, fmt.Sprintf("u%d", i%7), "hi")
			if _, err := q.Enqueue(context.Background(), e); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			fmt.Fprintln(w, id)
			w.Flush()
		}
	}
	return 2
}

func mustOpen(t testing.TB, dir string, opts *filestore.Options) *filestore.Queue {
	t.Helper()
	q, err := filestore.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

func TestQueue_StoreInUse(t *testing.T) {
	dir := t.TempDir()
	mustOpen(t, dir, nil)
	_, err := filestore.Open(dir, &filestore.Options{LockTimeout: 50 * time.Millisecond})
	var inUse *filestore.StoreInUseError
	if !errors.As(err, &inUse) {
		t.Fatalf("second Open: %v, want *StoreInUseError", err)
	}
	if inUse.PID != os.Getpid() || !strings.Contains(err.Error(), "in use by pid") {
		t.Fatalf("error %q does not name the holder", err)
	}
}

func TestQueue_CloseIdempotent(t *testing.T) {
	q := mustOpen(t, t.TempDir(), nil)
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(context.Background(), queuetest.Reply("a", "u", "x")); !errors.Is(err, queue.ErrClosed) {
		t.Fatalf("Enqueue after Close: %v", err)
	}
}

// waitFor waits for cond, re-checking whenever the store notifies, with a
// generous bound so that a broken wake-up fails instead of hanging.
func waitFor(t testing.TB, q *filestore.Queue, cond func() bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-q.Notify():
		case <-time.After(100 * time.Millisecond):
			// fall through to re-check; fsnotify is a hint, not a promise
		case <-deadline:
			t.Fatal("condition not reached")
		}
	}
}

func total(t testing.TB, q queue.Store) int {
	t.Helper()
	c, err := q.Counts(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for s := range c {
		n += c.Total(s)
	}
	return n
}

func TestQueue_ForeignAppend(t *testing.T) {
	dir := t.TempDir()
	q := mustOpen(t, dir, &filestore.Options{RescanInterval: -1})
	cmd := child(t, "append", dir, "ext:1:1")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, q, func() bool {
		_, err := q.Get(context.Background(), "", "ext-0")
		return err == nil
	})
	leases, err := q.Claim(context.Background(), queue.ClaimRequest{Owner: "t", Lease: time.Minute})
	if err != nil || len(leases) != 1 || leases[0].Key.EnvelopeID != "ext-0" {
		t.Fatalf("claim = %v, %v", leases, err)
	}
}

func TestQueue_ConcurrentForeignAppenders(t *testing.T) {
	dir := t.TempDir()
	q := mustOpen(t, dir, nil)
	var cmds []*exec.Cmd
	for p := 0; p < 4; p++ {
		c := child(t, "append", dir, fmt.Sprintf("p%d:250:100", p))
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
	}
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	q.Rescan()
	waitFor(t, q, func() bool { return total(t, q) >= 1000 })
	if n := total(t, q); n != 1000 {
		t.Fatalf("rows = %d, want 1000", n)
	}
	for p := 0; p < 4; p++ {
		for i := 0; i < 250; i += 37 {
			if _, err := q.Get(context.Background(), "", fmt.Sprintf("p%d-%d", p, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestQueue_RescanWithoutWatcher(t *testing.T) {
	dir := t.TempDir()
	q := mustOpen(t, dir, &filestore.Options{DisableWatcher: true, RescanInterval: 20 * time.Millisecond})
	if err := filestore.Append(dir, queuetest.Reply("r1", "u", "x")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, q, func() bool { return total(t, q) == 1 })
}

func TestQueue_DuplicateAppendedTwice(t *testing.T) {
	dir := t.TempDir()
	e := queuetest.Reply("same", "u", "x")
	for i := 0; i < 2; i++ {
		if err := filestore.Append(dir, e); err != nil {
			t.Fatal(err)
		}
	}
	q := mustOpen(t, dir, nil)
	if n := total(t, q); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}
	res, err := q.Enqueue(context.Background(), e)
	if err != nil || !res[0].Duplicate {
		t.Fatalf("enqueue again = %+v, %v", res, err)
	}
}

func TestQueue_TornLineThenCompleted(t *testing.T) {
	dir := t.TempDir()
	good := queuetest.Reply("g", "u", "x")
	torn := queuetest.Reply("t", "u", "y")
	if err := filestore.Append(dir, good); err != nil {
		t.Fatal(err)
	}
	path := filestore.LogPath(dir, "", "u")
	line, _ := json.Marshal(torn)
	half, rest := line[:len(line)/2], append(line[len(line)/2:], '\n')
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(half)
	f.Close()

	q := mustOpen(t, dir, nil)
	if n := total(t, q); n != 1 {
		t.Fatalf("rows with a torn tail = %d, want 1", n)
	}
	if _, err := q.Get(context.Background(), "", "t"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("torn record visible: %v", err)
	}
	q.Close()

	// The writer completes its line: it is indexed like any other.
	f, _ = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(rest)
	f.Close()
	q = mustOpen(t, dir, nil)
	if _, err := q.Get(context.Background(), "", "t"); err != nil {
		t.Fatalf("completed record: %v", err)
	}
	if qr, _ := q.Quarantined(); len(qr) != 0 {
		t.Fatalf("quarantined: %+v", qr)
	}
}

func TestQueue_CorruptMiddleLineQuarantined(t *testing.T) {
	dir := t.TempDir()
	if err := filestore.Append(dir, queuetest.Reply("a", "u", "x")); err != nil {
		t.Fatal(err)
	}
	path := filestore.LogPath(dir, "", "u")
	fi, _ := os.Stat(path)
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"schema_version":"1","id":"bad","secret":"CANARY-BODY"}` + "\n")
	f.Close()
	if err := filestore.Append(dir, queuetest.Reply("b", "u", "x")); err != nil {
		t.Fatal(err)
	}
	q := mustOpen(t, dir, nil)
	if n := total(t, q); n != 2 {
		t.Fatalf("rows = %d, want 2", n)
	}
	qr, err := q.Quarantined()
	if err != nil || len(qr) != 1 {
		t.Fatalf("quarantine = %+v, %v", qr, err)
	}
	if qr[0].Offset != fi.Size() || strings.Contains(qr[0].Reason, "CANARY") || qr[0].Reason == "" {
		t.Fatalf("quarantine record %+v (want offset %d, a reason without content)", qr[0], fi.Size())
	}
}

func TestQueue_RestartRecoversOldLeases(t *testing.T) {
	dir := t.TempDir()
	clock := queuetest.NewClock(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	opts := &filestore.Options{Options: queue.Options{Now: clock.Now}}
	q := mustOpen(t, dir, opts)
	if _, err := q.Enqueue(context.Background(), queuetest.Reply("r", "u", "x")); err != nil {
		t.Fatal(err)
	}
	l, err := q.Claim(context.Background(), queue.ClaimRequest{Owner: "dead", Lease: time.Hour})
	if err != nil || len(l) != 1 {
		t.Fatal(l, err)
	}
	q.Close()
	q = mustOpen(t, dir, opts)
	if rec, err := q.Recover(context.Background(), queue.ClaimRequest{Owner: "new", Lease: time.Minute, Limit: 10}); err != nil || len(rec) != 0 {
		t.Fatalf("recover before the old lease expired = %+v, %v", rec, err)
	}
	clock.Advance(time.Hour + time.Second)
	rec, err := q.Recover(context.Background(), queue.ClaimRequest{Owner: "new", Lease: time.Minute, Limit: 10})
	if err != nil || len(rec) != 1 || rec[0].Fence <= l[0].Fence {
		t.Fatalf("recover after restart = %+v, %v", rec, err)
	}
	if err := q.Commit(context.Background(), l[0], queue.Outcome{State: envelope.StateSent}); !errors.Is(err, queue.ErrStaleFence) {
		t.Fatalf("old lease commit: %v", err)
	}
}

// TestQueue_CrashDuringEnqueue kills a child that enqueues in a loop at
// random moments and checks that every acknowledged enqueue survived,
// exactly once, and that the store opens cleanly each time.
func TestQueue_CrashDuringEnqueue(t *testing.T) {
	dir := t.TempDir()
	kills := 20
	if testing.Short() {
		kills = 5
	}
	var acked []string
	for k := 0; k < kills; k++ {
		cmd := child(t, "enqueue-loop", dir, fmt.Sprintf("k%d", k))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		want := 1 + rand.IntN(200)
		for i := 0; i < want && sc.Scan(); i++ {
			acked = append(acked, sc.Text())
		}
		cmd.Process.Signal(syscall.SIGKILL)
		for sc.Scan() { // ids acknowledged before the kill landed
			acked = append(acked, sc.Text())
		}
		cmd.Wait()
	}
	q := mustOpen(t, dir, nil)
	for _, id := range acked {
		st, err := q.Get(context.Background(), "", id)
		if err != nil {
			t.Fatalf("acknowledged %s lost: %v", id, err)
		}
		if len(st.Segments) != 1 {
			t.Fatalf("%s has %d rows", id, len(st.Segments))
		}
	}
	if n := total(t, q); n < len(acked) {
		t.Fatalf("rows %d < acknowledged %d", n, len(acked))
	}
	t.Logf("%d kills, %d acknowledged enqueues, %d rows", kills, len(acked), total(t, q))
	_ = filepath.Join
}

// Concurrent enqueues to one log share appends (group commit); each caller
// must still read its own write at once, and nothing is indexed twice.
func TestQueue_ConcurrentEnqueueReadYourWrites(t *testing.T) {
	q := mustOpen(t, t.TempDir(), &filestore.Options{RescanInterval: -1})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for p := 0; p < 16; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				id := fmt.Sprintf("p%d-%d", p, i)
				if _, err := q.Enqueue(ctx, queuetest.Reply(id, "same-user", "hi")); err != nil {
					errs <- err
					return
				}
				if _, err := q.Get(ctx, "", id); err != nil {
					errs <- fmt.Errorf("%s not readable right after Enqueue returned: %w", id, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := total(t, q); n != 640 {
		t.Fatalf("rows = %d, want 640", n)
	}
	if qr, _ := q.Quarantined(); len(qr) != 0 {
		t.Fatalf("quarantined: %+v", qr)
	}
}
