package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

func TestStore(t *testing.T) {
	queuetest.Exercise(t, queuetest.Harness{
		Open: func(t testing.TB, opts *queue.Options) queue.Store { return memstore.New(opts) },
	})
}

// newStore returns a store on a test clock with deterministic backoff.
func newStore(t testing.TB, mod func(*queue.Options)) (*memstore.Store, *queuetest.Clock) {
	t.Helper()
	clock := queuetest.NewClock(queuetest.T0)
	opts := &queue.Options{
		Now:     clock.Now,
		Logger:  slog.New(slog.DiscardHandler),
		Backoff: queue.Backoff{NoJitter: true, Base: time.Second},
	}
	if mod != nil {
		mod(opts)
	}
	s := memstore.New(opts)
	t.Cleanup(func() { _ = s.Close() })
	return s, clock
}

func claimOne(t testing.TB, s queue.Store) *queue.Lease {
	t.Helper()
	ls, err := s.Claim(context.Background(), queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 10})
	if err != nil || len(ls) != 1 {
		t.Fatalf("Claim = %d leases, %v; want one", len(ls), err)
	}
	return ls[0]
}

func TestStore_NilArguments(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t, nil)
	_, err := s.Enqueue(ctx, queuetest.Reply("ok", "u-1", "hi"), nil)
	var ee *queue.EnqueueError
	if !errors.As(err, &ee) || ee.Index != 1 || !errors.Is(err, envelope.ErrInvalid) {
		t.Fatalf("Enqueue(nil) = %v, want EnqueueError at index 1 wrapping ErrInvalid", err)
	}
	if _, err := s.Get(ctx, envelope.DefaultTenant, "ok"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Get after a failed batch = %v", err)
	}
	if err := s.Commit(ctx, nil, queue.Outcome{State: envelope.StateSent}); err == nil {
		t.Fatal("Commit(nil) succeeded")
	}
	if err := s.Release(ctx, nil); err == nil {
		t.Fatal("Release(nil) succeeded")
	}
	for _, c := range []func() error{
		func() error { return s.SetConsent(ctx, "", "", queue.ConsentFlags{}) },
		func() error { return s.Suppress(ctx, "", "u", queue.Suppression{Channel: "fax"}) },
		func() error { return s.Erase(ctx, "", "") },
	} {
		if err := c(); err == nil {
			t.Fatal("a call with a missing user or unknown channel succeeded")
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Claim(cctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim with a cancelled context = %v", err)
	}
}

// New(nil) runs on the wall clock with default options.
func TestNew_NilOptions(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(nil)
	defer s.Close()
	before := time.Now()
	if _, err := s.Enqueue(ctx, queuetest.Reply("r", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	l := claimOne(t, s)
	if l.EnqueuedAt.Before(before) || l.EnqueuedAt.After(time.Now()) {
		t.Fatalf("EnqueuedAt = %v, want the wall clock", l.EnqueuedAt)
	}
}

func Example() {
	ctx := context.Background()
	s := memstore.New(nil)
	defer s.Close()

	res, err := s.Enqueue(ctx, queuetest.Reply("reply-1", "u_42", queuetest.ReplyText(2)))
	if err != nil {
		panic(err)
	}
	fmt.Println("segments:", res[0].Segments)
	for {
		leases, err := s.Claim(ctx, queue.ClaimRequest{Owner: "example", Lease: time.Minute, Limit: 10})
		if err != nil {
			panic(err)
		}
		if len(leases) == 0 {
			break
		}
		for _, l := range leases {
			fmt.Println("deliver segment", l.Key.Segment)
			if err := s.Commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: fmt.Sprint("msg-", l.Key.Segment)}); err != nil {
				panic(err)
			}
		}
	}
	st, err := s.Get(ctx, envelope.DefaultTenant, "reply-1")
	if err != nil {
		panic(err)
	}
	fmt.Println("status:", st.Status)
	// Output:
	// segments: 2
	// deliver segment 0
	// deliver segment 1
	// status: delivered
}

func BenchmarkClaimCommit(b *testing.B) {
	ctx := context.Background()
	s, _ := newStore(b, nil)
	envs := make([]*envelope.Envelope, b.N)
	for i := range envs {
		envs[i] = queuetest.Reply(fmt.Sprint("r-", i), fmt.Sprint("u-", i%100), "hi")
	}
	if _, err := s.Enqueue(ctx, envs...); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		ls, err := s.Claim(ctx, queue.ClaimRequest{Owner: "bench", Lease: time.Minute, Limit: 1})
		if err != nil || len(ls) != 1 {
			b.Fatalf("Claim = %v, %v", ls, err)
		}
		if err := s.Commit(ctx, ls[0], queue.Outcome{State: envelope.StateSent}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEnqueue(b *testing.B) {
	ctx := context.Background()
	s, _ := newStore(b, nil)
	for i := range b.N {
		if _, err := s.Enqueue(ctx, queuetest.Reply(fmt.Sprint("r-", i), "u-1", "hi")); err != nil {
			b.Fatal(err)
		}
	}
}
