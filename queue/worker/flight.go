package worker

import (
	"sync"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// A lease can look expired to the store while this worker still runs its
// task: the store judges leases by the wall clock, and a step of that
// clock (an NTP step at boot on a host without a hardware clock, a VM set
// right after a resume) ages every lease at once, while the task's own
// deadline runs on the monotonic clock. The loop then recovers the lease
// and would reconcile it beside the running call: a provider that cannot
// see the call yet answers "rejected", and the row would be sent again.
// So a recovered lease of a row whose task still runs here waits for that
// task, and settles the row with its answer.

// flight is a delivery task in progress, for the recovery of its lease.
type flight struct {
	fence uint64
	done  chan struct{} // closed when the task has ended
	// Set by the task (under flights.mu): it called the provider; the
	// outcome it committed or would commit (nil: none, the row left
	// sending or given back); it gave the lease back.
	called   bool
	out      *queue.Outcome
	released bool
	// taken: a recovered lease of the row waits for the task, which
	// leaves the store alone from then on (its lease is fenced out).
	taken bool
}

type flights struct {
	mu sync.Mutex
	m  map[envelope.Key]*flight
}

// start records the delivery task of l.
func (fs *flights) start(l *queue.Lease) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.m == nil {
		fs.m = map[envelope.Key]*flight{}
	}
	fs.m[l.Key] = &flight{fence: l.Fence, done: make(chan struct{})}
}

// end forgets the task of l and wakes a recovery waiting for it.
func (fs *flights) end(l *queue.Lease) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f := fs.m[l.Key]; f != nil && f.fence == l.Fence {
		delete(fs.m, l.Key)
		close(f.done)
	}
}

// note records, for the task of l, what it is about to do (called: the
// provider call starts; out: the outcome it commits; released: it gives
// the lease back). It reports whether a recovery has taken the row over,
// in which case the task must not write it.
func (fs *flights) note(l *queue.Lease, called bool, out *queue.Outcome, released bool) (taken bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.m[l.Key]
	if f == nil || f.fence != l.Fence {
		return false // not a delivery task's lease (a recovery's)
	}
	if called && !f.taken { // taken first: the call is not made
		f.called = true
	}
	if out != nil {
		o := *out
		f.out = &o
	}
	f.released = f.released || released
	return f.taken
}

// take returns the task still running here for the row of l, a lease the
// store recovered from it, and keeps that task from writing the row; nil
// when there is none. What the task noted may be read once f.done is
// closed.
func (fs *flights) take(l *queue.Lease) *flight {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f := fs.m[l.Key]
	if f == nil || f.fence >= l.Fence {
		return nil
	}
	f.taken = true
	return f
}
