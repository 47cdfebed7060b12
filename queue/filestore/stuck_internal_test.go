package filestore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue"
)

// A fault inside bbolt may leave one of its locks held, and the writer
// stuck in a transaction for good (made here by a commit hook that never
// returns). Once the index is known damaged, reads, writes and Close must
// not wait for that writer: they fail with the damage (Close within a
// bound), so that serve can stop and be restarted.
func TestDamaged_StuckWriterDoesNotHangTheStore(t *testing.T) {
	q := openFault(t, t.TempDir())
	ctx := context.Background()
	release := make(chan struct{})
	entered := make(chan struct{})
	hook := func() error { close(entered); <-release; return nil }
	q.beforeCommit.Store(&hook)
	defer close(release) // lets the stuck goroutine end with the test

	if _, err := q.Enqueue(ctx, faultEnvelope("stuck", "u1")); err != nil {
		t.Fatal(err)
	}
	<-entered // the writer is inside the index update's transaction
	q.beforeCommit.Store(nil)
	ce := &CorruptIndexError{Path: q.indexPath(), Reason: "a fault in a test"}
	calls := map[string]func() error{
		"Get": func() error { _, err := q.Get(ctx, "", "stuck"); return err },
		"Claim": func() error {
			_, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 1})
			return err
		},
	}
	errs := make(chan error, len(calls))
	for _, f := range calls {
		go func() { errs <- f() }()
	}
	time.Sleep(50 * time.Millisecond) // they wait for the stuck writer
	q.markDamaged(ce)
	for range calls {
		select {
		case err := <-errs:
			if !errors.As(err, new(*CorruptIndexError)) {
				t.Errorf("a call on the damaged store = %v, want the CorruptIndexError", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a call still waits for the stuck writer 5 s after the damage")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- q.Close() }()
	select {
	case <-closed:
	case <-time.After(damagedCloseWait + 5*time.Second):
		t.Fatal("Close waits for the stuck writer")
	}
}
