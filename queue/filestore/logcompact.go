package filestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// A user who is never idle keeps records in their log that are not pruned
// yet, so the log is never emptied and removed (removeEmptiedLog): without
// more it would grow for ever. After each prune, a log whose pruned
// records take at least half of its indexed size (and which holds at
// least Options.LogRewriteMin bytes) is rewritten with only the records
// the index still names, in their order, and the index is pointed at
// their new offsets.
//
// The rewrite runs in the writer, one log per transaction, under the log's
// Exclusive (no append of this process) and its flock (no other
// process's), and only when nothing is past the indexed offset and no
// record of this process waits for its index update: every line of the
// new file is indexed, at an offset the same transaction records. The
// new file is written beside the log (compactExt), synced, renamed over
// it and its directory synced before the transaction commits. A crash
// between the rename and the commit leaves the index naming the old file:
// the next catch-up finds another file under the log's name and indexes
// it again from its start (resetLog), which moves each record's entry to
// its new offset (relocate). A foreign appender waiting for the old
// file's flock finds another file under the name once it has it, and
// opens the new one (the appenders' contract, docs/data-format.md).
//
// A read that took a record's offset from a transaction older than the
// rewrite finds another record, or the end of the file, there: moved
// remembers where each record of a rewritten log went, for a minute, for
// such a read to look again.

// compactExt is the suffix of a log's rewrite before it is renamed over
// the log (ignored by the tailer, which reads only applog.Ext files).
const compactExt = ".compact"

// liveRec is one record a rewrite keeps.
type liveRec struct {
	ek  []byte
	off int64
	n   int // without its newline
}

// syncRewrite syncs a log's rewrite before its rename (tests fail it).
var syncRewrite = applog.Fdatasync

// movedRecs remembers where the records of rewritten logs went, for
// movedFor: a read's transaction is never that old.
type movedRecs struct {
	mu sync.Mutex
	m  map[string]movedLog
}

type movedLog struct {
	to map[int64]int64 // old offset → new offset
	at time.Time
}

const movedFor = time.Minute

func (m *movedRecs) put(rel string, to map[int64]int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	for k, l := range m.m {
		if now.Sub(l.at) > movedFor {
			delete(m.m, k)
		}
	}
	if m.m == nil {
		m.m = map[string]movedLog{}
	}
	m.m[rel] = movedLog{to, now}
}

func (m *movedRecs) get(rel string, off int64) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	to, ok := m.m[rel].to[off]
	return to, ok
}

// worthRewriting reports whether the log whose logs-bucket entry is v,
// of which the index names live bytes, is to be rewritten: its pruned
// records fill at least half of it, and it holds at least
// Options.LogRewriteMin bytes.
func (q *Queue) worthRewriting(v []byte, live int64) bool {
	off, _, ok := logPos(v)
	least := q.opts.LogRewriteMin
	return ok && least >= 0 && live > 0 && off >= least && off-live >= off/2
}

// compactLogs rewrites logs rels (Prune's choice: worthRewriting), each
// in a transaction of its own, from one read of the index for all of
// them. It returns how many it rewrote; a log that changed since the read,
// or that it cannot rewrite now, is left for the next prune.
func (q *Queue) compactLogs(ctx context.Context, rels []string) (int, error) {
	if len(rels) == 0 {
		return 0, nil
	}
	want := make(map[string]bool, len(rels))
	for _, rel := range rels {
		want[rel] = true
	}
	recs := map[string][]liveRec{}
	at := map[string][]byte{} // each log's entry when read
	err := q.view(func(tx *bolt.Tx) error {
		for _, rel := range rels {
			at[rel] = append([]byte(nil), tx.Bucket(bktLogs).Get([]byte(rel))...)
		}
		return tx.Bucket(bktEnv).ForEach(func(k, v []byte) error {
			var e envRec
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			if want[e.Log] {
				recs[e.Log] = append(recs[e.Log], liveRec{append([]byte(nil), k...), e.Off, e.Len})
			}
			return nil
		})
	})
	if err != nil {
		return 0, err
	}
	faultAt("log-compact-read")
	n := 0
	for _, rel := range rels {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		rs := recs[rel]
		sort.Slice(rs, func(i, j int) bool { return rs[i].off < rs[j].off })
		var done bool
		err := q.write(ctx, false, func(tx *bolt.Tx) error {
			var err error
			done, err = q.compactLog(tx, rel, at[rel], rs)
			return err
		})
		if err != nil {
			return n, err
		}
		if done {
			n++
		}
	}
	return n, nil
}

