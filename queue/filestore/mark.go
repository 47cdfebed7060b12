package filestore

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// MarkFile, in the data directory, names the index the store last used:
// the identity kept in that index (a random id in its meta bucket), the
// index file's generation (one more with each file a compaction, a rebuild
// or an Erase swaps in) and the bbolt transaction id of its last commit
// known to be on disk. Open refuses an index that is not the one named
// (another store's) or is older than the mark (a copy restored from a
// backup, an older copy moved over it): the records logged since that copy
// was taken would be indexed again as new work, and the rows it had
// pending delivered, a second time. outbox doctor --rebuild rebuilds the
// index from the logs under the same identity. The mark is written without
// fsync after durable commits, so it can only lag the index: a lost or
// torn mark is written again and refuses nothing. Before a new file is
// renamed over index.db the mark names the generation coming (next), so
// that whichever file a crash leaves there is accepted.
const MarkFile = "index.mark"

// keyID and keyGen are the index's identity and generation in the meta
// bucket.
var (
	keyID  = []byte("id")
	keyGen = []byte("gen")
)

// mark is MarkFile's content: an index at generation gen whose commits up
// to txid are on disk (0: unknown), and the generation of a file about to
// be swapped in (next, 0 when none).
type mark struct {
	id              string
	gen, txid, next uint64
}

const markPrefix = "outbox index "

// markLen is the length of every mark written: a fixed-size record
// overwritten in place.
var markLen = len(mark{id: newIndexID()}.bytes())

func markPath(dir string) string { return filepath.Join(dir, MarkFile) }

func (m mark) bytes() []byte {
	return fmt.Appendf(nil, "%s%s %020d %020d %020d\n", markPrefix, m.id, m.gen, m.txid, m.next)
}

// readMark reads the mark in dir; ok is false when there is none or it
// does not parse (torn: it refuses nothing).
func readMark(dir string) (m mark, ok bool) {
	f, err := openNoFollow(markPath(dir), os.O_RDONLY, 0)
	if err != nil {
		return m, false
	}
	defer f.Close()
	b := make([]byte, markLen+1)
	n, _ := f.Read(b)
	rest, found := bytes.CutPrefix(b[:n], []byte(markPrefix))
	if n != markLen || !found {
		return m, false
	}
	fields := strings.Fields(string(rest))
	if len(fields) != 4 || len(fields[0]) != 32 {
		return m, false
	}
	if _, err := hex.DecodeString(fields[0]); err != nil {
		return m, false
	}
	var v [3]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(fields[i+1], 10, 64); err != nil {
			return m, false
		}
	}
	return mark{id: fields[0], gen: v[0], txid: v[1], next: v[2]}, true
}

// writeMark writes m into dir's mark (not fsynced, never through a link).
func writeMark(dir string, m mark) error {
	f, err := openNoFollow(markPath(dir), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(m.bytes(), 0)
	if err == nil {
		err = f.Truncate(int64(markLen))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// newIndexID returns a new random index identity.
func newIndexID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ensureIdentity gives the index its identity and generation if it has
// none (a new index, one of an older outbox): id (a new one when "") and
// generation 1.
func ensureIdentity(tx *bolt.Tx, id string) error {
	meta := tx.Bucket(bktMeta)
	if meta.Get(keyID) == nil {
		if id == "" {
			id = newIndexID()
		}
		if err := meta.Put(keyID, []byte(id)); err != nil {
			return err
		}
	}
	if meta.Get(keyGen) == nil {
		return meta.Put(keyGen, u64(1))
	}
	return nil
}

// setGen sets the generation of a new index file.
func setGen(db *bolt.DB, gen uint64) error {
	return db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bktMeta)
		if err != nil {
			return err
		}
		return meta.Put(keyGen, u64(gen))
	})
}

// indexMark returns the identity and generation of db and its last
// transaction id.
func indexMark(db *bolt.DB) (m mark, err error) {
	err = db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(bktMeta); meta != nil {
			m.id = string(meta.Get(keyID))
			if v := meta.Get(keyGen); len(v) == 8 {
				m.gen = beUint64(v)
			}
		}
		m.txid = uint64(tx.ID())
		return nil
	})
	return m, err
}

// swapMark is the mark to write before a new file of generation next is
// renamed over an index whose durable state is cur.
func swapMark(cur mark, next uint64) mark {
	cur.next = next
	return cur
}

// openMark checks the index just opened against the data directory's mark
// (unless fresh: a new index, which checkNotLost has judged), takes its
// identity, and writes the mark for it.
func (q *Queue) openMark(fresh bool) error {
	m, err := indexMark(q.db.Load())
	if err != nil {
		return pointAtDoctor(q.dir, err)
	}
	if !fresh {
		if err := checkMark(q.dir, m, q.opts.NoSync); err != nil {
			return err
		}
	}
	q.markID, q.markGen, q.lastTx = m.id, m.gen, m.txid
	f, err := openNoFollow(markPath(q.dir), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	_ = f.Truncate(int64(markLen))
	q.markF = f
	noteOpen(&q.markInfo, f)
	q.markDurable()
	return nil
}

// markDurable writes the mark for the index's last commit, which is on
// disk (the writer calls it after a synced commit or a sync). With NoSync
// nothing is known to be on disk: the mark names the index only.
func (q *Queue) markDurable() {
	if q.markF == nil {
		return
	}
	m := mark{id: q.markID, gen: q.markGen, txid: q.lastTx}
	if q.opts.NoSync {
		m.txid = 0
	}
	q.writeMarkF(m)
	q.durableTx = m.txid
}

func (q *Queue) writeMarkF(m mark) {
	if q.markF != nil {
		_, _ = q.markF.WriteAt(m.bytes(), 0)
	}
}

// StaleIndexError is returned by Open when index.db is not the index the
// data directory's mark names, or is older than it: opening it would
// index again, as new work, the records it has not seen (some of them
// delivered since) and deliver them a second time.
type StaleIndexError struct {
	Dir    string
	Reason string
}

func (e *StaleIndexError) Error() string {
	return fmt.Sprintf("store %s: the index %s is %s: opening it would deliver again what was sent since; run \"outbox doctor --rebuild --data %s\" to rebuild it from the logs (rows of unknown fate become unresolved, never redelivered automatically)",
		e.Dir, filepath.Join(e.Dir, IndexFile), e.Reason, e.Dir)
}

// checkMark compares the open index (its identity, generation and last
// transaction id in m) with the data directory's mark.
func checkMark(dir string, m mark, noSync bool) error {
	want, ok := readMark(dir)
	switch {
	case !ok:
		return nil
	case want.id != m.id:
		return &StaleIndexError{Dir: dir, Reason: "not the index this store last used (another store's, or one from before the mark)"}
	case m.gen > want.gen || (want.next != 0 && m.gen == want.next):
		return nil // a newer file swapped in; the mark lagged
	case m.gen < want.gen:
		return &StaleIndexError{Dir: dir, Reason: fmt.Sprintf("older than the one this store last used (file generation %d of %d, from before a compaction or a rebuild: restored from a backup, or an older copy moved over it)", m.gen, want.gen)}
	case !noSync && m.txid < want.txid:
		return &StaleIndexError{Dir: dir, Reason: fmt.Sprintf("older than the one this store last used (at transaction %d of %d: restored from a backup, or an older copy moved over it)", m.txid, want.txid)}
	}
	return nil
}
