package filestore

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// The state an older build left when it died between its prune
// transaction and the removal of the logs it emptied (envelopes gone, logs
// and their entries still there): the next Prune removes those logs. A log
// whose lines were never records (all quarantined) is kept, with its
// quarantine file.
func TestPrune_RemovesLogsAnOlderPruneLeft(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	ctx := context.Background()
	mustEnqueue(t, q, faultEnvelope("o-a", "left"), faultEnvelope("o-b", "left"))
	if err := os.WriteFile(LogPath(dir, "", "junk"), []byte("not an envelope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := q.catchUpAll(); err != nil {
		t.Fatal(err)
	}
	if err := q.write(ctx, false, func(tx *bolt.Tx) error {
		for _, id := range []string{"o-a", "o-b"} {
			if _, err := q.deleteEnvelope(tx, envelope.DefaultTenant, id); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(LogPath(dir, "", "left")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the log an older prune left is still there (%v)", err)
	}
	for _, p := range []string{LogPath(dir, "", "junk"), LogPath(dir, "", "junk") + quarantineExt} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("a log of quarantined lines lost %s: %v", p, err)
		}
	}
	// The user's next envelope goes into a new log, read from its start.
	mustEnqueue(t, q, faultEnvelope("o-c", "left"))
	wantLeased(t, claimAll(t, q), "o-c")
	if rep, err := q.Check(); err != nil || len(rep.Problems) != 0 {
		t.Fatalf("Check: %+v, %v", rep, err)
	}
}

// A log that got a record past its indexed offset after Prune looked (a
// foreign append) is not removed, and neither is one replaced by another
// file.
func TestPrune_KeepsALogWithNewWork(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	q, err := Open(dir, &Options{Options: queue.Options{Now: func() time.Time { return now }, Retention: time.Hour}, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	mustEnqueue(t, q, faultEnvelope("n-a", "u1"), faultEnvelope("n-b", "u2"))
	for _, l := range claimAll(t, q) {
		if err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: "m"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := Append(dir, faultEnvelope("n-late", "u1")); err != nil { // not indexed yet
		t.Fatal(err)
	}
	path2 := LogPath(dir, "", "u2")
	b, _ := os.ReadFile(path2)
	if err := os.WriteFile(path2+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path2+".new", path2); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Hour)
	if n, err := q.Prune(ctx); err != nil || n != 2 {
		t.Fatalf("Prune = %d, %v", n, err)
	}
	for _, u := range []string{"u1", "u2"} {
		if _, err := os.Lstat(LogPath(dir, "", u)); err != nil {
			t.Errorf("%s's log was removed: %v", u, err)
		}
	}
	if err := q.catchUpAll(); err != nil {
		t.Fatal(err)
	}
	wantLeased(t, claimAll(t, q), "n-late")
}
