package filestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
)

// prepared is one validated envelope on its way into a log.
type prepared struct {
	env  *envelope.Envelope
	ek   []byte
	rel  string
	line []byte
	dup  bool
	off  int64
	ino  uint64    // the log's inode when appended
	segs int       // rows of the stored envelope (ours or the one we duplicate)
	at   time.Time // when Enqueue was called: the row's enqueue time
	seq  uint64    // enqueue order, taken in the call's order before indexing (0: at indexing)
}

func knownKey(rel string, off int64) string { return rel + "\x00" + strconv.FormatInt(off, 10) }

// register makes the appended records of an in-process Enqueue known to
// catch-ups until it has been indexed. A key may hold several records: a
// log deleted or replaced under the store is appended to again from
// offset 0, and its new records land at the offsets of older ones that
// are not indexed yet (knownAt tells them apart by their bytes).
func (q *Queue) register(items []*prepared) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range items {
		if !it.dup {
			k := knownKey(it.rel, it.off)
			q.known[k] = append(q.known[k], it)
		}
	}
}

func (q *Queue) unregister(items []*prepared) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, it := range items {
		// Only its own entry: a record whose append failed has no
		// offset, and another record may be registered at that key.
		if !it.dup {
			q.dropKnownLocked(knownKey(it.rel, it.off), it)
		}
	}
}

// dropKnownLocked removes p from the records known at key k (q.mu held).
func (q *Queue) dropKnownLocked(k string, p *prepared) {
	ps := q.known[k]
	for i, x := range ps {
		if x == p {
			ps = append(ps[:i:i], ps[i+1:]...)
			break
		}
	}
	if len(ps) == 0 {
		delete(q.known, k)
	} else {
		q.known[k] = ps
	}
}

// knownAt returns the record appended in process, and not indexed yet,
// that is the line at offset off of log rel as read now: one registered at
// that offset with these very bytes. An offset alone does not tell: after
// the log was deleted or replaced, its new file holds other records there
// (and an inode number can be reused).
func (q *Queue) knownAt(rel string, off int64, line []byte) *prepared {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.known[knownKey(rel, off)] {
		if len(p.line) == len(line)+1 && bytes.Equal(p.line[:len(line)], line) {
			return p
		}
	}
	return nil
}

// registered reports whether p is still known (not indexed, not erased).
func (q *Queue) registered(p *prepared) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, x := range q.known[knownKey(p.rel, p.off)] {
		if x == p {
			return true
		}
	}
	return false
}

// knownFunc finds a record appended in process (knownAt).
type knownFunc func(rel string, off int64, line []byte) *prepared

