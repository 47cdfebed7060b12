package wecom

import (
	"errors"

	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/envelope"
)

// Causes wrapped in returned DeliveryErrors: none names a member, a text,
// a secret or a token.
var (
	errNotWeCom     = errors.New("wecom: message is not a WeCom application message")
	errNoUser       = errors.New("wecom: message has no (single) member")
	errUnknownAgent = errors.New("wecom: the message's agentid is not configured")
	errMsgType      = errors.New("wecom: unknown msgtype")
	errEmpty        = errors.New("wecom: message content is empty")
	errTooLong      = errors.New("wecom: content exceeds 2048 bytes")
	errEncode       = errors.New("wecom: cannot build the request")
	errNoToken      = errors.New("wecom: gettoken answered without a token")
	errInvalidUser  = errors.New("wecom: the member is invalid (invaliduser)")
	errUnlicensed   = errors.New("wecom: the member has no license (unlicenseduser)")
	errMemberLimit  = errors.New("wecom: the member's minute or hour limit is reached (kept by outbox)")
	errDailyCap     = errors.New("wecom: the application's daily cap is reached (kept by outbox)")
)

// classify maps message/send's errcode (not 0, not a first token error).
func classify(r *wxapi.Result) error {
	cause := r.Cause()
	switch r.ErrCode {
	case wxapi.CodeInvalidToken, wxapi.CodeExpired, wxapi.CodeCredential,
		wxapi.CodeCorpID, wxapi.CodeSecret, wxapi.CodeAppMismatch,
		wxapi.CodeIPNotTrusted, wxapi.CodeNoPrivilege:
		return envelope.Permanent(envelope.ClassAuthFailed, cause)
	case wxapi.CodeAllInvalid:
		return envelope.RecipientGone(envelope.ClassInvalidRecipient, cause)
	case wxapi.CodeFreqLimit, wxapi.CodeConcurrency:
		return envelope.RetryAfter(envelope.ClassRateLimited, MinFreqRetry, cause)
	case wxapi.CodeBusy:
		return envelope.Retryable(envelope.ClassProviderUnavailable, cause)
	}
	return envelope.Permanent(envelope.ClassInvalidRequest, cause)
}

// classifyToken maps gettoken's errcode.
func classifyToken(r *wxapi.Result) error {
	switch r.ErrCode {
	case wxapi.CodeBusy:
		return envelope.Retryable(envelope.ClassProviderUnavailable, r.Cause())
	case wxapi.CodeFreqLimit, wxapi.CodeConcurrency:
		return envelope.RetryAfter(envelope.ClassRateLimited, MinFreqRetry, r.Cause())
	}
	// 40001/40013/40091/60020/48001 and the rest: the credentials or the
	// configuration, never fixed by retrying.
	return envelope.Permanent(envelope.ClassAuthFailed, r.Cause())
}
