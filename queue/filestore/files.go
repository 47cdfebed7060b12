package filestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"

	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

const quarantineExt = applog.QuarantineExt

func logRel(tenant, user string) string { return applog.RelPath(tenant, user) }

// LogPath returns the path of the append log of (tenant, user) under a data
// directory: <dir>/logs/<Name(tenant)>/<Name(user)>.jsonl, where Name keeps
// up to 40 bytes of the id reduced to [a-z0-9_-] and adds "-" and the first
// 16 hex digits of the id's SHA-256. Foreign appenders use it (or the same
// rule) to find the file to append to.
func LogPath(dir, tenant, user string) string {
	return applog.Path(dir, tenantOr(tenant), user)
}

// inode returns the file's inode number: a log replaced or recreated after
// removal starts again at offset 0.
func inode(path string) (uint64, error) { return applog.Inode(path) }

// removeLogIfDone removes a log whose records were all pruned: under the
// log's lock, and only when nothing was appended past the indexed offset.
func (q *Queue) removeLogIfDone(rel, tenant, user string) {
	q.app.Exclusive(rel, func() { q.removeLogLocked(rel, tenant, user) })
}

// removeLogLocked runs with no in-process append possible (Exclusive) and
// takes the log's flock against other processes; it removes the log only
// when every byte of it is indexed and no envelope of its user is left (an
// enqueue may have landed since Prune looked).
func (q *Queue) removeLogLocked(rel, tenant, user string) {
	path := filepath.Join(q.dir, rel)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX) != nil {
		return
	}
	var off int64 = -1
	live := false
	_ = q.dbView(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bktLogs).Get([]byte(rel)); len(v) == 16 {
			off = int64(binary.BigEndian.Uint64(v))
		}
		prefix := []byte(tenant + "\x00" + user + "\x00")
		if k, _ := tx.Bucket(bktUsers).Cursor().Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) {
			live = true
		}
		return nil
	})
	if live || off < 0 {
		return
	}
	// Nothing past the offset, or only an older build's reserve padding.
	if idle, err := applog.NothingPast(f, off); err != nil || !idle {
		return
	}
	_ = os.Remove(path)
	_ = os.Remove(path + quarantineExt)
	// Only the cache: a record appended in process and not indexed yet
	// is not in this file (nothing lies past its indexed offset), so it
	// went with an earlier file of the log; it stays known, to be indexed
	// and found lost (indexMissing), never forgotten.
	q.cache.dropLog(rel)
	_ = q.write(context.Background(), false, func(tx *bolt.Tx) error {
		return tx.Bucket(bktLogs).Delete([]byte(rel))
	})
}

// forgetLog forgets what this process remembers of the log rel that an
// Erase removed: its cached envelopes, and its records appended in process
// and not indexed yet, whichever file they went to (an Erase took them
// with the log), so that nothing of it is read back from memory or indexed
// after the removal. It runs under the log's Exclusive: no append of rel
// is under way, and every record appended before is registered.
func (q *Queue) forgetLog(rel string) {
	q.cache.dropLog(rel)
	q.mu.Lock()
	defer q.mu.Unlock()
	for k, ps := range q.known {
		for _, p := range ps {
			if p.rel == rel {
				q.dropKnownLocked(k, p)
			}
		}
	}
}

func isNotExist(err error) bool { return errors.Is(err, os.ErrNotExist) }
