package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// TestMetrics counts stored envelopes by channel, duplicates and the seam's
// expired leases under the file store's metric names.
func TestMetrics(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	clock := queuetest.NewClock(queuetest.T0)
	s, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: pgtest.Schema(t), Options: queue.Options{Now: clock.Now, Registerer: reg}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Enqueue(ctx, queuetest.Reply("a", "u-1", "hi"), queuetest.Reply("b", "u-1", "hi"), queuetest.Reply("a", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, queue.ClaimRequest{Owner: "seam", Lease: time.Second, ExpireToPending: true}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if _, err := s.Recover(ctx, queue.ClaimRequest{Owner: "r", Lease: time.Second}); err != nil {
		t.Fatal(err)
	}
	got, err := testutil.GatherAndCount(reg)
	if err != nil || got == 0 {
		t.Fatalf("gather: %d metrics, %v", got, err)
	}
	for name, want := range map[string]float64{
		"outbox_enqueued_total":            2,
		"outbox_enqueue_duplicates_total":  1,
		"outbox_seam_leases_expired_total": 1,
	} {
		if n, err := gathered(reg, name); err != nil || n != want {
			t.Errorf("%s = %v, %v; want %v", name, n, err, want)
		}
	}
}

// gathered sums every series of the metric name.
func gathered(reg prometheus.Gatherer, name string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum, nil
}
