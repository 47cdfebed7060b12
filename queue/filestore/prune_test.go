package filestore_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// pruneOptions open a store whose clock is 48 hours ahead, with an hour's
// retention: every terminal row is past it.
func pruneOptions() *filestore.Options {
	return &filestore.Options{
		Options:        queue.Options{Now: func() time.Time { return time.Now().Add(48 * time.Hour) }, Retention: time.Hour},
		DisableWatcher: true, RescanInterval: -1,
	}
}

// A process killed during Prune, at each point between its index
// transaction and the removal of the logs it emptied, never leaves logs
// that a later Prune cannot remove (issue K, item 9): the next Prune
// removes them, keeps the logs that still hold envelopes, and the store is
// consistent.
func TestPrune_KilledLeavesNoLogBehind(t *testing.T) {
	for _, point := range []string{"prune-removed", "prune-committed"} {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			q := mustOpen(t, dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
			ctx := context.Background()
			for _, e := range []*envelope.Envelope{
				queuetest.Reply("p-a1", "done-a", "hi"), queuetest.Reply("p-a2", "done-a", "hi"),
				queuetest.Reply("p-b1", "done-b", "hi"), queuetest.Reply("p-k1", "kept", "hi"),
			} {
				if _, err := q.Enqueue(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 10})
			if err != nil || len(ls) != 4 {
				t.Fatalf("claimed %d, %v", len(ls), err)
			}
			for _, l := range ls {
				if l.UserID == "kept" {
					continue // stays leased: not terminal
				}
				if err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: "m"}); err != nil {
					t.Fatal(err)
				}
			}
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			cmd := child(t, "prune-killed", dir, point)
			err = cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the child was not killed at %s: %v", point, err)
			}
			q = mustOpen(t, dir, pruneOptions())
			if _, err := q.Prune(ctx); err != nil {
				t.Fatal(err)
			}
			for _, u := range []string{"done-a", "done-b"} {
				if _, err := os.Lstat(filestore.LogPath(dir, "", u)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s's log is still there after the next Prune (%v)", u, err)
				}
			}
			if _, err := os.Lstat(filestore.LogPath(dir, "", "kept")); err != nil {
				t.Errorf("the log that holds an envelope was removed: %v", err)
			}
			if _, err := q.Get(ctx, "", "p-k1"); err != nil {
				t.Error(err)
			}
			for _, id := range []string{"p-a1", "p-b1"} {
				if _, err := q.Get(ctx, "", id); !errors.Is(err, queue.ErrNotFound) {
					t.Errorf("%s after the prunes: %v", id, err)
				}
			}
			if rep, err := q.Check(); err != nil || !rep.OK() {
				t.Fatalf("Check: %+v, %v", rep, err)
			}
		})
	}
}
