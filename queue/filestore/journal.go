package filestore

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
)

// The consent journal: the durable copy of the facts that only the index
// held before (consent flags and suppressions, the tenants' address
// suppressions, push subscriptions), so that a rebuild of the index from
// the logs keeps them.
//
// One file per store, <data>/journal/consent.jsonl, JSON Lines, one
// record per change, the state it leaves (replaying a record twice is
// replaying it once):
//
//	{"op":"consent","tenant":T,"user":U,"consent":Consent}       the user's whole record
//	{"op":"subscribe","tenant":T,"user":U,"sub":Subscription}     saved (replaces the same endpoint)
//	{"op":"unsubscribe","tenant":T,"user":U,"target":X}           deleted (X: the endpoint's target)
//	{"op":"suppress_address","tenant":T,"suppression":Suppression}
//	{"op":"lift_address","tenant":T,"target":X}
//	{"op":"erase","tenant":T,"user":U}                            the user's consent and subscriptions gone
//
// One file, not one per tenant: the index is one file with one position
// to record, a transaction's facts of every tenant cost one append and
// one fdatasync, and Erase rewrites one file (it is small: a change of
// consent is rare next to an envelope). Only the store writes it, in its
// writer's transactions: the lines of a transaction are appended (with
// the store's applog.Appender, fdatasync included) before the bbolt commit
// that records the journal's new end in meta "journal" (offset, inode),
// so an acknowledged change is durable and a crash between the append and
// the commit loses nothing: Open applies what lies past that position.
// Foreign appenders (Append, outbox enqueue) never write it.
//
// A torn last line (the store died in the middle of an append, which was
// never acknowledged) is never read, as with the logs; unlike a log's, it
// is cut at the next Open instead of ended with a newline, since no other
// writer can be in the middle of it. A line that does not parse is skipped
// (logged by its offset) and reported by Check. Erase appends an erase
// record, then rewrites the file without the user's earlier lines (temp
// file, fsync, rename, fsync of the directory); meta "journal_erase" marks
// a rewrite still to do, which the next Open finishes after a crash.
const (
	journalDir  = "journal"
	journalFile = "consent.jsonl"
	journalRel  = journalDir + string(filepath.Separator) + journalFile
)

var (
	keyJournal      = []byte("journal")
	keyJournalErase = []byte("journal_erase")
)

// The journal records' ops.
const (
	jConsent     = "consent"
	jSubscribe   = "subscribe"
	jUnsubscribe = "unsubscribe"
	jSuppressAdr = "suppress_address"
	jLiftAdr     = "lift_address"
	jErase       = "erase"
)

// jrec is one journal record.
type jrec struct {
	Op          string              `json:"op"`
	Tenant      string              `json:"tenant"`
	User        string              `json:"user,omitempty"`
	Target      string              `json:"target,omitempty"`
	Consent     *queue.Consent      `json:"consent,omitempty"`
	Sub         *queue.Subscription `json:"sub,omitempty"`
	Suppression *queue.Suppression  `json:"suppression,omitempty"`
}

// JournalPath returns the path of the consent journal of the store in dir.
func JournalPath(dir string) string { return filepath.Join(dir, journalRel) }

func journalPos(off int64, ino uint64) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(off))
	return binary.BigEndian.AppendUint64(b, ino)
}

// parseJournalLine decodes a line and checks that it has what its op needs.
func parseJournalLine(b []byte) (*jrec, error) {
	var r jrec
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	ok := r.Tenant != ""
	switch r.Op {
	case jConsent:
		ok = ok && r.User != "" && r.Consent != nil
	case jSubscribe:
		ok = ok && r.User != "" && r.Sub != nil && r.Sub.Sub.Endpoint != ""
	case jUnsubscribe:
		ok = ok && r.User != "" && r.Target != ""
	case jSuppressAdr:
		ok = ok && r.Suppression != nil && r.Suppression.Target != ""
	case jLiftAdr:
		ok = ok && r.Target != ""
	case jErase:
		ok = ok && r.User != ""
	default:
		return nil, fmt.Errorf("unknown op %q", r.Op)
	}
	if !ok {
		return nil, fmt.Errorf("a %q record without the fields it needs", r.Op)
	}
	return &r, nil
}

