package filestore

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Logs deleted, truncated or replaced under the store (issue K, item 4):
// an acknowledged envelope is in the file under its log's name, and what
// is appended after the fault is indexed; what was indexed stays indexed,
// and a row whose record is gone is dead-lettered (record_lost) when
// claimed, never delivered with another record's content.

func replyEnv(id, user, text string) *envelope.Envelope {
	e := faultEnvelope(id, user)
	e.Payload, _ = json.Marshal(envelope.ReplyPayload{Text: text})
	return e
}

// mustEnqueue enqueues envs and waits until they are indexed (a read
// waits for the index updates before it), so that a fault the test applies
// next hits records the index knows.
func mustEnqueue(t *testing.T, q *Queue, envs ...*envelope.Envelope) {
	t.Helper()
	for _, e := range envs {
		if _, err := q.Enqueue(context.Background(), e); err != nil {
			t.Fatalf("enqueue %s: %v", e.ID, err)
		}
		if _, err := q.Get(context.Background(), "", e.ID); err != nil {
			t.Fatalf("get %s: %v", e.ID, err)
		}
	}
}

// claimAll claims every due row and returns the leases by envelope id.
func claimAll(t *testing.T, q *Queue) map[string]*queue.Lease {
	t.Helper()
	ls, err := q.Claim(context.Background(), queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*queue.Lease{}
	for _, l := range ls {
		if l.Envelope == nil || l.Envelope.ID != l.Key.EnvelopeID {
			t.Fatalf("lease of %s carries another envelope: %+v", l.Key.EnvelopeID, l.Envelope)
		}
		out[l.Key.EnvelopeID] = l
	}
	return out
}

func wantLeased(t *testing.T, leases map[string]*queue.Lease, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if leases[id] == nil {
			t.Errorf("%s was not claimable (leases: %v)", id, keys(leases))
		}
	}
}

func keys(m map[string]*queue.Lease) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func wantLost(t *testing.T, q *Queue, leases map[string]*queue.Lease, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if leases[id] != nil {
			t.Errorf("%s was leased although its record is gone", id)
		}
		st, err := q.Get(context.Background(), "", id)
		if err != nil {
			t.Fatal(err)
		}
		if s := st.Segments[0]; s.State != envelope.StateDeadLetter || s.Class != envelope.ClassRecordLost {
			t.Errorf("%s: %s/%s, want dead_letter/record_lost", id, s.State, s.Class)
		}
	}
}

func wantInLog(t *testing.T, dir, user string, ids ...string) {
	t.Helper()
	b, err := os.ReadFile(LogPath(dir, "", user))
	if err != nil {
		t.Fatalf("log of %s: %v", user, err)
	}
	for _, id := range ids {
		if !bytes.Contains(b, []byte(`"id":"`+id+`"`)) {
			t.Errorf("%s is not in the file under its log's name: %q", id, b)
		}
	}
}

// noLogProblem fails on a problem Check reports about a log itself.
func noLogProblem(t *testing.T, rep *Report) {
	t.Helper()
	for _, p := range rep.Problems {
		if strings.HasPrefix(p, "log ") {
			t.Errorf("Check still reports: %s", p)
		}
	}
}

func reopen(t *testing.T, q *Queue, dir string) *Queue {
	t.Helper()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	return openFault(t, dir)
}

// (a) A log removed while the store keeps its descriptor open: the next
// envelope for that user goes into a new file under the log's name and is
// delivered, not dead-lettered.
func TestLogFault_DeletedLogGetsANewFile(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	mustEnqueue(t, q, replyEnv("before", "u1", "hello"))
	if err := os.Remove(LogPath(dir, "", "u1")); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, q, replyEnv("after", "u1", "hello"))
	wantInLog(t, dir, "u1", "after")
	leases := claimAll(t, q)
	wantLeased(t, leases, "after")
	wantLost(t, q, leases, "before")
	q = reopen(t, q, dir)
	mustEnqueue(t, q, replyEnv("later", "u1", "hello"))
	wantLeased(t, claimAll(t, q), "later")
	rep, err := q.Check()
	if err != nil {
		t.Fatal(err)
	}
	noLogProblem(t, rep)
}

