package filestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"
)

// Report is the result of Check.
type Report struct {
	Logs        int   `json:"logs"`
	Envelopes   int   `json:"envelopes"`
	Rows        int   `json:"rows"`
	Quarantined int   `json:"quarantined"`
	Unindexed   int64 `json:"unindexed_bytes"` // complete log bytes past the indexed offsets
	// The consent journal's records, and its complete bytes the index
	// has not applied yet (the next open applies them).
	Journal          int   `json:"journal_records"`
	JournalUnapplied int64 `json:"journal_unapplied_bytes"`
	// What the data directory's file system has left (df, df -i); no
	// FreeInodes on one that does not count them (btrfs).
	FreeBytes  uint64  `json:"free_bytes"`
	FreeInodes *uint64 `json:"free_inodes,omitempty"`
	// WentBack says that the index went back to its checkpoint (after a
	// restart of the machine: checkpoint.go), as Open would have.
	WentBack string   `json:"went_back,omitempty"`
	Problems []string `json:"problems,omitempty"`
	// Settled are records gone from the logs (a log deleted, cut or
	// replaced) of envelopes whose every row has ended (sent, or
	// dead-lettered record_lost when claimed): nothing waits for them and
	// nothing is to be done, so they are not problems. The rows go with
	// the prune after --retention.
	Settled []string `json:"settled,omitempty"`
}

// OK reports whether the check found no problem.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// Check verifies that the index and the logs of the store in dir agree:
// the file's structure (as Open checks it), bbolt's own consistency check,
// every log still the file that was indexed (the same inode, not shorter
// than its indexed offset, a line ending there; otherwise a problem with a
// hint), every envelope's record readable at
// its place and naming the same id, every row present in exactly the
// indexes its state implies. It takes the data directory's lock shared and
// opens the index read-only; it fails with ErrStoreBusy (a
// *StoreInUseError) while another process has the store open. A missing
// index is an error; an empty or damaged one is reported as a problem
// starting with "index".
func Check(dir string) (*Report, error) {
	path := filepath.Join(dir, IndexFile)
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("check: %w", err)
	}
	lk, err := lockDir(dir, false, 100*time.Millisecond)
	if err != nil {
		return nil, err
	}
	defer lk.release()
	if fi.Size() == 0 {
		return &Report{Problems: []string{"index is empty (0 bytes)"}}, nil
	}
	from, to, err := rollBack(dir)
	if err != nil {
		return &Report{Problems: []string{"index: " + err.Error()}}, nil
	}
	var wentBack string
	if from != 0 {
		wentBack = fmt.Sprintf("the machine restarted since the index's last checkpoint: the index went back from transaction %d to %d (what came after was not synced; serve redoes or reconciles it)", from, to)
	}
	if err := verifyIndexFile(path); err != nil {
		return &Report{WentBack: wentBack, Problems: []string{"index cannot be opened: " + err.Error()}}, nil
	}
	db, err := openReadOnly(path)
	if err != nil {
		if errors.Is(err, ErrStoreBusy) {
			return nil, err
		}
		return &Report{Problems: []string{"index cannot be opened: " + err.Error()}}, nil
	}
	defer db.Close()
	// An index Open would refuse as another's or an older one's.
	if m, err := indexMark(db); err == nil {
		var se *StaleIndexError
		if err := checkMark(dir, m, false); errors.As(err, &se) {
			return &Report{WentBack: wentBack, Problems: []string{"index is " + se.Reason}}, nil
		}
	}
	rep, err := checkDB(db, dir, nil)
	if rep != nil {
		rep.WentBack = wentBack
	}
	return rep, err
}

// boltCheck runs bbolt's consistency check in tx.
func boltCheck(tx *bolt.Tx) []string {
	out := []string{}
	for e := range tx.Check() {
		out = append(out, "index: "+e.Error())
	}
	return out
}

