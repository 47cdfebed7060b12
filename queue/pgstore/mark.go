package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxhq/outbox/queue"
)

// A database restored from a backup (pg_dump and restore, a point-in-time
// recovery, a snapshot) has its rows as they were then: everything
// delivered since is pending, sending or retryable again, and would be
// delivered a second time. What gives it away is its sequences: a
// sequence never goes back, except with the database. So each store
// records, in Options.MarkFile, the queue's identity (a random id made
// with the schema, which a copy of it keeps) and the highest fence and
// envelope number it has drawn, and refuses a database whose sequences are
// behind them: at Open, and as soon as a number it draws is not above the
// ones it drew before (a database restored under a running store).

// RestoredError is a database whose sequences are behind what this store
// (or this host, by its mark file) has drawn from them: it was restored
// from a backup, or is a copy. It matches queue.ErrUnavailable. Run
// outbox doctor --after-restore (AfterRestore) before serving it again.
type RestoredError struct {
	Schema    string
	Was, Now  int64  // the highest number drawn before, and the sequence now
	Sequence  string // fence_seq or envelope_seq
	AtRuntime bool   // found by a running store, not at Open
	MarkFile  string // the mark that knew it ("" at run time)
}

func (e *RestoredError) Error() string {
	where := "the mark file " + e.MarkFile + " recorded"
	if e.AtRuntime {
		where = "this store drew"
	}
	return fmt.Sprintf("pgstore: the database is older than the one this store used (schema %s: %s %s %d, the database is at %d): it was restored from a backup, or is a copy; everything delivered since the backup would be delivered again. Run outbox doctor --after-restore (the deliveries of unknown fate become unresolved), then start again",
		e.Schema, where, e.Sequence, e.Was, e.Now)
}

// Loggable marks its text safe to log (queue.Loggable).
func (e *RestoredError) Loggable() {}

// Is makes a RestoredError queue.ErrUnavailable.
func (e *RestoredError) Is(target error) bool { return target == queue.ErrUnavailable }

// mark is what a mark file holds.
type mark struct {
	Instance string `json:"instance"` // the schema's instance id
	Fence    int64  `json:"fence"`    // the highest fence drawn
	Envelope int64  `json:"envelope"` // the highest envelope number drawn
}

// drawn tracks the highest numbers a store drew from its sequences and
// writes them to its mark file, at most once a second.
type drawn struct {
	fence, envelope atomic.Int64
	dirty           atomic.Bool
	failing         atomic.Bool // the last write failed (warned once)
	mu              sync.Mutex  // one writer of the file, or one settle, at a time
}

// readMark reads a mark file; a missing, torn or foreign one is no mark.
func readMark(path string) (mark, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return mark{}, false
	}
	var m mark
	if json.Unmarshal(b, &m) != nil || m.Instance == "" {
		return mark{}, false
	}
	return m, true
}

