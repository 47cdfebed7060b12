package filestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// indexCut (a child process) enqueues 20 envelopes, empties index.db
// under the open store as an operator's "> index.db" would, and makes one
// call: it must fail with a *CorruptIndexError, not kill the process, and
// every call after it must fail too.
func indexCut(dir, first string) int {
	ctx := context.Background()
	q, err := filestore.Open(dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer q.Close()
	for i := range 20 {
		if _, err := q.Enqueue(ctx, queuetest.Reply(fmt.Sprintf("r%d", i), fmt.Sprintf("u%d", i%3), "hi")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if _, err := q.Get(ctx, "", "r19"); err != nil { // the index has them
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.Truncate(filepath.Join(dir, filestore.IndexFile), 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var calls []func() error
	read := func() error { _, err := q.Counts(ctx, ""); return err }
	write := func() error {
		_, err := q.Enqueue(ctx, queuetest.Reply("late", "u9", "hi"))
		if err != nil {
			return err
		}
		// The append is acknowledged before its index update; the
		// claim after it is a write of the index.
		_, err = q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: 60e9, Limit: 5})
		return err
	}
	if first == "read" {
		calls = []func() error{read, write}
	} else {
		calls = []func() error{write, read}
	}
	for i, call := range calls {
		err := call()
		var ce *filestore.CorruptIndexError
		if !errors.As(err, &ce) {
			fmt.Fprintf(os.Stderr, "call %d after the cut: %v, want a *CorruptIndexError\n", i, err)
			return 1
		}
		if !strings.Contains(err.Error(), "outbox doctor --rebuild") {
			fmt.Fprintf(os.Stderr, "call %d: %v does not point at outbox doctor\n", i, err)
			return 1
		}
	}
	select {
	case <-q.Damaged():
	default:
		fmt.Fprintln(os.Stderr, "Damaged is not closed")
		return 1
	}
	if q.DamageError() == nil {
		fmt.Fprintln(os.Stderr, "DamageError is nil")
		return 1
	}
	return 0
}

// An index emptied under a running store fails its calls with a clear
// error instead of killing the process (SIGBUS from the memory map, or a
// bbolt assertion on pages of zeros), and the logs rebuild everything.
func TestIndexCutUnderRunningStore(t *testing.T) {
	for _, first := range []string{"read", "write"} {
		t.Run(first, func(t *testing.T) {
			dir := t.TempDir()
			out, err := child(t, "index-cut", dir, first).Output()
			if err != nil {
				t.Fatalf("the child: %v (stdout %q)", err, out)
			}
			if _, err := filestore.Open(dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1}); err == nil || !strings.Contains(err.Error(), "doctor") {
				t.Fatalf("Open after the cut: %v, want a refusal that points at outbox doctor", err)
			}
			if _, err := filestore.Rebuild(dir, nil); err != nil {
				t.Fatal(err)
			}
			q := mustOpen(t, dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
			for i := range 20 {
				if _, err := q.Get(context.Background(), envelope.DefaultTenant, fmt.Sprintf("r%d", i)); err != nil {
					t.Errorf("r%d after the rebuild: %v", i, err)
				}
			}
		})
	}
}

// index.db removed or replaced (renamed over) under a running store, or
// the whole data directory removed: the store would go on writing to a
// file no one opens again. Within about a second it stops using it, as for
// a damaged index: Damaged closes, every call fails with a
// *CorruptIndexError that says what happened, and nothing more is
// acknowledged. The logs rebuild what is left.
func TestIndexRemovedUnderRunningStore(t *testing.T) {
	for _, fault := range []string{"removed", "replaced"} {
		t.Run(fault, func(t *testing.T) {
			ctx := context.Background()
			dir := filepath.Join(t.TempDir(), "data")
			q, err := filestore.Open(dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			for i := range 5 {
				if _, err := q.Enqueue(ctx, queuetest.Reply(fmt.Sprintf("r%d", i), "u-1", "hi")); err != nil {
					t.Fatal(err)
				}
			}
			index := filepath.Join(dir, filestore.IndexFile)
			reason := "the file was removed under the running store"
			switch fault {
			case "removed":
				err = os.Remove(index)
			case "replaced": // an older copy moved over it, as a restore would
				var b []byte
				if b, err = os.ReadFile(index); err == nil {
					if err = os.WriteFile(index+".copy", b, 0o600); err == nil {
						err = os.Rename(index+".copy", index)
					}
				}
				reason = "the file was replaced under the running store"
			}
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-q.Damaged():
			case <-time.After(10 * time.Second):
				t.Fatalf("the store still uses its index 10 s after it was %s", fault)
			}
			var ce *filestore.CorruptIndexError
			if err := q.DamageError(); !errors.As(err, &ce) || ce.Reason != reason || !strings.Contains(err.Error(), "outbox doctor --rebuild") {
				t.Fatalf("DamageError = %v, want %q", err, reason)
			}
			if _, err := q.Enqueue(ctx, queuetest.Reply("late", "u-1", "hi")); !errors.As(err, &ce) || !errors.Is(err, queue.ErrUnavailable) {
				t.Errorf("Enqueue after the index was %s = %v, want the damage, as queue.ErrUnavailable (503)", fault, err)
			}
			if _, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute}); !errors.As(err, &ce) {
				t.Errorf("Claim after the index was %s = %v, want the damage", fault, err)
			}
			q.Close()
			if _, err := filestore.Rebuild(dir, nil); err != nil {
				t.Fatal(err)
			}
			q = mustOpen(t, dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
			for i := range 5 {
				if _, err := q.Get(ctx, envelope.DefaultTenant, fmt.Sprintf("r%d", i)); err != nil {
					t.Errorf("r%d after the rebuild: %v", i, err)
				}
			}
			if _, err := q.Get(ctx, envelope.DefaultTenant, "late"); !errors.Is(err, queue.ErrNotFound) {
				t.Errorf("the refused envelope after the rebuild: %v", err)
			}
		})
	}
}

// TestDataDirMovedUnderRunningStore: the data directory renamed, removed,
// or renamed and replaced by an empty one, under the open store. An
// enqueue for a user whose log is not open yet must fail as the store's
// damage (503), never create logs at the old path (a second, index-less
// store there, with acknowledged records in it); the periodic check stops
// the store too. A moved directory holds everything acknowledged: opened
// where it is now, it has every envelope.
func TestDataDirMovedUnderRunningStore(t *testing.T) {
	for _, fault := range []string{"moved", "moved-replaced", "removed", "moved-claim"} {
		t.Run(fault, func(t *testing.T) {
			ctx := context.Background()
			base := t.TempDir()
			dir := filepath.Join(base, "data")
			q, err := filestore.Open(dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			for i := range 3 {
				if _, err := q.Enqueue(ctx, queuetest.Reply(fmt.Sprintf("r%d", i), "u-1", "hi")); err != nil {
					t.Fatal(err)
				}
			}
			moved := filepath.Join(base, "data.old")
			switch fault {
			case "moved", "moved-claim":
				err = os.Rename(dir, moved)
			case "moved-replaced":
				if err = os.Rename(dir, moved); err == nil {
					err = os.Mkdir(dir, 0o700)
				}
			case "removed":
				err = os.RemoveAll(dir)
			}
			if err != nil {
				t.Fatal(err)
			}
			if fault == "moved-claim" {
				// A claim finds the logs missing: the store's damage, never
				// the records lost (dead_letter record_lost).
				_, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 3})
				var me *filestore.DirMovedError
				if !errors.As(err, &me) || !errors.Is(err, queue.ErrUnavailable) {
					t.Fatalf("Claim after the data directory moved = %v, want a *DirMovedError", err)
				}
			}
			for _, user := range []string{"u-new", "u-1"} {
				_, err := q.Enqueue(ctx, queuetest.Reply("late-"+user, user, "hi"))
				var me *filestore.DirMovedError
				if !errors.As(err, &me) || !errors.Is(err, queue.ErrUnavailable) {
					t.Fatalf("Enqueue for %s after the data directory was %s = %v, want a *DirMovedError, as queue.ErrUnavailable (503)", user, fault, err)
				}
				want := ""
				if fault != "removed" {
					want = moved
				}
				if me.Path != dir || me.Now != want {
					t.Errorf("DirMovedError = %+v, want Path %s, Now %q", me, dir, want)
				}
				if want != "" && !strings.Contains(err.Error(), "moved to "+moved) {
					t.Errorf("the error does not say where the directory is now: %v", err)
				}
			}
			select {
			case <-q.Damaged():
			default:
				t.Fatal("Damaged is not closed")
			}
			var left []string
			_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if p != dir {
					left = append(left, p)
				}
				return nil
			})
			if _, err := os.Stat(dir); fault != "moved-replaced" && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the data directory's old path exists again: %v %v", err, left)
			}
			if len(left) > 0 {
				t.Errorf("the store wrote at the old path: %v", left)
			}
			q.Close()
			if fault == "removed" {
				return
			}
			q = mustOpen(t, moved, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
			for i := range 3 {
				got, err := q.Get(ctx, envelope.DefaultTenant, fmt.Sprintf("r%d", i))
				if err != nil {
					t.Errorf("r%d, opened where the directory is now: %v", i, err)
				} else if st := got.Status; st != string(envelope.StatePending) {
					t.Errorf("r%d, opened where the directory is now, is %s, want pending", i, st)
				}
			}
		})
	}
}

// TestDataDirMovedCheck: the periodic check (the tailer's) stops a store
// whose data directory moved while nothing was enqueued.
func TestDataDirMovedCheck(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "data")
	q := mustOpen(t, dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	defer q.Close()
	if err := os.Rename(dir, filepath.Join(base, "elsewhere")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-q.Damaged():
	case <-time.After(10 * time.Second):
		t.Fatal("the store runs on 10 s after its data directory moved")
	}
	var me *filestore.DirMovedError
	if err := q.DamageError(); !errors.As(err, &me) || me.Now != filepath.Join(base, "elsewhere") {
		t.Fatalf("DamageError = %v, want the move, naming where the directory is", err)
	}
}
