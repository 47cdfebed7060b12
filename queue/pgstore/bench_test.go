package pgstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

func benchStore(b *testing.B) *pgstore.Store {
	b.Helper()
	s, err := pgstore.Open(context.Background(), pgtest.DSN()+" pool_max_conns=16", &pgstore.Options{Schema: pgtest.Schema(b),
		Options: queue.Options{Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkEnqueue: one envelope per call, one producer.
func BenchmarkEnqueue(b *testing.B) {
	s, ctx := benchStore(b), context.Background()
	for i := range b.N {
		if _, err := s.Enqueue(ctx, queuetest.Reply(fmt.Sprint("r-", i), "u-1", "hi")); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnqueueParallel: one envelope per call, 16 producers.
func BenchmarkEnqueueParallel(b *testing.B) {
	s, ctx := benchStore(b), context.Background()
	var n atomic.Int64
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Enqueue(ctx, queuetest.Reply(fmt.Sprint("r-", n.Add(1)), "u-1", "hi")); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkClaimCommit: claim one row and commit it sent.
func BenchmarkClaimCommit(b *testing.B) {
	s, ctx := benchStore(b), context.Background()
	envs := make([]*envelope.Envelope, b.N)
	for i := range envs {
		envs[i] = queuetest.Reply(fmt.Sprint("r-", i), fmt.Sprint("u-", i%100), "hi")
	}
	for i := 0; i < len(envs); i += 1000 {
		if _, err := s.Enqueue(ctx, envs[i:min(i+1000, len(envs))]...); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		ls, err := s.Claim(ctx, queue.ClaimRequest{Owner: "bench", Lease: time.Minute})
		if err != nil || len(ls) != 1 {
			b.Fatalf("Claim = %v, %v", ls, err)
		}
		if err := s.Commit(ctx, ls[0], queue.Outcome{State: envelope.StateSent}); err != nil {
			b.Fatal(err)
		}
	}
}
