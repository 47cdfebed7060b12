package filestore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// openUnsynced opens a store whose claims of chat replies may skip fsync.
func openUnsynced(t *testing.T, dir string) *Queue {
	t.Helper()
	q, err := Open(dir, unsyncedOptions())
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// A claim skips its fsync only when every channel it asks for is in
// Options.UnsyncedClaims, and never for the HTTP seam's claims
// (ExpireToPending).
func TestClaim_UnsyncedOnlyForTheListedChannels(t *testing.T) {
	q := openUnsynced(t, t.TempDir())
	defer q.Close()
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c", "d"} {
		if _, err := q.Enqueue(ctx, faultEnvelope(id, "u1")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Get(ctx, "", "d"); err != nil { // every index update committed
		t.Fatal(err)
	}
	var noSync []bool // for each transaction, whether the writer skips its sync
	hook := func() error { noSync = append(noSync, !q.txSynced); return nil }
	q.beforeCommit.Store(&hook)
	defer q.beforeCommit.Store(nil)
	for _, tc := range []struct {
		name     string
		req      queue.ClaimRequest
		unsynced bool
	}{
		{"listed channel", queue.ClaimRequest{Channels: []envelope.Channel{envelope.ChannelTelegram}}, true},
		{"one channel not listed", queue.ClaimRequest{Channels: []envelope.Channel{envelope.ChannelTelegram, envelope.ChannelEmail}}, false},
		{"every channel", queue.ClaimRequest{}, false},
		{"seam claim", queue.ClaimRequest{Channels: []envelope.Channel{envelope.ChannelTelegram}, ExpireToPending: true}, false},
	} {
		noSync = nil
		tc.req.Owner, tc.req.Lease = "w", time.Minute
		ls, err := q.Claim(ctx, tc.req)
		if err != nil || len(ls) != 1 {
			t.Fatalf("%s: Claim = %d leases, %v; want 1", tc.name, len(ls), err)
		}
		if len(noSync) != 1 || noSync[0] != tc.unsynced {
			t.Fatalf("%s: transactions without fsync %v, want [%v]", tc.name, noSync, tc.unsynced)
		}
	}
}

// An unsynced claim lost in a machine crash (the index file as it was
// before the claim) leaves its row pending: it is claimed again, under the
// same key, as a first attempt.
func TestClaim_UnsyncedClaimLostInACrashIsRedelivered(t *testing.T) {
	dir := t.TempDir()
	q := openUnsynced(t, dir)
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, faultEnvelope("lost", "u1")); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	index := filepath.Join(dir, IndexFile)
	before, err := os.ReadFile(index) // what a crash leaves of the index: no claim
	if err != nil {
		t.Fatal(err)
	}
	markBefore, err := os.ReadFile(markPath(dir)) // and of its mark, which only lags it
	if err != nil {
		t.Fatal(err)
	}

	req := queue.ClaimRequest{Channels: []envelope.Channel{envelope.ChannelTelegram}, Owner: "w", Lease: time.Minute}
	q = openUnsynced(t, dir)
	first, err := q.Claim(ctx, req)
	if err != nil || len(first) != 1 {
		t.Fatalf("Claim = %d leases, %v; want 1", len(first), err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(index, before, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(markPath(dir), markBefore, 0o600); err != nil {
		t.Fatal(err)
	}

	q = openUnsynced(t, dir)
	defer q.Close()
	st, err := q.Get(ctx, "", "lost")
	if err != nil {
		t.Fatal(err)
	}
	if st.Segments[0].State != envelope.StatePending {
		t.Fatalf("after the lost claim the row is %s, want pending", st.Segments[0].State)
	}
	again, err := q.Claim(ctx, req)
	if err != nil || len(again) != 1 {
		t.Fatalf("Claim after the crash = %d leases, %v; want 1", len(again), err)
	}
	if again[0].Key != first[0].Key || again[0].Attempt != 1 {
		t.Fatalf("claimed again %+v attempt %d, want key %+v attempt 1", again[0].Key, again[0].Attempt, first[0].Key)
	}
}
