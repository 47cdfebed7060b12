package filestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// IndexFile is the name of the bbolt index inside the data directory.
const IndexFile = "index.db"

// Queue is the file-backed Store: per-(tenant, user) append logs indexed in
// one bbolt file, in a data directory. It is safe for concurrent use. Only
// one process may open a data directory at a time; other processes append
// to the logs (see applog) and the Queue's tailer ingests their records.
type Queue struct {
	dir  string
	opts Options
	log  *slog.Logger
	// db is the open index. An Erase swaps in a rewritten file (scrub.go):
	// the writer stores the new one; readers load it for each transaction.
	db  atomic.Pointer[bolt.DB]
	app *applog.Appender
	m   *storeMetrics

	lock    *dirLock // the data directory's lock
	ownLock bool     // Close releases lock (Open); else the caller does
	// rebuild: records are indexed with their rows already unresolved (or
	// expired), never pending (Rebuild's index under construction).
	rebuild bool
	// atOpen: Open's catch-up is indexing lines appended while no store had
	// the directory open (writer only; catchUpAll).
	atOpen bool

	ops    chan *op
	notify chan struct{}

	damage  atomic.Pointer[runDamage] // found at run time (damage.go)
	damaged chan struct{}             // closed with damage
	dirInfo os.FileInfo               // the data directory opened (checkDir)
	moved   movedRecs                 // where rewritten logs' records went (logcompact.go)
	resets  map[logReset]int          // the resets of a catch-up of every log, by reason (writer only; catchUpAll)
	// indexMu guards indexFile, the identity of the index file the store
	// has open, against a swap (an Erase's rewrite) while it is checked.
	indexMu   sync.Mutex
	indexFile os.FileInfo
	// The index's identity (MarkFile): its id; the id a rebuilt index
	// takes (carryID, Rebuild's); the mark file, and the last transaction
	// id the writer committed (writer only).
	markID  string
	markGen uint64
	carryID string
	markF   *os.File
	// markInfo and ckptInfo are the files markF and ckptF as opened, for
	// the tailer's check (markfiles.go) without the writer's fields.
	markInfo, ckptInfo atomic.Pointer[os.FileInfo]
	lastTx             uint64
	durableTx          uint64 // the txid in the mark
	// The index checkpoint (checkpoint.go), writer only: its file, the
	// sequence number of its last slot written, the read transaction that
	// pins it, and whether pinning stopped (past pinLimit).
	ckptF   *os.File
	ckptSeq uint64
	pin     *bolt.Tx
	pinOff  bool
	// releaseID gives up the claim of the store's identity on this host
	// (identity.go).
	releaseID func()
	// txSynced: the running transaction is synced and checkpointed
	// before its ops finish (writer only; tests read it).
	txSynced bool
	// k: the settings tests change, read once by Open (a damaged store's
	// writer may outlive its Close, and must not read a later test's).
	k knobs

	// beforeCommit, set only by tests, runs inside every write transaction
	// after its ops: an error fails the transaction (a full disk, an I/O
	// error during the bbolt commit).
	beforeCommit atomic.Pointer[func() error]

	mu       sync.Mutex
	submitMu sync.Mutex             // orders index submissions with lastIdx
	lastIdx  *op                    // the last index update submitted (guarded by mu)
	inflight map[string]struct{}    // env keys being enqueued in process
	known    map[string][]*prepared // appended in process, not yet indexed: "log 0 offset" → records (register)
	cache    *envCache

	txDelta map[countKey]int // the running transaction's count changes (writer only)
	// The consent journal (journal.go), writer only: the running
	// transaction's lines (nil outside one), whether one is an erase,
	// where the last flush put them, and whether lines a failed commit
	// could not take back are still to apply.
	txJournal []byte
	jbuf      []byte
	txErase   bool
	jAppend   [2]int64
	jReplay   bool
	cmu       sync.Mutex
	counts    map[countKey]int // nil until the first Counts
	closed    bool

	closeOnce  sync.Once
	stop       chan struct{}
	wg         sync.WaitGroup
	tail       *tailer
	ready      chan struct{}
	links      sync.Map // rel → true: symbolic links reported (links.go)
	unreadable sync.Map // rel → true: unreadable logs reported (links.go)
}

