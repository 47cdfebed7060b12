package queue

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// Store is the storage contract of the queue (SPEC §3, §4, §5). The file
// store (queue/filestore: logs indexed in bbolt) and the in-memory store
// (queue/memstore) implement it; both pass the contract suite and the
// differential test in queue/queuetest, and both compute every row change
// with the state machine in this package (machine.go).
//
// Every method that takes a tenant works on that tenant's rows only; an id
// that exists only in another tenant is ErrNotFound. Use Scope for a handle
// that fixes the tenant and rejects leases of another tenant with
// ErrCrossTenant.
type Store interface {
	// Enqueue validates every envelope (Prepare), checks current consent,
	// and stores the new ones atomically: either every non-duplicate
	// envelope becomes deliverable or none does. A (tenant, id) that
	// already exists (or appears earlier in the same call) is reported as
	// Duplicate and creates nothing, whatever current consent says
	// (idempotency first: consent is checked only for the envelopes the
	// call would store). An invalid envelope fails the call with an
	// *EnqueueError wrapping the *envelope.ValidationError; an envelope
	// refused by consent fails it with an *EnqueueError wrapping
	// ErrConsentDenied. Chat envelopes (reply-text.v1) materialise one row
	// per segment (envelope.Rows); the count is fixed once stored. The
	// envelopes of one call are stored in the call's order (List, and
	// Claim among rows due at the same time, follow enqueue order).
	//
	// It returns after the envelopes are durable (unless the store runs in
	// a relaxed durability mode).
	Enqueue(ctx context.Context, envs ...*envelope.Envelope) ([]EnqueueResult, error)

	// Claim leases up to req.Limit eligible rows: pending rows due now,
	// retryable rows whose backoff is due. In the same transaction it moves
	// rows past their envelope's expires_at to expired and rows that
	// current consent forbids to suppressed (neither is returned). Chat
	// segment i+1 is never eligible before segment i is sent. Each claimed
	// row goes to sending, its attempt count grows by one, and it gets the
	// owner, a lease expiry and a new fence from a sequence that never goes
	// backwards (also across restarts). Under any number of concurrent
	// claimers a row is leased to exactly one.
	Claim(ctx context.Context, req ClaimRequest) ([]*Lease, error)

	// Commit applies an outcome to a leased row. It is accepted only when
	// the row is sending with lease.Fence and lease.Owner; otherwise it
	// changes nothing and returns ErrStaleFence when the row was leased
	// again since (a newer fence, or another owner), or ErrLeaseLost when
	// it is no longer sending or no longer the row that was leased (erased,
	// perhaps enqueued again); a nil lease is ErrLeaseLost.
	//
	// A retryable outcome becomes dead_letter once the row's attempts since
	// the last Requeue reach the maximum. A sent segment makes the next
	// segment eligible; the envelope is delivered when every segment is
	// sent. A segment that ends otherwise (dead_letter, expired, bounced,
	// complaint, suppressed) ends the envelope's remaining segments in the
	// same state (suppressed for the recipient-gone ones), so that the
	// envelope is final. bounced, complaint and suppressed write the
	// matching suppression in the same transaction (push: only that
	// subscription); bounced and complaint of an e-mail also suppress the
	// address for the tenant (see SuppressEmail). Without a class they get
	// bounced, complaint and unsubscribed. The state machine (machine.go)
	// computes all of it.
	Commit(ctx context.Context, lease *Lease, out Outcome) error

	// Release gives back a lease whose provider call never started: the row
	// returns to the state it was claimed from, due at once, and the
	// attempt is not counted. Same fence rules as Commit.
	Release(ctx context.Context, lease *Lease) error

	// Recover leases up to req.Limit rows that are still sending after their
	// lease expired (a crashed or stopped worker) so that they can be
	// reconciled: each gets a new fence and owner and stays sending; the
	// attempt count does not change. The caller asks the provider and then
	// commits sent (accepted), retryable (rejected) or unresolved (unknown).
	// Rows leased with ClaimRequest.ExpireToPending are not returned: they
	// go straight back to pending (history: pending, interrupted), whatever
	// the limit. Oldest lease end first, then enqueue order.
	Recover(ctx context.Context, req ClaimRequest) ([]*Lease, error)

	// NextDue returns the earliest time at which a row that f admits
	// becomes eligible or its lease expires, or the zero time when nothing
	// is waiting. A worker passes its tenant and channels, so that rows it
	// cannot take do not hide its own.
	NextDue(ctx context.Context, f DueFilter) (time.Time, error)

	// Notify returns a channel that receives a value (coalesced) whenever
	// something may have become claimable: an enqueue, an ingested append,
	// a retry that is due at once, a requeue.
	Notify() <-chan struct{}

	// Get returns one envelope with its segments and their attempt history.
	Get(ctx context.Context, tenant, id string) (*EnvelopeStatus, error)
	// List returns rows (segments) matching f, oldest first, paged by an
	// opaque cursor.
	List(ctx context.Context, f ListFilter) (*Page, error)
	// Counts returns the number of rows per state and channel ("" = every tenant).
	Counts(ctx context.Context, tenant string) (Counts, error)

	// Requeue returns an envelope's dead_letter, unresolved, expired and
	// suppressed segments to pending with a fresh attempt budget; the
	// first segment not sent is due now, the later ones wait their turn
	// (attempts, the last class and history are kept). It returns
	// ErrInvalidTransition when the first segment not sent is in none of
	// those states (nothing to requeue, or its recipient is gone), and a
	// *TransitionError naming the reason when a claim now would only end
	// it again (consent still refuses it, it is past expires_at: an expired
	// envelope is never sent again, its record is gone).
	Requeue(ctx context.Context, tenant, id string) error
	// Resolve settles an envelope's unresolved segments as sent or
	// retryable (as must be StateSent or StateRetryable, checked first).
	// It returns ErrInvalidTransition when no segment is unresolved.
	Resolve(ctx context.Context, tenant, id string, as envelope.State) error

	// Consent returns the user's current consent from the store's own
	// consent records (the zero Consent when there is none).
	Consent(ctx context.Context, tenant, userID string) (Consent, error)
	// SetConsent replaces the user's consent flags by Consent.Set: an
	// explicit opt-in lifts that channel's unsubscribes, other
	// suppressions are kept, and the history notes both.
	// SetConsent, Suppress, LiftSuppression and Erase refuse an empty user
	// id (ErrNoUser); Suppress refuses an unknown channel.
	SetConsent(ctx context.Context, tenant, userID string, c ConsentFlags) error
	// Suppress adds a suppression to the user's consent record.
	Suppress(ctx context.Context, tenant, userID string, s Suppression) error
	// LiftSuppression removes the user's suppressions of a channel (of one
	// target, when target is not "") by Consent.Lift, whatever their
	// reason: an operator checked (a bounce that was a full mailbox, a
	// chat unblocked). ErrNotFound when none matched.
	LiftSuppression(ctx context.Context, tenant, userID string, ch envelope.Channel, target string) error

	// Erase deletes everything stored for a user: log, rows, consent and
	// suppressions (the tenant's address suppressions, which name no user,
	// are kept). Leased rows are erased too (their commits then fail with
	// ErrLeaseLost).
	Erase(ctx context.Context, tenant, userID string) error
	// Prune deletes envelopes whose rows are all terminal and older than
	// the retention period, and removes logs left empty. It returns the
	// number of envelopes pruned.
	Prune(ctx context.Context) (int, error)

	// SaveSubscription stores a browser push subscription for a user
	// (replacing one with the same endpoint) and lifts a suppression of
	// that endpoint left by an earlier 404/410: the browser subscribed
	// again (see Resubscribed).
	SaveSubscription(ctx context.Context, tenant, user string, sub envelope.PushSubscription) error
	// DeleteSubscription removes a user's push subscription by endpoint;
	// ErrNotFound when there is none.
	DeleteSubscription(ctx context.Context, tenant, user, endpoint string) error
	// Subscriptions lists a user's push subscriptions.
	Subscriptions(ctx context.Context, tenant, user string) ([]Subscription, error)
	// SuppressEmail suppresses the address for the tenant (a bounce or
	// complaint the e-mail service reported later): it stores the tenant's
	// address suppression EmailSuppression(address, reason, now), unless
	// the address is suppressed already (the first one stays), whether or
	// not any envelope carries the address yet. From then on every e-mail
	// envelope of any user of the tenant to that address is refused at
	// enqueue and suppressed at claim (Permits); other tenants are
	// untouched, and no user's consent record changes. A committed bounce
	// or complaint of an e-mail writes the same suppression of its address.
	SuppressEmail(ctx context.Context, tenant, address string, reason envelope.ErrorClass) error
	// AddressSuppressions lists the tenant's address suppressions, by
	// target (the address itself is never stored).
	AddressSuppressions(ctx context.Context, tenant string) ([]Suppression, error)
	// LiftAddressSuppression removes the tenant's suppression of target
	// (an operator's decision: the address works again); ErrNotFound when
	// there is none. Users' own suppressions of the address are kept.
	LiftAddressSuppression(ctx context.Context, tenant, target string) error

	// Close releases the store. It is idempotent.
	Close() error
}

