package queue

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultRetention is how long terminal rows are kept by default.
const DefaultRetention = 7 * 24 * time.Hour

// Options configures any store: what the contract's behaviour depends on. A
// nil *Options means all defaults; a zero field means its default. Each
// store reads its options once; a store's own settings live in its
// package's options (filestore.Options).
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
}

// WithDefaults returns a copy of o (nil allowed) with every zero field set
// to its default.
func (o *Options) WithDefaults() Options {
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
	return c
}