// writeMark replaces path with m (a rename: never a torn file; unsynced:
// a lost update leaves an older mark, which only knows less).
func writeMark(path string, m mark) error {
	b, _ := json.Marshal(m)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// checkMark compares the database with the store's mark file at Open and
// starts the store's record of what it draws.
func (s *Store) checkMark(ctx context.Context) error {
	id, fence, ev, err := s.sequences(ctx)
	if err != nil {
		return err
	}
	s.instance = id
	if s.markFile != "" {
		if m, ok := readMark(s.markFile); ok && m.Instance == id {
			for _, c := range []struct {
				seq     string
				was, is int64
			}{{"fence_seq", m.Fence, fence}, {"envelope_seq", m.Envelope, ev}} {
				if c.is < c.was {
					return &RestoredError{Schema: s.schema, Sequence: c.seq, Was: c.was, Now: c.is, MarkFile: s.markFile}
				}
			}
		}
	}
	s.drawn.fence.Store(fence)
	s.drawn.envelope.Store(ev)
	if s.markFile == "" {
		return nil
	}
	err = os.MkdirAll(filepath.Dir(s.markFile), 0o700)
	if err == nil {
		err = writeMark(s.markFile, mark{Instance: id, Fence: fence, Envelope: ev})
	}
	if err != nil {
		// A read-only data directory (a container's secret mount) must not
		// keep the queue from serving: without the file a restore is still
		// found while the store runs, only not across a restart.
		s.log.Warn("mark file cannot be written: a database restored from a backup is found only while the store runs",
			"operation", "mark", "status", "error", "error", errors.Unwrap(err))
		s.markFile = ""
	}
	return nil
}

// errSequenceBack is a number drawn not above one drawn before.
var errSequenceBack = errors.New("the database's sequences went back under the store; retry")

// high returns the record of the highest number drawn from seq.
func (s *Store) high(seq string) *atomic.Int64 {
	if seq == "envelope_seq" {
		return &s.drawn.envelope
	}
	return &s.drawn.fence
}

// drawnOK checks numbers drawn from seq (fence_seq or envelope_seq) by a
// request sent when the highest committed draw was before. Every one
// must be above it (a sequence only goes forward, and a number drawn in a
// committed transaction is durable). One that is not means the database
// went back under the store, or its schema was made afresh: the call
// fails (nothing of it is used), and the next call tells the two apart
// (settle). A number drawn in a transaction that did not commit may come
// again after a crash of the server: only committed ones are recorded.
func (s *Store) drawnOK(seq string, before int64, nums []int64) error {
	for _, n := range nums {
		if n <= before {
			s.suspect.Store(&RestoredError{Schema: s.schema, Sequence: seq, Was: before, Now: n, AtRuntime: true})
			return &NetError{Op: "draw", Cause: errSequenceBack}
		}
	}
	return nil
}

// drew records numbers drawn from seq by a transaction that committed.
func (s *Store) drew(seq string, nums []int64) {
	hi := s.high(seq)
	for _, n := range nums {
		for was := hi.Load(); n > was && !hi.CompareAndSwap(was, n); was = hi.Load() {
		}
	}
	if len(nums) > 0 {
		s.drawn.dirty.Store(true)
	}
}

// settle decides what a sequence that went back (drew) was: the schema
// made afresh (another instance id: a new queue, whose numbers start
// again) or the database restored (the same id): from then on every call
// fails with the RestoredError.
func (s *Store) settle(ctx context.Context) error {
	r := s.suspect.Load()
	if r == nil {
		return nil
	}
	s.drawn.mu.Lock()
	defer s.drawn.mu.Unlock()
	if s.suspect.Load() != r {
		return nil // settled by another call meanwhile
	}
	id, fence, ev, err := s.sequences(ctx)
	if err != nil {
		return err
	}
	if id == s.instance {
		s.restored.Store(r)
		s.log.Error("the database went back under the store (restored from a backup?): every call fails until outbox doctor --after-restore",
			"operation", "mark", "status", "restored")
		return r
	}
	s.instance = id
	s.drawn.fence.Store(fence)
	s.drawn.envelope.Store(ev)
	s.drawn.dirty.Store(true)
	s.suspect.Store(nil)
	s.log.Warn("the store's schema was made afresh under it (another instance): its numbers start again",
		"operation", "mark", "status", "new_instance")
	return nil
}

// sequences reads the schema's instance id and the highest numbers drawn
// from its sequences: last_value, unless none was drawn yet.
func (s *Store) sequences(ctx context.Context) (id string, fence, ev int64, err error) {
	err = s.pool.QueryRow(ctx, s.sql(`SELECT (SELECT id FROM {s}.instance LIMIT 1),
		(SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {s}.fence_seq),
		(SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {s}.envelope_seq)`)).Scan(&id, &fence, &ev)
	return id, fence, ev, safeErr("check sequences", err)
}

// saveMark writes the mark file when numbers were drawn since it was last
// written.
func (s *Store) saveMark() {
	if s.markFile == "" || s.restored.Load() != nil || !s.drawn.dirty.Swap(false) {
		return
	}
	s.drawn.mu.Lock()
	defer s.drawn.mu.Unlock()
	if s.suspect.Load() != nil {
		s.drawn.dirty.Store(true)
		return
	}
	m := mark{Instance: s.instance, Fence: s.drawn.fence.Load(), Envelope: s.drawn.envelope.Load()}
	if err := writeMark(s.markFile, m); err != nil {
		s.drawn.dirty.Store(true)
		if !s.drawn.failing.Swap(true) { // once, not every second
			s.log.Warn("mark file not written", "operation", "mark", "status", "error", "error", errors.Unwrap(err))
		}
		return
	}
	if s.drawn.failing.Swap(false) {
		s.log.Info("mark file written again", "operation", "mark", "status", "ok")
	}
}

// markLoop saves the mark every second, and once more at Close.
func (s *Store) markLoop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.saveMark()
			return
		case <-t.C:
			s.saveMark()
		}
	}
}

// AfterRestore makes a database restored from a backup safe to serve
// again: every delivery still to deliver (pending, sending, retryable) may
// have gone out after the backup was taken, so it becomes unresolved
// (queue.Restored: never redelivered automatically; outbox resolve and
// requeue decide), and the schema gets a new instance id, so that every
// host's mark file is superseded. Stop every serve on the schema first.
// An interrupted run is run again. It returns the envelopes changed.
func (s *Store) AfterRestore(ctx context.Context) (int, error) {
	if s.closed.Load() {
		return 0, queue.ErrClosed
	}
	s.restored.Store(nil) // this call is what such a database needs
	s.suspect.Store(nil)
	rows, err := s.pool.Query(ctx, s.sql(`SELECT DISTINCT tenant, env_id FROM {s}.deliveries
		WHERE state IN ('pending', 'sending', 'retryable')`))
	if err != nil {
		return 0, safeErr("after restore", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (envKey, error) {
		var k envKey
		return k, r.Scan(&k.tenant, &k.id)
	})
	if err != nil {
		return 0, safeErr("after restore", err)
	}
	n := 0
	for _, k := range keys {
		err := s.change(ctx, "after restore", k, nil, func(rows []queue.Delivery, now time.Time) (*queue.Step, error) {
			return queue.Restored(rows, now)
		})
		if err != nil {
			return n, err
		}
		n++
	}
	if _, err := s.pool.Exec(ctx, s.sql(`UPDATE {s}.instance SET id = md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text)`)); err != nil {
		return n, safeErr("after restore", err)
	}
	id, fence, ev, err := s.sequences(ctx)
	if err != nil {
		return n, err
	}
	s.drawn.mu.Lock()
	s.instance = id
	s.drawn.fence.Store(fence)
	s.drawn.envelope.Store(ev)
	s.drawn.mu.Unlock()
	s.drawn.dirty.Store(true)
	s.saveMark()
	return n, nil
}