var _ queue.Store = (*Queue)(nil)

// op is one write run by the writer goroutine inside a shared bbolt
// transaction. fn must check before it writes: an error return must leave
// the transaction as fn found it (other ops commit with it).
type op struct {
	fn func(tx *bolt.Tx) error
	// skipSync: the transaction may skip fsync (an index update repaired
	// from the logs, a commit or release left to reconciliation, an
	// unsynced claim redelivered under the same key).
	skipSync bool
	// scrub: once committed, the index file is rewritten before the op
	// completes (Erase, see scrubIndex).
	scrub bool
	err   error
	done  chan struct{}
	after func(err error) // run by the writer once the op is committed (or failed)
}

// finish completes an op.
func (o *op) finish(err error) {
	if err != nil {
		o.err = err
	}
	close(o.done)
	if o.after != nil {
		o.after(o.err)
	}
}

// StoreInUseError is returned by Open (and Rebuild, CompactFile, Compact,
// Check) when another process, or another Open in this process, holds the
// data directory's lock. It matches ErrStoreBusy with errors.Is.
type StoreInUseError struct {
	Path string
	PID  int // the holder's pid when known (0 otherwise)
}

func (e *StoreInUseError) Error() string {
	s := "store " + e.Path + " is in use"
	if e.PID > 0 {
		s += " by pid " + strconv.Itoa(e.PID)
	}
	return s + " (another outbox serve, an outbox command such as compact or doctor --rebuild, or a program embedding the queue, has it open)"
}

// Is makes a *StoreInUseError match ErrStoreBusy.
func (e *StoreInUseError) Is(target error) bool { return target == ErrStoreBusy }

// Open opens (creating) the store in dir. It takes the data directory's
// lock (LockFile), waiting at most Options.LockTimeout for it, checks the
// index file's structure before bbolt reads it (a damaged file fails with
// *CorruptIndexError, never a crash), repairs the index from the logs
// (records appended after the last indexed offset, including by other
// processes while it was closed) and starts the tailer. Rows that a
// previous process was sending keep their lease: once it expires, a
// worker's Recover hands them to reconciliation.
//
// A data directory whose index was lost (index.db missing, empty, or
// without its layout) while its logs hold records fails with
// *IndexLostError: indexing those records again would deliver every one
// of them a second time. Rebuild (outbox doctor --rebuild) indexes them
// with every row unresolved instead. A new data directory (no StampFile)
// opens normally, and records appended to its logs before the first Open
// are new work.
func Open(dir string, opts *Options) (*Queue, error) {
	o := opts.withDefaults()
	if err := checkNotLink(filepath.Join(dir, applog.Dir)); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, applog.Dir), 0o700); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	lk, err := lockDir(dir, true, o.LockTimeout)
	if err != nil {
		return nil, err
	}
	q, err := openLocked(dir, o, lk)
	if err != nil {
		lk.release()
		return nil, err
	}
	q.ownLock = true
	return q, nil
}

