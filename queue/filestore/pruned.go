package filestore

import (
	"encoding/binary"

	bolt "go.etcd.io/bbolt"
)

// A pruned envelope leaves the index, but its record stays in its log
// until the log is rewritten (logcompact.go) or removed. Were the log
// then indexed again from its start (resetLog: a copy of the data
// directory, a log restored or renamed over by an identical file), the
// record would be taken for a new envelope and delivered a second time.
// So Prune remembers where each pruned record lies, by log, until its log
// no longer holds it, and a catch-up skips a line found there with the
// same id and length. A new record of the same id lies elsewhere and is
// indexed as usual.
//
//	pruned  log path 0 tenant 0 id → offset(u64) length(u32)
var bktPruned = []byte("pruned")

func init() { allBuckets = append(allBuckets, bktPruned) }

func prunedKey(rel string, ek []byte) []byte {
	return append([]byte(rel+"\x00"), ek...)
}

// putPruned remembers the record of envelope ek at [off, off+n) of log
// rel, pruned in tx.
func putPruned(tx *bolt.Tx, rel string, ek []byte, off int64, n int) error {
	v := make([]byte, 12)
	binary.BigEndian.PutUint64(v, uint64(off))
	binary.BigEndian.PutUint32(v[8:], uint32(n))
	return tx.Bucket(bktPruned).Put(prunedKey(rel, ek), v)
}

// wasPruned reports whether the line [off, off+n) of log rel, a record of
// envelope ek, is one Prune removed from the index.
func wasPruned(tx *bolt.Tx, rel string, ek []byte, off int64, n int) bool {
	b := tx.Bucket(bktPruned)
	if b == nil {
		return false // an index from before this bucket, opened read-only
	}
	v := b.Get(prunedKey(rel, ek))
	return len(v) == 12 && int64(binary.BigEndian.Uint64(v)) == off && int(binary.BigEndian.Uint32(v[8:])) == n
}

// dropPruned forgets the pruned records of log rel: it is removed, or
// rewritten without them.
func dropPruned(tx *bolt.Tx, rel string) error {
	return dropPrefix(tx.Bucket(bktPruned), []byte(rel+"\x00"))
}