// Check runs Check on the open store. bbolt's own check reads the free
// list, which commits change (and a pinned checkpoint keeps full): it runs
// in the writer, between commits.
func (q *Queue) Check() (*Report, error) {
	if q.isClosed() {
		return nil, queue.ErrClosed
	}
	var structural []string
	if err := q.write(context.Background(), true, func(tx *bolt.Tx) error {
		structural = boltCheck(tx)
		return nil
	}); errors.Is(err, queue.ErrClosed) {
		return nil, err
	} else if err != nil {
		structural = nil // a damaged store commits nothing more: checked below
	}
	q.barrier()
	for {
		db := q.db.Load()
		rep, err := checkDB(db, q.dir, structural)
		if errors.Is(err, berrors.ErrDatabaseNotOpen) && q.db.Load() != db {
			continue // swapped by an Erase (scrubIndex) as it began
		}
		return rep, err
	}
}

// openReadOnly opens a bbolt file read-only, turning a panic on a corrupt
// file into an error.
func openReadOnly(path string) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("index is corrupt: %v", r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 100 * time.Millisecond})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, ErrStoreBusy
	}
	return db, err
}

// checkDB checks the index db of the store in dir. structural, when not
// nil, holds the problems bbolt's own check found already (run by the
// writer of an open store); nil runs it here.
func checkDB(db *bolt.DB, dir string, structural []string) (*Report, error) {
	rep := &Report{}
	bad := func(format string, a ...any) {
		if len(rep.Problems) < 100 {
			rep.Problems = append(rep.Problems, fmt.Sprintf(format, a...))
		}
	}
	err := db.View(func(tx *bolt.Tx) (err error) {
		defer func() {
			if r := recover(); r != nil {
				bad("index is corrupt: %v", r)
				err = nil
			}
		}()
		if structural == nil {
			structural = boltCheck(tx)
		}
		for _, p := range structural {
			bad("%s", p)
		}
		for _, b := range allBuckets {
			if tx.Bucket(b) == nil && !addedLater(b) {
				bad("index: bucket %q missing", b)
				return nil
			}
		}
		// A deleted log is a problem while a row of its envelopes has not
		// ended: known after the walk of the envelopes.
		deleted := map[string]string{}
		var deletedOrder []string
		_ = tx.Bucket(bktLogs).ForEach(func(k, v []byte) error {
			rep.Logs++
			if p := checkLog(dir, string(k), v, &rep.Unindexed); p != "" {
				if _, err := os.Lstat(filepath.Join(dir, string(k))); errors.Is(err, os.ErrNotExist) {
					deleted[string(k)] = p
					deletedOrder = append(deletedOrder, string(k))
				} else {
					bad("%s", p)
				}
			}
			return nil
		})
		open := map[string]bool{} // logs with an envelope not settled
		gone := map[string]int{}  // records gone of settled envelopes, by log
		var goneOrder []string
		// Logs the index has never read (appended by outbox enqueue or
		// another program since the store last ran): all of theirs is
		// still to index.
		rels, _ := logsIn(dir, func(string, error) {})
		for _, rel := range rels {
			if tx.Bucket(bktLogs).Get([]byte(rel)) != nil {
				continue
			}
			_, ino, err := applog.PathSize(filepath.Join(dir, rel))
			if err != nil {
				continue
			}
			rep.Logs++
			if p := checkLog(dir, rel, append(u64(0), u64(ino)...), &rep.Unindexed); p != "" {
				bad("%s", p)
			}
		}
		dueSeen, leaseSeen := 0, 0
		_ = tx.Bucket(bktDue).ForEachBucket(func(name []byte) error {
			return tx.Bucket(bktDue).Bucket(name).ForEach(func(k, v []byte) error {
				dueSeen++
				seg := int(beUint32(k[16:20]))
				r, _ := getRow(tx, rowKey(v, seg))
				if r == nil || r.Due != int64(beUint64(k[:8])) {
					bad("due index entry without a matching row")
				}
				return nil
			})
		})
		_ = tx.Bucket(bktLeases).ForEach(func(k, _ []byte) error {
			leaseSeen++
			r, _ := getRow(tx, k[8:])
			if r == nil || r.State != envelope.StateSending || r.LeaseEnd != int64(beUint64(k[:8])) {
				bad("lease index entry without a matching sending row")
			}
			return nil
		})
		dueWant, leaseWant := 0, 0
		_ = tx.Bucket(bktEnv).ForEach(func(k, v []byte) error {
			rep.Envelopes++
			var e envRec
			if err := json.Unmarshal(v, &e); err != nil {
				bad("envelope entry undecodable")
				return nil
			}
			_, id := splitEnvKey(k)
			settled := true
			for seg := 0; seg < e.Segs && settled; seg++ {
				if r, err := getRow(tx, rowKey(k, seg)); err != nil || r == nil || !r.State.Terminal() {
					settled = false
				}
			}
			if !settled {
				open[e.Log] = true
			}
			lost := func(format string, a ...any) {
				if !settled {
					bad(format, a...)
					return
				}
				if gone[e.Log] == 0 {
					goneOrder = append(goneOrder, e.Log)
				}
				gone[e.Log]++
			}
			b, err := applog.ReadAt(filepath.Join(dir, e.Log), e.Off, e.Len)
			if err != nil {
				lost("envelope record unreadable in %s at %d", e.Log, e.Off)
			} else {
				var env envelope.Envelope
				if json.Unmarshal(b, &env) != nil || env.ID != id {
					lost("envelope record in %s at %d does not match its index entry", e.Log, e.Off)
				}
			}
			for seg := 0; seg < e.Segs; seg++ {
				r, err := getRow(tx, rowKey(k, seg))
				if err != nil || r == nil {
					bad("envelope in %s at %d: row %d missing", e.Log, e.Off, seg)
					continue
				}
				rep.Rows++
				if !r.State.Valid() {
					bad("row with unknown state %q", r.State)
				}
				if r.Due > 0 {
					dueWant++
				}
				if r.State == envelope.StateSending && r.LeaseEnd > 0 {
					leaseWant++
				}
			}
			return nil
		})
		for _, rel := range deletedOrder {
			if open[rel] {
				bad("%s", deleted[rel])
			}
		}
		for _, rel := range goneOrder {
			n := fmt.Sprintf("log %s: the records of %d envelopes are gone from it; every row of theirs has ended (sent, dead-lettered, expired…), so nothing waits for them", rel, gone[rel])
			if _, ok := deleted[rel]; ok {
				n += "; " + hintEraseCut
			}
			rep.Settled = append(rep.Settled, n)
		}
		if dueSeen != dueWant {
			bad("due index has %d entries, rows want %d", dueSeen, dueWant)
		}
		if leaseSeen != leaseWant {
			bad("lease index has %d entries, rows want %d", leaseSeen, leaseWant)
		}
		js := checkJournal(tx, dir, bad)
		rep.Journal, rep.JournalUnapplied = js.lines, js.unapplied
		return nil
	})
	if err != nil {
		return nil, err
	}
	if q, err := ReadQuarantine(dir); err == nil {
		rep.Quarantined = len(q)
	}
	for _, p := range linkProblems(dir) {
		bad("%s", p)
	}
	for _, p := range ownerProblems(dir) {
		bad("%s", p)
	}
	if err := writable(dir); errors.Is(err, syscall.EROFS) {
		bad("%s", ReadOnlyProblem)
	}
	if sp, ok := freeSpace(dir); ok {
		rep.FreeBytes = sp.bytes
		if sp.limited {
			rep.FreeInodes = &sp.inodes
		}
		switch {
		case sp.bytes == 0:
			bad("%s", NoSpaceProblem)
		case sp.limited && sp.inodes == 0:
			bad("%s", NoInodesProblem)
		}
	}
	return rep, nil
}

