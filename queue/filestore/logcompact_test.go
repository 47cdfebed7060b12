package filestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// sendAll claims every due row and commits it sent, except the envelopes
// whose id starts with "keep-", whose leases are given back.
func sendAll(t *testing.T, q *filestore.Queue) {
	t.Helper()
	ctx := context.Background()
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if strings.HasPrefix(l.Key.EnvelopeID, "keep-") {
			err = q.Release(ctx, l)
		} else {
			err = q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: "m"})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// wantIntact checks that the envelope id is indexed with its own record.
func wantIntact(t *testing.T, q *filestore.Queue, id, text string) {
	t.Helper()
	st, err := q.Get(context.Background(), "", id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	if st.Envelope == nil || st.Envelope.ID != id || !strings.Contains(string(st.Envelope.Payload), text) {
		t.Fatalf("Get %s: the record read is %+v", id, st.Envelope)
	}
}

func logSize(t *testing.T, dir, user string) int64 {
	t.Helper()
	fi, err := os.Stat(filestore.LogPath(dir, "", user))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// A user who is never idle: every half hour 40 replies are enqueued and
// sent, with an hour's retention, and two envelopes of the first round stay
// pending throughout. Without rewrites their log would only grow (it is
// never emptied); with them it stays within a few rounds' size, every
// envelope still indexed reads its own record, and the store is
// consistent after each prune and after a restart.
func TestLogCompaction_AnActiveUsersLogStaysBounded(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := queuetest.NewClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	opts := &filestore.Options{Options: queue.Options{Now: clock.Now, Retention: time.Hour}, DisableWatcher: true, RescanInterval: -1, LogRewriteMin: 4096}
	q := mustOpen(t, dir, opts)
	pad := strings.Repeat("x", 200)
	for _, id := range []string{"keep-1", "keep-2"} {
		if _, err := q.Enqueue(ctx, queuetest.Reply(id, "busy", "kept "+id+" "+pad)); err != nil {
			t.Fatal(err)
		}
	}
	var round int64
	const rounds = 12
	for r := range rounds {
		for i := range 40 {
			id := fmt.Sprintf("r%02d-%02d", r, i)
			if _, err := q.Enqueue(ctx, queuetest.Reply(id, "busy", "text "+id+" "+pad)); err != nil {
				t.Fatal(err)
			}
		}
		if r == 0 {
			round = logSize(t, dir, "busy")
		}
		sendAll(t, q)
		clock.Advance(30 * time.Minute)
		if _, err := q.Prune(ctx); err != nil {
			t.Fatal(err)
		}
		if size := logSize(t, dir, "busy"); size > 5*round {
			t.Fatalf("round %d: the log holds %d bytes, more than 5 rounds' (%d): it is not rewritten", r, size, 5*round)
		}
		wantIntact(t, q, "keep-1", "kept keep-1")
		wantIntact(t, q, "keep-2", "kept keep-2")
		wantIntact(t, q, fmt.Sprintf("r%02d-07", r), fmt.Sprintf("text r%02d-07", r))
		if rep, err := q.Check(); err != nil || !rep.OK() {
			t.Fatalf("round %d: Check: %+v, %v", r, rep, err)
		}
	}
	if _, err := q.Get(ctx, "", "r00-07"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("r00-07 after its retention: %v, want pruned", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	// A foreign appender's record after the rewrites is indexed as new work.
	if err := filestore.Append(dir, queuetest.Reply("after", "busy", "appended "+pad)); err != nil {
		t.Fatal(err)
	}
	q = mustOpen(t, dir, opts)
	wantIntact(t, q, "after", "appended")
	wantIntact(t, q, "keep-1", "kept keep-1")
	c, err := q.Counts(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Total(envelope.StatePending); p != 3 {
		t.Errorf("%d pending after the restart, want 3 (the kept two and the appended one)", p)
	}
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 10})
	if err != nil || len(ls) != 3 {
		t.Fatalf("claimed %d, %v; want 3", len(ls), err)
	}
	for _, l := range ls {
		if l.Envelope == nil || l.Envelope.ID != l.Key.EnvelopeID {
			t.Errorf("lease of %s carries %+v", l.Key.EnvelopeID, l.Envelope)
		}
	}
	if rep, err := q.Check(); err != nil || !rep.OK() {
		t.Fatalf("Check after the restart: %+v, %v", rep, err)
	}
}

// A process killed while it rewrites a log, with the new file written but
// not renamed in, or renamed in before the index names its offsets: the
// next Open finds every envelope still indexed at its own record, leaves
// no rewrite behind, and a later prune rewrites the log.
func TestLogCompaction_KilledMidRewrite(t *testing.T) {
	for _, point := range []string{"log-compact-written", "log-compact-renamed"} {
		t.Run(point, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			q := mustOpen(t, dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
			pad := strings.Repeat("y", 100)
			for i := range 30 {
				id := fmt.Sprintf("d-%02d", i)
				if i%10 == 3 {
					id = fmt.Sprintf("keep-%02d", i)
				}
				if _, err := q.Enqueue(ctx, queuetest.Reply(id, "busy", "text "+id+" "+pad)); err != nil {
					t.Fatal(err)
				}
			}
			sendAll(t, q)
			before := logSize(t, dir, "busy")
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			err := child(t, "compact-killed", dir, point).Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the child was not killed at %s: %v", point, err)
			}
			q = mustOpen(t, dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
			for _, id := range []string{"keep-03", "keep-13", "keep-23"} {
				wantIntact(t, q, id, "text "+id)
			}
			if m, _ := filepath.Glob(filepath.Join(dir, "logs", "*", "*.compact")); len(m) != 0 {
				t.Errorf("rewrites left behind: %v", m)
			}
			if rep, err := q.Check(); err != nil || !rep.OK() {
				t.Fatalf("Check after the kill: %+v, %v", rep, err)
			}
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			o := pruneOptions()
			o.LogRewriteMin = 1024
			q = mustOpen(t, dir, o)
			if _, err := q.Prune(ctx); err != nil {
				t.Fatal(err)
			}
			if after := logSize(t, dir, "busy"); after*3 > before {
				t.Errorf("the log holds %d of its %d bytes after the next prune, want it rewritten", after, before)
			}
			for _, id := range []string{"keep-03", "keep-13", "keep-23"} {
				wantIntact(t, q, id, "text "+id)
			}
			if rep, err := q.Check(); err != nil || !rep.OK() {
				t.Fatalf("Check after the rewrite: %+v, %v", rep, err)
			}
		})
	}
}
