package filestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// storeWith enqueues n envelopes over a few users into a new store in dir,
// sends some of them, and closes it.
func storeWith(t *testing.T, dir string, n int) {
	t.Helper()
	q := openFault(t, dir)
	ctx := context.Background()
	for i := 0; i < n; i++ {
		if _, err := q.Enqueue(ctx, faultEnvelope(fmt.Sprintf("e%03d", i), fmt.Sprintf("u%d", i%4))); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: n / 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}

// One lock for the data directory: while a store is open, a second Open,
// Compact, CompactFile, Rebuild, Check and Known all fail with the
// holder's pid instead of opening the index beside it.
func TestLock_OneOpenerAtATime(t *testing.T) {
	dir := t.TempDir()
	storeWith(t, dir, 4)
	q := openFault(t, dir)
	check := func(what string, err error) {
		t.Helper()
		var inUse *StoreInUseError
		if !errors.As(err, &inUse) || inUse.PID != os.Getpid() || !errors.Is(err, ErrStoreBusy) {
			t.Fatalf("%s while the store is open: %v, want *StoreInUseError naming pid %d", what, err, os.Getpid())
		}
	}
	_, err := Open(dir, &Options{LockTimeout: 50 * time.Millisecond})
	check("Open", err)
	_, _, _, err = Compact(context.Background(), dir, &Options{LockTimeout: 50 * time.Millisecond})
	check("Compact", err)
	_, _, err = CompactFile(dir)
	check("CompactFile", err)
	_, err = Rebuild(dir, &Options{LockTimeout: 50 * time.Millisecond})
	check("Rebuild", err)
	_, err = Check(dir)
	check("Check", err)
	if _, err := Known(dir, []envelope.Key{{EnvelopeID: "e000"}}); !errors.Is(err, ErrStoreBusy) {
		t.Fatalf("Known while the store is open: %v", err)
	}
	if n := rows(t, q); n != 4 {
		t.Fatalf("the open store has %d rows", n)
	}
	q.Close()
	if _, _, _, err := Compact(context.Background(), dir, nil); err != nil {
		t.Fatalf("Compact after Close: %v", err)
	}
	q = openFault(t, dir)
	if n := rows(t, q); n != 4 {
		t.Fatalf("after Compact: %d rows", n)
	}
}

func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.Walk(from, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if fi.IsDir() {
			return os.MkdirAll(dst, 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}
