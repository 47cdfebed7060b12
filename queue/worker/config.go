package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"
)

// Default configuration values.
const (
	DefaultConcurrency     = 4
	DefaultLease           = 30 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
	// DefaultRescanInterval is the slow safety tick: the longest the worker
	// sleeps without looking at the store, whatever its timers say.
	DefaultRescanInterval = time.Minute
)

// Renderer turns one segment of an envelope into its channel's message.
// *render.Renderer satisfies it. It must be safe for concurrent use.
type Renderer interface {
	Render(e *envelope.Envelope, segment int, now time.Time) (*envelope.Message, error)
}

// Config configures a Worker. New reads it once; later changes to the
// caller's copy (or its maps) have no effect.
type Config struct {
	// Store is the queue to deliver from (required).
	Store queue.Store
	// Providers delivers each channel. A channel without a provider is
	// never claimed: its rows stay pending. At least one is required; a
	// provider's Capabilities().Channel must match its key.
	Providers map[envelope.Channel]channels.Provider
	// Renderer renders messages (required; render.Renderer satisfies it).
	Renderer Renderer
	// Tenant limits the worker to one tenant ("" = every tenant).
	Tenant string
	// Concurrency bounds the provider calls in flight (default 4).
	Concurrency int
	// Lease is how long a claimed row is held; a provider call must finish
	// within it (default 30s).
	Lease time.Duration
	// ClaimBatch is how many rows one claim transaction leases at most
	// for the free slots (default Concurrency; never more than those).
	// Rows of channels whose provider redelivers idempotently and that
	// have no rate limit are also claimed ahead, up to 8 per slot (32 in
	// all with fewer slots), and wait in the worker for a slot (see the
	// package documentation).
	ClaimBatch int
	// RateLimits limits each channel's provider calls per second (optional;
	// a missing or rate.Inf entry means unlimited).
	RateLimits map[envelope.Channel]rate.Limit
	// RateBursts is each rate-limited channel's burst (default 1).
	RateBursts map[envelope.Channel]int
	// ShutdownTimeout bounds how long Run waits for in-flight provider
	// calls after its context is cancelled (default 10s).
	ShutdownTimeout time.Duration
	// Logger receives structured logs (default slog.Default()); the worker
	// adds component=worker.
	Logger *slog.Logger
	// Registerer registers the worker's metrics (nil: metrics are kept but
	// not registered). Workers sharing a registerer share the collectors.
	Registerer prometheus.Registerer
	// TracerProvider creates the spans (nil: no tracing).
	TracerProvider trace.TracerProvider
	// Now returns the current time (default time.Now); give it the store's
	// clock.
	Now func() time.Time
	// Owner names the worker in leases (default "worker-" + a random UUID).
	Owner string
}

// Errors returned by New and Run.
var (
	// ErrClosed is returned by Run after Close.
	ErrClosed = errors.New("worker: closed")
	// ErrRunning is returned by Run when the worker is already running.
	ErrRunning = errors.New("worker: already running")
	// ErrShutdownTimeout is returned by Run when provider calls were still
	// running ShutdownTimeout after its context was cancelled (a provider
	// that ignores its context). Those calls go on in the background; their
	// rows stay sending and are reconciled once their leases expire.
	ErrShutdownTimeout = errors.New("worker: provider calls still running after the shutdown timeout")
)

// configError names the Config field that is wrong.
func configError(field, problem string) error {
	return fmt.Errorf("worker: Config.%s %s", field, problem)
}

// withDefaults validates c and returns a copy with defaults filled in.
func (c Config) withDefaults() (Config, error) {
	if c.Store == nil {
		return c, configError("Store", "is required")
	}
	if c.Renderer == nil {
		return c, configError("Renderer", "is required (render.New returns one)")
	}
	if len(c.Providers) == 0 {
		return c, configError("Providers", "is required: give at least one channel a provider")
	}
	providers := make(map[envelope.Channel]channels.Provider, len(c.Providers))
	for ch, p := range c.Providers {
		if !ch.Valid() {
			return c, configError("Providers", fmt.Sprintf("has an unknown channel %q", ch))
		}
		if p == nil {
			return c, configError("Providers", fmt.Sprintf("[%s] is nil", ch))
		}
		if got := p.Capabilities().Channel; got != ch {
			return c, configError("Providers", fmt.Sprintf("[%s] is a provider for channel %q", ch, got))
		}
		providers[ch] = p
	}
	c.Providers = providers

	switch {
	case c.Concurrency < 0:
		return c, configError("Concurrency", "must not be negative")
	case c.Concurrency == 0:
		c.Concurrency = DefaultConcurrency
	}
	switch {
	case c.Lease < 0:
		return c, configError("Lease", "must not be negative")
	case c.Lease == 0:
		c.Lease = DefaultLease
	}
	switch {
	case c.ClaimBatch < 0:
		return c, configError("ClaimBatch", "must not be negative")
	case c.ClaimBatch == 0 || c.ClaimBatch > c.Concurrency:
		c.ClaimBatch = c.Concurrency
	}
	switch {
	case c.ShutdownTimeout < 0:
		return c, configError("ShutdownTimeout", "must not be negative")
	case c.ShutdownTimeout == 0:
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	limits := make(map[envelope.Channel]rate.Limit, len(c.RateLimits))
	for ch, l := range c.RateLimits {
		if !ch.Valid() {
			return c, configError("RateLimits", fmt.Sprintf("has an unknown channel %q", ch))
		}
		if l <= 0 {
			return c, configError("RateLimits", fmt.Sprintf("[%s] must be positive (use rate.Inf for no limit)", ch))
		}
		limits[ch] = l
	}
	c.RateLimits = limits
	bursts := make(map[envelope.Channel]int, len(c.RateBursts))
	for ch, b := range c.RateBursts {
		if b < 0 {
			return c, configError("RateBursts", fmt.Sprintf("[%s] must not be negative", ch))
		}
		bursts[ch] = b
	}
	c.RateBursts = bursts

	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = c.Logger.With(slog.String(keyComponent, "worker"))
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Owner == "" {
		c.Owner = "worker-" + uuid.NewString()
	}
	return c, nil
}
