package filestore

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
)

// syncLog records the order of log syncs and index commits.
type syncLog struct {
	mu     sync.Mutex
	events []string
}

func (s *syncLog) add(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *syncLog) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.events
	s.events = nil
	return out
}

// Bytes another process appended are made durable before the index
// refers to them: a foreign writer may not have synced them (or not yet),
// and an index entry for a record a machine crash then takes points at
// whatever is appended there next (doctor: "does not match its index
// entry"), while a retry of that envelope is answered as a duplicate. Found
// by the power-cut drill (make powercut). The store's own appends, synced
// before they are registered, are not synced again.
func TestCatchUp_SyncsForeignBytesBeforeIndexing(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	defer q.Close()
	ctx := context.Background()
	var rec syncLog
	setAppender(t, q, applog.NewAppender(dir, func(f *os.File) error {
		rel, _ := filepath.Rel(dir, f.Name())
		rec.add("sync " + rel)
		return applog.Fdatasync(f)
	}))
	hook := func() error { rec.add("commit"); return nil }
	q.beforeCommit.Store(&hook)
	defer q.beforeCommit.Store(nil)

	// A foreign line, written without a sync (a shell's >>, or a writer
	// that has not synced yet).
	e := faultEnvelope("foreign-1", "u1")
	e.TenantID = envelope.DefaultTenant
	line, err := envelope.ValidEncoding(e)
	if err != nil {
		t.Fatal(err)
	}
	rel := applog.RelPath(e.TenantID, e.UserID)
	if _, err := applog.AppendLocked(filepath.Join(dir, rel), append(line, '\n'), nil); err != nil {
		t.Fatal(err)
	}
	rec.take()
	if err := q.write(ctx, true, func(tx *bolt.Tx) error { return q.catchUp(tx, rel, nil, nil) }); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.take(), []string{"sync " + rel, "commit"}; !slices.Equal(got, want) {
		t.Fatalf("catch-up of a foreign line: %q, want %q (the log synced before the index refers to it)", got, want)
	}
	if _, err := q.Get(ctx, "", "foreign-1"); err != nil {
		t.Fatal(err)
	}

	// Nothing new: no sync.
	if err := q.write(ctx, true, func(tx *bolt.Tx) error { return q.catchUp(tx, rel, nil, nil) }); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); slices.Contains(got, "sync "+rel) {
		t.Fatalf("catch-up with nothing new synced the log: %q", got)
	}

	// The store's own append: one sync, the append's.
	if _, err := q.Enqueue(ctx, faultEnvelope("own-1", "u1")); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Get(ctx, "", "own-1"); err != nil { // its index update committed
		t.Fatal(err)
	}
	n := 0
	for _, ev := range rec.take() {
		if ev == "sync "+rel {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("an own enqueue synced its log %d times, want 1", n)
	}
}

// A rebuild syncs the logs it indexes too: after a crash of serve, a log
// may hold bytes the page cache has and the disk has not (an append whose
// fsync never came), and the new index is fsynced before it replaces the
// old one.
func TestRebuild_SyncsTheLogsItIndexes(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	if _, err := q.Enqueue(context.Background(), faultEnvelope("e1", "u1")); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	e := faultEnvelope("e2", "u2")
	e.TenantID = envelope.DefaultTenant
	line, err := envelope.ValidEncoding(e)
	if err != nil {
		t.Fatal(err)
	}
	rel := applog.RelPath(e.TenantID, e.UserID)
	if _, err := applog.AppendLocked(filepath.Join(dir, rel), append(line, '\n'), nil); err != nil {
		t.Fatal(err)
	}
	var rec syncLog
	defer func(old applog.Syncer) { syncLogFile = old }(syncLogFile)
	syncLogFile = func(f *os.File) error {
		r, _ := filepath.Rel(dir, f.Name())
		rec.add("sync " + r)
		return applog.Fdatasync(f)
	}
	if n, err := Rebuild(dir, nil); err != nil || n != 2 {
		t.Fatalf("Rebuild = %d, %v; want 2 envelopes", n, err)
	}
	got := rec.take()
	for _, r := range []string{applog.RelPath(envelope.DefaultTenant, "u1"), rel} {
		if !slices.Contains(got, "sync "+r) {
			t.Errorf("Rebuild did not sync %s: %q", r, got)
		}
	}
}

// Erase makes the removal of the user's logs durable (a sync of their
// directory) before the commit that forgets them: a machine crash that
// undid the removal would bring the log back, and the catch-up would
// index the erased user's envelopes again as new ones, pending, to be
// delivered again. Found by the power-cut drill's erase check.
func TestErase_RemovalsDurableBeforeCommit(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	defer q.Close()
	ctx := context.Background()
	enqueueIndexed(t, q, "e1", "gone")
	var rec syncLog
	defer func(old func(string) error) { syncDir = old }(syncDir)
	inner := syncDir
	syncDir = func(d string) error {
		r, _ := filepath.Rel(dir, d)
		rec.add("syncdir " + r)
		return inner(d)
	}
	hook := func() error { rec.add("commit"); return nil }
	q.beforeCommit.Store(&hook)
	defer q.beforeCommit.Store(nil)
	if err := q.Erase(ctx, "", "gone"); err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Dir(applog.RelPath(envelope.DefaultTenant, "gone"))
	got := rec.take()
	i, j := slices.Index(got, "syncdir "+logDir), slices.Index(got, "commit")
	if i < 0 || j < 0 || i > j {
		t.Fatalf("erase: %q; want the sync of %s before the first commit", got, logDir)
	}
}

// An erase cut short between the removal of the logs (made durable first)
// and its commit leaves the index naming logs that are gone: doctor says
// that running the erase again finishes it, and it does.
func TestErase_CutShortIsFinishedByAnotherErase(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	defer q.Close()
	ctx := context.Background()
	enqueueIndexed(t, q, "e1", "gone")
	// What the cut left: the log removed, the index as it was.
	if err := os.Remove(filepath.Join(dir, applog.RelPath(envelope.DefaultTenant, "gone"))); err != nil {
		t.Fatal(err)
	}
	r, err := q.Check()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(r.Problems, func(p string) bool { return strings.Contains(p, "outbox erase of its user was cut short") }) {
		t.Fatalf("doctor after an erase cut short: %q; want the hint to run the erase again", r.Problems)
	}
	if err := q.Erase(ctx, "", "gone"); err != nil {
		t.Fatal(err)
	}
	if r, err = q.Check(); err != nil || !r.OK() {
		t.Fatalf("doctor after the erase run again: %q, %v", r.Problems, err)
	}
	if _, err := q.Get(ctx, "", "e1"); err == nil {
		t.Fatal("the erased envelope is still there")
	}
}

// enqueueIndexed enqueues one envelope and waits for its index update.
func enqueueIndexed(t *testing.T, q *Queue, id, user string) {
	t.Helper()
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, faultEnvelope(id, user)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Get(ctx, "", id); err != nil {
		t.Fatal(err)
	}
}
