package queue

import (
	"log/slog"
	"slices"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/prometheus/client_golang/prometheus"
)

// Default option values.
const (
	DefaultRetention      = 7 * 24 * time.Hour
	DefaultRescanInterval = 30 * time.Second
	DefaultLockTimeout    = time.Second
)

// Options configures a store. A nil *Options means all defaults; a zero
// field means its default. Open (and memstore.New) read the options once.
type Options struct {
	// Now returns the current time (default time.Now). Tests inject a clock.
	Now func() time.Time
	// Logger receives structured logs (default slog.Default() with
	// component=outbox). Logs never carry ids, addresses or bodies.
	Logger *slog.Logger
	// Registerer registers the store's metrics (nil: metrics are kept but
	// not registered).
	Registerer prometheus.Registerer
	// Backoff configures retries and the attempt limit.
	Backoff Backoff
	// Retention is how long terminal rows are kept before Prune deletes
	// them (default 7 days).
	Retention time.Duration
	// Consent, when set, replaces the store's own consent records as the
	// authority for enqueue and claim decisions.
	Consent ConsentSource

	// The following apply to the file-backed store only.

	// RescanInterval is how often the tailer rescans every log for appends
	// that fsnotify missed (default 30s; negative disables the rescan).
	RescanInterval time.Duration
	// DisableWatcher turns fsnotify off (the rescan still runs).
	DisableWatcher bool
	// LockTimeout bounds the wait for the store's file lock (default 1s).
	LockTimeout time.Duration
	// NoSync is the relaxed durability mode: enqueues return before the
	// log is fsynced and bbolt commits skip fsync. A crash of the machine
	// (not of the process) can lose acknowledged envelopes.
	NoSync bool
	// UnsyncedClaims lists the channels whose providers redeliver
	// idempotently (channels.Capabilities.IdempotentRedelivery: the same
	// key delivered twice has the effect of once). A claim whose requested
	// channels are all in it (an empty ClaimRequest.Channels means every
	// channel) skips the fsync of its index transaction: such a claim lost
	// in a machine crash (not a process crash) returns its rows to pending,
	// and they are delivered again under the same key, which those
	// providers absorb. Recoveries and claims with ExpireToPending (the
	// HTTP seam's) are always fsynced. Empty (the default): every claim is
	// fsynced. outbox serve sets it from its providers. The in-memory store
	// ignores it.
	UnsyncedClaims []envelope.Channel
}

func (o *Options) withDefaults() Options {
	var c Options
	if o != nil {
		c = *o
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default().With("component", "outbox")
	}
	c.Backoff = c.Backoff.WithDefaults()
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
	if c.RescanInterval == 0 {
		c.RescanInterval = DefaultRescanInterval
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	c.UnsyncedClaims = slices.Clone(c.UnsyncedClaims)
	return c
}

// WithDefaults returns a copy of o (nil allowed) with every zero field set
// to its default. Store implementations outside this package use it.
func (o *Options) WithDefaults() Options { return o.withDefaults() }
