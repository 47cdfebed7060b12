package httpapi

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// MinInflightWeight is the least a request with a body counts against
// Config.MaxInflight, whatever its size: validating one envelope
// allocates some 40 KiB however short it is.
const MinInflightWeight = 16 << 10

// RetryAfterOverloaded is the Retry-After, in seconds, of a 503 overloaded.
const RetryAfterOverloaded = 1

// inflight counts the bytes of the request bodies being handled, up to
// limit (negative: no limit). It never waits: a request that does not fit
// is refused.
type inflight struct {
	mu     sync.Mutex
	limit  int64
	used   int64
	warned time.Time // when a refusal was last logged
}

// acquire takes n bytes if they fit.
func (f *inflight) acquire(n int64) bool {
	if f.limit < 0 {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.used+n > f.limit {
		return false
	}
	f.used += n
	return true
}

// release gives back n bytes taken by acquire.
func (f *inflight) release(n int64) {
	if f.limit < 0 {
		return
	}
	f.mu.Lock()
	f.used -= n
	f.mu.Unlock()
}

// bodyWeight is what request r counts against Config.MaxInflight: 0
// without a body; else its Content-Length (Config.MaxBody when unknown),
// at least MinInflightWeight, at most MaxBody (a larger body is refused
// unread) and at most the limit itself (so that one request always fits
// when it is alone).
func (a *api) bodyWeight(r *http.Request) int64 {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return 0
	}
	n := r.ContentLength
	if n < 0 || n > a.cfg.MaxBody {
		n = a.cfg.MaxBody
	}
	n = max(n, MinInflightWeight)
	if lim := a.cfg.MaxInflight; lim > 0 {
		n = min(n, lim)
	}
	return n
}

// warn reports whether a refusal should be logged: at most one a second.
func (f *inflight) warn(now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now.Sub(f.warned) < time.Second {
		return false
	}
	f.warned = now
	return true
}

// overloaded answers 503 overloaded with Retry-After: the bodies in
// flight leave no room for this one. The connection is closed after the
// answer, so that the unread body is not read to keep it open. A refusal
// is logged at most once a second.
func (a *api) overloaded(w http.ResponseWriter, op, rid string) {
	if a.inflight.warn(time.Now()) {
		a.log.Warn("request refused: too many request bodies in flight (more refusals within a second are not logged)",
			"operation", op, "request_id", rid, "status", http.StatusServiceUnavailable)
	}
	w.Header().Set("Retry-After", strconv.Itoa(RetryAfterOverloaded))
	w.Header().Set("Connection", "close")
	writeError(w, newError(http.StatusServiceUnavailable, CodeOverloaded,
		fmt.Sprintf("too many request bodies in flight (at most %d bytes at once): retry after %d s", a.cfg.MaxInflight, RetryAfterOverloaded)))
}
