package envelope

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrorClass is a stable, low-cardinality name for why a delivery failed.
// Only classes are stored, logged and exported; raw provider errors never are.
type ErrorClass string

// Stable error classes.
const (
	ClassNone                ErrorClass = ""
	ClassRateLimited         ErrorClass = "rate_limited"
	ClassQuotaExceeded       ErrorClass = "quota_exceeded"
	ClassTimeout             ErrorClass = "timeout"
	ClassNetwork             ErrorClass = "network_error"
	ClassUnreachable         ErrorClass = "provider_unreachable" // no connection was made: nothing was sent
	ClassProviderUnavailable ErrorClass = "provider_unavailable"
	ClassInvalidRecipient    ErrorClass = "invalid_recipient"
	ClassSubscriptionGone    ErrorClass = "subscription_gone"
	ClassPayloadTooLarge     ErrorClass = "payload_too_large"
	ClassInvalidRequest      ErrorClass = "invalid_request"
	ClassAuthFailed          ErrorClass = "auth_failed"
	ClassBlockedByUser       ErrorClass = "blocked_by_user"
	ClassBounced             ErrorClass = "bounced"
	ClassComplaint           ErrorClass = "complaint"
	ClassUnsubscribed        ErrorClass = "unsubscribed"
	ClassConsentWithdrawn    ErrorClass = "consent_withdrawn"
	ClassNoConsent           ErrorClass = "no_consent" // no consent record for the user
	ClassIdempotencyConflict ErrorClass = "idempotency_conflict"
	ClassProviderPanic       ErrorClass = "provider_panic"
	ClassRenderFailed        ErrorClass = "render_failed"
	ClassNoProvider          ErrorClass = "no_provider"
	ClassMaxAttempts         ErrorClass = "max_attempts"
	ClassExpired             ErrorClass = "expired"
	ClassInterrupted         ErrorClass = "interrupted"
	ClassReconcileUnknown    ErrorClass = "reconcile_unknown"
	ClassReconcileRejected   ErrorClass = "reconcile_rejected"
	ClassOperator            ErrorClass = "operator"
	ClassIndexRebuilt        ErrorClass = "index_rebuilt"
	ClassRestored            ErrorClass = "database_restored" // the database was restored from a backup: the row's fate since is unknown
	ClassRecordLost          ErrorClass = "record_lost"
	ClassUnknown             ErrorClass = "unknown"
)

// Kind says what the queue does with a failed delivery.
type Kind int

// Failure kinds.
const (
	// KindRetryable: retry with backoff (honouring RetryAfter as a minimum).
	KindRetryable Kind = iota
	// KindPermanent: never retry this message; the row goes to dead_letter.
	KindPermanent
	// KindRecipientGone: the address is dead; the row goes to bounced (or
	// complaint) and the recipient is suppressed.
	KindRecipientGone
)

func (k Kind) String() string {
	switch k {
	case KindRetryable:
		return "retryable"
	case KindPermanent:
		return "permanent"
	case KindRecipientGone:
		return "recipient_gone"
	}
	return "unknown"
}

// DeliveryError is a classified delivery failure returned by providers.
//
// Its Error text holds only the kind and the class, never the wrapped
// error's text, so it is safe to log. Err keeps the raw cause for errors.Is
// and for a debugger; it must never be stored or logged.
type DeliveryError struct {
	Kind       Kind
	Class      ErrorClass
	RetryAfter time.Duration // a minimum delay before the next attempt (0 = backoff only)
	Err        error         // raw cause; never logged or stored
}

func (e *DeliveryError) Error() string {
	s := "delivery failed: " + e.Kind.String()
	if e.Class != "" {
		s += " (" + string(e.Class) + ")"
	}
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(", retry after %s", e.RetryAfter)
	}
	return s
}

func (e *DeliveryError) Unwrap() error { return e.Err }

// Retryable wraps err as a retryable failure of the given class.
func Retryable(class ErrorClass, err error) error {
	return &DeliveryError{Kind: KindRetryable, Class: class, Err: err}
}

// RetryAfter wraps err as a retryable failure to be retried no sooner than d.
func RetryAfter(class ErrorClass, d time.Duration, err error) error {
	return &DeliveryError{Kind: KindRetryable, Class: class, RetryAfter: d, Err: err}
}

// Permanent wraps err as a failure that must never be retried as is.
func Permanent(class ErrorClass, err error) error {
	return &DeliveryError{Kind: KindPermanent, Class: class, Err: err}
}

// RecipientGone wraps err as a failure meaning the recipient address is dead.
func RecipientGone(class ErrorClass, err error) error {
	return &DeliveryError{Kind: KindRecipientGone, Class: class, Err: err}
}

// Classify returns err's classification. An error that is not a
// *DeliveryError is retryable with class unknown (or timeout when it is a
// deadline).
func Classify(err error) *DeliveryError {
	if err == nil {
		return nil
	}
	var de *DeliveryError
	if errors.As(err, &de) {
		return de
	}
	var t interface{ Timeout() bool }
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &t) && t.Timeout()) {
		return &DeliveryError{Kind: KindRetryable, Class: ClassTimeout, Err: err}
	}
	return &DeliveryError{Kind: KindRetryable, Class: ClassUnknown, Err: err}
}

// Sentinel errors shared by the packages.
var (
	// ErrNotFound is returned when an envelope or row does not exist (in the
	// caller's tenant).
	ErrNotFound = errors.New("not found")
	// ErrDuplicate is returned (or reported) when an envelope's (tenant, id)
	// already exists.
	ErrDuplicate = errors.New("duplicate envelope")
	// ErrInvalid is wrapped by validation errors.
	ErrInvalid = errors.New("invalid envelope")
)