// compactLog rewrites log rel in tx (see above): with recs, the records
// the index named when the log's entry in the logs bucket read was, those
// of them it still names, then every line indexed since (what lies past
// was's offset, up to the entry's offset now), as it is. It reports
// whether it did; false when the log is another file than then, or busy:
// left for the next prune.
func (q *Queue) compactLog(tx *bolt.Tx, rel string, was []byte, recs []liveRec) (done bool, err error) {
	logs := tx.Bucket(bktLogs)
	off, ino, ok := logPos(logs.Get([]byte(rel)))
	from, wasIno, wasOK := logPos(was)
	if !ok || !wasOK || ino != wasIno || off < from {
		return false, nil // reset since: not the file that was read
	}
	keep := recs[:0:0]
	for _, r := range recs {
		e, err := getEnv(tx, r.ek)
		if err != nil {
			return false, err
		}
		if e != nil && e.Log == rel && e.Off == r.off {
			keep = append(keep, r) // else erased or pruned since
		}
	}
	path := filepath.Join(q.dir, rel)
	q.app.Exclusive(rel, func() {
		if q.hasKnown(rel) {
			return // a record of this process waits for its index update at an old offset
		}
		f, ferr := applog.OpenFile(path, os.O_RDWR, 0)
		if ferr != nil {
			return // gone, a link, or unreadable: the catch-up and doctor say so
		}
		defer f.Close()
		if unix.Flock(int(f.Fd()), unix.LOCK_EX) != nil {
			return
		}
		if fino, ferr := applog.FileInode(f); ferr != nil || fino != ino {
			return // another file under its name: the catch-up's affair
		}
		if idle, ferr := applog.NothingPast(f, off); ferr != nil || !idle {
			return // lines not indexed yet
		}
		if withdrawnPast(tx, rel, from) {
			// A withdrawn record in what would be copied as it is: a later
			// reset of the new file (a crash before this commits) would
			// index it. Rare (a failed batch in the last moments).
			return
		}
		to, base, nino, size := q.rewriteLog(f, path, keep, from, off)
		if to == nil {
			return
		}
		// The lines indexed since the read: each record the index names
		// there moves by the same distance. First, while every entry
		// still holds its old offset: a head record's new offset may be
		// a tail line's old one.
		if err = q.moveTail(tx, f, rel, from, off, base, to); err != nil {
			return
		}
		for _, r := range keep {
			if err = moveEnv(tx, r.ek, to[r.off]); err != nil {
				return
			}
		}
		if err = logs.Put([]byte(rel), append(u64(uint64(size)), u64(nino)...)); err != nil {
			return
		}
		if err = dropSkips(tx, rel); err != nil {
			return
		}
		// The pruned records are not in the new file. (The lines copied as
		// they are were indexed after the prune: none is pruned.)
		if err = dropPruned(tx, rel); err != nil {
			return
		}
		q.cache.dropLog(rel)
		q.moved.put(rel, to)
		done = true
	})
	if err != nil {
		return false, fmt.Errorf("compact log: %w", err)
	}
	if done {
		q.m.logCompactions.Inc()
	}
	return done, nil
}

// withdrawnPast reports whether log rel holds a withdrawn record (the
// skip bucket) at or after offset from.
func withdrawnPast(tx *bolt.Tx, rel string, from int64) bool {
	prefix := []byte(rel + "\x00")
	k, _ := tx.Bucket(bktSkip).Cursor().Seek(append(prefix, u64(uint64(from))...))
	return k != nil && bytes.HasPrefix(k, prefix)
}

// moveEnv sets the offset of envelope ek's record.
func moveEnv(tx *bolt.Tx, ek []byte, off int64) error {
	e, err := getEnv(tx, ek)
	if err != nil || e == nil {
		return err
	}
	e.Off = off
	return putEnv(tx, ek, e)
}

// moveTail moves the index entries of the records of log rel that lie in
// [from, end) of f, copied as they are to base onwards in the new file,
// recording each move in to.
func (q *Queue) moveTail(tx *bolt.Tx, f *os.File, rel string, from, end, base int64, to map[int64]int64) error {
	if end == from {
		return nil
	}
	tail := make([]byte, end-from)
	if _, err := f.ReadAt(tail, from); err != nil && err != io.EOF {
		return err
	}
	for _, ln := range applog.Lines(tail, from) {
		ek := lineKey(ln.Data)
		if ek == nil {
			continue // not a record (quarantined, withdrawn): copied, never indexed
		}
		e, err := getEnv(tx, ek)
		if err != nil {
			return err
		}
		if e == nil || e.Log != rel || e.Off != ln.Off {
			continue // a duplicate, or another log's
		}
		to[ln.Off] = base + ln.Off - from
		if err := moveEnv(tx, ek, to[ln.Off]); err != nil {
			return err
		}
	}
	return nil
}