// Enqueue implements Store. The records are appended to the users' logs
// (one write and one fsync per log, shared with concurrent enqueues) and
// Enqueue returns once they are on stable storage. The index update follows
// in the writer's order; every read of the store (Get, List, Claim, …)
// waits for the updates submitted before it, so a caller reads its own
// writes. If that update fails (a full disk), the records stay durable in
// their logs and are indexed by the next rescan or Open.
//
// Duplicates are decided before the append, against the index and the
// enqueues in flight in this process. A line with the same id appended by
// another process at the same moment is still indexed only once, but this
// call may then report created for the copy that lost.
func (q *Queue) Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]queue.EnqueueResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if q.isClosed() {
		return nil, queue.ErrClosed
	}
	now := q.opts.Now()
	checked, err := queue.Prepare(envs)
	if err != nil {
		return nil, err
	}
	items := make([]*prepared, len(checked))
	for i, c := range checked {
		e := c.Env
		items[i] = &prepared{
			env:  e,
			ek:   envKey(e.TenantID, e.ID),
			rel:  applog.RelPath(e.TenantID, e.UserID),
			line: append(c.Line, '\n'),
			segs: c.Segments,
			at:   now,
		}
	}

	// Consent and duplicates, then reserve the new keys against
	// concurrent enqueues of the same ids.
	reserved, err := q.reserve(ctx, items)
	defer func() { q.unreserve(reserved) }()
	if err != nil {
		return nil, err
	}

	// Append: one write per log.
	byLog := map[string][]*prepared{}
	var logs []string
	for _, it := range items {
		if it.dup {
			continue
		}
		if _, ok := byLog[it.rel]; !ok {
			logs = append(logs, it.rel)
		}
		byLog[it.rel] = append(byLog[it.rel], it)
	}
	type written struct {
		rel        string
		start, end int64
	}
	var done []written
	for _, rel := range logs {
		var buf []byte
		for _, it := range byLog[rel] {
			buf = append(buf, it.line...)
		}
		// The records are registered (known to every catch-up) as soon as
		// their batch is durable, before any append of that batch returns:
		// a concurrent Enqueue's catch-up then indexes them without reading
		// or validating them again.
		its := byLog[rel]
		start, _, err := q.app.Append(rel, buf, func(off int64, ino uint64) {
			for _, it := range its {
				it.off, it.ino = off, ino
				off += int64(len(it.line))
			}
			q.register(its)
		})
		if err != nil {
			// Withdraw what this call already appended to other logs.
			for _, w := range done {
				q.withdraw(w.rel, w.start, w.end)
			}
			q.unregister(items)
			q.m.EnqueueErrors.Inc()
			if errors.Is(err, ErrSymlink) {
				q.reportLink(rel, err)
			}
			if errors.Is(err, applog.ErrDirGone) && q.checkDir() {
				return nil, fmt.Errorf("enqueue: %w", q.damageErr())
			}
			return nil, fmt.Errorf("enqueue: append to log: %w", err)
		}
		done = append(done, written{rel, start, start + int64(len(buf))})
	}

	// Index: the writer catches each log up to (at least) our records. The
	// records appended in this process are registered so that any catch-up
	// indexes them without reading or validating them again. Enqueue does
	// not wait for it: the records are durable, the writer applies index
	// updates in order, and every read of the store waits for the index
	// updates submitted before it (see barrier), so a caller still reads
	// its own writes. The reservations hold until the index is written.
	keep := reserved
	reserved = nil // released by the index op, not by the deferred unreserve
	q.submitIndex(func(tx *bolt.Tx) error {
		// Enqueue order is the call's order, whichever log a record is
		// in (taken again if this transaction is retried).
		for _, it := range items {
			if !it.dup {
				it.seq = nextCounter(tx, keySeq)
			}
		}
		for _, w := range done {
			its := byLog[w.rel]
			// Our ids are reserved until this transaction is written: an
			// entry for the last one is ours, indexed with the whole batch
			// by a concurrent Enqueue's catch-up.
			if tx.Bucket(bktEnv).Get(its[len(its)-1].ek) != nil {
				continue
			}
			if err := q.catchUp(tx, w.rel, q.knownAt, its[0]); err != nil {
				return err
			}
			if err := q.indexMissing(tx, its); err != nil {
				return err
			}
		}
		return nil
	}, func(err error) {
		q.unregister(items)
		q.unreserve(keep)
		if err != nil && !errors.Is(err, queue.ErrClosed) {
			// The records are durable in the logs: the tailer's rescan or
			// the next Open indexes them.
			q.log.Error("index enqueued records failed; the rescan will retry", "operation", "enqueue", "status", "error")
			q.Rescan()
		}
		q.wake()
	})
	res := make([]queue.EnqueueResult, len(items))
	for i, it := range items {
		res[i] = queue.EnqueueResult{Tenant: it.env.TenantID, ID: it.env.ID, Duplicate: it.dup, Segments: it.segs}
		if !it.dup {
			q.m.Enqueued.WithLabelValues(string(it.env.Channel)).Inc()
		} else {
			q.m.Duplicates.Inc()
		}
	}
	return res, nil
}

