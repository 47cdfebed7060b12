package filestore

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
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