// Check's problems for a data directory on a file system that is full:
// enqueues are answered 507 storage_full until something is freed.
const (
	NoSpaceProblem  = "data directory: the file system has no space left: enqueues are refused (507 storage_full) until space is freed; the index is fine"
	NoInodesProblem = "data directory: the file system has no free inodes (df -i) though it may have space: each user's log is a file, so enqueues for users without one are refused (507 storage_full); free inodes, or move the store to a file system with more of them (mkfs.ext4 -i, or XFS)"
)

type space struct {
	bytes, inodes           uint64 // free for the store's user
	totalBytes, totalInodes uint64
	limited                 bool // the file system counts inodes (btrfs does not)
}

// freeSpace is what the file system of dir has left for the store's user.
func freeSpace(dir string) (space, bool) {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return space{}, false
	}
	bs := uint64(st.Bsize)
	return space{bytes: uint64(st.Bavail) * bs, inodes: uint64(st.Ffree),
		totalBytes: uint64(st.Blocks) * bs, totalInodes: uint64(st.Files), limited: st.Files > 0}, true
}

// ReadOnlyProblem is Check's problem for a data directory on a file
// system that accepts no writes.
const ReadOnlyProblem = "data directory: the file system is read-only (a disk error may have made the kernel remount it so, see dmesg): serve and every command that writes fail until it is writable again; copy the data directory off first if the disk is failing"