// indexMissing indexes, at their place, the records of its that the
// catch-up of their log did not find there: the log was deleted, truncated
// or replaced after they were appended. They were acknowledged, so they
// are indexed all the same, and their rows end record_lost when claimed
// (readEnvelope finds another record or none at their place), like an
// indexed envelope whose record vanished. A record an Erase took is no
// longer registered and stays out.
func (q *Queue) indexMissing(tx *bolt.Tx, its []*prepared) error {
	for _, it := range its {
		if tx.Bucket(bktEnv).Get(it.ek) != nil || !q.registered(it) {
			continue
		}
		q.log.Warn("an acknowledged record is no longer in its log (deleted, truncated or replaced under the store): indexed at its place, dead-lettered (record_lost) when claimed",
			"operation", "ingest", "status", "record_lost")
		if _, err := q.indexRecord(tx, it.rel, it.off, len(it.line)-1, it.env, it.segs, it.at, true, it.seq); err != nil {
			return err
		}
	}
	return nil
}

// checkConsent refuses the call when current consent, or the tenant's
// suppression of an address, forbids an envelope (queue.Permits).
func (q *Queue) checkConsent(ctx context.Context, tx *bolt.Tx, items []*prepared) error {
	for i, it := range items {
		if it.dup {
			continue // idempotency first: a stored envelope is not refused again
		}
		c, found, err := q.consentFor(ctx, tx, it.env.TenantID, it.env.UserID)
		if err != nil {
			return fmt.Errorf("enqueue: consent: %w", err)
		}
		addr, err := addressSupOf(tx, it.env)
		if err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		if err := queue.Admit(i, it.env, c, found, addr, q.opts.Now()); err != nil {
			return err
		}
	}
	return nil
}

// consentFor reads current consent from the configured source or the store.
func (q *Queue) consentFor(ctx context.Context, tx *bolt.Tx, tenant, user string) (queue.Consent, bool, error) {
	if q.opts.Consent != nil {
		return q.opts.Consent.Consent(ctx, tenant, user)
	}
	return getConsent(tx, tenant, user)
}

// reserve checks consent, marks duplicates and reserves the new keys; it
// returns the keys reserved (to release after indexing).
func (q *Queue) reserve(ctx context.Context, items []*prepared) ([]string, error) {
	// Reserve the ids against concurrent enqueues of the same ids first,
	// waiting while one is in flight (it is a duplicate once indexed, or
	// gone if it failed); then one look decides consent and duplicates of
	// what is indexed, with nothing of these ids able to land meanwhile.
	var reserved []string
	for {
		q.mu.Lock()
		busy := false
		for _, it := range items {
			if _, ok := q.inflight[string(it.ek)]; ok {
				busy = true
				break
			}
		}
		if !busy {
			for _, it := range items {
				k := string(it.ek)
				if _, ok := q.inflight[k]; !ok { // an id twice in one call: once
					q.inflight[k] = struct{}{}
					reserved = append(reserved, k)
				}
			}
			q.mu.Unlock()
			break
		}
		q.mu.Unlock()
		time.Sleep(50 * time.Microsecond)
	}
	first := map[string]*prepared{}
	err := q.viewNow(func(tx *bolt.Tx) error {
		for _, it := range items {
			k := string(it.ek)
			if p := first[k]; p != nil {
				it.dup, it.segs = true, p.segs
				continue
			}
			first[k] = it
			if e, err := getEnv(tx, it.ek); err != nil {
				return err
			} else if e != nil {
				it.dup, it.segs = true, e.Segs
			}
		}
		return q.checkConsent(ctx, tx, items)
	})
	if err != nil {
		q.unreserve(reserved)
		return nil, err
	}
	return reserved, nil
}

func (q *Queue) isInflight(ek []byte) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, ok := q.inflight[string(ek)]
	return ok
}

func (q *Queue) unreserve(keys []string) {
	q.mu.Lock()
	for _, k := range keys {
		delete(q.inflight, k)
	}
	q.mu.Unlock()
}

// withdraw removes records of a failed batch from a log: truncated when
// nothing was appended after them (checked under the log's lock), else
// recorded as skipped for the indexer.
func (q *Queue) withdraw(rel string, start, end int64) {
	if q.app.Withdraw(rel, start, end) {
		return
	}
	_ = q.write(context.Background(), false, func(tx *bolt.Tx) error {
		k := append([]byte(rel+"\x00"), u64(uint64(start))...)
		v := u64(uint64(end))
		return tx.Bucket(bktSkip).Put(k, v)
	})
}