// applyRecord writes r into the index: the one place where a journal
// record and the index entries it stands for meet.
func applyRecord(tx *bolt.Tx, r *jrec) error {
	switch r.Op {
	case jConsent:
		return putConsent(tx, r.Tenant, r.User, *r.Consent)
	case jSubscribe:
		v, err := json.Marshal(r.Sub)
		if err != nil {
			return err
		}
		return tx.Bucket(bktSubs).Put(subKey(r.Tenant, r.User, r.Sub.Sub.Endpoint), v)
	case jUnsubscribe:
		return tx.Bucket(bktSubs).Delete([]byte(r.Tenant + "\x00" + r.User + "\x00" + r.Target))
	case jSuppressAdr:
		v, err := json.Marshal(r.Suppression)
		if err != nil {
			return err
		}
		return tx.Bucket(bktAddrSup).Put(addrSupKey(r.Tenant, r.Suppression.Target), v)
	case jLiftAdr:
		return tx.Bucket(bktAddrSup).Delete(addrSupKey(r.Tenant, r.Target))
	case jErase:
		if err := tx.Bucket(bktConsent).Delete(consentKey(r.Tenant, r.User)); err != nil {
			return err
		}
		return eraseSubscriptions(tx, r.Tenant, r.User)
	}
	return fmt.Errorf("consent journal: unknown op %q", r.Op)
}

// record applies r to the index and adds it to the running transaction's
// journal lines (the writer appends them before the commit). Outside the
// writer, only Rebuild's store records, without a journal.
func (q *Queue) record(tx *bolt.Tx, r jrec) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if !q.rebuild && q.txJournal == nil {
		return errors.New("consent journal: a change outside the writer's transaction")
	}
	if err := applyRecord(tx, &r); err != nil {
		return err
	}
	if q.rebuild {
		return nil
	}
	if r.Op == jErase {
		q.txErase = true
	}
	q.txJournal = append(append(q.txJournal, b...), '\n')
	return nil
}

// flushJournal appends the transaction's journal lines (fsynced unless
// NoSync) and records the journal's new end in the transaction. The
// writer calls it after the ops, before the commit.
func (q *Queue) flushJournal(tx *bolt.Tx) error {
	if len(q.txJournal) == 0 {
		return nil
	}
	if q.journalGone(tx) {
		// Removed, replaced or cut under the running store: appending
		// would leave a journal without the facts before it (a rebuild
		// would lose them). The index, with this transaction's facts,
		// is written as the journal instead, as Open would.
		q.log.Warn("consent journal removed or replaced under the running store: written again from the index")
		size, ino, err := q.snapshotJournal(tx)
		if err != nil {
			return fmt.Errorf("consent journal: %w", err)
		}
		return tx.Bucket(bktMeta).Put(keyJournal, journalPos(size, ino))
	}
	start, ino, err := q.app.Append(journalRel, q.txJournal, nil)
	if err != nil {
		return fmt.Errorf("append to the consent journal: %w", err)
	}
	end := start + int64(len(q.txJournal))
	q.jAppend = [2]int64{start, end}
	meta := tx.Bucket(bktMeta)
	if q.txErase {
		if err := meta.Put(keyJournalErase, []byte{1}); err != nil {
			return err
		}
	}
	return meta.Put(keyJournal, journalPos(end, ino))
}

// journalGone reports whether the journal the index applied is no longer
// the file under its name (removed, another file, or cut shorter), other
// than by this store's own rewrite (whose erase mark is in tx).
func (q *Queue) journalGone(tx *bolt.Tx) bool {
	meta := tx.Bucket(bktMeta)
	off, applied, known := logPos(meta.Get(keyJournal))
	if !known || applied == 0 || meta.Get(keyJournalErase) != nil {
		return false
	}
	size, ino, err := applog.PathSize(JournalPath(q.dir))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return off > 0
	case err != nil:
		return false // the append reports it
	}
	return ino != applied || size < off
}

// journalDone runs in the writer after a transaction: a failed commit
// takes back what the transaction appended to the journal, or, when that
// fails too, has the next transaction apply it (as Open would).
func (q *Queue) journalDone(commitErr error) {
	if commitErr != nil && q.jAppend[1] > 0 {
		if !q.app.Withdraw(journalRel, q.jAppend[0], q.jAppend[1]) {
			q.jReplay = true
		}
	} else if commitErr == nil {
		q.jReplay = false
	}
	q.jAppend = [2]int64{}
	q.txErase = false
	q.jbuf, q.txJournal = q.txJournal[:0], nil
}

