package filestore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	bolt "go.etcd.io/bbolt"
)

// busyStore opens a store in a new directory whose clock runs ahead by
// what ahead holds, with an hour's retention and rewrites from any size.
func busyStore(t *testing.T, ahead *atomic.Int64, logger *slog.Logger) *Queue {
	t.Helper()
	o := queue.Options{Now: func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }, Retention: time.Hour, Logger: logger}
	q, err := Open(t.TempDir(), &Options{Options: o, DisableWatcher: true, RescanInterval: -1, LogRewriteMin: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// fillBusy enqueues m0 … m9 for user busy and sends all but keep.
func fillBusy(t *testing.T, q *Queue, text string, keep ...string) {
	t.Helper()
	ctx := context.Background()
	for i := range 10 {
		if _, err := q.Enqueue(ctx, queuetest.Reply(fmt.Sprintf("m%d", i), "busy", fmt.Sprintf("text m%d %s", i, text))); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if !slices.Contains(keep, l.Key.EnvelopeID) {
			if err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: "r"}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A read that took a record's place from a transaction older than its
// log's rewrite (an HTTP GET racing the hourly prune) still reads that
// envelope's record, where the rewrite moved it, never another's.
func TestLogCompaction_AnOlderReadFindsTheMovedRecord(t *testing.T) {
	ctx := context.Background()
	var ahead atomic.Int64
	q := busyStore(t, &ahead, discardLog)
	fillBusy(t, q, strings.Repeat("z", 100), "m8")
	ek := envKey(envelope.DefaultTenant, "m8")
	var old *envRec
	if err := q.view(func(tx *bolt.Tx) (err error) { old, err = getEnv(tx, ek); return err }); err != nil {
		t.Fatal(err)
	}
	ahead.Store(int64(2 * time.Hour))
	if _, err := q.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	var now *envRec
	if err := q.view(func(tx *bolt.Tx) (err error) { now, err = getEnv(tx, ek); return err }); err != nil {
		t.Fatal(err)
	}
	if now.Off == old.Off {
		t.Fatalf("m8 is still at offset %d: the log was not rewritten", old.Off)
	}
	q.cache = newEnvCache(envCacheSize) // the file, not the cache
	env, err := q.readEnvelope(ek, old)
	if err != nil || env.ID != "m8" {
		t.Fatalf("a read with m8's place before the rewrite: %+v, %v", env, err)
	}
}

// Records indexed between the read of a log's records and its rewrite (a
// busy user's log) are carried over: each reads its own record after the
// rewrite.
func TestLogCompaction_RecordsIndexedSinceTheRead(t *testing.T) {
	ctx := context.Background()
	var ahead atomic.Int64
	q := busyStore(t, &ahead, discardLog)
	pad := strings.Repeat("z", 100)
	enqueue := func(id string) {
		t.Helper()
		if _, err := q.Enqueue(ctx, queuetest.Reply(id, "busy", "text "+id+" "+pad)); err != nil {
			t.Fatal(err)
		}
	}
	fillBusy(t, q, pad, "m8", "m9")
	ahead.Store(int64(2 * time.Hour))
	defer func() { faultHook = nil }()
	faultHook = func(p string) {
		if p != "log-compact-read" {
			return
		}
		faultHook = nil
		enqueue("late-1")
		enqueue("late-2")
		_ = q.view(func(*bolt.Tx) error { return nil }) // their index updates are written
	}
	if _, err := q.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(q.m.logCompactions); got != 1 {
		t.Fatalf("%v log rewrites, want 1", got)
	}
	q.cache = newEnvCache(envCacheSize)
	for _, id := range []string{"m8", "m9", "late-1", "late-2"} {
		st, err := q.Get(ctx, envelope.DefaultTenant, id)
		if err != nil || st.Envelope == nil || st.Envelope.ID != id {
			t.Fatalf("Get %s after the rewrite: %+v, %v", id, st, err)
		}
	}
	if rep, err := q.Check(); err != nil || !rep.OK() {
		t.Fatalf("Check: %+v, %v", rep, err)
	}
}

// A rewrite that cannot be written (the disk full: the sync of the new
// file fails) changes nothing: the prune succeeds, the log is the same
// file with the same records, no rewrite is left behind, and the next
// prune, with space again, rewrites it.
func TestLogCompaction_DiskFullLeavesTheLog(t *testing.T) {
	ctx := context.Background()
	var ahead atomic.Int64
	var logs bytes.Buffer
	q := busyStore(t, &ahead, slog.New(slog.NewTextHandler(&logs, nil)))
	dir := q.Dir()
	fillBusy(t, q, "", "m5")
	ahead.Store(int64(2 * time.Hour))
	path := LogPath(dir, "", "busy")
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func(f func(*os.File) error) { syncRewrite = f }(syncRewrite)
	syncRewrite = func(*os.File) error {
		return &os.PathError{Op: "fdatasync", Path: path + compactExt, Err: syscall.ENOSPC}
	}
	if _, err := q.Prune(ctx); err != nil {
		t.Fatalf("Prune with a full disk for the rewrite: %v", err)
	}
	after, err := os.Stat(path)
	if err != nil || !os.SameFile(before, after) || after.Size() != before.Size() {
		t.Fatalf("the log changed though its rewrite failed: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "logs", "*", "*"+compactExt)); len(m) != 0 {
		t.Fatalf("a failed rewrite left %v", m)
	}
	if l := logs.String(); !strings.Contains(l, "no space left on device") || strings.Contains(l, "busy") {
		t.Fatalf("the failed rewrite's log line should name the system error and not the log (its user): %s", l)
	}
	if st, err := q.Get(ctx, "", "m5"); err != nil || st.Envelope == nil || st.Envelope.ID != "m5" {
		t.Fatalf("m5 after the failed rewrite: %+v, %v", st, err)
	}
	syncRewrite = applog.Fdatasync
	if _, err := q.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(q.m.logCompactions); got != 1 {
		t.Fatalf("%v rewrites once there is space, want 1", got)
	}
	if st, err := q.Get(ctx, "", "m5"); err != nil || st.Envelope == nil || st.Envelope.ID != "m5" {
		t.Fatalf("m5 after the rewrite: %+v, %v", st, err)
	}
}

var discardLog = slog.New(slog.NewTextHandler(io.Discard, nil))