// rewriteLog writes recs, read from f (the log at path, whose flock is
// held), then f's bytes [tailFrom, tailTo) as they are, to a new file, and
// renames it over path. It returns each record's new offset by its old
// one, where the tail starts in the new file, the new file's inode and
// size; a nil map when nothing was changed: a record is not where the
// index says (left for doctor), or the new file could not be written (a
// full disk: logged, tried again at the next prune). Once the new file is
// under the log's name the index must follow, whatever fails after.
func (q *Queue) rewriteLog(f *os.File, path string, recs []liveRec, tailFrom, tailTo int64) (map[int64]int64, int64, uint64, int64) {
	tmp := path + compactExt
	skip := func(err error) (map[int64]int64, int64, uint64, int64) {
		_ = os.Remove(tmp)
		if err != nil {
			q.log.Warn("rewriting a log without its pruned records failed; it is tried again at the next prune",
				"operation", "prune", "status", "error", "error", sysErr(err))
		}
		return nil, 0, 0, 0
	}
	out, err := applog.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return skip(err)
	}
	defer out.Close()
	to := make(map[int64]int64, len(recs))
	var at int64
	var buf bytes.Buffer
	flush := func() error {
		_, err := out.Write(buf.Bytes())
		buf.Reset()
		return err
	}
	for _, r := range recs {
		line := make([]byte, r.n+1)
		if _, err := f.ReadAt(line, r.off); err != nil && err != io.EOF {
			return skip(err)
		}
		if line[r.n] != '\n' || !bytes.Equal(lineKey(line[:r.n]), r.ek) {
			return skip(nil)
		}
		to[r.off] = at
		buf.Write(line)
		at += int64(len(line))
		if buf.Len() >= 1<<20 {
			if err := flush(); err != nil {
				return skip(err)
			}
		}
	}
	base := at
	if tailTo > tailFrom {
		tail := make([]byte, tailTo-tailFrom)
		if _, err := f.ReadAt(tail, tailFrom); err != nil && err != io.EOF {
			return skip(err)
		}
		buf.Write(tail)
		at += int64(len(tail))
	}
	if err := flush(); err != nil {
		return skip(err)
	}
	if !q.opts.NoSync {
		if err := syncRewrite(out); err != nil {
			return skip(err)
		}
	}
	ino, err := applog.FileInode(out)
	if err != nil {
		return skip(err)
	}
	faultAt("log-compact-written")
	if err := os.Rename(tmp, path); err != nil {
		return skip(err)
	}
	if !q.opts.NoSync {
		// Not durable yet if this fails: after a power cut the old file
		// may be back, which the catch-up indexes again (relocate).
		if err := syncDir(filepath.Dir(path)); err != nil {
			q.log.Warn("syncing a rewritten log's directory failed", "operation", "prune", "status", "error", "error", sysErr(err))
		}
	}
	faultAt("log-compact-renamed")
	return to, base, ino, at
}

// sysErr is err's system error alone: a log's path holds its user's id.
func sysErr(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return "not a system error"
}

// lineKey is the envelope key of a log line's record (its tenant and
// id), or nil when the line is not JSON with an id.
func lineKey(line []byte) []byte {
	var id struct {
		Tenant string `json:"tenant_id"`
		ID     string `json:"id"`
	}
	if json.Unmarshal(line, &id) != nil || id.ID == "" {
		return nil
	}
	if id.Tenant == "" {
		id.Tenant = envelope.DefaultTenant
	}
	return envKey(id.Tenant, id.ID)
}

// hasKnown reports whether a record of log rel appended by this process
// waits for its index update (q.known, keyed "log 0 offset").
func (q *Queue) hasKnown(rel string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k := range q.known {
		if strings.HasPrefix(k, rel+"\x00") {
			return true
		}
	}
	return false
}

// removeCompactLeftovers removes rewrites of logs that a crash left
// before their rename (Open).
func removeCompactLeftovers(dir string) {
	m, _ := filepath.Glob(filepath.Join(dir, applog.Dir, "*", "*"+applog.Ext+compactExt))
	for _, p := range m {
		_ = os.Remove(p)
	}
}