// journalBegin starts a transaction's journal lines (writer only).
func (q *Queue) journalBegin(tx *bolt.Tx) error {
	if q.jbuf == nil {
		q.jbuf = make([]byte, 0, 4096)
	}
	q.txJournal = q.jbuf[:0]
	if !q.jReplay {
		return nil
	}
	off, _, _ := logPos(tx.Bucket(bktMeta).Get(keyJournal))
	_, err := q.replayInto(tx, off)
	return err
}

// scanJournal calls fn with every complete line of the journal at path
// from offset from: its offset and record, or the reason it is not one. It
// returns where the complete lines end (a torn tail, if any, starts
// there). A missing journal is an empty one.
func scanJournal(path string, from int64, fn func(off int64, r *jrec, raw []byte, bad error) error) (int64, error) {
	at := from
	for {
		c, err := applog.ReadLines(path, at)
		if err != nil {
			return at, fmt.Errorf("read the consent journal: %w", err)
		}
		for _, l := range applog.Lines(c.Data, at) {
			r, perr := parseJournalLine(l.Data)
			if err := fn(l.Off, r, l.Data, perr); err != nil {
				return at, err
			}
		}
		at += int64(len(c.Data))
		switch {
		case c.Long && c.LongEnd < 0:
			return at, nil // an unfinished line: the torn tail
		case c.Long:
			if err := fn(at, nil, nil, fmt.Errorf("line longer than %d bytes", applog.MaxLine)); err != nil {
				return at, err
			}
			at = c.LongEnd
		case !c.More:
			return at, nil
		}
	}
}

// replay applies the journal's records from offset from to the index and
// records where they end; it reports whether an erase was among them.
// Lines that are no record are skipped, logged by their offset.
func replay(tx *bolt.Tx, dir string, from int64, log *slog.Logger) (end int64, erased bool, err error) {
	path := JournalPath(dir)
	end, err = scanJournal(path, from, func(off int64, r *jrec, _ []byte, bad error) error {
		if bad != nil {
			log.Warn("consent journal: a line that is no record skipped (outbox doctor lists it)", "offset", off, "reason", bad.Error())
			return nil
		}
		erased = erased || r.Op == jErase
		return applyRecord(tx, r)
	})
	if err != nil {
		return 0, false, err
	}
	_, ino, serr := applog.PathSize(path)
	if serr != nil && !errors.Is(serr, os.ErrNotExist) {
		return 0, false, fmt.Errorf("consent journal: %w", serr)
	}
	meta := tx.Bucket(bktMeta)
	if erased {
		if err := meta.Put(keyJournalErase, []byte{1}); err != nil {
			return 0, false, err
		}
	}
	return end, erased, meta.Put(keyJournal, journalPos(end, ino))
}

func (q *Queue) replayInto(tx *bolt.Tx, from int64) (int64, error) {
	end, _, err := replay(tx, q.dir, from, q.log)
	return end, err
}

// openJournal brings the index up to date with the journal at Open: it
// applies the records past the position the index recorded (all of them
// when the index is new, or the journal is an erase's rewrite whose commit
// was lost), cuts a torn tail, writes the journal from the index when it
// is missing while the index holds facts (an index from before the
// journal, or a journal deleted) or when it was replaced or cut by hand
// (the index is then the newer truth), and finishes an erase's rewrite.
func (q *Queue) openJournal() error {
	if err := checkNotLink(filepath.Join(q.dir, journalDir)); err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	path := JournalPath(q.dir)
	return q.db.Load().Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bktMeta)
		off, applied, known := logPos(meta.Get(keyJournal))
		size, ino, err := applog.PathSize(path)
		missing := errors.Is(err, os.ErrNotExist)
		if err != nil && !missing {
			return fmt.Errorf("consent journal: %w", err)
		}
		var from int64
		switch {
		case missing:
			if n := factCount(tx); n > 0 && (!known || off > 0) {
				if known {
					q.log.Warn("consent journal missing: written again from the index", "facts", n)
				}
				size, ino, err := q.snapshotJournal(tx)
				if err != nil {
					return err
				}
				return meta.Put(keyJournal, journalPos(size, ino))
			}
			return meta.Put(keyJournal, journalPos(0, 0))
		case known && (ino != applied || size < off) && meta.Get(keyJournalErase) == nil:
			// Not this store's doing (its own rewrites leave the erase
			// mark until they commit): an older copy or a cut file,
			// whose records must not undo the index's newer ones.
			q.log.Warn("consent journal replaced or cut shorter than the index applied: written again from the index")
			size, ino, err := q.snapshotJournal(tx)
			if err != nil {
				return err
			}
			return meta.Put(keyJournal, journalPos(size, ino))
		case known && (ino != applied || size < off):
			// An erase's rewrite renamed in before its commit: the
			// index's facts less the erased user's, and perhaps lines
			// appended after it that were never acknowledged.
		case known:
			from = off
		}
		end, err := q.replayInto(tx, from)
		if err != nil {
			return err
		}
		if end < size {
			if err := q.cutJournal(end); err != nil {
				return err
			}
		}
		if meta.Get(keyJournalErase) != nil {
			return q.rewriteErased(tx)
		}
		return nil
	})
}

