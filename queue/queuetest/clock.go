// Package queuetest holds the shared contract suite of queue.Store and the
// helpers that tests of stores and of code embedding a store use: a
// settable clock, builders of valid envelopes and a consent helper.
//
// A store implementation runs the suite from its own tests:
//
//	func TestStore(t *testing.T) {
//		queuetest.Exercise(t, queuetest.Harness{
//			Open: func(t testing.TB, opts *queue.Options) queue.Store { return memstore.New(opts) },
//		})
//	}
//
// The package is imported by tests only; it has no test build tag so that
// other modules' stores (PostgreSQL, later) can run the same suite.
package queuetest

import (
	"sync"
	"time"
)

// Clock is a settable clock for tests. Its Now method is what
// queue.Options.Now expects. It is safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock that stands at t until moved.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d (backward when d is negative) and
// returns the new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}
