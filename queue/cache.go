package queue

import (
	"container/list"
	"strconv"
	"sync"

	"github.com/outboxhq/outbox/envelope"
)

// envCache keeps recently enqueued or read envelopes, keyed by their log
// position, so that claiming a fresh row needs no log read and no decode.
// Records are immutable once appended, so a cached envelope never goes
// stale; callers get copies.
type envCache struct {
	mu  sync.Mutex
	max int
	ll  *list.List
	m   map[string]*list.Element
}

type cacheEntry struct {
	key string
	env *envelope.Envelope
}

// envCacheSize bounds the cache (about 1–2 KiB per envelope).
const envCacheSize = 8192

func newEnvCache(max int) *envCache {
	return &envCache{max: max, ll: list.New(), m: map[string]*list.Element{}}
}

func cacheKey(log string, off int64) string { return log + "\x00" + strconv.FormatInt(off, 10) }

func (c *envCache) get(key string) *envelope.Envelope {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[key]; ok {
		c.ll.MoveToFront(el)
		return cloneEnvelope(el.Value.(*cacheEntry).env)
	}
	return nil
}

func (c *envCache) put(key string, env *envelope.Envelope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[key]; ok {
		c.ll.MoveToFront(el)
		return
	}
	c.m[key] = c.ll.PushFront(&cacheEntry{key, cloneEnvelope(env)})
	for c.ll.Len() > c.max {
		last := c.ll.Back()
		c.ll.Remove(last)
		delete(c.m, last.Value.(*cacheEntry).key)
	}
}
