package resend

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
)

// Resend's documented error names (https://resend.com/docs/api-reference/errors).
// Only these are ever kept, logged or returned; anything else reads as "".
var knownNames = map[string]bool{
	"validation_error":               true,
	"invalid_idempotency_key":        true,
	"missing_api_key":                true,
	"restricted_api_key":             true,
	"invalid_api_key":                true,
	"not_found":                      true,
	"method_not_allowed":             true,
	"invalid_idempotent_request":     true,
	"concurrent_idempotent_requests": true,
	"missing_required_field":         true,
	"invalid_from_address":           true,
	"invalid_attachment":             true,
	"invalid_parameter":              true,
	"invalid_access":                 true,
	"invalid_region":                 true,
	"rate_limit_exceeded":            true,
	"daily_quota_exceeded":           true,
	"monthly_quota_exceeded":         true,
	"security_error":                 true,
	"application_error":              true,
	"internal_server_error":          true,
}

// Resend error names the mapping branches on.
const (
	nameInvalidIdempotentRequest = "invalid_idempotent_request"
	nameConcurrentIdempotent     = "concurrent_idempotent_requests"
	nameDailyQuota               = "daily_quota_exceeded"
	nameMonthlyQuota             = "monthly_quota_exceeded"
)

// defaultRateLimitDelay is the delay used for a 429 that announces none.
const defaultRateLimitDelay = time.Second

// APIError is Resend's answer to a failed API call, as kept by the
// provider: the HTTP status and Resend's error name. It never holds Resend's
// message text. It is the Err of the envelope.DeliveryError the provider
// returns for an HTTP error; use errors.As to inspect it.
type APIError struct {
	// StatusCode is the HTTP status of the response.
	StatusCode int
	// Name is Resend's error name (e.g. "invalid_idempotent_request") when
	// it is one of Resend's documented names, else "".
	Name string
}

// Error returns "resend: HTTP <status> <name>".
func (e *APIError) Error() string {
	s := "resend: HTTP " + strconv.Itoa(e.StatusCode)
	if e.Name != "" {
		s += " " + e.Name
	}
	return s
}

// callError is the cause kept for a call that got no HTTP answer. Its text
// is fixed: the raw transport error (which holds the request URL) is
// dropped. It unwraps to the context's error when the call was cancelled.
type callError struct {
	msg   string
	cause error // context.Canceled or context.DeadlineExceeded, or nil
}

func (e *callError) Error() string { return e.msg }
func (e *callError) Unwrap() error { return e.cause }

var (
	// errNoID is the cause kept when Resend answers 2xx without an e-mail id.
	errNoID = errors.New("resend: success answer without an e-mail id")
	// errLimiter is the cause kept when the rate limiter cannot grant a
	// request before the context's deadline.
	errLimiter = errors.New("resend: rate limit wait exceeds the deadline")
)

// knownName returns name when it is a documented Resend error name, else "".
func knownName(name string) string {
	if knownNames[name] {
		return name
	}
	return ""
}

// apiError returns the APIError for a captured exchange.
func (x *exchange) apiError() *APIError {
	return &APIError{StatusCode: x.status, Name: knownName(x.body.Name)}
}

// failure classifies a failed call. x is the call's exchange (nil when the
// call never reached the transport); err is what the caller got.
func (p *Provider) failure(ctx context.Context, op string, x *exchange, err error) *envelope.DeliveryError {
	if x == nil || x.status == 0 {
		return p.noAnswer(ctx, op, err)
	}
	if x.status >= 200 && x.status < 300 {
		// A success without a usable id: a replay under the same key
		// returns the original id, so retrying is safe.
		de := envelope.Classify(envelope.Retryable(envelope.ClassProviderUnavailable, errNoID))
		p.logFailure(op, x, de)
		return de
	}
	de := p.classifyStatus(x)
	p.logFailure(op, x, de)
	return de
}

// noAnswer classifies a call that got no HTTP response.
func (p *Provider) noAnswer(ctx context.Context, op string, err error) *envelope.DeliveryError {
	var de *envelope.DeliveryError
	switch cerr := ctx.Err(); {
	case errors.Is(cerr, context.DeadlineExceeded):
		de = classified(envelope.Retryable(envelope.ClassTimeout, &callError{"resend: call timed out", cerr}))
	case cerr != nil:
		de = classified(envelope.Retryable(envelope.ClassInterrupted, &callError{"resend: call cancelled", cerr}))
	case errors.Is(err, errLimiter):
		de = classified(envelope.Retryable(envelope.ClassTimeout, errLimiter))
	case channels.NotConnected(err):
		de = classified(envelope.Retryable(envelope.ClassUnreachable, &callError{"resend: the service could not be reached", nil}))
	case isTimeout(err):
		de = classified(envelope.Retryable(envelope.ClassTimeout, &callError{"resend: call timed out", nil}))
	default:
		de = classified(envelope.Retryable(envelope.ClassNetwork, &callError{"resend: network error", nil}))
	}
	p.log.LogAttrs(context.Background(), slog.LevelWarn, "resend call failed",
		slog.String("op", op), slog.String("error_class", string(de.Class)))
	return de
}