// Hints of the problems of a log that is no longer the file its index
// entry describes.
const (
	hintRecordsLost = "hint: records that were in it and are not any more are lost; their rows are dead-lettered (record_lost) when claimed"
	hintReindex     = "the store indexes the log again from its start at its next start, append or rescan (outbox serve does so by itself), without a rebuild"
	// An erase removes the logs durably before its commit: one that a
	// crash cut short leaves them gone and the index naming them.
	hintEraseCut = "if an outbox erase of its user was cut short (a crash, no answer), run it again: it finishes"
)

// checkLog checks log rel against its index entry v (offset, inode) and
// adds its complete bytes past the offset to unindexed. It returns the
// problem, or "".
func checkLog(dir, rel string, v []byte, unindexed *int64) string {
	path := filepath.Join(dir, rel)
	size, ino, err := applog.PathSize(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Sprintf("log %s: deleted (%v); %s; %s", rel, err, hintRecordsLost, hintEraseCut)
		}
		if errors.Is(err, ErrSymlink) {
			return "" // listed with every other link (linkProblems)
		}
		return fmt.Sprintf("log %s: %v", rel, err)
	}
	off, indexed, ok := logPos(v)
	switch {
	case !ok:
		return ""
	case ino != indexed:
		return fmt.Sprintf("log %s: replaced (inode %d, the index read inode %d): another file under its name; %s; %s", rel, ino, indexed, hintRecordsLost, hintReindex)
	case size < off:
		return fmt.Sprintf("log %s: truncated (%d bytes, shorter than its indexed offset %d); %s; %s", rel, size, off, hintRecordsLost, hintReindex)
	}
	// The complete bytes past the offset, a window at a time (lines
	// longer than applog.MaxLine are skipped, not read).
	from := max(off-1, 0)
	at := from
	for {
		c, err := applog.ReadLines(path, at)
		if err != nil {
			return fmt.Sprintf("log %s: %v", rel, err)
		}
		if at == from && off > 0 && (len(c.Data) == 0 || c.Data[0] != '\n') {
			return fmt.Sprintf("log %s: changed before its indexed offset %d (no line ends there: cut and written again); %s; %s", rel, off, hintRecordsLost, hintReindex)
		}
		at += int64(len(c.Data))
		if c.Long && c.LongEnd >= 0 {
			at = c.LongEnd
		} else if !c.More {
			break
		}
	}
	if off > 0 {
		from++ // the newline before the offset
	}
	*unindexed += at - from
	return ""
}

