package filestore

import (
	"context"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// After a restore, what was still to deliver when the copy was taken
// (pending, leased) is unresolved, class restored; what had ended stays;
// a second run changes nothing.
func TestAfterRestore_MakesWhatWaitedUnresolved(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	ctx := context.Background()
	mustEnqueue(t, q, faultEnvelope("a-sent", "u1"))
	deliverAll(t, q)
	mustEnqueue(t, q, faultEnvelope("a-leased", "u1"))
	if ls := claimAll(t, q); ls["a-leased"] == nil {
		t.Fatal("a-leased not claimed")
	}
	mustEnqueue(t, q, faultEnvelope("a-pending", "u2"))

	n, err := q.AfterRestore(ctx)
	if err != nil || n != 2 {
		t.Fatalf("AfterRestore = %d, %v; want 2", n, err)
	}
	for id, want := range map[string]string{"a-sent": queue.StatusDelivered, "a-leased": "unresolved", "a-pending": "unresolved"} {
		st, err := q.Get(ctx, "", id)
		if err != nil || st.Status != want {
			t.Fatalf("%s = %+v, %v; want %s", id, st, err, want)
		}
		if want == "unresolved" && st.Segments[0].Class != envelope.ClassRestored {
			t.Errorf("%s: class %q, want %q", id, st.Segments[0].Class, envelope.ClassRestored)
		}
	}
	if ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 10}); err != nil || len(ls) != 0 {
		t.Fatalf("claim after AfterRestore = %d leases, %v", len(ls), err)
	}
	if n, err := q.AfterRestore(ctx); err != nil || n != 0 {
		t.Fatalf("second AfterRestore = %d, %v; want 0", n, err)
	}
	if rep, err := q.Check(); err != nil || !rep.OK() {
		t.Fatalf("Check: %+v, %v", rep, err)
	}
}
