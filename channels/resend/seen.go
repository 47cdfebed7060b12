package resend

import (
	"container/list"
	"sync"
	"time"
)

// seenSet is a bounded set of recently seen strings: at most max entries,
// each forgotten ttl after it was added (the oldest goes first when full).
// It is safe for concurrent use.
type seenSet struct {
	mu    sync.Mutex
	max   int
	ttl   time.Duration
	order *list.List // of seenEntry, oldest at the front
	items map[string]*list.Element
}

type seenEntry struct {
	key   string
	added time.Time
}

func newSeenSet(max int, ttl time.Duration) *seenSet {
	return &seenSet{max: max, ttl: ttl, order: list.New(), items: make(map[string]*list.Element)}
}

// has reports whether key was added less than ttl before now.
func (s *seenSet) has(key string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now)
	_, ok := s.items[key]
	return ok
}

// add records key as seen at now.
func (s *seenSet) add(key string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now)
	if e, ok := s.items[key]; ok {
		s.order.Remove(e)
	}
	s.items[key] = s.order.PushBack(seenEntry{key: key, added: now})
	for s.order.Len() > s.max {
		s.remove(s.order.Front())
	}
}

// len returns the number of entries kept.
func (s *seenSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.order.Len()
}

func (s *seenSet) expire(now time.Time) {
	for e := s.order.Front(); e != nil; e = s.order.Front() {
		if now.Sub(e.Value.(seenEntry).added) < s.ttl {
			return
		}
		s.remove(e)
	}
}

func (s *seenSet) remove(e *list.Element) {
	delete(s.items, e.Value.(seenEntry).key)
	s.order.Remove(e)
}
