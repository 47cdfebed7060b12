package filestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
)

func faultEnvelope(id, user string) *envelope.Envelope {
	p, _ := json.Marshal(envelope.ReplyPayload{Text: "hello"})
	return &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion, ID: id, UserID: user,
		Channel: envelope.ChannelTelegram, Template: envelope.TemplateReply,
		Recipient: envelope.Recipient{ChatID: "4242"}, Payload: p,
		CreatedAt: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
	}
}

func openFault(t *testing.T, dir string) *Queue {
	t.Helper()
	q, err := Open(dir, &Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// setAppender swaps the store's appender on its writer goroutine, the one
// that reads it besides the caller (catch-ups read the logs through it).
func setAppender(t *testing.T, q *Queue, a *applog.Appender) {
	t.Helper()
	if err := q.write(context.Background(), true, func(*bolt.Tx) error { q.app = a; return nil }); err != nil {
		t.Fatal(err)
	}
}

func rows(t *testing.T, q *Queue) int {
	t.Helper()
	c, err := q.Counts(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for s := range c {
		n += c.Total(s)
	}
	return n
}

// A full disk (ENOSPC) or an I/O error while fsyncing the log: the enqueue
// fails with a clear error, nothing is acknowledged, nothing is indexed, and
// nothing of the record stays in the log.
func TestFault_LogSyncFails(t *testing.T) {
	for _, fault := range []error{syscall.ENOSPC, syscall.EIO} {
		t.Run(fault.Error(), func(t *testing.T) {
			dir := t.TempDir()
			q := openFault(t, dir)
			if _, err := q.Enqueue(context.Background(), faultEnvelope("ok", "u")); err != nil {
				t.Fatal(err)
			}
			setAppender(t, q, applog.NewAppender(dir, func(*os.File) error { return fault }))
			_, err := q.Enqueue(context.Background(), faultEnvelope("lost", "u"))
			if !errors.Is(err, fault) || !strings.Contains(err.Error(), "append to log") {
				t.Fatalf("Enqueue = %v, want a clear error wrapping %v", err, fault)
			}
			if _, err := q.Get(context.Background(), "", "lost"); !errors.Is(err, queue.ErrNotFound) {
				t.Fatalf("failed enqueue is visible: %v", err)
			}
			b, _ := os.ReadFile(LogPath(dir, "", "u"))
			if strings.Contains(string(b), `"lost"`) || strings.Count(string(b), "\n") != 1 {
				t.Fatalf("log keeps the failed record: %q", b)
			}
			// The disk recovers: the next enqueue works and the first is intact.
			setAppender(t, q, applog.NewAppender(dir, applog.Fdatasync))
			if _, err := q.Enqueue(context.Background(), faultEnvelope("after", "u")); err != nil {
				t.Fatal(err)
			}
			if n := rows(t, q); n != 2 {
				t.Fatalf("rows = %d, want 2", n)
			}
		})
	}
}

// A batch over several logs whose second append fails: the first log's
// records are withdrawn, so no prefix of the batch becomes deliverable.
func TestFault_BatchAcrossLogsWithdrawn(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	calls := 0
	setAppender(t, q, applog.NewAppender(dir, func(f *os.File) error {
		calls++
		if calls == 2 {
			return syscall.ENOSPC
		}
		return applog.Fdatasync(f)
	}))
	_, err := q.Enqueue(context.Background(), faultEnvelope("a", "u1"), faultEnvelope("b", "u2"))
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Enqueue = %v", err)
	}
	q.Rescan()
	if err := q.catchUpAll(false); err != nil {
		t.Fatal(err)
	}
	if n := rows(t, q); n != 0 {
		t.Fatalf("rows after a failed batch = %d, want 0", n)
	}
}

// A failing bbolt commit (a full disk while writing the index). The log is
// the durability point: an enqueue whose record reached it is acknowledged
// even if the index update that follows fails; nothing is half-indexed,
// and the record is indexed once the disk recovers. A failing claim
// changes nothing.
func TestFault_IndexCommitFails(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	rows(t, q) // counts are kept from here on
	q.setBeforeCommit(func() error { return syscall.ENOSPC })
	if _, err := q.Enqueue(context.Background(), faultEnvelope("x", "u")); err != nil {
		t.Fatalf("Enqueue = %v: the record is durable in its log", err)
	}
	q.barrier()
	if n := rows(t, q); n != 0 { // the disk is still full: nothing indexed
		t.Fatalf("half-indexed: %d rows", n)
	}
	q.setBeforeCommit(nil)
	b, _ := os.ReadFile(LogPath(dir, "", "u"))
	if !strings.Contains(string(b), `"id":"x"`) {
		t.Fatalf("record not in the log: %q", b)
	}
	if err := q.catchUpAll(false); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Get(context.Background(), "", "x"); err != nil {
		t.Fatalf("record not indexed after the disk recovered: %v", err)
	}
	q.setBeforeCommit(func() error { return syscall.EIO })
	if _, err := q.Claim(context.Background(), queue.ClaimRequest{Owner: "w", Lease: time.Minute}); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Claim = %v", err)
	}
	q.setBeforeCommit(nil)
	st, _ := q.Get(context.Background(), "", "x")
	if st.Segments[0].State != envelope.StatePending || st.Segments[0].Attempts != 0 {
		t.Fatalf("failed claim changed the row: %+v", st.Segments[0])
	}
}

// A log deleted under a running store: its rows are dead-lettered with a
// clear class when claimed; other users' rows are untouched; doctor notes
// the log.
func TestFault_LogDeletedUnderRunningStore(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, faultEnvelope("gone", "u1"), faultEnvelope("kept", "u2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(LogPath(dir, "", "u1")); err != nil {
		t.Fatal(err)
	}
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 10})
	if err != nil || len(ls) != 1 || ls[0].Key.EnvelopeID != "kept" {
		t.Fatalf("claim = %+v, %v", ls, err)
	}
	st, err := q.Get(ctx, "", "gone")
	if err != nil || st.Segments[0].State != envelope.StateDeadLetter || st.Segments[0].Class != envelope.ClassRecordLost {
		t.Fatalf("row of the deleted log = %+v, %v", st, err)
	}
	// Its only row has ended: a note, nothing to do.
	rep, err := q.Check()
	if err != nil || !rep.OK() || len(rep.Settled) != 1 {
		t.Fatalf("Check should note the missing log, settled: %+v, %v", rep, err)
	}
}

