package channels

import (
	"context"
	"log/slog"

	"github.com/outboxhq/outbox/envelope"
)

// Request is what a provider may log about one request to its service:
// the operation, the HTTP status and the service's own result code. Never
// a recipient, a body, a URL, a credential or the service's error text.
type Request struct {
	Operation string // deliver, reconcile, gettoken …
	Status    int    // HTTP status; 0 when nothing answered
	CodeName  string // the log attribute of Code: error_code, errcode …
	Code      int    // the service's own result code; left out when 0
}

// Hint says, for a failed request, how loud its record is and what an
// operator should check; the zero values mean info and no hint.
type Hint func(err error, de *envelope.DeliveryError) (slog.Level, string)

// LogRequest writes the one record of a request: "<what> sent" at debug
// when err is nil; otherwise "<what> failed" with the error's kind, class
// and retry-after, at the level and with the hint that hint gives (hint
// may be nil).
func LogRequest(ctx context.Context, log *slog.Logger, what string, r Request, err error, hint Hint) {
	attrs := []slog.Attr{slog.String("operation", r.Operation), slog.Int("status", r.Status)}
	if r.Code != 0 {
		attrs = append(attrs, slog.Int(r.CodeName, r.Code))
	}
	if err == nil {
		log.LogAttrs(ctx, slog.LevelDebug, what+" sent", attrs...)
		return
	}
	de := envelope.Classify(err)
	attrs = append(attrs, slog.String("kind", de.Kind.String()), slog.String("error_class", string(de.Class)))
	if de.RetryAfter > 0 {
		attrs = append(attrs, slog.Duration("retry_after", de.RetryAfter))
	}
	level := slog.LevelInfo
	if hint != nil {
		var h string
		if level, h = hint(err, de); h != "" {
			attrs = append(attrs, slog.String("hint", h))
		}
	}
	log.LogAttrs(ctx, level, what+" failed", attrs...)
}
