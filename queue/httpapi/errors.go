package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Stable error codes of the JSON error body.
const (
	CodeBadJSON           = "bad_json"                  // the body is not the JSON the route expects
	CodeBadRequest        = "bad_request"               // a parameter or field is missing or invalid
	CodeInvalidEnvelope   = "invalid_envelope"          // an envelope breaks the contract (problems list them)
	CodeConsentDenied     = "consent_denied"            // current consent refuses an envelope (problems say why)
	CodeExpired           = "envelope_expired"          // 422: an envelope is already past its expires_at
	CodeUnauthorized      = "unauthorized"              // missing or wrong credentials
	CodeNotFound          = "not_found"                 // no such envelope, subscription, resource or route
	CodeMethodNotAllowed  = "method_not_allowed"        // the route exists for other methods (Allow lists them)
	CodeInvalidTransition = "invalid_transition"        // the operator action does not apply to the current state
	CodeStaleFence        = "stale_fence"               // the fence given no longer holds the envelope
	CodeLeaseLost         = "lease_lost"                // this process holds no lease on the envelope: fetch /pending again
	CodeBodyTooLarge      = "body_too_large"            // the body exceeds Config.MaxBody
	CodeUnsupportedMedia  = "unsupported_media_type"    // the body must be application/json
	CodeUnavailable       = "unavailable"               // the store is closed or unreachable, or the request was cancelled
	CodeOverloaded        = "overloaded"                // too many request bodies in flight (Config.MaxInflight), or the process ran out of open files: retry after Retry-After
	CodeStorageFull       = "storage_full"              // 507: the store's storage is full (queue.StorageFull)
	CodeStorageReadOnly   = "storage_read_only"         // 503: it accepts no writes (queue.StorageReadOnly)
	CodeStorageDenied     = "storage_permission_denied" // 503: it refuses the store a part of it (queue.StorageDenied)
	CodeInternal          = "internal_error"            // anything unexpected (details are never returned)
)

// Problem is one entry of an error's problems list: which envelope of the
// request (Index), where in it (Path, the JSON path; "" for the whole
// envelope) and the rule it breaks, or the consent class that refused it.
type Problem struct {
	Index int    `json:"index"`
	Path  string `json:"path,omitempty"`
	Rule  string `json:"rule"`
}

