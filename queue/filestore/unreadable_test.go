package filestore_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// A log or a tenant directory the store's user may not read (created by a
// command run as root, mode 0600) is skipped and reported, once each; the
// other logs are indexed as usual. Before, one such log failed every
// catch-up, and Open with it.
func TestIngest_UnreadableLogSkipped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the store as another user (CI runs as root)")
	}
	base, err := os.MkdirTemp("", "unreadable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "filestore.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	dir := filepath.Join(base, "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	asNobody := func(mode, arg string) (string, string) {
		t.Helper()
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), "OUTBOX_TEST_CHILD="+mode, "OUTBOX_TEST_DIR="+dir, "OUTBOX_TEST_ARG="+arg)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s as nobody: %v\n%s", mode, err, errb.String())
		}
		return strings.TrimSpace(out.String()), errb.String()
	}
	asNobody("append", "a:2:2")
	if n, _ := asNobody("open-count", ""); n != "2" {
		t.Fatalf("pending = %s, want 2", n)
	}
	// As root: a log in the store's tenant directory, and a new tenant
	// directory, both root's and unreadable by the store's user.
	if err := filestore.Append(dir, queuetest.Reply("root-1", "u-root", "hi")); err != nil {
		t.Fatal(err)
	}
	other := queuetest.Reply("root-2", "u-root", "hi")
	other.TenantID = "acme"
	if err := filestore.Append(dir, other); err != nil {
		t.Fatal(err)
	}
	asNobody("append", "b:2:2") // the store's user appends on
	n, logs := asNobody("open-count", "")
	if n != "4" {
		t.Errorf("pending = %s, want 4 (the readable logs' records)", n)
	}
	if got := strings.Count(logs, "cannot be read (permission denied"); got != 2 {
		t.Errorf("%d warnings about unreadable logs, want 2 (the log and the tenant directory):\n%s", got, logs)
	}
	// outbox doctor lists them, even run as root (which could read them).
	rep, err := filestore.Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	owned := 0
	for _, p := range rep.Problems {
		if strings.Contains(p, "belongs to uid 0, not to the store's user (uid 65534)") {
			owned++
		}
	}
	if owned != 3 { // the root log, the root tenant directory and its log
		t.Errorf("Check lists %d files of another user, want 3: %q", owned, rep.Problems)
	}
}

// outbox doctor counts the records of a log the index has never read (a
// new user's, appended by outbox enqueue while serve was stopped) as
// still to index, instead of saying nothing is.
func TestCheck_CountsLogsNeverIndexed(t *testing.T) {
	dir := t.TempDir()
	q := mustOpen(t, dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	if _, err := q.Enqueue(context.Background(), queuetest.Reply("r-1", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	q.Close()
	before, err := filestore.Check(dir)
	if err != nil || !before.OK() || before.Unindexed != 0 {
		t.Fatalf("Check = %+v, %v", before, err)
	}
	for i := range 3 {
		if err := filestore.Append(dir, queuetest.Reply(fmt.Sprintf("new-%d", i), "u-new", "hi")); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := filestore.Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Logs != before.Logs+1 || rep.Unindexed == 0 {
		t.Errorf("Check after 3 records in a new log = %+v; want one more log, its bytes unindexed", rep)
	}
}
