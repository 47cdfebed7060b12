package filestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
)

// The index checkpoint: why a power cut cannot tear the index.
//
// Most index transactions are committed without fsync (enqueue index
// updates, which the logs repeat; claims of idempotent providers; commits,
// which are reconciled when lost). Without a sync bbolt puts no barrier
// between a transaction's pages and its meta page, and the disk may keep
// the meta page of a transaction whose pages it lost: a tree made of stale
// pages ("page 60 referenced twice"; docs/powercut.md). The checkpoint is
// the last transaction known to be wholly on disk: after each sync of the
// index the writer copies that transaction's meta page into CheckpointFile
// (fsynced) and holds a read transaction at it, so that bbolt reuses none
// of its pages. A write that must survive a power cut (a claim for a
// provider that does not redeliver idempotently, consent, an erase, …) is
// acknowledged only once a checkpoint covers it.
//
// Open, when the machine has restarted since the checkpoint (another boot
// id) and the index went past it, writes the checkpoint's meta page back
// over both of bbolt's: the index is the checkpoint's, whole, and what
// came after it, unsynced by design, is done again as after any lost
// unsynced write (the logs indexed again, claims redelivered under their
// key, commits reconciled). After a crash of the process alone the page
// cache kept every write, and the index is used as it is.

// CheckpointFile, in the data directory, holds the index's last
// checkpoint: two fixed-size slots, written in turn.
const CheckpointFile = "index.checkpoint"

const (
	ckptMagic    = "outbox checkpoint 1\n"
	ckptSlotSize = 256
	ckptMetaSize = pageHeaderSize + metaSize // a meta page's bytes that are not zero
	ckptBootMax  = 64
)

// checkpoint is one slot of CheckpointFile: the meta page (its first
// ckptMetaSize bytes) of transaction txid of index.db, taken during boot.
// A txid of 0 names no transaction (past pinLimit bbolt syncs every commit;
// a new file about to be swapped in): Open never goes back.
type checkpoint struct {
	seq  uint64
	boot string
	txid uint64
	meta [ckptMetaSize]byte
}

