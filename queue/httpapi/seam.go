package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// SeamOwner is the lease owner of envelopes handed out by
// GET /internal/outbox/pending.
const SeamOwner = "seam"

// Limits of GET /internal/outbox/pending.
const (
	DefaultPendingLimit = 10
	MaxPendingLimit     = 100
)

// PendingReply is the answer of GET /internal/outbox/pending: the full
// envelopes leased to the caller and, in the same order, their leases.
type PendingReply struct {
	Envelopes []*envelope.Envelope `json:"envelopes"`
	Leases    []PendingLease       `json:"leases"`
}

// PendingLease is the lease on one envelope handed out by the seam. Pass
// Fence back with the status to make sure the lease still holds.
type PendingLease struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant_id"`
	Fence     uint64    `json:"fence"`
	ExpiresAt time.Time `json:"lease_expires_at"`
}

// pending leases up to limit envelopes of one channel to the caller.
func (a *api) pending(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	ch := envelope.Channel(q.Get("channel"))
	if ch != envelope.ChannelEmail && ch != envelope.ChannelPush {
		return badRequest(`channel must be "email" or "push"`)
	}
	limit := DefaultPendingLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return badRequest("limit must be a positive integer")
		}
		limit = min(n, MaxPendingLimit)
	}
	tenant, err := tenantParam(r)
	if err != nil {
		return err
	}
	leases, err := a.cfg.Store.Claim(r.Context(), queue.ClaimRequest{
		Tenant:          tenant, // "" = every tenant
		Channels:        []envelope.Channel{ch},
		Owner:           SeamOwner,
		Lease:           a.cfg.SeamLease,
		Limit:           limit,
		ExpireToPending: true,
	})
	if err != nil {
		return err
	}
	reply := PendingReply{Envelopes: []*envelope.Envelope{}, Leases: []PendingLease{}}
	now := a.cfg.Now()
	for _, l := range leases {
		a.leases.put(l, now)
		reply.Envelopes = append(reply.Envelopes, l.Envelope)
		reply.Leases = append(reply.Leases, PendingLease{
			ID: l.Key.EnvelopeID, Tenant: l.Key.Tenant, Fence: l.Fence, ExpiresAt: l.ExpiresAt,
		})
	}
	writeJSON(w, http.StatusOK, reply)
	return nil
}

// StatusRequest is the body of POST /internal/outbox/{id}/status.
type StatusRequest struct {
	// Status is one of SeamStatuses.
	Status string `json:"status"`
	// Detail is accepted for compatibility with the RFC and ignored: it may
	// hold raw provider text, which is never stored or logged.
	Detail json.RawMessage `json:"detail,omitempty"`
	// Fence, when given, must be the fence of the lease handed out with the
	// envelope (409 stale_fence otherwise).
	Fence *uint64 `json:"fence,omitempty"`
	// ErrorClass, for failed and retry only, is the stable class recorded
	// with the dead letter or the retry (default "unknown").
	ErrorClass envelope.ErrorClass `json:"error_class,omitempty"`
}

// StatusReply is the answer of POST /internal/outbox/{id}/status: the
// envelope's status afterwards, and Noop when it was already settled and
// nothing changed.
type StatusReply struct {
	Status string `json:"status"`
	Noop   bool   `json:"noop,omitempty"`
}

// Seam statuses.
const (
	SeamDelivered  = "delivered"
	SeamSent       = "sent" // the same as delivered
	SeamRetry      = "retry"
	SeamBounced    = "bounced"
	SeamComplaint  = "complaint"
	SeamSuppressed = "suppressed"
	SeamFailed     = "failed"
)

// SeamStatuses are the statuses POST /internal/outbox/{id}/status accepts.
var SeamStatuses = []string{SeamDelivered, SeamSent, SeamRetry, SeamFailed, SeamBounced, SeamComplaint, SeamSuppressed}

var errBadStatus = badRequest("status must be one of " + strings.Join(SeamStatuses, ", ") +
	" (delivered or sent: it went out; retry: a transient failure, retried with backoff; failed: a dead letter)")

// outcomeFor maps a seam status to the outcome committed for the row:
// delivered (or sent) → sent, retry → retryable (the backoff decides when,
// or dead_letter at the attempt limit), failed → dead_letter (terminal),
// bounced, complaint and suppressed → the same state, whose commit writes
// the suppression (a bounced push subscription suppresses that
// subscription only).
func outcomeFor(req *StatusRequest, ch envelope.Channel) (queue.Outcome, error) {
	switch req.Status {
	case SeamDelivered, SeamSent:
		return queue.Outcome{State: envelope.StateSent}, nil
	case SeamFailed, SeamRetry:
		class := req.ErrorClass
		if class == "" {
			class = envelope.ClassUnknown
		} else if !knownClasses[class] {
			return queue.Outcome{}, badRequest("unknown error_class")
		}
		if req.Status == SeamRetry {
			return queue.Outcome{State: envelope.StateRetryable, Class: class}, nil
		}
		return queue.Outcome{State: envelope.StateDeadLetter, Class: class}, nil
	case SeamBounced:
		class := envelope.ClassBounced
		if ch == envelope.ChannelPush {
			class = envelope.ClassSubscriptionGone
		}
		return queue.Outcome{State: envelope.StateBounced, Class: class}, nil
	case SeamComplaint:
		return queue.Outcome{State: envelope.StateComplaint, Class: envelope.ClassComplaint}, nil
	case SeamSuppressed:
		return queue.Outcome{State: envelope.StateSuppressed, Class: envelope.ClassUnsubscribed}, nil
	}
	return queue.Outcome{}, errBadStatus
}

