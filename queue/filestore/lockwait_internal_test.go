package filestore

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// An enqueue that waits for another process's lock on its user's log (a
// foreign appender that hangs holding it) says so in the store's log while
// it waits, without naming the log (its name holds the user id), and once
// more when it went on: before, its requests only hung.
func TestEnqueue_LogsALongWaitForALogsLock(t *testing.T) {
	defer func(d time.Duration) { applog.LockWarnAfter = d }(applog.LockWarnAfter)
	applog.LockWarnAfter = 10 * time.Millisecond
	dir := t.TempDir()
	var logs lockedLog
	q, err := Open(dir, &Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	const user = "u-lockwait-7f3"
	if _, err := q.Enqueue(ctx, queuetest.Reply("r-1", user, "hi")); err != nil {
		t.Fatal(err)
	}
	holder, err := os.OpenFile(filepath.Join(dir, applog.RelPath("default", user)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := q.Enqueue(ctx, queuetest.Reply("r-2", user, "hi"))
		done <- err
	}()
	waitLog := func(want string) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), want); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("no %q in the store's log:\n%s", want, logs.String())
			}
		}
	}
	waitLog("status=lock_wait")
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitLog("status=lock_acquired")
	if out := logs.String(); strings.Contains(out, user) || strings.Contains(out, applog.RelPath("default", user)) {
		t.Errorf("the log names the user or their log:\n%s", out)
	}
	if _, err := q.Get(ctx, "default", "r-2"); err != nil {
		t.Fatalf("the enqueue that waited: Get = %v", err)
	}
}
