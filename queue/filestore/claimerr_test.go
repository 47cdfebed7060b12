package filestore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// failingConsent answers for every user but one, whose look-up fails
// once down is set.
type failingConsent struct {
	bad  string
	down *atomic.Bool
}

func (f failingConsent) Consent(ctx context.Context, tenant, user string) (queue.Consent, bool, error) {
	if user == f.bad && f.down.Load() {
		return queue.Consent{}, false, errors.New("consent source down")
	}
	return queue.Consent{}, false, nil
}

// A claim whose later row fails (here its consent look-up) hands back
// the leases it took before it: they are written in the same index
// transaction, which commits. Before, the claim returned the error and
// those rows stayed sending, leased to no one, until their lease ran out
// and a reconciliation took them.
func TestClaim_LaterRowFailsKeepsEarlierLeases(t *testing.T) {
	ctx := context.Background()
	var down atomic.Bool
	q := mustOpen(t, t.TempDir(), &filestore.Options{DisableWatcher: true, RescanInterval: -1,
		Options: queue.Options{Consent: failingConsent{bad: "u-2", down: &down}}})
	for _, e := range []*envelope.Envelope{queuetest.Reply("first", "u-1", "hi"), queuetest.Reply("second", "u-2", "hi")} {
		if _, err := q.Enqueue(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	down.Store(true)
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 2})
	if err != nil || len(ls) != 1 || ls[0].Key.EnvelopeID != "first" {
		t.Fatalf("Claim = %v, %v; want the lease of first", ls, err)
	}
	if _, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 2}); err == nil {
		t.Error("the claim of second's row succeeded with its consent look-up failing")
	}
	st, err := q.Get(ctx, "", "second")
	if err != nil || st.Segments[0].State != envelope.StatePending {
		t.Errorf("second = %+v, %v; want it pending", st, err)
	}
}