// cutJournal cuts the journal's torn tail at end (no writer but this store
// ever appends to it, and Open holds the directory's lock).
func (q *Queue) cutJournal(end int64) error {
	f, err := applog.OpenFile(JournalPath(q.dir), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("consent journal: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(end); err != nil {
		return fmt.Errorf("consent journal: cut a torn line: %w", err)
	}
	if !q.opts.NoSync {
		return f.Sync()
	}
	return nil
}

// factCount counts the index's consent records, address suppressions and
// subscriptions.
func factCount(tx *bolt.Tx) int {
	n := 0
	for _, b := range [][]byte{bktConsent, bktAddrSup, bktSubs} {
		if bk := tx.Bucket(b); bk != nil {
			n += bk.Stats().KeyN
		}
	}
	return n
}

// snapshotJournal writes every fact of the index as a new journal.
func (q *Queue) snapshotJournal(tx *bolt.Tx) (int64, uint64, error) {
	return q.writeJournal(func(emit func(r jrec) error) error {
		if err := tx.Bucket(bktConsent).ForEach(func(k, v []byte) error {
			t, u := splitEnvKey(k)
			var c queue.Consent
			if err := json.Unmarshal(v, &c); err != nil {
				return fmt.Errorf("a consent record in the index is damaged (run \"outbox doctor\"): %w", err)
			}
			return emit(jrec{Op: jConsent, Tenant: t, User: u, Consent: &c})
		}); err != nil {
			return err
		}
		if err := tx.Bucket(bktSubs).ForEach(func(k, v []byte) error {
			t, rest := splitEnvKey(k)
			u, _ := splitEnvKey([]byte(rest))
			var s queue.Subscription
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("a subscription in the index is damaged (run \"outbox doctor\"): %w", err)
			}
			return emit(jrec{Op: jSubscribe, Tenant: t, User: u, Sub: &s})
		}); err != nil {
			return err
		}
		return tx.Bucket(bktAddrSup).ForEach(func(k, v []byte) error {
			t, _ := splitEnvKey(k)
			var s queue.Suppression
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("an address suppression in the index is damaged (run \"outbox doctor\"): %w", err)
			}
			return emit(jrec{Op: jSuppressAdr, Tenant: t, Suppression: &s})
		})
	})
}

