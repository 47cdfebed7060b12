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

var quiet = &filestore.Options{DisableWatcher: true, RescanInterval: -1}

// deliverAll claims every due row of q and commits it sent.
func deliverAll(t *testing.T, q *filestore.Queue) int {
	t.Helper()
	ctx := context.Background()
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent}); err != nil {
			t.Fatal(err)
		}
	}
	return len(ls)
}

func enqueueN(t *testing.T, q *filestore.Queue, prefix string, n int) {
	t.Helper()
	for i := range n {
		if _, err := q.Enqueue(context.Background(), queuetest.Reply(fmt.Sprintf("%s%d", prefix, i), "u-1", "hi")); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(to+".tmp", to); err != nil {
		t.Fatal(err)
	}
}

// An older copy of index.db put back (a restore from last night's backup)
// is refused at Open: accepted, the rows it still has pending, and the
// records logged after it, would be delivered again although they were
// sent since. outbox doctor --rebuild makes them unresolved instead.
func TestOpen_RefusesAnIndexRestoredFromABackup(t *testing.T) {
	dir := t.TempDir()
	index := filepath.Join(dir, filestore.IndexFile)
	q := mustOpen(t, dir, quiet)
	enqueueN(t, q, "old", 3)
	q.Close()
	saved, err := os.ReadFile(index) // last night's backup
	if err != nil {
		t.Fatal(err)
	}

	q = mustOpen(t, dir, quiet)
	enqueueN(t, q, "new", 2)
	if n := deliverAll(t, q); n != 5 {
		t.Fatalf("delivered %d, want 5", n)
	}
	q.Close()

	if err := os.WriteFile(index+".restore", saved, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(index+".restore", index); err != nil {
		t.Fatal(err)
	}
	_, err = filestore.Open(dir, quiet)
	var se *filestore.StaleIndexError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "older than the one this store last used") || !strings.Contains(err.Error(), "outbox doctor --rebuild") {
		t.Fatalf("Open of a restored index = %v, want a *StaleIndexError naming outbox doctor --rebuild", err)
	}
	if rep, err := filestore.Check(dir); err != nil || rep.OK() || !strings.HasPrefix(rep.Problems[0], "index is older than the one this store last used") {
		t.Errorf("Check of a restored index = %+v, %v; want it reported, as Open refuses it", rep, err)
	}
	if _, err := filestore.Rebuild(dir, nil); err != nil {
		t.Fatal(err)
	}
	q = mustOpen(t, dir, quiet)
	if n := deliverAll(t, q); n != 0 {
		t.Errorf("after the rebuild %d rows were claimable again; every one was sent", n)
	}
	c, err := q.Counts(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Total(envelope.StateUnresolved); got != 5 {
		t.Errorf("after the rebuild %d rows unresolved, want the 5 of unknown fate (%v)", got, c)
	}
}

// Another store's index moved in is refused; a torn or missing mark
// refuses nothing (and is written again); a compaction, an Erase's rewrite
// and a rebuild keep the index accepted.
func TestOpen_IndexMark(t *testing.T) {
	ctx := context.Background()
	t.Run("another store's index", func(t *testing.T) {
		a, b := t.TempDir(), t.TempDir()
		for _, dir := range []string{a, b} {
			q := mustOpen(t, dir, quiet)
			enqueueN(t, q, "r", 2)
			q.Close()
		}
		copyFile(t, filepath.Join(b, filestore.IndexFile), filepath.Join(a, filestore.IndexFile))
		_, err := filestore.Open(a, quiet)
		var se *filestore.StaleIndexError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "not the index this store last used") {
			t.Fatalf("Open with another store's index = %v", err)
		}
	})
	t.Run("torn or missing mark", func(t *testing.T) {
		dir := t.TempDir()
		q := mustOpen(t, dir, quiet)
		enqueueN(t, q, "r", 2)
		q.Close()
		mark := filepath.Join(dir, filestore.MarkFile)
		for _, content := range []string{"outbox index 12", ""} {
			if content == "" {
				if err := os.Remove(mark); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(mark, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			q := mustOpen(t, dir, quiet)
			q.Close()
			if b, err := os.ReadFile(mark); err != nil || !strings.HasPrefix(string(b), "outbox index ") || len(b) < 40 {
				t.Fatalf("the mark after Open: %q, %v", b, err)
			}
		}
	})
	t.Run("backup from before a compaction", func(t *testing.T) {
		dir := t.TempDir()
		index := filepath.Join(dir, filestore.IndexFile)
		q := mustOpen(t, dir, quiet)
		enqueueN(t, q, "old", 3)
		q.Close()
		saved, err := os.ReadFile(index)
		if err != nil {
			t.Fatal(err)
		}
		q = mustOpen(t, dir, quiet)
		deliverAll(t, q)
		q.Close()
		if _, _, err := filestore.CompactFile(dir); err != nil { // a new file: its transaction ids start again
			t.Fatal(err)
		}
		if err := os.WriteFile(index, saved, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = filestore.Open(dir, quiet)
		var se *filestore.StaleIndexError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "file generation 1 of 2") {
			t.Fatalf("Open of a copy from before the compaction = %v", err)
		}
	})
	t.Run("a swap cut short", func(t *testing.T) {
		// The mark names the generation coming before the new file is
		// renamed in: a kill before the rename leaves the old file, one
		// after it the new file with the mark not yet updated. Both open.
		dir := t.TempDir()
		q := mustOpen(t, dir, quiet)
		enqueueN(t, q, "r", 2)
		q.Close()
		path := filepath.Join(dir, filestore.MarkFile)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(strings.TrimPrefix(string(b), "outbox index "))
		if len(f) != 4 {
			t.Fatalf("mark %q", b)
		}
		var gen, txid uint64
		fmt.Sscan(f[1], &gen)
		fmt.Sscan(f[2], &txid)
		write := func(gen, txid, next uint64) {
			if err := os.WriteFile(path, fmt.Appendf(nil, "outbox index %s %020d %020d %020d\n", f[0], gen, txid, next), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write(gen, txid, gen+1) // killed before the rename
		mustOpen(t, dir, quiet).Close()
		if _, _, err := filestore.CompactFile(dir); err != nil { // the file of generation gen+1
			t.Fatal(err)
		}
		write(gen, txid+1000, gen+1) // killed after the rename, before the mark's update
		mustOpen(t, dir, quiet).Close()
		write(gen+1, txid+1000, 0) // but an index behind its mark is refused
		var se *filestore.StaleIndexError
		if _, err := filestore.Open(dir, quiet); !errors.As(err, &se) {
			t.Fatalf("Open of an index behind its mark = %v", err)
		}
	})
	t.Run("compaction, erase and rebuild", func(t *testing.T) {
		dir := t.TempDir()
		q := mustOpen(t, dir, quiet)
		enqueueN(t, q, "r", 3)
		if _, err := q.Enqueue(ctx, queuetest.Reply("gone", "u-2", "hi")); err != nil {
			t.Fatal(err)
		}
		deliverAll(t, q)
		if err := q.Erase(ctx, envelope.DefaultTenant, "u-2"); err != nil { // rewrites the index under the running store
			t.Fatal(err)
		}
		enqueueN(t, q, "after", 1)
		q.Close()
		q = mustOpen(t, dir, quiet)
		q.Close()
		if _, _, err := filestore.CompactFile(dir); err != nil {
			t.Fatal(err)
		}
		q = mustOpen(t, dir, quiet)
		q.Close()
		if _, err := filestore.Rebuild(dir, nil); err != nil {
			t.Fatal(err)
		}
		q = mustOpen(t, dir, quiet)
		if _, err := q.Get(ctx, envelope.DefaultTenant, "after0"); err != nil {
			t.Errorf("after0 after compaction and rebuild: %v", err)
		}
	})
}