// openLocked opens the store in dir, whose lock lk the caller holds; the
// caller releases it (Close does when ownLock is set).
func openLocked(dir string, o Options, lk *dirLock) (_ *Queue, err error) {
	// A copy beside its running original is refused before anything in it
	// is read or written (identity.go): the mark names the identity.
	claimed, releaseID := "", func() {}
	if m, ok := readMark(dir); ok {
		if releaseID, err = claimIdentity(m.id, dir); err != nil {
			return nil, err
		}
		claimed = m.id
	}
	defer func() {
		if err != nil {
			releaseID()
		}
	}()
	path := filepath.Join(dir, IndexFile)
	if err := checkNotLink(path); err != nil {
		return nil, fmt.Errorf("open store index: %w", err)
	}
	removeCompactLeftovers(dir)
	fresh := true
	if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
		fresh = false
		from, to, err := rollBack(dir)
		if err != nil {
			return nil, err
		}
		if from != 0 {
			o.Logger.Warn("the machine restarted since the index's last checkpoint: the index goes back to it (what came after was not synced: the logs are indexed again, unsynced claims and commits are redone or reconciled)",
				"operation", "open", "status", "rolled_back", "from_tx", from, "to_tx", to)
		}
		if err := verifyIndexFile(path); err != nil {
			return nil, err
		}
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("open store index %s: %w", path, err)
	}
	if fresh {
		if err := checkNotLost(dir, "missing or empty"); err != nil {
			return nil, err
		}
	}
	k := currentKnobs()
	db, pinOff, err := openIndex(path, o, k.mapSize)
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			// An older build, which does not take the directory's lock.
			return nil, &StoreInUseError{Path: dir, PID: readPID(dir)}
		}
		var ce *CorruptIndexError
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, fmt.Errorf("open store index %s: %w (run \"outbox doctor\" to check it, \"outbox doctor --rebuild\" to rebuild it from the logs)", path, err)
	}
	q := &Queue{
		k:        k,
		pinOff:   pinOff,
		dir:      dir,
		opts:     o,
		log:      o.Logger,
		lock:     lk,
		ops:      make(chan *op, 1024),
		notify:   make(chan struct{}, 1),
		inflight: map[string]struct{}{},
		known:    map[string][]*prepared{},
		cache:    newEnvCache(envCacheSize),
		stop:     make(chan struct{}),
		damaged:  make(chan struct{}),
		ready:    make(chan struct{}),
	}
	q.db.Store(db)
	q.indexFile, _ = os.Stat(path)
	q.dirInfo, _ = os.Stat(dir)
	q.app = applog.NewAppender(dir, logSyncer(o.NoSync))
	q.app.SlowLock = q.slowLock
	q.m = newStoreMetrics(o.Registerer, dir)
	if err := q.init(); err != nil {
		db.Close()
		return nil, pointAtDoctor(dir, err)
	}
	if err := q.openMark(fresh); err != nil {
		db.Close()
		return nil, err
	}
	// The journal's facts before the logs': an envelope appended while
	// the store was closed is judged by the consent it has now.
	if err := q.openJournal(); err != nil {
		q.app.Close()
		q.markF.Close()
		db.Close()
		return nil, pointAtDoctor(dir, err)
	}
	if err := writePID(dir); err != nil {
		q.markF.Close()
		db.Close()
		return nil, err
	}
	if err := q.openCheckpoint(); err != nil {
		q.markF.Close()
		db.Close()
		return nil, pointAtDoctor(dir, err)
	}
	// A store without a mark before (a new one) claims its identity now,
	// before anything is indexed or delivered.
	if q.markID != claimed {
		more, err := claimIdentity(q.markID, dir)
		if err != nil {
			q.releasePin()
			if q.ckptF != nil {
				q.ckptF.Close()
			}
			q.markF.Close()
			db.Close()
			return nil, err
		}
		first := releaseID
		releaseID = func() { first(); more() }
	}
	q.releaseID = releaseID
	q.wg.Add(1)
	go q.writeLoop()
	// Catch up on every log before reporting ready.
	if err := q.catchUpAll(true); err != nil {
		q.Close()
		return nil, pointAtDoctor(dir, err)
	}
	// The index exists and holds the logs' records: from now on a missing
	// index is a lost one.
	if err := writeStamp(dir); err != nil {
		q.Close()
		return nil, err
	}
	q.tail = newTailer(q)
	if err := q.tail.start(); err != nil {
		q.Close()
		return nil, err
	}
	close(q.ready)
	return q, nil
}

// boltOptions are the options the store opens its index file with, mapped
// with mapSize of address space (see pinLimit).
func (o Options) boltOptions(mapSize int) *bolt.Options {
	return &bolt.Options{
		Timeout:         o.LockTimeout,
		NoFreelistSync:  true,
		FreelistType:    bolt.FreelistMapType,
		NoSync:          o.NoSync,
		OpenFile:        openNoFollow,
		InitialMmapSize: mapSize,
	}
}

