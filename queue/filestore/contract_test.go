package filestore_test

import (
	"testing"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// TestQueue_Contract runs the shared contract suite on the file-backed
// store. It runs in the relaxed durability mode to keep the suite fast:
// fsync changes no semantics here, and durability has its own tests below
// (the crash test, the torn-line and restart tests).
func TestQueue_Contract(t *testing.T) {
	relaxed := func(opts *queue.Options) *filestore.Options {
		o := filestore.Options{NoSync: true}
		if opts != nil {
			o.Options = *opts
		}
		return &o
	}
	queuetest.Exercise(t, queuetest.Harness{
		Open: func(t testing.TB, opts *queue.Options) queue.Store {
			return mustOpen(t, t.TempDir(), relaxed(opts))
		},
		Reopen: func(t testing.TB, s queue.Store, opts *queue.Options) queue.Store {
			q := s.(*filestore.Queue)
			dir := q.Dir()
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			return mustOpen(t, dir, relaxed(opts))
		},
	})
}