func classified(err error) *envelope.DeliveryError { return envelope.Classify(err) }

// isTimeout reports whether err is a timeout of the HTTP client or the net.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// classifyStatus maps an HTTP error answer to a DeliveryError.
func (p *Provider) classifyStatus(x *exchange) *envelope.DeliveryError {
	ae := x.apiError()
	switch {
	case ae.Name == nameDailyQuota:
		now := p.now().UTC()
		midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
		d := midnight.Sub(now)
		p.logQuota("daily", d)
		return classified(envelope.RetryAfter(envelope.ClassQuotaExceeded, d, ae))
	case ae.Name == nameMonthlyQuota:
		d := 24 * time.Hour
		p.logQuota("monthly", d)
		return classified(envelope.RetryAfter(envelope.ClassQuotaExceeded, d, ae))
	case x.status == http.StatusTooManyRequests:
		return classified(envelope.RetryAfter(envelope.ClassRateLimited, retryAfter(x.header, p.now()), ae))
	case x.status == http.StatusConflict:
		if ae.Name == nameInvalidIdempotentRequest {
			p.log.LogAttrs(context.Background(), slog.LevelError,
				"resend refused a reused idempotency key with a different request; the message is dead-lettered",
				slog.Int("status", x.status), slog.String("resend_error", ae.Name))
			return classified(envelope.Permanent(envelope.ClassIdempotencyConflict, ae))
		}
		// concurrent_idempotent_requests: the first request is still in
		// flight; the same key and body later are safe.
		return classified(envelope.Retryable(envelope.ClassIdempotencyConflict, ae))
	case x.status == http.StatusUnauthorized || x.status == http.StatusForbidden:
		p.log.LogAttrs(context.Background(), slog.LevelError,
			"resend rejected the API key or the sender; check RESEND_API_KEY and the verified domain of Options.From",
			slog.Int("status", x.status), slog.String("resend_error", ae.Name))
		return classified(envelope.Permanent(envelope.ClassAuthFailed, ae))
	case x.status == http.StatusUnavailableForLegalReasons:
		p.log.LogAttrs(context.Background(), slog.LevelError,
			"resend refused the message for security reasons; the message is dead-lettered",
			slog.Int("status", x.status), slog.String("resend_error", ae.Name))
		return classified(envelope.Permanent(envelope.ClassInvalidRequest, ae))
	case x.status == http.StatusRequestEntityTooLarge:
		return classified(envelope.Permanent(envelope.ClassPayloadTooLarge, ae))
	case x.status == http.StatusRequestTimeout:
		return classified(envelope.Retryable(envelope.ClassTimeout, ae))
	case x.status >= 500:
		return classified(envelope.Retryable(envelope.ClassProviderUnavailable, ae))
	case x.status >= 400:
		return classified(envelope.Permanent(envelope.ClassInvalidRequest, ae))
	}
	// 1xx/3xx that the client did not follow: not an answer we understand.
	return classified(envelope.Retryable(envelope.ClassProviderUnavailable, ae))
}

// retryAfter reads a 429's delay: retry-after (seconds or an HTTP date),
// else ratelimit-reset (seconds), else defaultRateLimitDelay. The result is
// never below one second.
func retryAfter(h http.Header, now time.Time) time.Duration {
	d := time.Duration(-1)
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 && s < 1e9 {
			d = time.Duration(s * float64(time.Second))
		} else if t, err := http.ParseTime(v); err == nil {
			d = t.Sub(now)
		}
	}
	if d < 0 {
		if v := strings.TrimSpace(h.Get("Ratelimit-Reset")); v != "" {
			if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 && s < 1e9 {
				d = time.Duration(s * float64(time.Second))
			}
		}
	}
	if d < 0 {
		d = defaultRateLimitDelay
	}
	if d < time.Second {
		d = time.Second
	}
	return d
}

func (p *Provider) logQuota(which string, d time.Duration) {
	p.log.LogAttrs(context.Background(), slog.LevelWarn,
		"resend e-mail quota exceeded; e-mail deliveries are deferred until it resets (raise the plan's quota to send sooner)",
		slog.String("quota", which), slog.Duration("retry_after", d),
		slog.String("error_class", string(envelope.ClassQuotaExceeded)))
}

func (p *Provider) logFailure(op string, x *exchange, de *envelope.DeliveryError) {
	level := slog.LevelWarn
	if de.Kind == envelope.KindRetryable {
		level = slog.LevelInfo
	}
	attrs := []slog.Attr{
		slog.String("op", op),
		slog.Int("status", x.status),
		slog.String("resend_error", knownName(x.body.Name)),
		slog.String("error_class", string(de.Class)),
		slog.String("kind", de.Kind.String()),
	}
	if de.RetryAfter > 0 {
		attrs = append(attrs, slog.Duration("retry_after", de.RetryAfter))
	}
	p.log.LogAttrs(context.Background(), level, "resend call failed", attrs...)
}
