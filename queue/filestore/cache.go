package filestore

import (
	"container/list"
	"strconv"
	"strings"
	"sync"

	"github.com/outboxhq/outbox/envelope"
)

// envCache keeps recently enqueued or read envelopes, keyed by their log
// position, so that claiming a fresh row needs no log read and no decode.
// Records are immutable once appended, but a removed log (Erase, Prune)
// can be created again with the same offsets: its envelopes are dropped
// with it (dropLog). Callers get copies.
type envCache struct {
	mu    sync.Mutex
	max   int
	ll    *list.List
	m     map[string]*list.Element
	byLog map[string]map[*list.Element]struct{}
}

type cacheEntry struct {
	key, log string
	env      *envelope.Envelope
}

// envCacheSize bounds the cache (about 1–2 KiB per envelope).
const envCacheSize = 8192

func newEnvCache(max int) *envCache {
	return &envCache{max: max, ll: list.New(), m: map[string]*list.Element{}, byLog: map[string]map[*list.Element]struct{}{}}
}

func cacheKey(log string, off int64) string { return log + "\x00" + strconv.FormatInt(off, 10) }

// logOf returns the log of a cacheKey.
func logOf(key string) string { return key[:strings.LastIndexByte(key, 0)] }

func (c *envCache) get(key string) *envelope.Envelope {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[key]; ok {
		c.ll.MoveToFront(el)
		return el.Value.(*cacheEntry).env.Clone()
	}
	return nil
}

func (c *envCache) put(key string, env *envelope.Envelope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[key]; ok {
		el.Value.(*cacheEntry).env = env.Clone()
		c.ll.MoveToFront(el)
		return
	}
	e := &cacheEntry{key: key, log: logOf(key), env: env.Clone()}
	el := c.ll.PushFront(e)
	c.m[key] = el
	if c.byLog[e.log] == nil {
		c.byLog[e.log] = map[*list.Element]struct{}{}
	}
	c.byLog[e.log][el] = struct{}{}
	for c.ll.Len() > c.max {
		c.remove(c.ll.Back())
	}
}

// remove drops one entry; c.mu is held.
func (c *envCache) remove(el *list.Element) {
	e := el.Value.(*cacheEntry)
	c.ll.Remove(el)
	delete(c.m, e.key)
	if set := c.byLog[e.log]; set != nil {
		delete(set, el)
		if len(set) == 0 {
			delete(c.byLog, e.log)
		}
	}
}

// dropLog forgets every envelope of the log rel: it was removed, and a log
// created again at its path reuses its offsets.
func (c *envCache) dropLog(rel string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for el := range c.byLog[rel] {
		c.remove(el)
	}
}