// knownClasses are the stable error classes a seam caller may report.
var knownClasses = func() map[envelope.ErrorClass]bool {
	m := map[envelope.ErrorClass]bool{}
	for _, c := range []envelope.ErrorClass{
		envelope.ClassRateLimited, envelope.ClassQuotaExceeded, envelope.ClassTimeout,
		envelope.ClassNetwork, envelope.ClassUnreachable, envelope.ClassProviderUnavailable, envelope.ClassInvalidRecipient,
		envelope.ClassSubscriptionGone, envelope.ClassPayloadTooLarge, envelope.ClassInvalidRequest,
		envelope.ClassAuthFailed, envelope.ClassBlockedByUser, envelope.ClassBounced,
		envelope.ClassComplaint, envelope.ClassUnsubscribed, envelope.ClassConsentWithdrawn, envelope.ClassNoConsent,
		envelope.ClassIdempotencyConflict, envelope.ClassRenderFailed, envelope.ClassMaxAttempts,
		envelope.ClassExpired, envelope.ClassUnknown,
	} {
		m[c] = true
	}
	return m
}()

// status commits what the external worker reports for an envelope it was
// handed. It is idempotent per id: once the envelope is settled, any
// further status is a 200 no-op.
func (a *api) status(w http.ResponseWriter, r *http.Request) error {
	id, tenant, err := envelopeParams(r)
	if err != nil {
		return err
	}
	var req StatusRequest
	if err := a.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if _, err := outcomeFor(&req, envelope.ChannelEmail); err != nil {
		return err // a bad status or class, before anything is looked up
	}
	ctx := r.Context()
	st, err := a.cfg.Store.Get(ctx, tenant, id)
	if err != nil {
		return err
	}
	if settled(st) {
		writeJSON(w, http.StatusOK, StatusReply{Status: st.Status, Noop: true})
		return nil
	}
	l := a.leases.get(tenantOr(tenant), id)
	if l == nil && req.Fence != nil {
		// Not in memory (a restart, an evicted entry): the fence the
		// caller got from /pending is enough, the store checks it.
		l = &queue.Lease{Key: envelope.Key{Tenant: tenantOr(tenant), EnvelopeID: id}, Owner: SeamOwner, Fence: *req.Fence}
	}
	if l == nil {
		// A concurrent status may have just committed and dropped it.
		return a.noopIfSettled(w, r, tenant, id, errNoLease)
	}
	if req.Fence != nil && *req.Fence != l.Fence {
		return a.noopIfSettled(w, r, tenant, id, errStaleFence)
	}
	out, err := outcomeFor(&req, st.Channel)
	if err != nil {
		return err
	}
	if err := a.cfg.Store.Commit(ctx, l, out); err != nil {
		if !errors.Is(err, queue.ErrLeaseLost) && !errors.Is(err, queue.ErrStaleFence) {
			return err
		}
		// Our lease no longer holds. A concurrent identical status may
		// have won (settled: a no-op); another lease may hold the row
		// (stale fence); or it went back to pending (fetch it again).
		a.leases.drop(l)
		st, gerr := a.cfg.Store.Get(ctx, tenant, id)
		switch {
		case gerr != nil:
			return gerr
		case settled(st):
			writeJSON(w, http.StatusOK, StatusReply{Status: st.Status, Noop: true})
			return nil
		case len(st.Segments) > 0 && st.Segments[0].State == envelope.StateSending:
			return errStaleFence
		}
		return errNoLease
	}
	a.leases.drop(l)
	st, err = a.cfg.Store.Get(ctx, tenant, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, StatusReply{Status: st.Status})
	return nil
}

// noopIfSettled answers the 200 no-op when the envelope is settled by now
// (a concurrent status won), and returns err otherwise.
func (a *api) noopIfSettled(w http.ResponseWriter, r *http.Request, tenant, id string, err error) error {
	st, gerr := a.cfg.Store.Get(r.Context(), tenant, id)
	if gerr != nil {
		return gerr
	}
	if settled(st) {
		writeJSON(w, http.StatusOK, StatusReply{Status: st.Status, Noop: true})
		return nil
	}
	return err
}

// settled reports whether an envelope is delivered or in a terminal state.
func settled(st *queue.EnvelopeStatus) bool {
	return st.Status == queue.StatusDelivered || envelope.State(st.Status).Terminal()
}

// leaseKey identifies a seam envelope (email and push have one segment).
type leaseKey struct{ tenant, id string }

// leaseCache remembers the leases handed out by the seam, at most max of
// them: when full, expired leases go first, then the ones expiring first.
type leaseCache struct {
	mu  sync.Mutex
	max int
	m   map[leaseKey]*queue.Lease
}

func newLeaseCache(max int) *leaseCache {
	return &leaseCache{max: max, m: map[leaseKey]*queue.Lease{}}
}

func (c *leaseCache) put(l *queue.Lease, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := leaseKey{l.Key.Tenant, l.Key.EnvelopeID}
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		for k2, l2 := range c.m {
			if !l2.ExpiresAt.After(now) {
				delete(c.m, k2)
			}
		}
		for len(c.m) >= c.max {
			var oldest leaseKey
			var at time.Time
			first := true
			for k2, l2 := range c.m {
				if first || l2.ExpiresAt.Before(at) {
					oldest, at, first = k2, l2.ExpiresAt, false
				}
			}
			delete(c.m, oldest)
		}
	}
	c.m[k] = l
}

func (c *leaseCache) get(tenant, id string) *queue.Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[leaseKey{tenant, id}]
}

// drop forgets l, unless a newer lease on the same envelope replaced it.
func (c *leaseCache) drop(l *queue.Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := leaseKey{l.Key.Tenant, l.Key.EnvelopeID}
	if cur, ok := c.m[k]; ok && cur.Fence == l.Fence {
		delete(c.m, k)
	}
}

func (c *leaseCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
