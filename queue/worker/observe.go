package worker

import (
	"context"
	"errors"
	"log/slog"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Log keys: the only keys the worker ever logs.
const (
	keyComponent  = "component"
	keyOperation  = "operation"
	keyChannel    = "channel"
	keyProvider   = "provider"
	keyStatus     = "status"
	keyErrorClass = "error_class"
	keyTraceID    = "trace_id"
)

// Span attribute keys: the only attributes the worker's spans carry.
const (
	attrChannel    = attribute.Key("outbox.channel")
	attrProvider   = attribute.Key("outbox.provider")
	attrStatus     = attribute.Key("outbox.status")
	attrErrorClass = attribute.Key("outbox.error_class")
)

// Span names.
const (
	spanDeliver   = "outbox.deliver"
	spanReconcile = "outbox.reconcile"
)

// tracerName is the instrumentation scope of the worker's spans.
const tracerName = "github.com/outboxhq/outbox/queue/worker"

// result is what became of one task: the status (a state, "released",
// "interrupted", "lost", …) and the stable class.
type result struct {
	status string
	class  envelope.ErrorClass
}

// failed reports whether r is a failure for span status and log level.
func (r result) failed() bool {
	switch r.status {
	case string(envelope.StateSent), outcomeReleased, callInterrupted, statusRecovered:
		return false
	}
	return true
}

// level is the log level of a task's result.
func (r result) level() slog.Level {
	switch r.status {
	case outcomeReleased:
		return slog.LevelDebug
	case string(envelope.StateSent), string(envelope.StateRetryable), callInterrupted, callLost, statusRecovered:
		// A sent line at info shows the operator that delivery works.
		return slog.LevelInfo
	case callPanic, "store_error":
		return slog.LevelError
	}
	return slog.LevelWarn
}

// endSpan records r on span with only the allowed attributes and ends it.
func endSpan(span trace.Span, r result) {
	span.SetAttributes(attrStatus.String(r.status), attrErrorClass.String(string(r.class)))
	if r.failed() {
		span.SetStatus(codes.Error, string(r.class))
	} else {
		span.SetStatus(codes.Ok, "")
	}
	span.End()
}

// logResult logs one task's result with only the allowed keys.
func (w *Worker) logResult(ctx context.Context, op string, ch envelope.Channel, r result) {
	lvl := r.level()
	if !w.log.Enabled(ctx, lvl) {
		return
	}
	attrs := []slog.Attr{
		slog.String(keyOperation, op),
		slog.String(keyChannel, string(ch)),
		slog.String(keyProvider, w.names[ch]),
		slog.String(keyStatus, r.status),
	}
	if r.class != "" {
		attrs = append(attrs, slog.String(keyErrorClass, string(r.class)))
	}
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		attrs = append(attrs, slog.String(keyTraceID, sc.TraceID().String()))
	}
	w.log.LogAttrs(ctx, lvl, op+" "+r.status, attrs...)
}

// storeClass maps a store error to a stable class for logs: store errors
// are never logged as text (they may carry paths or ids).
func storeClass(err error) envelope.ErrorClass {
	if queue.Exhausted(err) {
		return "resource_exhausted" // out of open files or memory: raise LimitNOFILE
	}
	if p := queue.StorageProblemOf(err); p != "" {
		return envelope.ErrorClass("storage_" + p) // what the operator has to fix
	}
	switch {
	case errors.Is(err, queue.ErrStaleFence):
		return "stale_fence"
	case errors.Is(err, queue.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, queue.ErrClosed):
		return "store_closed"
	case errors.Is(err, queue.ErrUnavailable):
		return "store_unavailable"
	case errors.Is(err, queue.ErrNotFound):
		return "not_found"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return envelope.ClassTimeout
	}
	return "store_error"
}

// logStoreError logs a failed store call.
func (w *Worker) logStoreError(ctx context.Context, op string, err error) {
	attrs := []slog.Attr{slog.String(keyOperation, op), slog.String(keyStatus, "store_error"),
		slog.String(keyErrorClass, string(storeClass(err)))}
	if r := queue.Reason(err); r != "" {
		attrs = append(attrs, slog.String("reason", r)) // the store marked it safe (queue.Loggable)
	}
	w.log.LogAttrs(ctx, slog.LevelError, "store call failed", attrs...)
}
