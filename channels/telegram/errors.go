package telegram

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// APIError is the cause wrapped in the DeliveryError returned for a Bot API
// failure. It keeps the HTTP status and Telegram's error_code only: the
// description (which may quote the request) is never kept.
type APIError struct {
	StatusCode int
	ErrorCode  int
}

// Error returns the status (and error_code), nothing of the answer's text.
func (e *APIError) Error() string {
	s := "telegram: Bot API answered " + strconv.Itoa(e.StatusCode)
	if e.ErrorCode != 0 && e.ErrorCode != e.StatusCode {
		s += " (error_code " + strconv.Itoa(e.ErrorCode) + ")"
	}
	return s
}

// Causes wrapped in returned DeliveryErrors. Their text names no token,
// chat or text.
var (
	errNotChat   = errors.New("telegram: message is not a chat message")
	errNoChatID  = errors.New("telegram: message has no chat id")
	errEmptyText = errors.New("telegram: message text is empty")
	errEncode    = errors.New("telegram: cannot build the request")
	errPacing    = errors.New("telegram: pacing wait would outlast the deadline")
	// errMigrated marks a chat that became a supergroup (the app must
	// switch to migrate_to_chat_id).
	errMigrated = errors.New("telegram: chat migrated to a supergroup")
)

// migratedError wraps an APIError for a migrated chat.
type migratedError struct{ *APIError }

func (e migratedError) Unwrap() []error { return []error{e.APIError, errMigrated} }

// Description fragments (lower case) that mean the bot can no longer write
// to the chat.
var (
	goneForbidden = []string{
		"blocked by the user",
		"user is deactivated",
		"was kicked",
		"can't initiate conversation",
		"is not a member",
		"chat not found",
	}
	goneBadRequest = []string{
		"chat not found",
		"user not found",
		"peer_id_invalid",
		"chat_id is empty",
	}
)

// classify maps a Bot API failure to a DeliveryError. ar is the decoded
// answer (zero when the body was not the Bot API's JSON).
func classify(resp *http.Response, ar *apiResponse) error {
	status := resp.StatusCode
	code := ar.ErrorCode
	if code == 0 {
		code = status
	}
	cause := &APIError{StatusCode: status, ErrorCode: ar.ErrorCode}
	desc := strings.ToLower(ar.Description)
	retryAfter := time.Duration(0)
	if ar.Parameters != nil && ar.Parameters.RetryAfter > 0 {
		retryAfter = time.Duration(ar.Parameters.RetryAfter) * time.Second
	} else if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s > 0 {
		retryAfter = time.Duration(s) * time.Second
	}
	switch {
	case code == http.StatusTooManyRequests:
		if retryAfter > 0 {
			return envelope.RetryAfter(envelope.ClassRateLimited, retryAfter, cause)
		}
		return envelope.Retryable(envelope.ClassRateLimited, cause)
	case code == http.StatusUnauthorized || code == http.StatusNotFound:
		return envelope.Permanent(envelope.ClassAuthFailed, cause)
	case code == http.StatusForbidden:
		if containsAny(desc, goneForbidden) {
			return envelope.RecipientGone(envelope.ClassBlockedByUser, cause)
		}
		return envelope.Permanent(envelope.ClassInvalidRecipient, cause)
	case code == http.StatusBadRequest:
		if ar.Parameters != nil && ar.Parameters.MigrateToChatID != 0 {
			return envelope.Permanent(envelope.ClassInvalidRecipient, migratedError{cause})
		}
		if containsAny(desc, goneBadRequest) {
			return envelope.RecipientGone(envelope.ClassInvalidRecipient, cause)
		}
		return envelope.Permanent(envelope.ClassInvalidRequest, cause)
	case code >= 500 || status >= 500:
		if retryAfter > 0 {
			return envelope.RetryAfter(envelope.ClassProviderUnavailable, retryAfter, cause)
		}
		return envelope.Retryable(envelope.ClassProviderUnavailable, cause)
	case code >= 400 && code < 500:
		return envelope.Permanent(envelope.ClassInvalidRequest, cause)
	}
	// A 2xx that is not {"ok":true,"result":{…}}, or a 1xx/3xx: not an
	// acceptance we can record.
	return envelope.Retryable(envelope.ClassProviderUnavailable, cause)
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
