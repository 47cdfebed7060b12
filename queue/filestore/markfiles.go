package filestore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// index.mark and index.checkpoint are written in place through the
// descriptors the store opened. Removed or replaced under the running
// store (a clean-up of the data directory), they would be written no more
// until the next start: an older index put back meanwhile would not be
// refused (index.mark), nor a torn index taken back to its checkpoint
// after a power cut (index.checkpoint). The tailer's check notices it
// every indexCheckInterval, and the writer makes them again: the next
// synced commit, this one, writes both.

// noteOpen records f's identity in p.
func noteOpen(p *atomic.Pointer[os.FileInfo], f *os.File) {
	if fi, err := f.Stat(); err == nil {
		p.Store(&fi)
	}
}

// goneFrom reports whether path no longer leads to the file open is.
func goneFrom(path string, open *os.FileInfo) bool {
	if open == nil {
		return false
	}
	fi, err := os.Lstat(path)
	return errors.Is(err, os.ErrNotExist) || (err == nil && !os.SameFile(fi, *open))
}

// checkMarkFiles has the writer make index.mark and index.checkpoint
// again when either is no longer the file the store has open.
func (q *Queue) checkMarkFiles() {
	if q.damageErr() != nil || q.isClosed() {
		return
	}
	if !goneFrom(markPath(q.dir), q.markInfo.Load()) && !goneFrom(filepath.Join(q.dir, CheckpointFile), q.ckptInfo.Load()) {
		return
	}
	if err := q.write(context.Background(), false, func(*bolt.Tx) error { return q.remakeMarkFiles() }); err != nil && !errors.Is(err, queue.ErrClosed) && q.damageErr() == nil {
		q.log.Warn("index.mark or index.checkpoint was removed or replaced under the running store and could not be made again; it is tried again", "operation", "index", "status", "error", "error", sysErr(err))
	}
}

// remakeMarkFiles opens index.mark and index.checkpoint again under their
// names where they are no longer the files the store has open (writer
// only). The transaction it runs in, synced, writes both.
func (q *Queue) remakeMarkFiles() error {
	made := false
	if q.markF != nil && goneFrom(markPath(q.dir), q.markInfo.Load()) {
		f, err := openNoFollow(markPath(q.dir), os.O_WRONLY|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		_ = f.Truncate(int64(markLen))
		q.markF.Close()
		q.markF = f
		noteOpen(&q.markInfo, f)
		made = true
	}
	path := filepath.Join(q.dir, CheckpointFile)
	if q.ckptF != nil && goneFrom(path, q.ckptInfo.Load()) {
		f, err := openNoFollow(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		q.ckptF.Close()
		q.ckptF = f
		noteOpen(&q.ckptInfo, f)
		made = true
	}
	if !made {
		return nil
	}
	q.log.Warn("index.mark or index.checkpoint was removed or replaced under the running store: made again", "operation", "index", "status", "remade")
	if q.opts.NoSync {
		return nil
	}
	return syncDir(q.dir)
}
