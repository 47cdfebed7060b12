package pgstore_test

import (
	"context"
	"testing"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// harness opens a store in a fresh schema; Reopen closes it and opens the
// same schema again.
func harness() queuetest.Harness {
	open := func(t testing.TB, schema string, opts *queue.Options) queue.Store {
		o := pgstore.Options{Schema: schema}
		if opts != nil {
			o.Options = *opts
		}
		s, err := pgstore.Open(context.Background(), pgtest.DSN(), &o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	return queuetest.Harness{
		Open: func(t testing.TB, opts *queue.Options) queue.Store { return open(t, pgtest.Schema(t), opts) },
		Reopen: func(t testing.TB, s queue.Store, opts *queue.Options) queue.Store {
			p := s.(*pgstore.Store)
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			return open(t, p.Schema(), opts)
		},
	}
}

func TestStore(t *testing.T) { queuetest.Exercise(t, harness()) }
