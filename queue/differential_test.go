package queue_test

import (
	"testing"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// TestDifferential runs the in-memory store and the file store side by
// side against the reference model of the contract (queuetest.Differential).
// make test runs a small fixed budget of seeds; a long run:
//
//	OUTBOX_DIFF_SEEDS=2000 OUTBOX_DIFF_STEPS=120 go test -run '^TestDifferential$' ./queue/
func TestDifferential(t *testing.T) {
	queuetest.Differential(t, queuetest.DiffConfig{
		Stores: []queuetest.DiffStore{
			{Name: "memstore", Harness: queuetest.Harness{
				Open: func(t testing.TB, opts *queue.Options) queue.Store { return memstore.New(opts) },
			}},
			{Name: "file", Harness: fileHarness(func(o *queue.Options) { o.NoSync = true })},
		},
		Seeds: 40,
		Steps: 60,
	})
}

// fileHarness opens the file store in a fresh directory, with mod applied
// to the options (Reopen closes it and opens the same directory again).
func fileHarness(mod func(*queue.Options)) queuetest.Harness {
	with := func(opts *queue.Options) *queue.Options {
		var o queue.Options
		if opts != nil {
			o = *opts
		}
		if mod != nil {
			mod(&o)
		}
		return &o
	}
	return queuetest.Harness{
		Open: func(t testing.TB, opts *queue.Options) queue.Store {
			return mustOpen(t, t.TempDir(), with(opts))
		},
		Reopen: func(t testing.TB, s queue.Store, opts *queue.Options) queue.Store {
			q := s.(*queue.Queue)
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			return mustOpen(t, q.Dir(), with(opts))
		},
	}
}
