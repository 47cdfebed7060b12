package worker

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Leases claimed ahead. A claim is a store transaction, durable before any
// provider call; claiming only for the slots that are free makes it one
// transaction for every row or two when calls are quicker than claims (a
// local endpoint, a sink). For channels whose provider redelivers
// idempotently the loop then also claims rows for slots not free yet, and
// keeps them here until a slot frees. The lease is still written before
// the call, without exception; what changes is how many leases a crash
// leaves to be reconciled. So the loop keeps only as many ahead as its
// slots finish in about two claims (from moving averages of both), which
// is none in front of a provider whose calls take tens of milliseconds, and
// at most aheadPerSlot per slot. Channels that are rate limited are not
// claimed ahead (their rows would wait for tokens inside their lease), nor
// are those of providers that do not redeliver idempotently.
//
// A task whose call returns starts the oldest lease waiting here itself,
// in the slot it held, rather than freeing the slot for the loop, which
// may be inside a claim (a database round trip) and would start the
// lease only after it. It does so only while the loop has nothing of its
// own for a free slot (handOn): the rows of a channel not claimed ahead
// and a paused channel's probe go first, and the loop looks for expired
// leases at least every recoverEvery (it does so when a slot is free).

// The loop keeps at most aheadPerSlot rows per slot leased ahead, and at
// least aheadLeast in all (a claim of a few rows costs about what one of
// one does).
const (
	aheadPerSlot = 32
	aheadLeast   = 128
)

// recoverEvery is how long tasks may keep passing their slots to leases
// waiting ahead before the loop wants one free to look for expired leases.
const recoverEvery = 100 * time.Millisecond

// pace keeps moving averages of how long this worker's claims and
// provider calls take, on its clock.
type pace struct {
	mu          sync.Mutex
	claim, call time.Duration
	calls       bool // a call has been timed
}

func (p *pace) addClaim(d time.Duration) {
	p.mu.Lock()
	p.claim = average(p.claim, d)
	p.mu.Unlock()
}

func (p *pace) addCall(d time.Duration) {
	p.mu.Lock()
	if !p.calls {
		p.call, p.calls = max(d, 0), true
	} else {
		p.call = average(p.call, d)
	}
	p.mu.Unlock()
}

func average(avg, d time.Duration) time.Duration {
	return max(avg+(d-avg)/8, 0)
}

// aheadTarget is how many rows to keep ahead for slots slots, at most
// most: what the slots finish during two claims.
func aheadTarget(slots, most int, claim, call time.Duration, calls bool) int {
	switch {
	case !calls:
		return 0
	case call <= 0:
		return most
	}
	return int(min(int64(most), 2*int64(slots)*int64(claim)/int64(call)))
}

func (w *Worker) aheadMax() int {
	w.pace.mu.Lock()
	defer w.pace.mu.Unlock()
	return aheadTarget(w.cfg.Concurrency, max(w.cfg.Concurrency*aheadPerSlot, aheadLeast), w.pace.claim, w.pace.call, w.pace.calls)
}

// aheadable reports whether rows of ch may be claimed ahead.
func (w *Worker) aheadable(ch envelope.Channel) bool {
	return w.idem[ch] && w.limiters[ch] == nil
}

// aheadRoom is how many more rows the loop claims ahead now: none until
// half of those waiting have left, then enough to fill up again, so that
// the claims stay large.
func (w *Worker) aheadRoom() int {
	most := w.aheadMax()
	n := w.aheadLen()
	if 2*n > most {
		return 0
	}
	return most - n
}

// aheadKept is how long before its end a lease waiting here is given back
// unused: the call it waits for must still fit in it.
func (w *Worker) aheadKept(l *queue.Lease) time.Time {
	return l.ExpiresAt.Add(-w.cfg.Lease / 2)
}

func (w *Worker) aheadLen() int {
	w.aheadMu.Lock()
	defer w.aheadMu.Unlock()
	return len(w.ahead)
}

func (w *Worker) addAhead(l *queue.Lease) {
	w.aheadMu.Lock()
	w.ahead = append(w.ahead, l)
	w.aheadMu.Unlock()
}