// Subscription is a browser push subscription saved for a user.
type Subscription struct {
	Sub     envelope.PushSubscription `json:"subscription"`
	Created time.Time                 `json:"created_at"`
}

// Errors returned by stores.
var (
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("queue: store is closed")
	// ErrStaleFence is returned when a commit carries a fence that no longer
	// holds the row (the lease expired and the row was leased again).
	ErrStaleFence = errors.New("queue: stale fence")
	// ErrLeaseLost is returned when a commit's row is no longer sending.
	ErrLeaseLost = errors.New("queue: lease lost")
	// ErrCrossTenant is returned when a tenant-scoped handle is given
	// another tenant's lease or row.
	ErrCrossTenant = errors.New("queue: row belongs to another tenant")
	// ErrConsentDenied is returned (wrapped in *EnqueueError) when current
	// consent forbids an envelope.
	ErrConsentDenied = errors.New("queue: consent denied")
	// ErrExpired is returned (wrapped in *EnqueueError, Reason expired)
	// when a new envelope is already past its expires_at: it could never
	// be delivered, so it is refused rather than stored to expire.
	ErrExpired = errors.New("queue: envelope already past its expires_at")
	// ErrInvalidTransition is returned when an operator action does not
	// apply to the envelope's current state.
	ErrInvalidTransition = errors.New("queue: invalid transition")
	// ErrUnavailable is what a store's error matches (errors.Is) when the
	// store cannot serve calls: its database server is down or the
	// connection to it was lost, or a file store's index was damaged under
	// it. A write either took effect whole or not at all; an enqueue may be
	// retried (duplicates are reported).
	ErrUnavailable = errors.New("queue: the store is unavailable")
	// ErrNotFound is envelope.ErrNotFound.
	ErrNotFound = envelope.ErrNotFound
)

