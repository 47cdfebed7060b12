package filestore

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// (d) doctor's Check reports a log shorter than its indexed offset, a
// replaced one and one changed before its indexed offset, each with a
// hint, and none once the store has indexed it again.
func TestCheck_ReportsTruncatedOrReplacedLog(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(t *testing.T, path string)
		want  string
	}{
		{"truncated", func(t *testing.T, path string) {
			if err := os.Truncate(path, 10); err != nil {
				t.Fatal(err)
			}
		}, "truncated"},
		{"replaced by a copy", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			if err := os.WriteFile(path+".new", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(path+".new", path); err != nil {
				t.Fatal(err)
			}
		}, "replaced"},
		{"rewritten", func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
			f, _ := json.Marshal(replyEnv("c-f", "u1", strings.Repeat("a long reply ", 40)))
			if err := os.WriteFile(path, append(f, '\n'), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			q := openFault(t, dir)
			mustEnqueue(t, q, replyEnv("c-a", "u1", "hello"), replyEnv("c-b", "u1", "hello"))
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			tc.fault(t, LogPath(dir, "", "u1"))
			rep, err := Check(dir)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, p := range rep.Problems {
				if strings.HasPrefix(p, "log ") && strings.Contains(p, tc.want) && strings.Contains(p, "hint:") {
					found = true
				}
			}
			if rep.OK() || !found {
				t.Fatalf("Check does not report the %s log with a hint: %+v", tc.name, rep.Problems)
			}
			q = openFault(t, dir)
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			if rep, err = Check(dir); err != nil {
				t.Fatal(err)
			}
			noLogProblem(t, rep)
		})
	}
}

// A deleted log is a problem while a row of its envelopes waits for the
// records it held; once every such row has ended (sent before, or
// dead-lettered record_lost when claimed) there is nothing to do, and
// doctor says so in a note instead of failing until the prune.
func TestCheck_ADeletedLogWhoseEnvelopesEndedIsANote(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	ctx := context.Background()
	mustEnqueue(t, q, replyEnv("s-a", "u1", "hello"))
	for _, l := range claimAll(t, q) {
		if err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: "m"}); err != nil {
			t.Fatal(err)
		}
	}
	mustEnqueue(t, q, replyEnv("s-b", "u1", "hello"), replyEnv("s-c", "u2", "hello"))
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(LogPath(dir, "", "u1")); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || !strings.Contains(strings.Join(rep.Problems, "\n"), "deleted") {
		t.Fatalf("a deleted log with a pending row: problems %q", rep.Problems)
	}

	q = openFault(t, dir)
	if ls := claimAll(t, q); ls["s-b"] != nil || ls["s-c"] == nil { // s-b: record_lost
		t.Fatalf("claimed %v", keys(ls))
	}
	if st, err := q.Get(ctx, "", "s-b"); err != nil || st.Status != string(envelope.StateDeadLetter) {
		t.Fatalf("s-b = %+v, %v; want dead_letter", st, err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err = Check(dir); err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("every row of the deleted log's envelopes ended, yet problems %q", rep.Problems)
	}
	if len(rep.Settled) != 1 || !strings.Contains(rep.Settled[0], "2 envelopes") {
		t.Fatalf("notes %q, want one for the deleted log's 2 envelopes", rep.Settled)
	}
}
