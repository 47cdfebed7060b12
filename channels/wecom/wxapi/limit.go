package wxapi

import (
	"sync"
	"time"
)

// Limit is at most N sends per Per.
type Limit struct {
	N   int
	Per time.Duration
}

// buckets per window: a window is counted in Per/buckets steps, the
// oldest step in full, so the limiter is never more lenient than Limit.
const buckets = 60

// Limiter keeps sliding-window limits per key (a member of an app, a
// robot), because WeCom drops messages past its limits without an error:
// outbox must never send them. It is safe for concurrent use.
type Limiter struct {
	limits []Limit
	now    func() time.Time
	max    int

	mu   sync.Mutex
	keys map[string]*keyWindows
}

type keyWindows struct {
	w    []window
	last time.Time
}

type window struct {
	idx [buckets]int64
	n   [buckets]int32
}

// NewLimiter returns a limiter applying every limit to each key, reading
// time from now, keeping at most max keys (the least recently used one
// whose windows have passed is forgotten first).
func NewLimiter(now func() time.Time, max int, limits ...Limit) *Limiter {
	return &Limiter{limits: limits, now: now, max: max, keys: map[string]*keyWindows{}}
}

// Take counts one send for key and returns 0, or, when a limit is full,
// counts nothing and returns how long until it has room.
func (l *Limiter) Take(key string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	k := l.keys[key]
	if k == nil {
		l.evict(now)
		k = &keyWindows{w: make([]window, len(l.limits))}
		l.keys[key] = k
	}
	k.last = now
	var wait time.Duration
	for i, lim := range l.limits {
		if d := k.w[i].full(lim, now); d > wait {
			wait = d
		}
	}
	if wait > 0 {
		return wait
	}
	for i, lim := range l.limits {
		k.w[i].add(lim, now)
	}
	return 0
}

// step is the bucket length of lim.
func step(lim Limit) int64 { return max(int64(lim.Per)/buckets, 1) }

// full returns 0 when the window has room at now, else the wait until its
// oldest counted bucket leaves it.
func (w *window) full(lim Limit, now time.Time) time.Duration {
	st := step(lim)
	b := now.UnixNano() / st
	count, oldest := 0, int64(-1)
	for i := range buckets {
		if w.n[i] > 0 && w.idx[i] > b-buckets {
			count += int(w.n[i])
			if oldest < 0 || w.idx[i] < oldest {
				oldest = w.idx[i]
			}
		}
	}
	if count < lim.N {
		return 0
	}
	return time.Duration((oldest+buckets)*st - now.UnixNano())
}

func (w *window) add(lim Limit, now time.Time) {
	b := now.UnixNano() / step(lim)
	slot := b % buckets
	if w.idx[slot] != b {
		w.idx[slot], w.n[slot] = b, 0
	}
	w.n[slot]++
}

// evict makes room for a new key: keys idle longer than every window are
// dropped; if none is, the least recently used key goes.
func (l *Limiter) evict(now time.Time) {
	if len(l.keys) < l.max {
		return
	}
	var longest time.Duration
	for _, lim := range l.limits {
		longest = max(longest, lim.Per+time.Duration(step(lim)))
	}
	var lru string
	var lruAt time.Time
	for key, k := range l.keys {
		if now.Sub(k.last) > longest {
			delete(l.keys, key)
			continue
		}
		if lru == "" || k.last.Before(lruAt) {
			lru, lruAt = key, k.last
		}
	}
	if len(l.keys) >= l.max && lru != "" {
		delete(l.keys, lru)
	}
}

// Len returns the number of keys kept.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

// DailyCap counts sends per calendar day in a time zone (WeCom's day is
// China Standard Time) and refuses past a cap.
type DailyCap struct {
	cap int
	loc *time.Location
	now func() time.Time

	mu    sync.Mutex
	day   string
	count map[string]int
}

// ChinaTime is UTC+8, the zone of WeCom's daily limits.
var ChinaTime = time.FixedZone("CST", 8*3600)

// NewDailyCap returns a cap of n sends per key and day in loc.
func NewDailyCap(n int, loc *time.Location, now func() time.Time) *DailyCap {
	return &DailyCap{cap: n, loc: loc, now: now, count: map[string]int{}}
}

// Take counts one send for key, or returns the wait until the next day
// when key reached the cap today.
func (c *DailyCap) Take(key string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now().In(c.loc)
	day := now.Format(time.DateOnly)
	if day != c.day {
		c.day, c.count = day, map[string]int{}
	}
	if c.count[key] >= c.cap {
		y, m, d := now.Date()
		return time.Date(y, m, d+1, 0, 0, 0, 0, c.loc).Sub(now)
	}
	c.count[key]++
	return 0
}