// rewriteErased rewrites the journal without the lines of every erased
// user up to that user's last erase record (a user signed up again after
// it keeps the new lines), and without lines that are no record (they may
// hold an erased user's data, and nobody can read them), then records the
// new file in the transaction. It runs in the writer (or at Open): no
// append can come between the read and the rename.
func (q *Queue) rewriteErased(tx *bolt.Tx) error {
	path := JournalPath(q.dir)
	type who struct{ tenant, user string }
	lastErase := map[who]int64{}
	if _, err := scanJournal(path, 0, func(off int64, r *jrec, _ []byte, bad error) error {
		if bad == nil && r.Op == jErase {
			lastErase[who{r.Tenant, r.User}] = off
		}
		return nil
	}); err != nil {
		return err
	}
	size, ino, err := q.writeJournal(func(emit func(r jrec) error) error {
		_, err := scanJournal(path, 0, func(off int64, r *jrec, _ []byte, bad error) error {
			if bad != nil {
				return nil
			}
			if last, ok := lastErase[who{r.Tenant, r.User}]; ok && r.User != "" && off <= last {
				return nil
			}
			return emit(*r)
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("consent journal: remove an erased user's lines: %w", err)
	}
	meta := tx.Bucket(bktMeta)
	if err := meta.Delete(keyJournalErase); err != nil {
		return err
	}
	return meta.Put(keyJournal, journalPos(size, ino))
}

// forgetErased has the writer rewrite the journal after an Erase (the
// erase record is in it already, and the index committed).
func (q *Queue) forgetErased() error {
	return q.write(context.Background(), false, q.rewriteErased)
}

// writeJournal replaces the journal atomically with the records fill
// emits: a temporary file beside it, fsynced, renamed over it (with no
// append of this process running), then the directory fsynced. It returns
// the new file's size and inode.
func (q *Queue) writeJournal(fill func(emit func(r jrec) error) error) (int64, uint64, error) {
	dir := filepath.Join(q.dir, journalDir)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return 0, 0, err
	}
	path := JournalPath(q.dir)
	tmp := path + ".rewrite"
	f, err := applog.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, 0, err
	}
	w := bufio.NewWriter(f)
	var size int64
	err = fill(func(r jrec) error {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		n, err := w.Write(append(b, '\n'))
		size += int64(n)
		return err
	})
	if err == nil {
		err = w.Flush()
	}
	if err == nil && !q.opts.NoSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return 0, 0, err
	}
	q.app.Exclusive(journalRel, func() { err = os.Rename(tmp, path) })
	if err != nil {
		_ = os.Remove(tmp)
		return 0, 0, err
	}
	if !q.opts.NoSync {
		if err := syncDir(dir); err != nil {
			return 0, 0, err
		}
		if err := syncDir(q.dir); err != nil {
			return 0, 0, err
		}
	}
	_, ino, err := applog.PathSize(path)
	return size, ino, err
}

// rebuildJournal applies the whole journal to the index Rebuild builds.
func rebuildJournal(tx *bolt.Tx, dir string, log *slog.Logger) error {
	_, _, err := replay(tx, dir, 0, log)
	return err
}

// journalState is what checkJournal found.
type journalState struct {
	lines     int
	unapplied int64
}

// checkJournal checks the journal against the index's position (bad gets
// each problem) and returns its lines and its complete bytes past that
// position.
func checkJournal(tx *bolt.Tx, dir string, bad func(format string, a ...any)) journalState {
	var st journalState
	path := JournalPath(dir)
	off, applied, known := logPos(tx.Bucket(bktMeta).Get(keyJournal))
	size, ino, err := applog.PathSize(path)
	const later = "hint: the next open of the store (outbox serve) writes it again from the index; a rebuild before that loses what the journal lacks"
	switch {
	case errors.Is(err, os.ErrNotExist):
		if n := factCount(tx); n > 0 && (!known || off > 0) {
			why := "deleted"
			if !known {
				why = "not written yet (an index from before the journal)"
			}
			bad("journal %s: %s while the index holds %d consent records, address suppressions and subscriptions; hint: the next open of the store (outbox serve) writes it from the index; a rebuild before that loses them", journalRel, why, n)
		}
		return st
	case errors.Is(err, ErrSymlink):
		bad("journal %s: a symbolic link, never followed; replace it with the real file or remove it", journalRel)
		return st
	case err != nil:
		bad("journal %s: %v", journalRel, err)
		return st
	case known && ino != applied:
		bad("journal %s: replaced (inode %d, the index applied inode %d); %s", journalRel, ino, applied, later)
	case known && size < off:
		bad("journal %s: truncated (%d bytes, shorter than the offset the index applied, %d); %s", journalRel, size, off, later)
	}
	end, err := scanJournal(path, 0, func(at int64, _ *jrec, _ []byte, perr error) error {
		if perr != nil {
			bad("journal %s: the line at offset %d is no record (%v): an open and a rebuild skip it", journalRel, at, perr)
			return nil
		}
		st.lines++
		return nil
	})
	if err != nil {
		bad("journal %s: %v", journalRel, err)
		return st
	}
	if known && ino == applied && end > off {
		st.unapplied = end - off
	}
	return st
}