// (b) A log truncated under the store, to zero or into a record: the
// envelopes enqueued afterwards are indexed and claimable, also after a
// restart; the cut records' rows are record_lost; only the cut line is
// quarantined.
func TestLogFault_TruncatedLogIndexesWhatFollows(t *testing.T) {
	long := strings.Repeat("a long reply ", 40)
	for _, tc := range []struct {
		name       string
		cut        func(lens []int64) int64 // where to cut, from the lines' lengths
		after      *envelope.Envelope
		lost, kept []string
		quarantine int
	}{
		// The new line is exactly as long as the cut ones: the log then
		// has the size the index remembers, a newline where it expects one.
		{"to zero, same length", func([]int64) int64 { return 0 }, replyEnv("t-c", "u1", "hello"), []string{"t-a", "t-b"}, nil, 0},
		{"to zero, longer", func([]int64) int64 { return 0 }, replyEnv("t-c", "u1", long), []string{"t-a", "t-b"}, nil, 0},
		{"into a record", func(l []int64) int64 { return l[0] + 10 }, replyEnv("t-c", "u1", "hello"), []string{"t-b"}, []string{"t-a"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			q := openFault(t, dir)
			mustEnqueue(t, q, replyEnv("t-a", "u1", "hello"), replyEnv("t-b", "u1", "hello"))
			path := LogPath(dir, "", "u1")
			b, _ := os.ReadFile(path)
			var lens []int64
			for _, ln := range bytes.SplitAfter(b, []byte("\n")) {
				if len(ln) > 0 {
					lens = append(lens, int64(len(ln)))
				}
			}
			if err := os.Truncate(path, tc.cut(lens)); err != nil {
				t.Fatal(err)
			}
			mustEnqueue(t, q, tc.after)
			wantInLog(t, dir, "u1", "t-c")
			leases := claimAll(t, q)
			wantLeased(t, leases, append([]string{"t-c"}, tc.kept...)...)
			wantLost(t, q, leases, tc.lost...)
			if qr, _ := q.Quarantined(); len(qr) != tc.quarantine {
				t.Errorf("%d lines quarantined, want %d: %+v", len(qr), tc.quarantine, qr)
			}
			q = reopen(t, q, dir)
			mustEnqueue(t, q, replyEnv("t-d", "u1", "hello"))
			wantLeased(t, claimAll(t, q), "t-d")
			if st, err := q.Get(context.Background(), "", "t-c"); err != nil || st.Segments[0].State != envelope.StateSending {
				t.Errorf("t-c after restart: %+v, %v", st, err)
			}
			rep, err := q.Check()
			if err != nil {
				t.Fatal(err)
			}
			noLogProblem(t, rep)
		})
	}
}

// (b) A log truncated, then appended to by another process: the rescan
// (or the next Open, when the store was stopped) indexes the new lines,
// whether the log is then shorter than the indexed offset or longer.
func TestLogFault_TruncatedLogThenForeignAppend(t *testing.T) {
	long := strings.Repeat("a long reply ", 40)
	for _, tc := range []struct {
		name    string
		text    string
		stopped bool
	}{
		{"shorter, running", "hi", false},
		{"longer, running", long, false},
		{"shorter, stopped", "hi", true},
		{"longer, stopped", long, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			q := openFault(t, dir)
			mustEnqueue(t, q, replyEnv("f-a", "u1", "hello"), replyEnv("f-b", "u1", "hello"))
			if tc.stopped {
				if err := q.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Truncate(LogPath(dir, "", "u1"), 0); err != nil {
				t.Fatal(err)
			}
			if err := Append(dir, replyEnv("f-c", "u1", tc.text)); err != nil {
				t.Fatal(err)
			}
			if tc.stopped {
				q = openFault(t, dir)
			} else if err := q.catchUpAll(false); err != nil {
				t.Fatal(err)
			}
			leases := claimAll(t, q)
			wantLeased(t, leases, "f-c")
			wantLost(t, q, leases, "f-a", "f-b")
			if qr, _ := q.Quarantined(); len(qr) != 0 {
				t.Errorf("quarantined: %+v", qr)
			}
		})
	}
}

// (c) A log replaced by another file (written aside, renamed over it):
// the store appends to the new file, indexes its new records, keeps
// indexed the records it still holds (at their new offsets), and
// dead-letters the rows whose records it lost.
func TestLogFault_ReplacedLog(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	mustEnqueue(t, q, replyEnv("r-a", "u1", "hello"), replyEnv("r-b", "u1", "hello"))
	path := LogPath(dir, "", "u1")
	b, _ := os.ReadFile(path)
	lines := bytes.SplitAfter(b, []byte("\n"))
	foreign, _ := json.Marshal(replyEnv("r-f", "u1", "from the new file"))
	// r-b's line first, then a new record: r-b moved from its offset.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, append(append([]byte(nil), lines[1]...), append(foreign, '\n')...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, q, replyEnv("r-c", "u1", "hello"))
	wantInLog(t, dir, "u1", "r-b", "r-f", "r-c")
	if err := q.catchUpAll(false); err != nil {
		t.Fatal(err)
	}
	leases := claimAll(t, q)
	wantLeased(t, leases, "r-b", "r-c", "r-f")
	wantLost(t, q, leases, "r-a")
	q = reopen(t, q, dir)
	rep, err := q.Check()
	if err != nil {
		t.Fatal(err)
	}
	noLogProblem(t, rep)
}

