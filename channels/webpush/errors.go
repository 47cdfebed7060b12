package webpush

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
)

// StatusError is the cause wrapped in the DeliveryError returned for a push
// service's non-2xx answer. It holds the status code only: the answer's
// body is never kept.
type StatusError struct {
	StatusCode int
}

// Error returns the status code, nothing of the answer's body.
func (e *StatusError) Error() string {
	return "webpush: push service answered " + strconv.Itoa(e.StatusCode)
}

// Causes wrapped in returned DeliveryErrors. Their text names no endpoint,
// key or payload.
var (
	errNotPush             = errors.New("webpush: message is not a push message")
	errBadSubscriptionKeys = errors.New("webpush: subscription keys are not a P-256 p256dh and a 16-byte auth")
	errBadTopic            = errors.New("webpush: topic is not 1-32 URL-safe base64 characters")
	errBadUrgency          = errors.New("webpush: urgency is not very-low, low, normal or high")
)

// classifyNetErr maps an error from resolving or calling the push service
// to a DeliveryError. The raw error (whose text holds the endpoint URL) is
// replaced by a redacted cause.
func classifyNetErr(err error) error {
	if errors.Is(err, ErrEndpointNotAllowed) {
		return envelope.Permanent(envelope.ClassInvalidRecipient, ErrEndpointNotAllowed)
	}
	return channels.ClassifyTransport(err)
}

// classifyStatus maps a push service's answer to nil (2xx) or a
// DeliveryError.
func classifyStatus(resp *http.Response) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	cause := &StatusError{StatusCode: code}
	switch {
	case code == http.StatusNotFound || code == http.StatusGone:
		return envelope.RecipientGone(envelope.ClassSubscriptionGone, cause)
	case code == http.StatusRequestEntityTooLarge:
		return envelope.Permanent(envelope.ClassPayloadTooLarge, cause)
	case code == http.StatusTooManyRequests:
		if d := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); d > 0 {
			return envelope.RetryAfter(envelope.ClassRateLimited, d, cause)
		}
		return envelope.Retryable(envelope.ClassRateLimited, cause)
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return envelope.Permanent(envelope.ClassAuthFailed, cause)
	case code >= 400 && code < 500:
		return envelope.Permanent(envelope.ClassInvalidRequest, cause)
	case code >= 500:
		if d := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); d > 0 {
			return envelope.RetryAfter(envelope.ClassProviderUnavailable, d, cause)
		}
		return envelope.Retryable(envelope.ClassProviderUnavailable, cause)
	}
	// 1xx and 3xx (redirects are not followed): not an acceptance.
	return envelope.Retryable(envelope.ClassProviderUnavailable, cause)
}

// parseRetryAfter reads a Retry-After value, delay-seconds or an HTTP-date
// (RFC 9110 §10.2.3), as a delay from now. It returns 0 when v is empty,
// malformed or in the past.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter
		}
		return time.Duration(secs) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	d := t.Sub(now)
	if d <= 0 {
		return 0
	}
	// HTTP-dates have whole seconds: round up so the wait is never short.
	d = (d + time.Second - 1).Truncate(time.Second)
	return min(d, maxRetryAfter)
}

// maxRetryAfter caps an announced delay (a bogus far-future date must not
// park a row for years; its expiry bounds it anyway).
const maxRetryAfter = 7 * 24 * time.Hour
