package filestore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
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

// markDamaged records the first damage found at run time and closes
// Damaged.
func (q *Queue) markDamaged(ce *CorruptIndexError) {
	if !q.damage.CompareAndSwap(nil, ce) {
		return
	}
	close(q.damaged)
	q.log.Error("the index was damaged under the running store: every call fails from now on; stop the process, then start it again (it refuses the index or repairs it; \"outbox doctor --rebuild\" rebuilds it from the logs, which hold every acknowledged envelope)",
		"operation", "index", "status", "damaged", "reason", ce.Reason)
}

// checkIndexFile marks the store damaged when index.db is no longer the
// file the store has open: removed (with its directory, perhaps) or
// replaced, renamed over, under it. The store would go on writing to a file
// that no one opens again, and everything it recorded would be lost at the
// next start. The tailer runs it every indexCheckInterval.
func (q *Queue) checkIndexFile() {
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
	if ce := q.damage.Load(); ce != nil {
		return ce
	}
	return nil
}

// Damaged is closed when the store found its index damaged while running
// (see DamageError); from then on every call fails. A process should
// stop: the next Open checks the index.
func (q *Queue) Damaged() <-chan struct{} { return q.damaged }

// DamageError is the *CorruptIndexError that closed Damaged, or nil.
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
