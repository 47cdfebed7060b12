package pgstore_test

import (
	"testing"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// TestDifferential runs the PostgreSQL store beside the in-memory one
// against the reference model (queuetest.Differential); make diff runs it
// longer (OUTBOX_DIFF_SEEDS, OUTBOX_DIFF_STEPS).
func TestDifferential(t *testing.T) {
	queuetest.Differential(t, queuetest.DiffConfig{
		Stores: []queuetest.DiffStore{
			{Name: "memstore", Harness: queuetest.Harness{
				Open: func(t testing.TB, opts *queue.Options) queue.Store { return memstore.New(opts) },
			}},
			{Name: "postgres", Harness: harness()},
		},
		Seeds: 16,
		Steps: 60,
	})
}