// EnqueueError says which envelope of an Enqueue call failed and why.
type EnqueueError struct {
	Index  int                 // position in the call
	Tenant string              // the envelope's tenant
	ID     string              // the envelope's id
	Reason envelope.ErrorClass // for consent denials: why
	Err    error
}

func (e *EnqueueError) Error() string {
	s := "envelope " + strconv.Itoa(e.Index) + ": " + e.Err.Error()
	if e.Reason != "" {
		s += " (" + string(e.Reason) + ")"
	}
	return s
}

func (e *EnqueueError) Unwrap() error { return e.Err }

// EnqueueResult reports one envelope of an Enqueue call.
type EnqueueResult struct {
	Tenant    string `json:"tenant_id"`
	ID        string `json:"id"`
	Duplicate bool   `json:"duplicate"`
	Segments  int    `json:"segments"`
}

// DueFilter narrows NextDue to the rows one claimer could take.
type DueFilter struct {
	Tenant   string             // "" = every tenant
	Channels []envelope.Channel // empty = every channel
}

// ClaimRequest says what to lease.
type ClaimRequest struct {
	Tenant   string             // "" = every tenant
	Channels []envelope.Channel // empty = every channel
	Owner    string             // who holds the lease (required)
	Lease    time.Duration      // lease duration (required, > 0)
	Limit    int                // at most this many rows (≤ 0 means 1)
	// ExpireToPending marks the leases so that, when they expire, the rows
	// go back to pending instead of to reconciliation (the HTTP seam's
	// external workers dedupe on the envelope id themselves).
	ExpireToPending bool
}