// A corrupted or truncated index: Check reports it; Rebuild re-indexes
// every log, keeps the broken file aside, and marks rows of unknown fate
// unresolved (never redelivered automatically).
func TestFault_CorruptIndexRebuilt(t *testing.T) {
	for _, mode := range []string{"truncated", "garbage"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			q := openFault(t, dir)
			ctx := context.Background()
			for _, id := range []string{"a", "b", "c"} {
				if _, err := q.Enqueue(ctx, faultEnvelope(id, "u")); err != nil {
					t.Fatal(err)
				}
			}
			q.Close()
			path := filepath.Join(dir, IndexFile)
			switch mode {
			case "truncated":
				if err := os.Truncate(path, 4096); err != nil {
					t.Fatal(err)
				}
			case "garbage":
				b, _ := os.ReadFile(path)
				for i := 0; i < len(b); i += 7 {
					b[i] ^= 0x5a
				}
				os.WriteFile(path, b, 0o600)
			}
			rep, err := Check(dir)
			if err != nil || rep.OK() {
				t.Fatalf("Check of a %s index = %+v, %v", mode, rep, err)
			}
			n, err := Rebuild(dir, nil)
			if err != nil || n != 3 {
				t.Fatalf("Rebuild = %d, %v", n, err)
			}
			if m, _ := filepath.Glob(path + ".broken-*"); len(m) != 1 {
				t.Fatalf("broken index not kept aside: %v", m)
			}
			rep, err = Check(dir)
			if err != nil || !rep.OK() {
				t.Fatalf("Check after rebuild = %+v, %v", rep, err)
			}
			q2 := openFault(t, dir)
			for _, id := range []string{"a", "b", "c"} {
				st, err := q2.Get(ctx, "", id)
				if err != nil || st.Segments[0].State != envelope.StateUnresolved || st.Segments[0].Class != envelope.ClassIndexRebuilt {
					t.Fatalf("%s after rebuild = %+v, %v", id, st, err)
				}
			}
			if ls, _ := q2.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 10}); len(ls) != 0 {
				t.Fatalf("rebuilt rows were claimable: %d", len(ls))
			}
		})
	}
}

func (q *Queue) setBeforeCommit(fn func() error) {
	if fn == nil {
		q.beforeCommit.Store(nil)
		return
	}
	q.beforeCommit.Store(&fn)
}

// The in-memory counts stay equal to a full scan through enqueues, claims,
// commits, releases, recoveries, erases and prunes.
func TestCounts_MatchScan(t *testing.T) {
	q := openFault(t, t.TempDir())
	ctx := context.Background()
	check := func(when string) {
		t.Helper()
		got, err := q.Counts(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		var want map[countKey]int
		if err := q.db.Load().View(func(tx *bolt.Tx) (err error) { want, err = scanCounts(tx); return err }); err != nil {
			t.Fatal(err)
		}
		total := 0
		for k, n := range want {
			total += n
			if got[k.state][k.channel] < n {
				t.Fatalf("%s: counts %v, scan %v", when, got, want)
			}
		}
		sum := 0
		for s := range got {
			sum += got.Total(s)
		}
		if sum != total {
			t.Fatalf("%s: counts total %d, scan %d", when, sum, total)
		}
	}
	check("empty")
	for i := 0; i < 20; i++ {
		if _, err := q.Enqueue(ctx, faultEnvelope(fmt.Sprintf("e%d", i), fmt.Sprintf("u%d", i%3))); err != nil {
			t.Fatal(err)
		}
	}
	check("enqueued")
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 8})
	if err != nil {
		t.Fatal(err)
	}
	check("claimed")
	for i, l := range ls {
		switch i % 4 {
		case 0:
			q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent})
		case 1:
			q.Commit(ctx, l, queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassTimeout})
		case 2:
			q.Commit(ctx, l, queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassInvalidRequest})
		case 3:
			q.Release(ctx, l)
		}
	}
	check("committed")
	if err := q.Erase(ctx, "", "u1"); err != nil {
		t.Fatal(err)
	}
	check("erased")
}