// updateHandOn decides, at the start of a turn, whether tasks may start
// the leases waiting here until the next turn; probe lists the paused
// channels whose probe is due.
func (w *Worker) updateHandOn(probe []envelope.Channel) {
	on := len(probe) == 0 &&
		!slices.ContainsFunc(w.ready(), func(ch envelope.Channel) bool { return !w.aheadable(ch) }) &&
		w.now().Before(w.lastRecover.Add(recoverEvery))
	w.aheadMu.Lock()
	w.handOn = on
	w.aheadMu.Unlock()
}

// handOver takes the oldest lease waiting here for the slot of a task that
// ends, or returns nil when the slot is to be freed: the loop wants it
// (handOn is off), none waits, the worker is stopping, or the oldest is for
// the loop to prune (paused, or kept too long).
func (w *Worker) handOver(ctx context.Context) *queue.Lease {
	w.aheadMu.Lock()
	defer w.aheadMu.Unlock()
	if !w.handOn || len(w.ahead) == 0 || ctx.Err() != nil {
		return nil
	}
	l := w.ahead[0]
	if !w.startable(l, w.now()) {
		return nil
	}
	w.ahead = w.ahead[1:]
	return l
}

// startable reports whether a lease claimed as usual (not a probe) may
// start at now: its channel is not paused (a pause may have begun while it
// was claimed or waited) and its call still fits in its lease.
func (w *Worker) startable(l *queue.Lease, now time.Time) bool {
	ready, _ := w.paused.split([]envelope.Channel{l.Channel}, now)
	return len(ready) > 0 && now.Before(w.aheadKept(l))
}

// pruneAhead gives back, unused, the waiting leases that have aged past
// aheadKept, those of channels now paused, and all of them when the
// worker is stopping; it drops those a recovery has just taken over.
func (w *Worker) pruneAhead(ctx context.Context, recovered []*queue.Lease) {
	now := w.now()
	stopping := ctx.Err() != nil
	ready, _ := w.paused.split(w.channels, now)
	var back []*queue.Lease
	w.aheadMu.Lock()
	w.ahead = slices.DeleteFunc(w.ahead, func(l *queue.Lease) bool {
		if slices.ContainsFunc(recovered, func(r *queue.Lease) bool { return r.Key == l.Key }) {
			return true // fenced out: its row is being reconciled
		}
		if stopping || !now.Before(w.aheadKept(l)) || !slices.Contains(ready, l.Channel) {
			back = append(back, l)
			return true
		}
		return false
	})
	w.aheadMu.Unlock()
	for _, l := range back {
		w.release(ctx, l)
	}
}

// waiting reports whether a lease of ch waits here.
func (w *Worker) waiting(ch envelope.Channel) bool {
	w.aheadMu.Lock()
	defer w.aheadMu.Unlock()
	return slices.ContainsFunc(w.ahead, func(l *queue.Lease) bool { return l.Channel == ch })
}

// startAhead dispatches waiting leases into the free slots, oldest first,
// once those that may not start are given back (pruneAhead).
func (w *Worker) startAhead(ctx context.Context) bool {
	if w.free() == 0 || w.aheadLen() == 0 {
		return false
	}
	w.pruneAhead(ctx, nil)
	started := false
	for w.free() > 0 {
		w.aheadMu.Lock()
		if len(w.ahead) == 0 {
			w.aheadMu.Unlock()
			break
		}
		l := w.ahead[0]
		w.ahead = w.ahead[1:]
		w.aheadMu.Unlock()
		w.dispatch(ctx, "deliver", l)
		started = true
	}
	return started
}

// aheadWait is how long until the first waiting lease must be given back,
// or 0 when none waits.
func (w *Worker) aheadWait() time.Duration {
	w.aheadMu.Lock()
	defer w.aheadMu.Unlock()
	var wait time.Duration
	for _, l := range w.ahead {
		d := max(w.aheadKept(l).Sub(w.now()), time.Millisecond)
		if wait == 0 || d < wait {
			wait = d
		}
	}
	return wait
}
