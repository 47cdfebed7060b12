package queuetest_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// TestDifferential runs every store side by side against the reference
// model of the contract (queuetest.Differential). make test runs a small
// fixed budget of seeds; make diff a long run.
func TestDifferential(t *testing.T) {
	queuetest.Differential(t, queuetest.DiffConfig{
		Stores: []queuetest.DiffStore{
			{Name: "memstore", Harness: queuetest.Harness{
				Open: func(t testing.TB, opts *queue.Options) queue.Store { return memstore.New(opts) },
			}},
			{Name: "file", Harness: fileHarness()},
		},
		Seeds: 40,
		Steps: 60,
	})
}

// fileHarness opens the file store (relaxed durability: fsync changes no
// semantics here) in a fresh directory; Reopen closes it and opens the
// same directory again.
func fileHarness() queuetest.Harness {
	open := func(t testing.TB, dir string, opts *queue.Options) queue.Store {
		// Logs are rewritten at every prune that leaves half of one dead.
		o := filestore.Options{NoSync: true, DisableWatcher: true, LogRewriteMin: 1}
		if opts != nil {
			o.Options = *opts
		}
		q, err := filestore.Open(dir, &o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { q.Close() })
		return q
	}
	return queuetest.Harness{
		Open: func(t testing.TB, opts *queue.Options) queue.Store { return open(t, t.TempDir(), opts) },
		Reopen: func(t testing.TB, s queue.Store, opts *queue.Options) queue.Store {
			q := s.(*filestore.Queue)
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			return open(t, q.Dir(), opts)
		},
		Rebuilt: func(t testing.TB, s queue.Store, opts *queue.Options) queue.Store {
			dir := t.TempDir()
			copyData(t, s.(*filestore.Queue).Dir(), dir)
			o := filestore.Options{NoSync: true}
			if opts != nil {
				o.Options = *opts
			}
			if _, err := filestore.Rebuild(dir, &o); err != nil {
				t.Fatal(err)
			}
			return open(t, dir, opts)
		},
	}
}

// copyData copies a data directory's logs and journal (what a rebuild
// reads), not its index.
func copyData(t testing.TB, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		switch {
		case d.IsDir():
			return os.MkdirAll(filepath.Join(to, rel), 0o700)
		case !d.Type().IsRegular() || rel == filestore.IndexFile:
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}