// apiError is an error with its HTTP status, stable code and a fixed
// message that never holds request content.
type apiError struct {
	Status     int
	Code       string
	Message    string
	Problems   []Problem
	RetryAfter int // seconds, for the Retry-After header (0: none)
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func newError(status int, code, msg string) *apiError {
	return &apiError{Status: status, Code: code, Message: msg}
}

func badRequest(msg string) *apiError { return newError(http.StatusBadRequest, CodeBadRequest, msg) }

// Errors raised by the handlers themselves.
var (
	errUnauthorized = newError(http.StatusUnauthorized, CodeUnauthorized, "missing or invalid credentials")
	errBadJSON      = newError(http.StatusBadRequest, CodeBadJSON, "request body is not valid JSON of the expected shape")
	errBadCursor    = badRequest("invalid cursor")
	errNoLease      = newError(http.StatusConflict, CodeLeaseLost, "no lease is held for this envelope (it expired or the service restarted): fetch /internal/outbox/pending again")
	errStaleFence   = newError(http.StatusConflict, CodeStaleFence, "the fence no longer holds the envelope")
	errWantJSON     = newError(http.StatusUnsupportedMediaType, CodeUnsupportedMedia, "request body must be application/json")
	// A store that cannot write says why, not internal_error: the
	// messages name the condition only (no path, no id).
	errStorageFull      = newError(http.StatusInsufficientStorage, CodeStorageFull, "storage full: the store's disk (or its database server's) has no space or no free inodes left, or its quota is used up; retry once space is freed")
	errStoreUnavailable = newError(http.StatusServiceUnavailable, CodeUnavailable, "store unavailable: the store cannot serve calls now (its database cannot be reached or did not answer in time, or its index was damaged, or its data directory moved, under it); retry later (an enqueue repeated with the same ids is safe: stored ones are answered as duplicates)")
	errStorageReadOnly  = newError(http.StatusServiceUnavailable, CodeStorageReadOnly, "storage read-only: the store does not accept writes (its file system is read-only, or its database is a standby or read-only); retry once it is writable again")
	errExhausted        = &apiError{Status: http.StatusServiceUnavailable, Code: CodeOverloaded, RetryAfter: RetryAfterOverloaded,
		Message: "overloaded: the service ran out of open files or memory (raise its limit of open files, LimitNOFILE or ulimit -n, if this lasts); retry after Retry-After"}
	errStorageDenied = newError(http.StatusServiceUnavailable, CodeStorageDenied, "storage access refused: the store may not use part of its storage (a file of another user's in its data directory, or a table its database role has no privilege on); retry once the operator fixed it")
)

// errorFor maps any error to its API error. It is the only place where
// domain errors become HTTP statuses and codes; the second result is true
// when the error was unexpected (and must be logged).
func errorFor(err error) (*apiError, bool) {
	var ae *apiError
	var mbe *http.MaxBytesError
	var ee *queue.EnqueueError
	var ve *envelope.ValidationError
	var te *queue.TransitionError
	switch {
	case errors.As(err, &ae):
		return ae, false
	case errors.As(err, &mbe):
		return newError(http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
			fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)), false
	case errors.As(err, &ee) && errors.Is(err, queue.ErrConsentDenied):
		e := newError(http.StatusConflict, CodeConsentDenied, "current consent refuses an envelope ("+consentHint(ee.Reason)+"); nothing was stored")
		rule := string(ee.Reason)
		if rule == "" {
			rule = string(envelope.ClassConsentWithdrawn)
		}
		e.Problems = []Problem{{Index: ee.Index, Rule: rule}}
		return e, false
	case errors.As(err, &ee) && errors.Is(err, queue.ErrExpired):
		e := newError(http.StatusUnprocessableEntity, CodeExpired, "an envelope is already past its expires_at and could never be delivered; nothing was stored")
		e.Problems = []Problem{{Index: ee.Index, Path: "expires_at", Rule: "must be in the future"}}
		return e, false
	case errors.As(err, &ve):
		index := 0
		if ee != nil {
			index = ee.Index
		}
		return invalidEnvelope(index, ve), false
	case errors.Is(err, queue.ErrBadCursor):
		return errBadCursor, false
	case errors.Is(err, queue.ErrNotFound):
		return newError(http.StatusNotFound, CodeNotFound, "not found"), false
	case errors.As(err, &te):
		return newError(http.StatusConflict, CodeInvalidTransition, te.Explain()), false
	case errors.Is(err, queue.ErrInvalidTransition):
		return newError(http.StatusConflict, CodeInvalidTransition, "the action does not apply to the envelope's current state"), false
	case errors.Is(err, queue.ErrStaleFence):
		return errStaleFence, false
	case errors.Is(err, queue.ErrLeaseLost):
		return errNoLease, false
	case errors.Is(err, queue.ErrCrossTenant):
		return badRequest("the envelope belongs to another tenant"), false
	}
	// Logged too: the operator has to act (free space, fix the storage,
	// raise a limit, bring the database back).
	if queue.Exhausted(err) {
		return errExhausted, true
	}
	switch queue.StorageProblemOf(err) {
	case queue.StorageFull:
		return errStorageFull, true
	case queue.StorageReadOnly:
		return errStorageReadOnly, true
	case queue.StorageDenied:
		return errStorageDenied, true
	}
	switch {
	case errors.Is(err, queue.ErrUnavailable):
		return errStoreUnavailable, true
	case errors.Is(err, queue.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return newError(http.StatusServiceUnavailable, CodeUnavailable, "service unavailable"), false
	}
	return newError(http.StatusInternalServerError, CodeInternal, "internal error"), true
}

// invalidEnvelope builds the 400 for a validation error of envelope index.
func invalidEnvelope(index int, ve *envelope.ValidationError) *apiError {
	e := newError(http.StatusBadRequest, CodeInvalidEnvelope, "invalid envelope; nothing was stored")
	for _, p := range ve.Problems {
		e.Problems = append(e.Problems, Problem{Index: index, Path: p.Path, Rule: p.Rule})
	}
	return e
}

// errorBody is the JSON shape of every error response.
type errorBody struct {
	Error struct {
		Code     string    `json:"code"`
		Message  string    `json:"message"`
		Problems []Problem `json:"problems,omitempty"`
	} `json:"error"`
}

// consentHint says why a consent class refuses and what lifts it.
func consentHint(class envelope.ErrorClass) string {
	switch class {
	case envelope.ClassNoConsent:
		return "the user has no consent record: PUT /v1/consent/{user_id} first; " + queue.ConsentRules
	case envelope.ClassConsentWithdrawn, "":
		return queue.ConsentRules
	case envelope.ClassUnsubscribed:
		return "the user unsubscribed from this channel"
	case envelope.ClassBounced, envelope.ClassComplaint:
		return "the address is suppressed after a " + string(class) + "; an operator lifts it with outbox suppressions lift"
	}
	return "the recipient is suppressed (" + string(class) + ")"
}
