package memstore

import (
	"cmp"
	"container/heap"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// The schedule is a min-heap of (due time, enqueue order, segment) entries
// for pending and retryable rows, so that a claim looks only at rows that
// are due instead of scanning every row. Entries are never updated in
// place: rescheduling a row pushes a new entry with the row's next
// generation, and an entry whose generation, due time or row state no
// longer matches is dropped when it reaches the top.

type entry struct {
	due   time.Time
	seq   uint64
	index int
	gen   uint64
	r     *row
}

// valid reports whether e still describes r's schedule.
func (e *entry) valid() bool {
	r := e.r
	return !r.removed && e.gen == r.gen &&
		(r.State == envelope.StatePending || r.State == envelope.StateRetryable) && r.Due.Equal(e.due)
}

type schedule []*entry

func (h schedule) Len() int { return len(h) }

func (h schedule) Less(i, j int) bool {
	a, b := h[i], h[j]
	if c := a.due.Compare(b.due); c != 0 {
		return c < 0
	}
	if c := cmp.Compare(a.seq, b.seq); c != 0 {
		return c < 0
	}
	return a.index < b.index
}

func (h schedule) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *schedule) Push(x any) { *h = append(*h, x.(*entry)) }

func (h *schedule) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	return e
}

// schedule puts r on the schedule at its due time (a pending or retryable
// row with a due time), dropping any earlier entry of r.
func (s *Store) schedule(r *row) {
	r.gen++
	if (r.State == envelope.StatePending || r.State == envelope.StateRetryable) && !r.Due.IsZero() {
		heap.Push(&s.sched, &entry{due: r.Due, seq: r.env.seq, index: r.index, gen: r.gen, r: r})
	}
}

// top returns the earliest valid entry, dropping stale ones, or nil.
func (s *Store) top() *entry {
	for len(s.sched) > 0 {
		if e := s.sched[0]; e.valid() {
			return e
		}
		heap.Pop(&s.sched)
	}
	return nil
}

// popDue removes and returns the earliest valid entry due at now, or nil.
func (s *Store) popDue(now time.Time) *entry {
	e := s.top()
	if e == nil || e.due.After(now) {
		return nil
	}
	return heap.Pop(&s.sched).(*entry)
}

// pushBack returns popped entries that were not consumed.
func (s *Store) pushBack(es []*entry) {
	for _, e := range es {
		heap.Push(&s.sched, e)
	}
}
