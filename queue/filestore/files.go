package filestore

import (
	"bytes"
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

// removeEmptiedLog removes log rel, which no envelope points at any more,
// in Prune's transaction tx: under its Exclusive (no in-process append)
// and its flock (no other process's), and only when it is still the file
// that was indexed and holds nothing past its indexed offset (an append
// since would be new work). Its entry in the logs bucket goes only once
// the removal is synced (its directory fsynced): a log that came back
// after a machine crash while its entry was gone would be indexed again
// from its start, every record as new. A log that was never emptied by a
// prune here (orphan: no envelope pointed at it when Prune looked) keeps
// its quarantine file, and with it the log: its lines were not records.
// Failures leave the log for the next Prune.
func (q *Queue) removeEmptiedLog(tx *bolt.Tx, rel string, orphan bool) {
	logs := tx.Bucket(bktLogs)
	off, ino, ok := logPos(logs.Get([]byte(rel)))
	if !ok {
		return
	}
	path := filepath.Join(q.dir, rel)
	q.app.Exclusive(rel, func() {
		f, err := applog.OpenFile(path, os.O_RDWR, 0)
		switch {
		case isNotExist(err):
			// Gone already (removed by a prune that died before its
			// commit, or by hand): only its entry is left.
		case err != nil:
			return // a link (never followed; doctor lists it), or unreadable
		default:
			defer f.Close()
			if unix.Flock(int(f.Fd()), unix.LOCK_EX) != nil {
				return
			}
			if fino, err := applog.FileInode(f); err != nil || fino != ino {
				return // another file under its name: not what was indexed
			}
			if orphan {
				if _, err := os.Lstat(path + quarantineExt); !isNotExist(err) {
					return
				}
			}
			// Nothing past the offset, or only an older build's reserve padding.
			if idle, err := applog.NothingPast(f, off); err != nil || !idle {
				return
			}
			if os.Remove(path) != nil {
				return
			}
			_ = os.Remove(path + quarantineExt)
		}
		if !q.opts.NoSync {
			if err := syncDir(filepath.Dir(path)); err != nil && !isNotExist(err) {
				return
			}
		}
		q.cache.dropLog(rel)
		if logs.Delete([]byte(rel)) == nil {
			_ = dropSkips(tx, rel)
			_ = dropPruned(tx, rel)
		}
	})
}

// dropSkips deletes the withdrawn ranges recorded for log rel (the skip
// bucket): they belong to a file that is gone, and a new file under its
// name must be read whole.
func dropSkips(tx *bolt.Tx, rel string) error {
	return dropPrefix(tx.Bucket(bktSkip), []byte(rel+"\x00"))
}

// dropPrefix deletes the keys of b that start with prefix.
func dropPrefix(b *bolt.Bucket, prefix []byte) error {
	var stale [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		stale = append(stale, append([]byte(nil), k...))
	}
	for _, k := range stale {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
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