// pointAtDoctor makes an error of reading the index while opening (a
// record bbolt hands back that does not decode, an I/O error) name what to
// run, unless it already does.
func pointAtDoctor(dir string, err error) error {
	var ce *CorruptIndexError
	if errors.As(err, &ce) || errors.Is(err, queue.ErrClosed) {
		return err
	}
	if queue.StorageProblemOf(err) == queue.StorageFull {
		return fmt.Errorf("open store %s: %w (the file system is full: free space, then retry; nothing is wrong with the index)", dir, err)
	}
	return fmt.Errorf("open store %s: %w (run \"outbox doctor --data %s\" to check it; \"outbox doctor --rebuild\" rebuilds the index from the logs)", dir, err, dir)
}

// openBolt opens a bbolt file, turning a panic on a damaged file into a
// *CorruptIndexError.
func openBolt(path string, bo *bolt.Options) (db *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, &CorruptIndexError{Path: path, Reason: fmt.Sprint(r)}
		}
	}()
	return bolt.Open(path, 0o600, bo)
}

// slowLock logs an append that waits for another process's lock on a log
// (not which log: its name holds a user id).
func (q *Queue) slowLock(waited time.Duration, acquired bool) {
	if !acquired {
		q.log.Warn("an append waits for another process's lock on its log: that user's enqueues wait until it is released (a process appending to the logs must hold the lock only for its write and fsync; docs/data-format.md)",
			"operation", "append", "status", "lock_wait", "waited", waited)
		return
	}
	q.log.Info("the log's lock was released; the append went on", "operation", "append", "status", "lock_acquired", "waited", waited.Round(time.Millisecond))
}

// Dir returns the store's data directory.
func (q *Queue) Dir() string { return q.dir }

func (q *Queue) init() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &CorruptIndexError{Path: q.indexPath(), Reason: fmt.Sprint(r)}
		}
	}()
	db := q.db.Load()
	// An index without its layout version was created and never written
	// (or lost its content): like a missing one.
	var versioned bool
	if err := db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(bktMeta); meta != nil && meta.Get(keyVersion) != nil {
			versioned = true
		}
		return nil
	}); err != nil {
		return err
	}
	if !versioned && !q.rebuild {
		if err := checkNotLost(q.dir, "without its layout"); err != nil {
			return err
		}
	}
	return db.Update(func(tx *bolt.Tx) error {
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bktMeta)
		if v := meta.Get(keyVersion); v == nil {
			if err := meta.Put(keyVersion, u64(layoutVersion)); err != nil {
				return err
			}
		} else if n := beUint64(v); n != layoutVersion {
			return fmt.Errorf("open store: index layout version %d, this outbox reads %d", n, layoutVersion)
		}
		return ensureIdentity(tx, q.carryID)
	})
}

// damagedCloseWait bounds how long Close waits for the store's goroutines
// once the index is damaged: a fault inside bbolt may leave one of its
// locks held, and a goroutine waiting for it would wait for ever.
const damagedCloseWait = 2 * time.Second

// waitAtMost waits for wg; once damaged is closed, for at most d more. It
// reports whether wg finished.
func waitAtMost(wg *sync.WaitGroup, damaged <-chan struct{}, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-damaged:
	}
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// Close stops the tailer and the writer and closes the index. It is
// idempotent.
func (q *Queue) Close() error {
	var err error
	q.closeOnce.Do(func() {
		q.barrier() // acknowledged enqueues are indexed before the store closes
		q.mu.Lock()
		q.closed = true
		q.mu.Unlock()
		if q.tail != nil {
			q.tail.close()
		}
		close(q.stop)
		if !waitAtMost(&q.wg, q.damaged, damagedCloseWait) {
			q.log.Warn("closing a damaged index: its writer is stuck in it, and is left to the process's end",
				"operation", "close", "status", "damaged")
		}
		q.app.Close()
		if q.markF != nil {
			_ = q.markF.Close()
		}
		if q.ckptF != nil {
			_ = q.ckptF.Close()
		}
		if q.releaseID != nil {
			q.releaseID()
		}
		removePID(q.dir)
		switch {
		case !q.indexSound():
			// A fault inside a bbolt transaction may have left bbolt's
			// locks held: its Close would wait for ever. The file and its
			// mapping go with the process.
			err = q.damageErr()
		case q.damageErr() != nil: // the directory moved: the index is sound
			_ = q.db.Load().Close()
			err = q.damageErr()
		default:
			err = q.db.Load().Close()
		}
		if q.ownLock {
			q.lock.release()
		}
	})
	return err
}

