package pgstore

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// group runs concurrent calls of one kind together (group commit): one
// group at a time; the calls that arrive while it runs wait and go
// together in the next, which the first of them runs. A call on a quiet
// store runs at once, alone.
type group[T any] struct {
	mu      sync.Mutex
	running bool
	waiting []*member[T]

	// size is a call's share of max, the most one group takes (a larger
	// call goes alone).
	size func(T) int
	max  int
	// run runs a group (ctx ends when every member's context has ended)
	// and sets each member's result.
	run func(ctx context.Context, calls []T)

	// Test hooks (nil outside tests): a call starts waiting, a group runs.
	onWait  func()
	onGroup func(calls int)
}

type member[T any] struct {
	call T
	ctx  context.Context
	lead chan []*member[T] // a group for this call to run
	done chan struct{}     // closed when another call ran this one's group
}

// do runs call in a group. It returns ctx's error when ctx ended while the
// call waited for a group (then it did not run), else nil: run set the
// call's result.
func (g *group[T]) do(ctx context.Context, call T) error {
	m := &member[T]{call: call, ctx: ctx, lead: make(chan []*member[T], 1), done: make(chan struct{})}
	g.mu.Lock()
	if !g.running {
		g.running = true
		g.mu.Unlock()
		g.runGroup([]*member[T]{m})
		return nil
	}
	g.waiting = append(g.waiting, m)
	g.mu.Unlock()
	if g.onWait != nil {
		g.onWait()
	}
	cancelled := ctx.Done()
	for {
		select {
		case grp := <-m.lead:
			g.runGroup(grp)
			return nil
		case <-m.done:
			return nil
		case <-cancelled:
			g.mu.Lock()
			if i := slices.Index(g.waiting, m); i >= 0 {
				g.waiting = slices.Delete(g.waiting, i, i+1)
				g.mu.Unlock()
				return ctx.Err()
			}
			g.mu.Unlock()
			cancelled = nil // in a group already: its statements end it
		}
	}
}

// runGroup runs grp, then hands the calls waiting by now to the first of
// them.
func (g *group[T]) runGroup(grp []*member[T]) {
	if g.onGroup != nil {
		g.onGroup(len(grp))
	}
	calls := make([]T, len(grp))
	for i, m := range grp {
		calls[i] = m.call
	}
	ctx, stop := groupContext(grp)
	g.run(ctx, calls)
	stop()
	for _, m := range grp[1:] {
		close(m.done)
	}
	g.mu.Lock()
	if len(g.waiting) == 0 {
		g.running = false
		g.mu.Unlock()
		return
	}
	n, size := 0, 0
	for n < len(g.waiting) && (n == 0 || size+g.size(g.waiting[n].call) <= g.max) {
		size += g.size(g.waiting[n].call)
		n++
	}
	next := slices.Clone(g.waiting[:n])
	g.waiting = slices.Delete(g.waiting, 0, n)
	g.mu.Unlock()
	next[0].lead <- next
}

// groupContext returns a context that ends when every member's context
// has ended (the one member's own context for a group of one).
func groupContext[T any](grp []*member[T]) (context.Context, func()) {
	if len(grp) == 1 {
		return grp[0].ctx, func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int64
	left.Store(int64(len(grp)))
	stops := make([]func() bool, len(grp))
	for i, m := range grp {
		stops[i] = context.AfterFunc(m.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, st := range stops {
			st()
		}
		cancel()
	}
}
