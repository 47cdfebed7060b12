package filestore

import (
	"context"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"
)

// scrubIndex rewrites the index file so that nothing deleted before it
// stays in the file: bbolt keeps the old contents of the pages it frees
// until it reuses them, so an erased user's keys and values (ids,
// subscriptions with their endpoints, consent) would stay readable in
// index.db. It returns once the rewritten file is in place and synced.
func (q *Queue) scrubIndex(ctx context.Context) error {
	return q.run(ctx, &op{fn: func(*bolt.Tx) error { return nil }, scrub: true, done: make(chan struct{})})
}

// scrubAfter rewrites the index file (rewriteIndex) once for the ops of a
// committed batch that asked for it, and fails them if it fails. The
// writer runs it between transactions.
func (q *Queue) scrubAfter(batch []*op) {
	var want []*op
	for _, o := range batch {
		if o.scrub && o.err == nil {
			want = append(want, o)
		}
	}
	if len(want) == 0 {
		return
	}
	if err := q.rewriteIndex(); err != nil {
		q.log.Error("rewrite the index after an erase failed", "operation", "erase", "status", "error")
		for _, o := range want {
			o.err = err
		}
	}
}

// rewriteIndex compacts the open index into a new file and swaps it in,
// run by the writer (so no write commits meanwhile; the store's exclusive
// directory lock keeps every other process out): the new file holds only
// the live content, is fsynced, opened, renamed over index.db and the
// directory fsynced. Readers go on with the old file while it is copied;
// those that begin after the swap read the new one, and the old one is
// closed once the reads on it are done. Killed at any instant, it leaves
// index.db as it was or the complete new file (a leftover temporary file
// is removed by the next rewrite or compaction).
func (q *Queue) rewriteIndex() error {
	old := q.db.Load()
	path := q.indexPath()
	tmp := path + ".compact.tmp"
	next := q.markGen + 1
	if err := compactInto(old, tmp, next); err != nil {
		return fmt.Errorf("erase: rewrite the index: %w", err)
	}
	// Opened before the rename: once index.db is the new file, the store
	// never goes on with the old one.
	ndb, pinOff, err := openIndex(tmp, q.opts, q.k.mapSize)
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("erase: open the rewritten index: %w", err)
	}
	nm, err := indexMark(ndb)
	if err != nil {
		ndb.Close()
		_ = os.Remove(tmp)
		return fmt.Errorf("erase: read the rewritten index: %w", err)
	}
	// Whichever file a crash leaves at index.db, the mark accepts it.
	q.writeMarkF(swapMark(mark{id: q.markID, gen: q.markGen, txid: q.durableTx}, next))
	if q.ckptF != nil {
		seq, err := dropCheckpoint(q.dir)
		if err != nil {
			ndb.Close()
			_ = os.Remove(tmp)
			return fmt.Errorf("erase: %w", err)
		}
		q.ckptSeq = max(q.ckptSeq, seq)
	}
	q.indexMu.Lock()
	if err := os.Rename(tmp, path); err != nil {
		q.indexMu.Unlock()
		ndb.Close()
		_ = os.Remove(tmp)
		return fmt.Errorf("erase: swap in the rewritten index: %w", err)
	}
	q.db.Store(ndb)
	q.indexFile, _ = os.Stat(path)
	q.indexMu.Unlock()
	q.markGen, q.lastTx = next, nm.txid // compactInto synced it
	// The new file's first checkpoint, at once (the old one's is dropped).
	q.releasePin()
	q.pinOff = q.pinOff || pinOff
	if q.ckptF != nil && !q.pinOff {
		if err := q.takeCheckpoint(ndb); err != nil {
			q.logSyncError(err)
		}
	}
	q.markDurable()
	q.wg.Add(1)
	go func() {
		// Waits for the reads that began on the old file.
		defer q.wg.Done()
		_ = old.Close()
	}()
	if err := syncDir(q.dir); err != nil {
		return fmt.Errorf("erase: sync the data directory after the index rewrite: %w", err)
	}
	return nil
}