func (q *Queue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// writeLoop runs every write: ops queued while a transaction commits are
// grouped into the next one, so concurrent writers share fsyncs.
func (q *Queue) writeLoop() {
	defer q.wg.Done()
	// Transactions that skipped fsync (skipSync) are synced and
	// checkpointed (checkpoint.go) with the next synced one, or by this
	// timer within syncDelay, whichever comes first: that bounds how much
	// a machine crash can take from the index (the logs themselves are
	// always fsynced).
	syncTimer := time.NewTimer(time.Hour)
	syncTimer.Stop()
	unsynced := false
	defer func() {
		if unsynced && q.damageErr() == nil {
			q.logSyncError(q.syncIndex())
		}
		if q.indexSound() {
			q.releasePin()
		}
	}()
	for {
		var first *op
		select {
		case <-syncTimer.C:
			if unsynced {
				q.logSyncError(q.syncIndex())
			}
			unsynced = false
			continue
		case first = <-q.ops:
		case <-q.stop:
			// Fail what is still queued.
			for {
				select {
				case o := <-q.ops:
					o.finish(queue.ErrClosed)
				default:
					return
				}
			}
		}
		batch := []*op{first}
	more:
		for len(batch) < maxBatch {
			select {
			case o := <-q.ops:
				batch = append(batch, o)
			default:
				break more
			}
		}
		skipSync := true
		for _, o := range batch {
			skipSync = skipSync && o.skipSync
		}
		if err := q.damageErr(); err != nil {
			for _, o := range batch {
				o.finish(err)
			}
			continue
		}
		db := q.db.Load()
		// bbolt syncs a commit itself only once the index is too large
		// to pin a checkpoint; otherwise syncIndex does, after it.
		db.NoSync = q.opts.NoSync || !q.pinOff
		q.txSynced = !skipSync && !q.opts.NoSync
		q.txDelta = map[countKey]int{}
		var txid uint64
		err := q.guard(func() error {
			// A damaged index that the check at Open let through fails the
			// transaction (rolled back) and the store, not the process.
			return db.Update(func(tx *bolt.Tx) error {
				if err := q.journalBegin(tx); err != nil {
					return err
				}
				for _, o := range batch {
					mark := len(q.txJournal)
					if o.err = o.fn(tx); o.err != nil {
						q.txJournal = q.txJournal[:mark]
					}
				}
				// The journal's lines are durable before the commit that
				// acknowledges them.
				if err := q.flushJournal(tx); err != nil {
					return err
				}
				if hook := q.beforeCommit.Load(); hook != nil {
					if err := (*hook)(); err != nil {
						return err
					}
				}
				txid = uint64(tx.ID())
				return nil
			})
		})
		q.journalDone(err)
		if err == nil {
			q.lastTx = txid
		}
		if err == nil {
			q.applyDelta(q.txDelta)
		}
		q.txDelta = nil
		committed := err == nil
		if err != nil {
			err = fmt.Errorf("commit index: %w", err)
		} else if !skipSync {
			// Acknowledged once a checkpoint covers it. A failed sync
			// fails the ops, whose changes are committed: like any write
			// whose fate is unknown, they are reconciled. A sync that
			// failed for want of a descriptor or memory (a burst) is
			// tried again first: a claim failed that way leaves its
			// leases to expire and be reconciled.
			err = q.syncIndex()
			for try := 0; err != nil && queue.Exhausted(err) && try < syncRetries; try++ {
				time.Sleep(time.Duration(5<<try) * time.Millisecond)
				err = q.syncIndex()
			}
			q.logSyncError(err)
		}
		if err == nil {
			q.scrubAfter(batch)
		}
		for _, o := range batch {
			o.finish(err)
		}
		switch {
		case !committed:
		case err != nil || skipSync:
			if !unsynced { // the timer tries the sync again
				unsynced = true
				syncTimer.Reset(q.k.syncDelay)
			}
		default:
			unsynced = false
			syncTimer.Stop()
		}
	}
}

// syncRetries bounds the tries of a sync that failed for a passing
// shortage (queue.Exhausted), 5 ms doubling: 155 ms in all.
const syncRetries = 5

// logSyncer is how the store syncs logs: not at all in relaxed mode
// (noSync).
func logSyncer(noSync bool) applog.Syncer {
	if noSync {
		return nil
	}
	return syncLogFile
}

// syncLogFile is the Syncer of the store's logs (a test's hook).
var syncLogFile applog.Syncer = applog.Fdatasync

// syncDelay bounds how long an index transaction that skipped fsync stays
// unsynced.
var syncDelay = 20 * time.Millisecond // a var for tests

// maxBatch bounds the ops of one transaction.
const maxBatch = 512

// write runs fn in the writer's next transaction and waits for its commit.
func (q *Queue) write(ctx context.Context, skipSync bool, fn func(tx *bolt.Tx) error) error {
	return q.run(ctx, &op{fn: fn, skipSync: skipSync, done: make(chan struct{})})
}

// run queues o for the writer and waits for it.
func (q *Queue) run(ctx context.Context, o *op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if q.isClosed() {
		return queue.ErrClosed
	}
	if err := q.damageErr(); err != nil {
		return err
	}
	select {
	case q.ops <- o:
	case <-q.stop:
		return queue.ErrClosed
	}
	select {
	case <-o.done:
		return o.err
	case <-q.damaged:
		// A fault may leave the writer stuck in bbolt for good.
		return q.damageErr()
	}
}

// submitIndex queues an index update without waiting for it; after runs
// once it is committed. Reads wait for it (barrier).
func (q *Queue) submitIndex(fn func(tx *bolt.Tx) error, after func(error)) {
	o := &op{fn: fn, skipSync: true, done: make(chan struct{}), after: after}
	q.submitMu.Lock()
	defer q.submitMu.Unlock()
	q.mu.Lock()
	q.lastIdx = o
	q.mu.Unlock()
	select {
	case q.ops <- o:
	case <-q.stop:
		o.finish(queue.ErrClosed)
	}
}

// barrier waits until every index update submitted before it is applied:
// a read after an Enqueue returned sees what it enqueued.
func (q *Queue) barrier() {
	q.mu.Lock()
	o := q.lastIdx
	q.mu.Unlock()
	if o != nil {
		select {
		case <-o.done:
		case <-q.damaged: // the read fails with the damage
		}
	}
}

// view runs a read transaction after the pending index updates.
func (q *Queue) view(fn func(tx *bolt.Tx) error) error {
	if q.isClosed() {
		return queue.ErrClosed
	}
	q.barrier()
	return q.dbView(fn)
}

// viewNow runs a read transaction without waiting for pending index
// updates (Enqueue's own checks, which rely on its reservations instead).
func (q *Queue) viewNow(fn func(tx *bolt.Tx) error) error {
	if q.isClosed() {
		return queue.ErrClosed
	}
	return q.dbView(fn)
}

// dbView runs a read transaction on the open index file. One that began
// as an Erase swapped the file in (and closed the old one) runs on the
// new one: the same content, as no write commits meanwhile.
func (q *Queue) dbView(fn func(tx *bolt.Tx) error) error {
	for {
		if err := q.damageErr(); err != nil {
			return err
		}
		db := q.db.Load()
		err := q.guard(func() error { return db.View(fn) })
		if errors.Is(err, berrors.ErrDatabaseNotOpen) && q.db.Load() != db {
			continue
		}
		return err
	}
}

// indexPath is the index file's path (bbolt's Path of a file swapped in
// by an Erase is the name it was written under).
func (q *Queue) indexPath() string { return filepath.Join(q.dir, IndexFile) }

func (q *Queue) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// Notify implements Store.
func (q *Queue) Notify() <-chan struct{} { return q.notify }

// Ready is closed once Open has caught up on every log.
func (q *Queue) Ready() <-chan struct{} { return q.ready }

func beUint64(b []byte) uint64 { return binary.BigEndian.Uint64(b[:8]) }

func pidPath(dir string) string { return filepath.Join(dir, "outbox.pid") }

// PID returns the pid the process that has the store in dir open wrote
// into its pid file, 0 when there is none (nothing has it open, or it
// could not write the file). It names a process in an error; it proves
// nothing about whether that process still runs.
func PID(dir string) int { return readPID(dir) }

// writePID writes the pid file, never through a symbolic link: a link
// there fails Open (a *applog.LinkError). Other failures are ignored (the
// pid only serves the next opener's error).
func writePID(dir string) error {
	f, err := openNoFollow(pidPath(dir), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		if errors.Is(err, ErrSymlink) {
			return fmt.Errorf("open store: %w", err)
		}
		return nil
	}
	_, _ = f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
	_ = f.Close()
	return nil
}

// removePID removes the pid file (a link there: the link, not its target).
func removePID(dir string) { _ = os.Remove(pidPath(dir)) }

func readPID(dir string) int {
	f, err := openNoFollow(pidPath(dir), os.O_RDONLY, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	b := make([]byte, 32)
	m, _ := f.Read(b)
	n, _ := strconv.Atoi(string(bytes.TrimSpace(b[:m])))
	return n
}

// readEnvelope loads the record of the indexed envelope ek from its log
// (or the cache of recent envelopes). The result is the caller's copy. A
// record at its place that is another envelope's (its log was truncated
// or replaced, and other records were appended at that offset) is an
// error, like a missing one: it is never read as this envelope.
//
// A log missing because the whole data directory moved away under the
// store says nothing of the record: that is the store's damage (a
// *DirMovedError), which passing reports, never a lost record.
func (q *Queue) readEnvelope(ek []byte, e *envRec) (*envelope.Envelope, error) {
	env, err := q.readRecord(ek, e)
	if err != nil && errors.Is(err, fs.ErrNotExist) && q.checkDir() {
		return nil, fmt.Errorf("read envelope record: %w", q.damageErr())
	}
	return env, err
}

// passing reports whether err, from readEnvelope, says nothing of the
// record: a resource ran out, or the store cannot serve now (its data
// directory moved). The caller tries again later instead of judging the
// record lost.
func passing(err error) bool { return queue.Exhausted(err) || errors.Is(err, queue.ErrUnavailable) }

func (q *Queue) readRecord(ek []byte, e *envRec) (*envelope.Envelope, error) {
	env, err := q.readRecordAt(ek, e)
	if err != nil {
		// Its log rewritten since e was read (logcompact.go): look where
		// the record went.
		if to, ok := q.moved.get(e.Log, e.Off); ok && to != e.Off {
			now := *e
			now.Off = to
			if env, err2 := q.readRecordAt(ek, &now); err2 == nil {
				return env, nil
			}
		}
	}
	return env, err
}

func (q *Queue) readRecordAt(ek []byte, e *envRec) (*envelope.Envelope, error) {
	key := cacheKey(e.Log, e.Off)
	if env := q.cache.get(key); env != nil && isRecordOf(ek, env) {
		// The log must still exist: a record whose log was deleted is
		// lost, whatever a cache remembers.
		if _, err := inode(filepath.Join(q.dir, e.Log)); err == nil {
			return env, nil
		}
	}
	env, err := q.readEnvelopeFile(e)
	if err == nil && !isRecordOf(ek, env) {
		return nil, errors.New("read envelope record: another record is at its place (the log was truncated or replaced)")
	}
	if err == nil {
		q.cache.put(key, env)
	}
	return env, err
}

// isRecordOf reports whether env is the envelope of key ek.
func isRecordOf(ek []byte, env *envelope.Envelope) bool {
	return len(ek) == len(env.TenantID)+1+len(env.ID) && string(ek[:len(env.TenantID)]) == env.TenantID &&
		ek[len(env.TenantID)] == 0 && string(ek[len(env.TenantID)+1:]) == env.ID
}

func (q *Queue) readEnvelopeFile(e *envRec) (*envelope.Envelope, error) {
	b, err := applog.ReadAt(filepath.Join(q.dir, e.Log), e.Off, e.Len)
	if err != nil {
		return nil, fmt.Errorf("read envelope record: %w", err)
	}
	var env envelope.Envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return nil, fmt.Errorf("decode envelope record: %w", err)
	}
	if env.TenantID == "" {
		env.TenantID = envelope.DefaultTenant
	}
	return &env, nil
}
