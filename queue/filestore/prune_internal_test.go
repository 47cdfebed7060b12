package filestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	"log/slog"
	"os"
	"strings"
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
	if err := q.catchUpAll(false); err != nil {
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
	if err := q.catchUpAll(false); err != nil {
		t.Fatal(err)
	}
	wantLeased(t, claimAll(t, q), "n-late")
}

// openPruning opens dir with a clock the test moves, a retention of an
// hour and logs never rewritten unless rewriteMin says otherwise.
func openPruning(t *testing.T, dir string, now *time.Time, rewriteMin int64) *Queue {
	t.Helper()
	q, err := Open(dir, &Options{Options: queue.Options{Now: func() time.Time { return *now }, Retention: time.Hour}, LogRewriteMin: rewriteMin, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// deliverAll claims every due row and commits it sent.
func deliverAll(t *testing.T, q *Queue) {
	t.Helper()
	for _, l := range claimAll(t, q) {
		if err := q.Commit(context.Background(), l, queue.Outcome{State: envelope.StateSent, Receipt: "m"}); err != nil {
			t.Fatal(err)
		}
	}
}

// prunedOf counts what the index remembers of log rel's pruned records.
func prunedOf(t *testing.T, q *Queue, rel string) int {
	t.Helper()
	n := 0
	if err := q.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bktPruned).Cursor()
		prefix := []byte(rel + "\x00")
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			n++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// A store copied file by file (cp -a to a new disk, a restore) has logs
// of other inodes, which it indexes again from their start. The records
// of envelopes delivered and pruned are still in them (a log is rewritten
// only once pruned records fill half of it): they are not new envelopes,
// and are not delivered again.
func TestPrune_ACopiedStoreDoesNotDeliverPrunedRecordsAgain(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	q := openPruning(t, dir, &now, -1)
	ctx := context.Background()
	mustEnqueue(t, q, faultEnvelope("p-a", "u1"), faultEnvelope("p-b", "u1"))
	deliverAll(t, q)
	mustEnqueue(t, q, faultEnvelope("p-c", "u1")) // keeps the log
	now = now.Add(2 * time.Hour)
	if n, err := q.Prune(ctx); err != nil || n != 2 {
		t.Fatalf("Prune = %d, %v", n, err)
	}
	q.Close()

	copied := t.TempDir()
	copyTree(t, dir, copied)
	q = openPruning(t, copied, &now, -1)
	leases := claimAll(t, q)
	wantLeased(t, leases, "p-c")
	for _, id := range []string{"p-a", "p-b"} {
		if leases[id] != nil {
			t.Errorf("%s, delivered and pruned, was claimed again from the copy", id)
		}
		if _, err := q.Get(ctx, "", id); !errors.Is(err, queue.ErrNotFound) {
			t.Errorf("Get(%s) = %v, want ErrNotFound", id, err)
		}
	}
}

// An id enqueued again after its envelope was pruned is a new record at
// another offset: indexed, also when its log is indexed again from its
// start before the store saw it.
func TestPrune_AnIDAppendedAgainAfterItsPruneIsIndexed(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	q := openPruning(t, dir, &now, -1)
	ctx := context.Background()
	mustEnqueue(t, q, faultEnvelope("q-a", "u1"), faultEnvelope("q-b", "u1"))
	deliverAll(t, q)
	now = now.Add(2 * time.Hour)
	mustEnqueue(t, q, faultEnvelope("q-c", "u1"))
	if n, err := q.Prune(ctx); err != nil || n != 2 {
		t.Fatalf("Prune = %d, %v", n, err)
	}
	if err := Append(dir, faultEnvelope("q-a", "u1")); err != nil { // not indexed yet
		t.Fatal(err)
	}
	path := LogPath(dir, "", "u1")
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(path+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil { // the same content, another file
		t.Fatal(err)
	}
	if err := q.catchUpAll(false); err != nil {
		t.Fatal(err)
	}
	leases := claimAll(t, q)
	wantLeased(t, leases, "q-a", "q-c")
	if leases["q-b"] != nil {
		t.Error("q-b, delivered and pruned, was claimed again")
	}
}

// What the index remembers of pruned records goes with them: when their
// log is rewritten without them, removed, or erased.
func TestPrune_ForgetsPrunedRecordsWithTheirLog(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	q := openPruning(t, dir, &now, 1)
	ctx := context.Background()
	rel := func(u string) string { return applog.RelPath(envelope.DefaultTenant, u) }
	mustEnqueue(t, q, faultEnvelope("f-a", "rw"), faultEnvelope("f-b", "rw"), faultEnvelope("f-c", "gone"), faultEnvelope("f-d", "er"))
	deliverAll(t, q)
	// rw keeps one record of three: rewritten; er keeps three of four: not.
	mustEnqueue(t, q, faultEnvelope("f-f", "rw"), faultEnvelope("f-g", "er"), faultEnvelope("f-h", "er"), faultEnvelope("f-i", "er"))
	now = now.Add(2 * time.Hour)
	if n, err := q.Prune(ctx); err != nil || n != 4 {
		t.Fatalf("Prune = %d, %v", n, err)
	}
	if n := prunedOf(t, q, rel("rw")); n != 0 {
		t.Errorf("rewritten log: %d pruned records remembered, want 0", n)
	}
	if n := prunedOf(t, q, rel("gone")); n != 0 {
		t.Errorf("removed log: %d pruned records remembered, want 0", n)
	}
	if n := prunedOf(t, q, rel("er")); n != 1 {
		t.Fatalf("log kept as it is: %d pruned records remembered, want 1", n)
	}
	if err := q.Erase(ctx, "", "er"); err != nil {
		t.Fatal(err)
	}
	if n := prunedOf(t, q, rel("er")); n != 0 {
		t.Errorf("erased user's log: %d pruned records remembered, want 0", n)
	}
	wantLeased(t, claimAll(t, q), "f-f")
}

// A copy of a store has every log under another inode: a few warnings,
// then one line that counts them all, not one per user.
func TestCatchUp_ACopiedStoreWarnsOnceForItsLogs(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	for i := range 10 {
		mustEnqueue(t, q, faultEnvelope(fmt.Sprintf("w-%d", i), fmt.Sprintf("u%d", i)))
	}
	q.Close()
	copied := t.TempDir()
	copyTree(t, dir, copied)
	var logs bytes.Buffer
	q, err := Open(copied, &Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if n := strings.Count(logs.String(), "level=WARN"); n != resetsLogged+1 {
		t.Errorf("%d warnings for 10 copied logs, want %d:\n%s", n, resetsLogged+1, logs.String())
	}
	if !strings.Contains(logs.String(), "10 logs replaced under the store in all") {
		t.Errorf("no line counts the copied logs:\n%s", logs.String())
	}
	if n := len(claimAll(t, q)); n != 10 {
		t.Errorf("%d claimable in the copy, want 10", n)
	}
}
