package applog

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// An append that waits for another process's flock on its log (a foreign
// appender that hangs while holding it) is reported while it waits, and
// again when it got the lock; it then appends as usual.
func TestAppender_ReportsALongLockWait(t *testing.T) {
	defer func(d time.Duration) { LockWarnAfter = d }(LockWarnAfter)
	LockWarnAfter = 10 * time.Millisecond
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	a := NewAppender(dir, Fdatasync)
	defer a.Close()
	reports := make(chan lockReport, 4)
	a.SlowLock = func(d time.Duration, acquired bool) { reports <- lockReport{d, acquired} }
	first := rec(1, 64)
	if _, _, err := a.Append(rel, first, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-reports:
		t.Fatalf("an append without a lock held reported %+v", r)
	default:
	}

	// Another open file description of the log: its flock excludes the
	// appender's as another process's would.
	holder, err := os.OpenFile(filepath.Join(dir, rel), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	second := rec(2, 64)
	done := make(chan error, 1)
	go func() {
		_, _, err := a.Append(rel, second, nil)
		done <- err
	}()
	if r := <-reports; r.acquired || r.waited != LockWarnAfter {
		t.Fatalf("first report %+v, want the wait so far", r)
	}
	select {
	case err := <-done:
		t.Fatalf("the append went on while the lock was held: %v", err)
	default:
	}
	unlockAndWant(t, holder, reports, done)
	wantFile(t, filepath.Join(dir, rel), first, second)
}

// A foreign appender's AppendIn (outbox enqueue) reports a long wait for
// the log's lock the same way.
func TestAppendIn_ReportsALongLockWait(t *testing.T) {
	defer func(d time.Duration) { LockWarnAfter = d }(LockWarnAfter)
	LockWarnAfter = 10 * time.Millisecond
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	first := rec(1, 64)
	if _, err := AppendIn(dir, rel, first, nil, func(time.Duration, bool) { t.Error("an append without a lock held reported a wait") }); err != nil {
		t.Fatal(err)
	}
	holder, err := os.OpenFile(filepath.Join(dir, rel), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	reports := make(chan lockReport, 4)
	second := rec(2, 64)
	done := make(chan error, 1)
	go func() {
		_, err := AppendIn(dir, rel, second, nil, func(d time.Duration, acquired bool) { reports <- lockReport{d, acquired} })
		done <- err
	}()
	if r := <-reports; r.acquired {
		t.Fatalf("first report %+v, want the wait so far", r)
	}
	unlockAndWant(t, holder, reports, done)
	wantFile(t, filepath.Join(dir, rel), first, second)
}

type lockReport struct {
	waited   time.Duration
	acquired bool
}

// unlockAndWant releases holder's lock and checks that the append waiting
// for it reports the whole wait and succeeds.
func unlockAndWant(t *testing.T, holder *os.File, reports <-chan lockReport, done <-chan error) {
	t.Helper()
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if r := <-reports; !r.acquired || r.waited < LockWarnAfter {
		t.Fatalf("second report %+v, want the lock acquired after the whole wait", r)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
