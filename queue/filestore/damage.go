package filestore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/outboxhq/outbox/queue"
)

// The index is a memory-mapped file: one emptied, truncated or overwritten
// under the running store (by hand, by a tool, by a full disk's partial
// write) makes bbolt read past the end of the file (a fault, SIGBUS) or
// read pages of zeros (a bbolt assertion). Either would kill the process
// with a runtime dump. Every transaction runs guarded instead: the fault
// or panic becomes a *CorruptIndexError, and the store stops using the
// index: every later call fails with that error and Damaged is closed, so
// that the process can stop cleanly. Nothing acknowledged is lost (the
// logs hold every record); the next Open refuses the index or repairs it.

// guard runs f, a bbolt transaction on the index, turning a memory fault
// or a panic into a *CorruptIndexError that marks the store damaged.
func (q *Queue) guard(f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = &CorruptIndexError{Path: q.indexPath(), Reason: fmt.Sprint(r)}
		}
		var ce *CorruptIndexError
		if errors.As(err, &ce) {
			q.markDamaged(ce)
		}
	}()
	return f()
}

// markDamaged records the first damage found at run time (a
// *CorruptIndexError or a *DirMovedError) and closes Damaged.
func (q *Queue) markDamaged(err error) {
	if !q.damage.CompareAndSwap(nil, &runDamage{err}) {
		return
	}
	close(q.damaged)
	var ce *CorruptIndexError
	if errors.As(err, &ce) {
		q.log.Error("the index was damaged under the running store: every call fails from now on; stop the process, then start it again (it refuses the index or repairs it; \"outbox doctor --rebuild\" rebuilds it from the logs, which hold every acknowledged envelope)",
			"operation", "index", "status", "damaged", "reason", ce.Reason)
		return
	}
	q.log.Error(err.Error()+" (every call fails from now on)", "operation", "index", "status", "moved")
}

// indexSound reports whether the index file can still be used and closed
// as bbolt's: no damage, or only the data directory moved (the file the
// store has open is intact wherever it now is).
func (q *Queue) indexSound() bool {
	var ce *CorruptIndexError
	return !errors.As(q.damageErr(), &ce)
}

// runDamage holds the damage found at run time.
type runDamage struct{ err error }

// DirMovedError is the damage of a store whose data directory is no
// longer at the path it was opened by: moved (renamed), removed, or
// replaced by another directory, under the running store. The store stops
// (every call fails, Damaged is closed) rather than go on at the old path:
// a new log created there would split what is acknowledged between two
// directories, one of them without an index. Nothing acknowledged is
// lost: the moved directory holds it all, with its index.
type DirMovedError struct {
	Path string // the path the store was opened by
	Now  string // the directory's path now, where the system can tell; "" if unknown or removed
}

// Is makes a DirMovedError queue.ErrUnavailable (HTTP 503, the worker
// backs off).
func (e *DirMovedError) Is(target error) bool { return target == queue.ErrUnavailable }

func (e *DirMovedError) Error() string {
	if e.Now != "" {
		return fmt.Sprintf("the data directory %s was moved to %s under the running store: stop the process, then move the directory back or open it where it is now (it holds everything acknowledged, with its index)", e.Path, e.Now)
	}
	return fmt.Sprintf("the data directory %s was removed or replaced under the running store: stop the process; put the directory back (from where it was moved, or a backup: then run \"outbox doctor --rebuild\") before starting it again", e.Path)
}

// checkDir marks the store damaged (a *DirMovedError) when its data
// directory's path no longer leads to the directory it opened, and
// reports whether it is damaged that way. A path it cannot look up for
// another reason (a permission, an I/O error) is not damage.
func (q *Queue) checkDir() bool {
	if q.dirInfo == nil {
		return false
	}
	fi, err := os.Stat(q.dir)
	switch {
	case err == nil && os.SameFile(fi, q.dirInfo):
		return false
	case err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
		return false
	}
	q.markDamaged(&DirMovedError{Path: q.dir, Now: q.dirNow()})
	return true
}

// dirNow is where the data directory is now, from the path of the lock
// file the store holds open (Linux's /proc); "" when removed or unknown.
func (q *Queue) dirNow() string {
	if q.lock == nil || q.lock.f == nil {
		return ""
	}
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", q.lock.f.Fd()))
	if err != nil || !filepath.IsAbs(p) || strings.HasSuffix(p, " (deleted)") {
		return ""
	}
	return filepath.Dir(p)
}

// checkIndexFile marks the store damaged when its data directory moved
// (checkDir), or when index.db is no longer the file the store has open:
// removed (with its directory, perhaps) or replaced, renamed over, under
// it. The store would go on writing to a file that no one opens again,
// and everything it recorded would be lost at the next start. The tailer
// runs it every indexCheckInterval.
func (q *Queue) checkIndexFile() {
	if q.checkDir() {
		return
	}
	defer q.checkMarkFiles()
	q.indexMu.Lock()
	fi, err := os.Stat(q.indexPath())
	open := q.indexFile
	q.indexMu.Unlock()
	var reason string
	switch {
	case errors.Is(err, fs.ErrNotExist):
		reason = "the file was removed under the running store"
	case err != nil || open == nil || os.SameFile(fi, open):
		return // the same file, or no way to tell (not damage)
	default:
		reason = "the file was replaced under the running store"
	}
	q.markDamaged(&CorruptIndexError{Path: q.indexPath(), Reason: reason})
}

// indexCheckInterval is how often the tailer checks that index.db is still
// the file the store has open (a stat).
const indexCheckInterval = time.Second

// damageErr is the damage found at run time, or nil.
func (q *Queue) damageErr() error {
	if d := q.damage.Load(); d != nil {
		return d.err
	}
	return nil
}

// Damaged is closed when the store found its index damaged, or its data
// directory moved, while running (see DamageError); from then on every
// call fails. A process should stop: the next Open checks the index.
func (q *Queue) Damaged() <-chan struct{} { return q.damaged }

// DamageError is the *CorruptIndexError or *DirMovedError that closed
// Damaged, or nil.
func (q *Queue) DamageError() error { return q.damageErr() }

// Ping reports whether the store can serve calls (a readiness check): nil,
// queue.ErrClosed after Close, the damage found at run time, or the error
// of a data directory it may not write in (a read-only file system).
func (q *Queue) Ping(context.Context) error {
	if q.isClosed() {
		return queue.ErrClosed
	}
	if err := q.damageErr(); err != nil {
		return err
	}
	// A file system remounted read-only under the store (after disk
	// errors) fails every write: not ready (queue.StorageReadOnly).
	if err := writable(q.dir); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	return nil
}