// Rebuild rebuilds the index of the store in dir from its logs, after the
// bbolt file was lost or damaged (or on request: outbox doctor --rebuild).
// It never opens the old file, so it works on one that cannot be opened at
// all. Consent records, suppressions (the users' and the tenants' address
// suppressions) and push subscriptions come back from the consent journal
// (journal.go), applied before the logs. Delivery states cannot be
// recovered from the logs: every rebuilt row whose envelope has not
// expired is unresolved (class index_rebuilt), never redelivered
// automatically; an operator requeues or resolves it. It returns the
// number of envelopes indexed.
//
// It is atomic and crash-safe: it takes the data directory's lock, writes
// StampFile (so that an index missing after a crash is a lost one, never
// a new one), builds the new index in index.db.rebuild beside the old
// one, with every row created unresolved or expired in the transaction
// that creates it, fsyncs it, keeps the old file as index.db.broken-<time>
// (a hard link) and renames the new one over index.db, then fsyncs the
// directory. Killed at any instant, it leaves index.db as it was or the
// complete new index.
func Rebuild(dir string, opts *Options) (int, error) {
	o := opts.withDefaults()
	if err := os.MkdirAll(filepath.Join(dir, applog.Dir), 0o700); err != nil {
		return 0, fmt.Errorf("rebuild: %w", err)
	}
	lk, err := lockDir(dir, true, o.LockTimeout)
	if err != nil {
		return 0, err
	}
	defer lk.release()
	path := filepath.Join(dir, IndexFile)
	if indexFileBusy(path) {
		return 0, &StoreInUseError{Path: dir, PID: readPID(dir)}
	}
	if err := writeStamp(dir); err != nil {
		return 0, fmt.Errorf("rebuild: %w", err)
	}
	tmp := path + ".rebuild"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("rebuild: remove an unfinished rebuild: %w", err)
	}
	// The rebuilt index keeps the store's identity (the mark's), in the
	// next generation; whichever file a kill leaves at index.db, the mark
	// accepts it.
	cur, ok := readMark(dir)
	if !ok {
		cur = mark{id: newIndexID()}
	}
	next := cur.gen + 1
	n, err := buildIndex(dir, tmp, cur.id, next, o)
	if err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("rebuild: %w", err)
	}
	if err := writeMark(dir, swapMark(cur, next)); err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("rebuild: %w", err)
	}
	if _, err := dropCheckpoint(dir); err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("rebuild: %w", err)
	}
	if _, err := os.Lstat(path); err == nil {
		if err := keepAside(path, o.Now()); err != nil {
			_ = os.Remove(tmp)
			return 0, fmt.Errorf("rebuild: keep the old index: %w", err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("rebuild: swap in the new index: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return 0, fmt.Errorf("rebuild: %w", err)
	}
	if err := writeMark(dir, mark{id: cur.id, gen: next}); err != nil {
		return 0, fmt.Errorf("rebuild: %w", err)
	}
	return n, nil
}

// buildIndex indexes every log of dir into a new bbolt file at path, with
// every row unresolved or expired, and fsyncs it.
func buildIndex(dir, path, id string, gen uint64, o Options) (int, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return 0, err
	}
	n, err := fillIndex(dir, db, id, o)
	if err == nil {
		err = setGen(db, gen)
	}
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return n, err
}

func fillIndex(dir string, db *bolt.DB, id string, o Options) (int, error) {
	o.Registerer = nil // the metrics of a store that never opens
	q := &Queue{
		dir:      dir,
		opts:     o,
		log:      o.Logger,
		rebuild:  true,
		carryID:  id,
		inflight: map[string]struct{}{},
		known:    map[string][]*prepared{},
		cache:    newEnvCache(1),
		// Syncing: the new index must not refer to log bytes a machine
		// crash could still take (see catchUp).
		app: applog.NewAppender(dir, logSyncer(o.NoSync)),
		m:   newStoreMetrics(nil, ""),
	}
	q.db.Store(db)
	defer q.app.Close()
	if err := q.init(); err != nil {
		return 0, err
	}
	// The consent journal first: consent, suppressions and
	// subscriptions, as the logs' records are indexed after them.
	if err := checkNotLink(filepath.Join(dir, journalDir)); err != nil {
		return 0, err
	}
	if err := db.Update(func(tx *bolt.Tx) error { return rebuildJournal(tx, dir, q.log) }); err != nil {
		return 0, err
	}
	rels, err := q.listLogs()
	if err != nil {
		return 0, err
	}
	// Several transactions, a batch of logs each: the file is not the
	// index until it is renamed over index.db.
	const perTx = 256
	for i := 0; i < len(rels); i += perTx {
		err := db.Update(func(tx *bolt.Tx) error {
			for _, rel := range rels[i:min(i+perTx, len(rels))] {
				if err := q.catchUp(tx, rel, nil, nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	n := 0
	if err := db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bktEnv).Stats().KeyN
		return nil
	}); err != nil {
		return 0, err
	}
	return n, db.Sync()
}

// keepAside hard-links the index at path to path.broken-<time> (a new
// name), so that renaming the new index over path replaces it atomically;
// where hard links are refused it renames it instead (a crash before the
// new one is in place then leaves no index.db, which Open refuses as
// lost).
func keepAside(path string, now time.Time) error {
	base := path + ".broken-" + now.UTC().Format("20060102T150405")
	aside := base
	for i := 2; ; i++ {
		if _, err := os.Lstat(aside); errors.Is(err, os.ErrNotExist) {
			break
		}
		aside = fmt.Sprintf("%s-%d", base, i)
	}
	if err := os.Link(path, aside); err == nil {
		return nil
	}
	return os.Rename(path, aside)
}

// indexFileBusy reports whether a process holds bbolt's own lock on the
// index file: an older build, which does not take the directory's lock.
func indexFileBusy(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return true
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

// CompactFile rewrites the index of the (closed) store in dir into a new,
// compact bbolt file and swaps it in atomically, holding the data
// directory's lock throughout. It returns the sizes before and after.
func CompactFile(dir string) (before, after int64, err error) {
	lk, err := lockDir(dir, true, 100*time.Millisecond)
	if err != nil {
		return 0, 0, err
	}
	defer lk.release()
	return compactLocked(dir)
}

// Compact prunes the terminal rows of the store in dir past
// Options.Retention (Prune, removing logs left empty) and compacts its
// index file (CompactFile), holding the data directory's lock from the
// first step to the last: no other process can open the store in between,
// nor hold the old file while the new one is renamed over it. It returns
// the envelopes pruned and the file sizes before and after.
func Compact(ctx context.Context, dir string, opts *Options) (pruned int, before, after int64, err error) {
	o := opts.withDefaults()
	o.DisableWatcher = true
	o.RescanInterval = -1
	lk, err := lockDir(dir, true, o.LockTimeout)
	if err != nil {
		return 0, 0, 0, err
	}
	defer lk.release()
	q, err := openLocked(dir, o, lk)
	if err != nil {
		return 0, 0, 0, err
	}
	pruned, err = q.Prune(ctx)
	if cerr := q.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return pruned, 0, 0, err
	}
	before, after, err = compactLocked(dir)
	return pruned, before, after, err
}

// compactLocked compacts the index of dir, whose lock the caller holds.
func compactLocked(dir string) (before, after int64, err error) {
	path := filepath.Join(dir, IndexFile)
	if _, _, err := rollBack(dir); err != nil {
		return 0, 0, err
	}
	if err := verifyIndexFile(path); err != nil {
		return 0, 0, err
	}
	src, err := openBolt(path, &bolt.Options{Timeout: 100 * time.Millisecond, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return 0, 0, &StoreInUseError{Path: dir, PID: readPID(dir)}
		}
		return 0, 0, err
	}
	defer src.Close()
	cur, err := indexMark(src)
	if err != nil {
		return 0, 0, err
	}
	next := cur.gen + 1
	tmp := path + ".compact.tmp"
	if err := compactInto(src, tmp, next); err != nil {
		return 0, 0, err
	}
	if fi, err := os.Stat(path); err == nil {
		before = fi.Size()
	}
	// Whichever file a kill leaves at index.db, the mark accepts it (an
	// index of an older outbox, without identity, has no mark yet).
	marked := cur.id != ""
	if marked {
		if err := writeMark(dir, swapMark(cur, next)); err != nil {
			return 0, 0, err
		}
	}
	if _, err := dropCheckpoint(dir); err != nil {
		return 0, 0, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, 0, err
	}
	if err := syncDir(dir); err != nil {
		return 0, 0, err
	}
	if marked {
		if err := writeMark(dir, mark{id: cur.id, gen: next}); err != nil {
			return 0, 0, err
		}
	}
	if fi, err := os.Stat(path); err == nil {
		after = fi.Size()
	}
	return before, after, nil
}

// compactInto writes the live content of src (every bucket, key and
// sequence, nothing of the pages bbolt freed) into a new bbolt file at
// tmp, fsynced and closed. A file or link already at tmp is removed
// first, and the new one is created exclusively, never through a link.
// On failure tmp is removed.
func compactInto(src *bolt.DB, tmp string, gen uint64) error {
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("compact: %w", err)
	}
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{
		Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			return openNoFollow(name, flag|os.O_EXCL, perm)
		},
	})
	if err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	err = bolt.Compact(dst, src, 64<<20)
	if err == nil {
		err = setGen(dst, gen)
	}
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("compact: %w", err)
	}
	return nil
}

// syncDir fsyncs a directory (its entries); a var, for the tests.
var syncDir = func(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