// (a) A log removed after an enqueue was acknowledged and before its index
// update ran, then appended to again (its new file reaches the same
// offsets): the first records are still indexed, and end record_lost when
// claimed; they are never forgotten because a later record of the new file
// landed at their offset, and never taken for the new file's records.
func TestLogFault_DeletedBeforeIndexed(t *testing.T) {
	for _, tc := range []struct {
		name          string
		before, after []*envelope.Envelope
	}{
		{"no new record", []*envelope.Envelope{replyEnv("d-a", "u1", "hello")}, nil},
		{"same offset", []*envelope.Envelope{replyEnv("d-a", "u1", "hello")}, []*envelope.Envelope{replyEnv("d-b", "u1", "hello")}},
		{"same offsets, two each", []*envelope.Envelope{replyEnv("d-a", "u1", "hello"), replyEnv("d-b", "u1", "hello")},
			[]*envelope.Envelope{replyEnv("d-c", "u1", "hello"), replyEnv("d-d", "u1", "hello")}},
		// The new file's first record covers both old ones; the next one
		// starts where the second old one started in the old file.
		{"other offsets", []*envelope.Envelope{replyEnv("d-a", "u1", "hello"), replyEnv("d-b", "u1", "hello")},
			[]*envelope.Envelope{replyEnv("d-c", "u1", strings.Repeat("long ", 40)), replyEnv("d-d", "u1", "hello")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			q := openFault(t, dir)
			release := holdWriter(t, q)
			ctx := context.Background()
			if _, err := q.Enqueue(ctx, tc.before...); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(LogPath(dir, "", "u1")); err != nil {
				t.Fatal(err)
			}
			var lost, kept []string
			for _, e := range tc.before {
				lost = append(lost, e.ID)
			}
			if len(tc.after) > 0 {
				if _, err := q.Enqueue(ctx, tc.after...); err != nil {
					t.Fatal(err)
				}
				for _, e := range tc.after {
					kept = append(kept, e.ID)
				}
				wantInLog(t, dir, "u1", kept...)
			}
			release()
			for _, id := range append(append([]string(nil), lost...), kept...) {
				if _, err := q.Get(ctx, "", id); err != nil {
					t.Errorf("%s acknowledged, then %v", id, err)
				}
			}
			leases := claimAll(t, q)
			wantLeased(t, leases, kept...)
			wantLost(t, q, leases, lost...)
			q = reopen(t, q, dir)
			mustEnqueue(t, q, replyEnv("d-later", "u1", "hello"))
			wantLeased(t, claimAll(t, q), "d-later")
		})
	}
}

// A leased row whose log is deleted before its lease expires: recovery
// cannot reconcile it (the message is gone) and must not lease it for
// ever, nor fail the recovery of the others: it becomes unresolved,
// record_lost, once; the other user's row is recovered.
func TestLogFault_DeletedUnderALeaseIsUnresolved(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	q, err := Open(dir, &Options{Options: queue.Options{Now: clock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	mustEnqueue(t, q, replyEnv("a", "u1", "hello"), replyEnv("b", "u2", "hello"))
	wantLeased(t, claimAll(t, q), "a", "b")
	if err := os.Remove(LogPath(dir, "", "u1")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	ctx := context.Background()
	req := queue.ClaimRequest{Owner: "r", Lease: time.Minute, Limit: 10}
	ls, err := q.Recover(ctx, req)
	if err != nil || len(ls) != 1 || ls[0].Key.EnvelopeID != "b" {
		t.Fatalf("Recover = %v, %v; want the lease of b only", leaseIDs(ls), err)
	}
	st, err := q.Get(ctx, "", "a")
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Segments[0]; s.State != envelope.StateUnresolved || s.Class != envelope.ClassRecordLost {
		t.Fatalf("a after recovery: %s/%s, want unresolved/record_lost", s.State, s.Class)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	if ls, err := q.Recover(ctx, req); err != nil || len(ls) != 1 || ls[0].Key.EnvelopeID != "b" {
		t.Fatalf("second Recover = %v, %v; want b again, a never", leaseIDs(ls), err)
	}
}

func leaseIDs(ls []*queue.Lease) []string {
	var ids []string
	for _, l := range ls {
		ids = append(ids, l.Key.EnvelopeID)
	}
	return ids
}