func (c *checkpoint) bytes() []byte {
	b := make([]byte, 0, ckptSlotSize)
	b = append(b, ckptMagic...)
	le := binary.LittleEndian
	b = le.AppendUint64(b, c.seq)
	b = le.AppendUint64(b, c.txid)
	boot := c.boot
	if len(boot) > ckptBootMax {
		boot = boot[:ckptBootMax]
	}
	b = append(b, byte(len(boot)))
	b = append(b, boot...)
	b = append(b, make([]byte, ckptBootMax-len(boot))...)
	b = append(b, c.meta[:]...)
	b = le.AppendUint32(b, crc32.Checksum(b, crcTable))
	return append(b, make([]byte, ckptSlotSize-len(b))...)
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// parseCheckpoint decodes a slot; ok is false for one torn or never written.
func parseCheckpoint(b []byte) (c checkpoint, ok bool) {
	const n = len(ckptMagic) + 2*8 + 1 + ckptBootMax + ckptMetaSize
	if len(b) < n+4 || !bytes.HasPrefix(b, []byte(ckptMagic)) {
		return c, false
	}
	le := binary.LittleEndian
	if crc32.Checksum(b[:n], crcTable) != le.Uint32(b[n:]) {
		return c, false
	}
	p := b[len(ckptMagic):]
	c.seq, c.txid = le.Uint64(p), le.Uint64(p[8:])
	p = p[16:]
	bl := int(p[0])
	if bl > ckptBootMax {
		return c, false
	}
	c.boot = string(p[1 : 1+bl])
	copy(c.meta[:], p[1+ckptBootMax:])
	return c, true
}

// readCheckpoint returns the newest valid slot of dir's CheckpointFile.
func readCheckpoint(dir string) (checkpoint, bool) {
	f, err := openNoFollow(filepath.Join(dir, CheckpointFile), os.O_RDONLY, 0)
	if err != nil {
		return checkpoint{}, false
	}
	defer f.Close()
	b := make([]byte, 2*ckptSlotSize)
	n, _ := f.ReadAt(b, 0)
	b = b[:n]
	var best checkpoint
	found := false
	for off := 0; off+ckptSlotSize <= len(b); off += ckptSlotSize {
		if c, ok := parseCheckpoint(b[off : off+ckptSlotSize]); ok && (!found || c.seq > best.seq) {
			best, found = c, true
		}
	}
	return best, found
}

// bootID identifies the running boot of the machine ("" when unknown:
// every restart is then taken for one of the machine). The power-cut
// drill sets OUTBOX_TEST_BOOT_ID to stand for a restart of the machine
// that its processes cannot see.
var bootID = func() string {
	if v := os.Getenv("OUTBOX_TEST_BOOT_ID"); v != "" {
		return v
	}
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Pinning a transaction holds bbolt's mmap lock for reading, and bbolt
// takes it for writing to map a grown file again: the map is made large
// enough at Open that the index does not outgrow it. Past pinLimit the
// store stops pinning and bbolt syncs every commit itself.
var (
	pinMapSize = min(1<<36, math.MaxInt/2) // 64 GiB of address space, no memory
	pinLimit   = pinMapSize / 2
)

// openIndex opens the store's index file at path, mapped with
// pinMapSize of address space; where that much is refused (a limit on
// the process's address space), with a map fitted to the file, and then
// without pinning (pinOff: bbolt syncs every commit).
func openIndex(path string, o Options, mapSize int) (db *bolt.DB, pinOff bool, err error) {
	db, err = openBolt(path, o.boltOptions(mapSize))
	if errors.Is(err, syscall.ENOMEM) {
		bo := o.boltOptions(0)
		db, err = openBolt(path, bo)
		pinOff = true
	}
	if err != nil {
		return nil, false, err
	}
	if fi, err := os.Stat(path); err == nil {
		fitAlloc(db, fi.Size())
	}
	return db, pinOff, nil
}

// fitAlloc sets how much bbolt grows the file by, for an index of size
// bytes: bbolt sizes its growth from the map (to the map's size while it
// is small, then in AllocSize steps), and the map is pinMapSize. The
// index grows as it did with a map fitted to it: by doubling, in steps of
// at most bbolt's default.
func fitAlloc(db *bolt.DB, size int64) {
	db.AllocSize = int(min(max(size, 32<<10), 16<<20)) // bbolt's default AllocSize
}

// rollBack is the recovery of Open after a restart of the machine: when
// the index in dir went past its checkpoint (see above), the checkpoint's
// meta page is written over both of bbolt's. It reports the transaction
// ids it went from and back to (0, 0 when it did nothing). The checkpoint
// names whatever file is at index.db (every swap of the file drops it
// first, dropCheckpoint); one put there by hand is left alone unless the
// checkpoint's tree is whole in it.
func rollBack(dir string) (from, to uint64, err error) {
	c, ok := readCheckpoint(dir)
	if !ok || c.txid == 0 {
		return 0, 0, nil
	}
	if b := bootID(); b != "" && b == c.boot {
		return 0, 0, nil // the page cache kept every write
	}
	cm, ok := readMeta(c.meta[:])
	if !ok || cm.txid != c.txid {
		return 0, 0, nil
	}
	path := filepath.Join(dir, IndexFile)
	f, err := openNoFollow(path, os.O_RDWR, 0)
	if err != nil {
		return 0, 0, nil // no index: the checks of Open judge it
	}
	defer f.Close()
	ps := int64(cm.pageSize)
	var newest uint64
	for slot := range int64(2) {
		b := make([]byte, ckptMetaSize)
		if _, err := f.ReadAt(b, slot*ps); err == nil {
			if m, ok := readMeta(b); ok && m.txid > newest {
				newest = m.txid
			}
		}
	}
	if newest <= c.txid || verifyIndexAt(path, cm) != nil {
		return 0, 0, nil
	}
	page := make([]byte, ps)
	copy(page, c.meta[:])
	for slot := range int64(2) {
		binary.NativeEndian.PutUint64(page, uint64(slot)) // the page header's id
		if _, err := f.WriteAt(page, slot*ps); err != nil {
			return 0, 0, fmt.Errorf("open store: go back to the index checkpoint: %w", err)
		}
	}
	if err := applog.Fdatasync(f); err != nil {
		return 0, 0, fmt.Errorf("open store: go back to the index checkpoint: %w", err)
	}
	return newest, c.txid, nil
}

// dropCheckpoint makes dir's checkpoint name no transaction, durably,
// before another file is renamed over index.db: the checkpoint of the old
// file must never be applied to the new one.
// It returns the sequence number of the slot it wrote last.
func dropCheckpoint(dir string) (uint64, error) {
	c, ok := readCheckpoint(dir)
	if !ok {
		return 0, nil
	}
	f, err := openNoFollow(filepath.Join(dir, CheckpointFile), os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("drop the index checkpoint: %w", err)
	}
	defer f.Close()
	for slot := range uint64(2) { // both: the next write goes to either
		d := checkpoint{seq: c.seq + 1 + slot}
		if _, err := f.WriteAt(d.bytes(), int64(d.seq%2)*ckptSlotSize); err != nil {
			return 0, fmt.Errorf("drop the index checkpoint: %w", err)
		}
	}
	if err := applog.Fdatasync(f); err != nil {
		return 0, fmt.Errorf("drop the index checkpoint: %w", err)
	}
	return c.seq + 2, nil
}

// openCheckpoint opens the data directory's CheckpointFile, creating it
// durably (a checkpoint file that a power cut took would leave a torn
// index unrecovered), and takes the first checkpoint, before the writer
// commits anything without a sync.
func (q *Queue) openCheckpoint() error {
	if q.opts.NoSync {
		return nil
	}
	path := filepath.Join(q.dir, CheckpointFile)
	c, _ := readCheckpoint(q.dir)
	f, err := openNoFollow(path, os.O_RDWR, 0)
	created := false
	if errors.Is(err, os.ErrNotExist) {
		created = true
		f, err = openNoFollow(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err == nil {
			if err = syncDir(q.dir); err != nil {
				f.Close()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("open store: index checkpoint: %w", err)
	}
	q.ckptF, q.ckptSeq = f, c.seq
	noteOpen(&q.ckptInfo, f)
	if q.pinOff { // no checkpoint of this file will be kept: none may be applied
		seq, err := dropCheckpoint(q.dir)
		if err != nil {
			q.ckptF.Close()
			return fmt.Errorf("open store: %w", err)
		}
		q.ckptSeq = max(q.ckptSeq, seq)
	}
	if err := q.syncIndex(); err != nil {
		if created && queue.StorageProblemOf(err) == queue.StorageFull {
			// A full disk leaves no room for a new checkpoint file (an
			// existing one is written in place): none is kept this time,
			// and bbolt syncs every commit. The empty file names nothing.
			q.log.Warn("the file system is full: the index checkpoint cannot be written, every index transaction is synced until the next start",
				"operation", "open", "status", "storage_full")
			q.releasePin()
			q.pinOff = true
			_ = f.Truncate(0)
			_ = applog.Fdatasync(f)
			return nil
		}
		q.ckptF.Close()
		return fmt.Errorf("open store: %w", err)
	}
	return nil
}

// syncIndex makes everything the index committed durable and takes a
// checkpoint of it (writer only). With NoSync it does nothing.
func (q *Queue) syncIndex() error {
	if q.opts.NoSync {
		return nil
	}
	if err := q.damageErr(); err != nil {
		return err
	}
	if q.pinOff {
		q.markDurable() // bbolt synced every commit
		return nil
	}
	db := q.db.Load()
	if err := q.k.syncDB(db); err != nil {
		return fmt.Errorf("sync index: %w", err)
	}
	// The pin reads the mapped meta pages: a file cut under the store
	// is damage, not a crash.
	if err := q.guard(func() error { return q.takeCheckpoint(db) }); err != nil {
		return err
	}
	q.markDurable()
	return nil
}

// logSyncError logs a failed sync or checkpoint of the index.
func (q *Queue) logSyncError(err error) {
	if err != nil {
		q.log.Error("syncing the index failed: the writes since the last sync are not known to be on disk",
			"operation", "sync_index", "status", "error", "error", err.Error())
	}
}

// syncDB syncs the index file (a test's hook).
var syncDB = func(db *bolt.DB) error { return db.Sync() }

// takeCheckpoint records db's last commit, which the caller has synced,
// as the checkpoint and pins it in place of the previous one.
func (q *Queue) takeCheckpoint(db *bolt.DB) error {
	// bbolt reads the meta pages holding a lock it does not release on a
	// fault: on a file cut too short for them (an operator's "> index.db")
	// the fault would leave every later call of the store waiting on it.
	if fi, err := os.Stat(q.indexPath()); err == nil && fi.Size() < 2*int64(db.Info().PageSize) {
		return &CorruptIndexError{Path: q.indexPath(), Reason: fmt.Sprintf("%d bytes, too short for a bbolt file", fi.Size())}
	}
	pin, err := db.Begin(false)
	if err != nil {
		return fmt.Errorf("index checkpoint: %w", err)
	}
	fitAlloc(db, pin.Size())
	c := checkpoint{seq: q.ckptSeq + 1, boot: q.k.boot, txid: uint64(pin.ID())}
	if pin.Size() > int64(q.k.pinLimit) {
		c.txid = 0 // from now on bbolt syncs every commit (see pinLimit)
	}
	if c.txid != 0 {
		err = readCheckpointMeta(q.indexPath(), db.Info().PageSize, &c)
	}
	if err == nil {
		err = q.writeCheckpoint(&c)
	}
	if err != nil {
		_ = pin.Rollback()
		return err
	}
	q.releasePin()
	if c.txid == 0 {
		_ = pin.Rollback()
		q.pinOff = true
		return nil
	}
	q.pin, q.pinOff = pin, false
	return nil
}

// readCheckpointMeta reads the meta page of transaction c.txid from the
// index file at path (bbolt writes transaction t's meta page to page t%2).
func readCheckpointMeta(path string, pageSize int, c *checkpoint) error {
	f, err := openNoFollow(path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("index checkpoint: %w", err)
	}
	defer f.Close()
	if _, err := f.ReadAt(c.meta[:], int64(c.txid%2)*int64(pageSize)); err != nil {
		return fmt.Errorf("index checkpoint: read the meta page: %w", err)
	}
	if m, ok := readMeta(c.meta[:]); !ok || m.txid != c.txid {
		return fmt.Errorf("index checkpoint: meta page %d does not hold transaction %d", c.txid%2, c.txid)
	}
	return nil
}

// writeCkptAt writes a checkpoint slot (a test's hook).
var writeCkptAt = func(f *os.File, b []byte, off int64) (int, error) { return f.WriteAt(b, off) }

// knobs are the store's settings that tests change (syncDelay, syncDB,
// writeCkptAt, bootID, pinLimit, pinMapSize), as Open found them.
type knobs struct {
	syncDelay time.Duration
	syncDB    func(*bolt.DB) error
	writeCkpt func(*os.File, []byte, int64) (int, error)
	boot      string
	pinLimit  int
	mapSize   int
}

func currentKnobs() knobs {
	return knobs{syncDelay: syncDelay, syncDB: syncDB, writeCkpt: writeCkptAt, boot: bootID(), pinLimit: pinLimit, mapSize: pinMapSize}
}

func (q *Queue) writeCheckpoint(c *checkpoint) error {
	if _, err := q.k.writeCkpt(q.ckptF, c.bytes(), int64(c.seq%2)*ckptSlotSize); err != nil {
		return fmt.Errorf("index checkpoint: %w", err)
	}
	if err := applog.Fdatasync(q.ckptF); err != nil {
		return fmt.Errorf("index checkpoint: %w", err)
	}
	q.ckptSeq = c.seq
	return nil
}

// releasePin ends the read transaction that holds the checkpoint (before
// the index is closed or swapped: bbolt's Close waits for it).
func (q *Queue) releasePin() {
	if q.pin != nil {
		_ = q.pin.Rollback()
		q.pin = nil
	}
}
