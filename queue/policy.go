package queue

import (
	"math/rand/v2"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// Backoff configures retries: the n-th retry waits about Base·2^(n-1),
// at most Cap, with ±Jitter of randomness; after MaxAttempts attempts a
// retryable failure becomes dead_letter.
type Backoff struct {
	Base        time.Duration // default 1s
	Cap         time.Duration // default 1h
	MaxAttempts int           // default 8
	Jitter      float64       // fraction in [0,1); default 0.2
	NoJitter    bool          // disables jitter (tests)
}

// Default backoff settings.
const (
	DefaultBackoffBase = time.Second
	DefaultBackoffCap  = time.Hour
	DefaultMaxAttempts = 8
	DefaultJitter      = 0.2
)

// WithDefaults returns b with zero fields set to their defaults.
func (b Backoff) WithDefaults() Backoff {
	if b.Base <= 0 {
		b.Base = DefaultBackoffBase
	}
	if b.Cap <= 0 {
		b.Cap = DefaultBackoffCap
	}
	if b.Cap < b.Base {
		b.Cap = b.Base
	}
	if b.MaxAttempts <= 0 {
		b.MaxAttempts = DefaultMaxAttempts
	}
	if b.Jitter <= 0 || b.Jitter >= 1 {
		b.Jitter = DefaultJitter
	}
	if b.NoJitter {
		b.Jitter = 0
	}
	return b
}

// Delay returns the wait after the given attempt failed (attempt ≥ 1),
// at least minDelay (a provider's Retry-After).
func (b Backoff) Delay(attempt int, minDelay time.Duration) time.Duration {
	b = b.WithDefaults()
	if attempt < 1 {
		attempt = 1
	}
	d := b.Base
	for i := 1; i < attempt && d < b.Cap; i++ {
		d *= 2
	}
	if d > b.Cap {
		d = b.Cap
	}
	if b.Jitter > 0 {
		f := 1 + b.Jitter*(2*rand.Float64()-1)
		d = time.Duration(float64(d) * f)
	}
	if d < minDelay {
		d = minDelay
	}
	return d
}

// Decide turns a committed outcome into the row's next state and the time it
// becomes eligible again (zero when it does not). attempts is the row's
// attempt count including the one being committed.
func (b Backoff) Decide(out Outcome, attempts int, now time.Time) (envelope.State, time.Time) {
	switch out.State {
	case envelope.StateRetryable:
		if out.NoAttempt {
			return envelope.StateRetryable, now.Add(out.RetryAfter)
		}
		if attempts >= b.WithDefaults().MaxAttempts {
			return envelope.StateDeadLetter, time.Time{}
		}
		return envelope.StateRetryable, now.Add(b.Delay(attempts, out.RetryAfter))
	default:
		return out.State, time.Time{}
	}
}

// ValidOutcome reports whether a worker may commit state s.
func ValidOutcome(s envelope.State) bool {
	switch s {
	case envelope.StateSent, envelope.StateRetryable, envelope.StateDeadLetter,
		envelope.StateBounced, envelope.StateComplaint, envelope.StateSuppressed,
		envelope.StateUnresolved, envelope.StateExpired:
		return true
	}
	return false
}

// Suppressing reports whether committing s writes a suppression.
func Suppressing(s envelope.State) bool {
	return s == envelope.StateBounced || s == envelope.StateComplaint || s == envelope.StateSuppressed
}