// catchUpAll indexes every log from its stored offset (Open, rescans);
// atOpen says the lines it finds were appended while no store had the
// directory open.
func (q *Queue) catchUpAll(atOpen bool) error {
	rels, err := q.listLogs()
	if err != nil {
		return err
	}
	if rels, err = q.withNews(rels); err != nil || len(rels) == 0 {
		return err
	}
	return q.write(context.Background(), true, func(tx *bolt.Tx) error {
		// A copy of the data directory has every log under another inode:
		// one warning for them all, not one per user.
		q.resets, q.atOpen = map[logReset]int{}, atOpen
		defer func() {
			q.atOpen = false
			for why, n := range q.resets {
				if n > resetsLogged {
					q.log.Warn(fmt.Sprintf("%d logs %s under the store in all, %d more than the warnings above (a copy or a restore of the data directory?): each indexed again from its start; if it was restored from a backup, stop serve and run outbox doctor --after-restore, or what was delivered since the backup is delivered again", n, why, n-resetsLogged),
						"operation", "ingest", "status", "reindexed", "count", n)
				}
			}
			q.resets = nil
		}()
		for _, rel := range rels {
			if err := q.catchUp(tx, rel, nil, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// resetsLogged is how many resets of one catch-up of every log are
// logged one by one; past it, one line counts them all.
const resetsLogged = 3

// withNews returns the logs among rels that may hold lines past their
// indexed offset, and those replaced or cut shorter than it (see catchUp).
// Most logs hold none: they are told apart by reads in parallel, outside
// the writer's transaction, and only the others are caught up in it. An
// offset read here can only be behind the one the catch-up will find, so
// no log with news is left out.
func (q *Queue) withNews(rels []string) ([]string, error) {
	type pos struct {
		off int64
		ino uint64
	}
	at := make([]pos, len(rels))
	err := q.viewNow(func(tx *bolt.Tx) error {
		logs := tx.Bucket(bktLogs)
		for i, rel := range rels {
			if v := logs.Get([]byte(rel)); len(v) == 16 {
				at[i] = pos{int64(binary.BigEndian.Uint64(v)), binary.BigEndian.Uint64(v[8:])}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	news := make([]bool, len(rels))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(2*runtime.GOMAXPROCS(0), len(rels)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(rels); i = int(next.Add(1) - 1) {
				size, ino, err := applog.PathSize(filepath.Join(q.dir, rels[i]))
				switch {
				case errors.Is(err, os.ErrNotExist):
				case err != nil || ino != at[i].ino || size < at[i].off:
					news[i] = true // a new, replaced or truncated file, or let the catch-up report
				default:
					c, err := q.app.ReadLines(rels[i], at[i].off)
					news[i] = err != nil || len(c.Data) > 0 || c.LongEnd >= 0
				}
			}
		}()
	}
	wg.Wait()
	out := rels[:0]
	for i, rel := range rels {
		if news[i] {
			out = append(out, rel)
		}
	}
	return out, nil
}

// listLogs returns every log's path relative to the data directory.
func (q *Queue) listLogs() ([]string, error) {
	return logsIn(q.dir, func(rel string, why error) {
		if errors.Is(why, ErrSymlink) {
			// Never followed: skipped and reported (doctor lists it).
			q.reportLink(rel, nil)
		} else if errors.Is(why, fs.ErrPermission) {
			q.reportUnreadable(rel)
		}
	})
}

// logsIn lists the logs of the store in dir (each path relative to dir),
// sorted; skipped hears of each tenant directory or log left out, and why
// (ErrSymlink: a link, never followed; fs.ErrPermission: unreadable).
func logsIn(dir string, skipped func(rel string, why error)) ([]string, error) {
	root := filepath.Join(dir, applog.Dir)
	var out []string
	tenants, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	for _, t := range tenants {
		rel := filepath.Join(applog.Dir, t.Name())
		if isLink(t) {
			skipped(rel, ErrSymlink)
			continue
		}
		if !t.IsDir() {
			continue
		}
		files, err := os.ReadDir(filepath.Join(root, t.Name()))
		if err != nil {
			if errors.Is(err, fs.ErrPermission) {
				skipped(rel, err)
			}
			continue
		}
		for _, f := range files {
			if f.IsDir() || filepath.Ext(f.Name()) != applog.Ext {
				continue
			}
			rel := filepath.Join(rel, f.Name())
			if isLink(f) {
				skipped(rel, ErrSymlink)
				continue
			}
			out = append(out, rel)
		}
	}
	sort.Strings(out)
	return out, nil
}

// logPos decodes a logs bucket value: the offset up to which the log is
// indexed and the inode of the file that was indexed.
func logPos(v []byte) (off int64, ino uint64, ok bool) {
	if len(v) != 16 {
		return 0, 0, false
	}
	return int64(binary.BigEndian.Uint64(v)), binary.BigEndian.Uint64(v[8:]), true
}

// catchUp indexes the complete lines of log rel past its stored offset and
// stores the new offset, all in tx. known maps "rel 0 offset" to records
// this process already validated; mine, when not nil, is the first record
// of an Enqueue's batch in this log that is not indexed yet. Lines that are
// not valid envelopes are quarantined, not returned as errors.
//
// A log that is no longer the file that was indexed is indexed again from
// its start (see resetLog): another file under its name (its inode
// changed: deleted and created again, or another file renamed over it),
// a file shorter than its indexed offset, one where an append of this
// process landed before that offset (appends go at the end: the file was
// cut first), and one where no line ends at that offset any more (cut,
// then written past it again). The statx and the read are the ones a
// catch-up always makes; only the byte before the offset is read too.
func (q *Queue) catchUp(tx *bolt.Tx, rel string, known knownFunc, mine *prepared) error {
	logs := tx.Bucket(bktLogs)
	off, ino, indexed := logPos(logs.Get([]byte(rel)))
	var reset logReset
	if indexed && mine != nil && mine.ino == ino && mine.off < off {
		reset = resetTruncated
	}
	path := filepath.Join(q.dir, rel)
	size, fino, err := applog.PathSize(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if errors.Is(err, ErrSymlink) {
			// Never followed: skipped, and reported, without failing the
			// other logs' catch-up.
			q.reportLink(rel, err)
			return nil
		}
		if errors.Is(err, fs.ErrPermission) {
			q.reportUnreadable(rel)
			return nil
		}
		return fmt.Errorf("stat log: %w", err)
	}
	switch {
	case !indexed || reset != "":
	case fino != ino:
		reset = resetReplaced
	case size < off:
		reset = resetTruncated
	}
	var c applog.Chunk
	if indexed && reset == "" && off > 0 {
		// From the newline that ends the last indexed line.
		if c, err = q.app.ReadLines(rel, off-1); err == nil {
			if len(c.Data) > 0 && c.Data[0] == '\n' {
				c.Data = c.Data[1:]
			} else {
				reset = resetRewritten
			}
		}
	}
	if reset != "" {
		if err := q.resetLog(tx, rel, reset); err != nil {
			return err
		}
		off = 0
	}
	if off == 0 {
		c, err = q.app.ReadLines(rel, 0)
	}
	// The log is read a window at a time (applog.ReadLines): a line longer
	// than applog.MaxLine is never read, but quarantined once its newline
	// is there, and the lines after it are indexed; until then the offset
	// stays at its start.
	pos := off
	ing := ingestion{rel: rel, fino: fino, known: known, reset: reset, now: q.opts.Now()}
	for {
		if errors.Is(err, ErrSymlink) {
			// Its tenant directory is a link (caught when it is opened).
			q.reportLink(rel, err)
			return nil
		}
		if errors.Is(err, fs.ErrPermission) && pos == off {
			// Nothing of it read: skipped, and reported, without failing
			// the other logs' catch-up.
			q.reportUnreadable(rel)
			return nil
		}
		if err != nil {
			q.log.Error("read log failed", "operation", "ingest", "status", "error")
			return fmt.Errorf("read log: %w", err)
		}
		stop, ierr := q.ingestLines(tx, &ing, c.Data, pos)
		if ierr != nil {
			return ierr
		}
		if stop >= 0 {
			pos = stop
			break
		}
		pos += int64(len(c.Data))
		if c.Long {
			if c.LongEnd < 0 {
				break
			}
			q.quarantine(rel, pos, fmt.Errorf("line exceeds %d bytes", applog.MaxLine))
			pos = c.LongEnd
		} else if !c.More {
			break
		}
		c, err = q.app.ReadLines(rel, pos)
	}
	if pos == off && reset == "" {
		return nil
	}
	if ing.unsynced {
		// Before the transaction that refers to them can commit.
		if err := q.app.SyncLog(rel, fino, !indexed); err != nil {
			return err
		}
	}
	return logs.Put([]byte(rel), append(u64(uint64(pos)), u64(fino)...))
}

// ingestion is the state of one catch-up of a log (catchUp).
type ingestion struct {
	rel   string
	fino  uint64 // the log's inode
	known knownFunc
	reset logReset
	moved map[string]bool // records found elsewhere in a reset log
	now   time.Time
	// unsynced: lines were read that no Enqueue of this process wrote
	// (and synced): another process's, or an earlier run's.
	unsynced bool
}

// ingestLines indexes the complete lines data of a log, read at offset
// base, for catchUp. It returns -1, or the offset to stop at: a line of an
// in-process Enqueue not registered yet is left, with what follows, to
// that Enqueue's own catch-up.
func (q *Queue) ingestLines(tx *bolt.Tx, ing *ingestion, data []byte, base int64) (int64, error) {
	rel, known := ing.rel, ing.known
	skip := tx.Bucket(bktSkip)
	for _, ln := range applog.Lines(data, base) {
		var p *prepared
		if known != nil {
			p = known(rel, ln.Off, ln.Data)
		}
		if v := skip.Get(append([]byte(rel+"\x00"), u64(uint64(ln.Off))...)); v != nil {
			continue
		}
		var env *envelope.Envelope
		if p != nil {
			env = p.env
		} else {
			// A record of an in-process Enqueue that is not registered yet
			// (its batch is being synced; or, for the tailer, one that
			// may still be withdrawn): leave it, and what follows, to that
			// Enqueue's own catch-up. A cheap look at its ids spares
			// validating it twice. This never skips a registered record:
			// appends to a log are flushed one batch after another and a
			// batch is registered before the next one is written.
			var ids struct {
				ID       string `json:"id"`
				TenantID string `json:"tenant_id"`
			}
			if json.Unmarshal(ln.Data, &ids) == nil && q.isInflight(envKey(tenantOr(ids.TenantID), ids.ID)) {
				// Stop at the line's start, after the newline before it
				// (ln.Off is past the spaces it may start with): the
				// stored offset always follows a newline.
				return base + int64(bytes.LastIndexByte(data[:ln.Off-base], '\n')+1), nil
			}
			ing.unsynced = true
			e, err := envelope.Parse(ln.Data)
			if err != nil {
				q.quarantine(rel, ln.Off, err)
				continue
			}
			if e.TenantID == "" {
				e.TenantID = envelope.DefaultTenant
			}
			if applog.RelPath(e.TenantID, e.UserID) != rel {
				q.quarantine(rel, ln.Off, errors.New("record belongs to another tenant or user than its log"))
				continue
			}
			env = e
			if ek := envKey(e.TenantID, e.ID); wasPruned(tx, rel, ek, ln.Off, len(ln.Data)) && tx.Bucket(bktEnv).Get(ek) == nil {
				continue // delivered long ago, and pruned (pruned.go)
			}
			if ing.reset != "" {
				if ing.moved == nil {
					ing.moved = map[string]bool{}
				}
				if err := q.relocate(tx, rel, ln, env, data, base, ing.moved); err != nil {
					return 0, err
				}
			}
		}
		segs, at, seq := 0, ing.now, uint64(0)
		if p != nil {
			segs, at, seq = p.segs, p.at, p.seq
		}
		ok, err := q.indexRecord(tx, rel, ln.Off, len(ln.Data), env, segs, at, p != nil, seq)
		if err != nil {
			return 0, err
		}
		if p == nil && ok {
			q.m.ingested.Inc()
		}
		if p != nil && ok {
			// Cached here, in the writer's order, not by Enqueue: an
			// Erase of the log that commits first drops the record
			// (forgetLog) and it is never cached.
			q.cache.put(cacheKey(rel, ln.Off), p.env)
		}
	}
	return -1, nil
}

// logReset is why a log is indexed again from its start.
type logReset string

const (
	resetReplaced  logReset = "replaced"  // another file under its name
	resetTruncated logReset = "truncated" // cut shorter than its indexed offset
	resetRewritten logReset = "rewritten" // cut, then written past its indexed offset again
)

// resetLog prepares log rel, no longer the file that was indexed, to be
// indexed again from its start, in tx: what was indexed stays indexed (a
// record read again is a duplicate of itself; one found at another offset
// is moved there, see relocate; a row whose record is gone is
// dead-lettered, record_lost, when claimed, as readEnvelope then finds
// another record or none at its place), and every record of the file is
// read, none skipped: the cached envelopes of the log and its withdrawn
// ranges (the skip bucket) belonged to the earlier content and are
// dropped. A withdrawn record still in the file is then indexed like any
// other record of it. It says so in the log and in
// outbox_log_resets_total{reason}.
func (q *Queue) resetLog(tx *bolt.Tx, rel string, why logReset) error {
	q.m.logResets.WithLabelValues(string(why)).Inc()
	if q.resets == nil || q.resets[why] < resetsLogged {
		q.log.Warn("log "+string(why)+" under the store: indexing it again from its start; rows whose records it lost are dead-lettered (record_lost) when claimed",
			"operation", "ingest", "status", "reindexed")
	}
	if q.resets != nil {
		q.resets[why]++
	}
	q.cache.dropLog(rel)
	return dropSkips(tx, rel)
}

// relocate moves the index entry of a record of log rel, read again after
// a reset at line ln, to ln's offset when its place no longer holds the
// same line (a log rewritten with some lines removed, or copied in another
// order). data is what the reset read now, from offset base (a record
// whose place lies outside it is compared with the file). moved keeps the
// records already moved in this pass: the first copy of a record wins.
func (q *Queue) relocate(tx *bolt.Tx, rel string, ln applog.Line, env *envelope.Envelope, data []byte, base int64, moved map[string]bool) error {
	ek := envKey(env.TenantID, env.ID)
	if moved[string(ek)] {
		return nil
	}
	e, err := getEnv(tx, ek)
	if err != nil || e == nil || e.Log != rel || e.Off == ln.Off {
		return err
	}
	if at := e.Off - base; at >= 0 && at+int64(e.Len) <= int64(len(data)) {
		if bytes.Equal(data[at:at+int64(e.Len)], ln.Data) {
			return nil // still in place too
		}
	} else if e.Len == len(ln.Data) {
		// Outside the part of the log read now: look at the file.
		if b, err := applog.ReadAt(filepath.Join(q.dir, rel), e.Off, e.Len); err == nil && bytes.Equal(b, ln.Data) {
			return nil
		}
	}
	moved[string(ek)] = true
	e.Off, e.Len = ln.Off, len(ln.Data)
	return putEnv(tx, ek, e)
}

// indexRecord creates the env entry and rows of one record unless its
// (tenant, id) exists. Records from other processes that current consent
// forbids are stored as suppressed.
func (q *Queue) indexRecord(tx *bolt.Tx, rel string, off int64, n int, env *envelope.Envelope, segs int, now time.Time, checked bool, seq uint64) (bool, error) {
	ek := envKey(env.TenantID, env.ID)
	if tx.Bucket(bktEnv).Get(ek) != nil {
		return false, nil
	}
	if seq == 0 {
		seq = nextCounter(tx, keySeq)
	}
	if segs <= 0 {
		segs = envelope.Rows(env)
	}
	enq := now
	if (q.rebuild || q.atOpen) && !env.CreatedAt.IsZero() && env.CreatedAt.Before(now) {
		// A log line does not say when it was enqueued: for a rebuild, or a
		// line appended while no store watched, the envelope's creation is
		// the nearest known time (the rebuild's or the Open's would make a
		// month-old row look fresh to the operator resolving it, and its
		// delivery quick in the latency metric).
		enq = env.CreatedAt
	}
	rec := &envRec{
		User: env.UserID, Channel: env.Channel, Template: env.Template,
		Log: rel, Off: off, Len: n, Segs: segs,
		Enq: enq.UnixNano(), Exp: nano(env.ExpiresAt),
		Seq: seq,
	}
	rows := queue.NewRows(env, segs, now)
	if q.rebuild {
		// A rebuilt index cannot know what became of the record: its rows
		// are created unresolved (or expired), in this transaction, and
		// never exist as pending.
		st, err := queue.Rebuilt(segs, env.ExpiresAt, now)
		if err != nil {
			return false, err
		}
		rows = st.Rows
	} else if !checked {
		c, found, err := q.consentFor(context.Background(), tx, env.TenantID, env.UserID)
		if err != nil {
			return false, err
		}
		addr, err := addressSupOf(tx, env)
		if err != nil {
			return false, err
		}
		if ok, why := queue.Permits(env, &c, found, addr); !ok {
			st, err := queue.Refuse(rows, queue.Verdict{State: envelope.StateSuppressed, Class: why}, now)
			if err != nil {
				return false, err
			}
			rows = st.Rows
		}
	}
	if err := putEnv(tx, ek, rec); err != nil {
		return false, err
	}
	for seg := range rows {
		r := fromDelivery(&rows[seg])
		if err := q.putRow(tx, ek, seg, rec, env.TenantID, nil, &r); err != nil {
			return false, err
		}
	}
	if err := tx.Bucket(bktUsers).Put(userKey(env.TenantID, env.UserID, env.ID), nil); err != nil {
		return false, err
	}
	return true, tx.Bucket(bktOrder).Put(u64(rec.Seq), ek)
}

// quarantine records a complete line that is not a valid envelope in the
// log's quarantine file: its offset and the reason (problem paths and rules
// only, never the content).
func (q *Queue) quarantine(rel string, off int64, reason error) {
	q.m.quarantined.Inc()
	q.log.Warn("log line quarantined", "operation", "ingest", "status", "quarantined")
	rec := QuarantineRecord{Log: rel, Offset: off, Reason: reason.Error(), At: q.opts.Now().UTC()}
	line, _ := json.Marshal(rec)
	path := filepath.Join(q.dir, rel+applog.QuarantineExt)
	f, err := applog.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		q.log.Error("write quarantine failed", "operation", "ingest", "status", "error")
		return
	}
	defer f.Close()
	_, _ = f.Write(append(line, '\n'))
	_ = f.Sync()
}

// QuarantineRecord is one quarantined log line.
type QuarantineRecord struct {
	Log    string    `json:"log"`
	Offset int64     `json:"offset"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// Quarantined lists every quarantined record of the store.
func (q *Queue) Quarantined() ([]QuarantineRecord, error) {
	return ReadQuarantine(q.dir)
}

// ReadQuarantine lists the quarantined records under a data directory
// (works without opening the store).
func ReadQuarantine(dir string) ([]QuarantineRecord, error) {
	files, err := filepath.Glob(filepath.Join(dir, applog.Dir, "*", "*"+applog.Ext+applog.QuarantineExt))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []QuarantineRecord
	for _, f := range files {
		b, err := readNoFollow(f)
		if errors.Is(err, ErrSymlink) {
			continue // never followed; Check lists it
		}
		if err != nil {
			return nil, err
		}
		for _, ln := range applog.Lines(b, 0) {
			var r QuarantineRecord
			if json.Unmarshal(ln.Data, &r) == nil {
				out = append(out, r)
			}
		}
	}
	return out, nil
}