// Checked returns r with its defaults (a Limit ≤ 0 is 1), or an error when
// it names no owner or no positive lease duration: what every store's
// Claim and Recover accept.
func (r ClaimRequest) Checked() (ClaimRequest, error) {
	if r.Owner == "" {
		return r, errors.New("queue: claim request needs an owner")
	}
	if r.Lease <= 0 {
		return r, errors.New("queue: claim request needs a positive lease duration")
	}
	if r.Limit <= 0 {
		r.Limit = 1
	}
	return r, nil
}

// Lease is a claimed row. Only its (Owner, Fence) may commit the row.
type Lease struct {
	Key        envelope.Key       `json:"key"`
	UserID     string             `json:"user_id"`
	Channel    envelope.Channel   `json:"channel"`
	Owner      string             `json:"owner"`
	Fence      uint64             `json:"fence"`
	Attempt    int                `json:"attempt"` // attempts so far, this one included
	ExpiresAt  time.Time          `json:"lease_expires_at"`
	Segments   int                `json:"segments"`
	EnqueuedAt time.Time          `json:"enqueued_at"`
	Envelope   *envelope.Envelope `json:"envelope"` // a copy of the stored envelope
}

// Outcome is what a worker commits for a leased row.
type Outcome struct {
	// State is one of sent, retryable, dead_letter, bounced, complaint,
	// suppressed, unresolved, expired.
	State      envelope.State
	Class      envelope.ErrorClass // stable class for anything but sent
	RetryAfter time.Duration       // retryable: minimum delay
	Receipt    string              // sent: provider receipt id
	// NoAttempt, for retryable, gives the attempt back (a reconciliation
	// that found the earlier call rejected did not fail a new attempt).
	NoAttempt bool
}

// EnvelopeStatus is one envelope with its segments.
type EnvelopeStatus struct {
	Tenant     string             `json:"tenant_id"`
	ID         string             `json:"id"`
	UserID     string             `json:"user_id"`
	Channel    envelope.Channel   `json:"channel"`
	Template   envelope.Template  `json:"template"`
	Status     string             `json:"status"` // "delivered", or the state of the first segment not sent
	EnqueuedAt time.Time          `json:"enqueued_at"`
	Segments   []SegmentStatus    `json:"segments"`
	Envelope   *envelope.Envelope `json:"envelope,omitempty"`
}

// StatusDelivered is EnvelopeStatus.Status when every segment is sent.
const StatusDelivered = "delivered"

// SegmentStatus is one row.
type SegmentStatus struct {
	Index     int                 `json:"index"`
	State     envelope.State      `json:"state"`
	Attempts  int                 `json:"attempts"`
	Class     envelope.ErrorClass `json:"error_class,omitempty"`
	Receipt   string              `json:"receipt,omitempty"`
	Fence     uint64              `json:"fence,omitempty"`
	NextAt    time.Time           `json:"next_at,omitzero"`
	LeaseEnd  time.Time           `json:"lease_expires_at,omitzero"`
	UpdatedAt time.Time           `json:"updated_at"`
	History   []Attempt           `json:"history,omitempty"`
}

// Attempt is one entry of a row's history: a claim's end or an operator act.
type Attempt struct {
	Attempt int                 `json:"attempt"`
	At      time.Time           `json:"at"`
	State   envelope.State      `json:"state"`
	Class   envelope.ErrorClass `json:"error_class,omitempty"`
}

// ListFilter selects rows for List.
type ListFilter struct {
	Tenant  string           // "" = every tenant
	State   envelope.State   // "" = every state
	Channel envelope.Channel // "" = every channel
	Limit   int              // ≤ 0 means 50; at most 1000
	Cursor  string           // from Page.Next
}

// Row is one row in a List page.
type Row struct {
	Key       envelope.Key        `json:"key"`
	UserID    string              `json:"user_id"`
	Channel   envelope.Channel    `json:"channel"`
	State     envelope.State      `json:"state"`
	Attempts  int                 `json:"attempts"`
	Class     envelope.ErrorClass `json:"error_class,omitempty"`
	UpdatedAt time.Time           `json:"updated_at"`
}

// Page is one page of List.
type Page struct {
	Rows []Row  `json:"rows"`
	Next string `json:"next,omitempty"` // "" when this is the last page
}

// Counts holds row counts by state and channel.
type Counts map[envelope.State]map[envelope.Channel]int

// Total returns the count for state over every channel.
func (c Counts) Total(s envelope.State) int {
	n := 0
	for _, v := range c[s] {
		n += v
	}
	return n
}
