// Package resend delivers e-mail through Resend (https://resend.com) and
// brings Resend's bounces and complaints back as suppressions.
//
// # Sending
//
// New builds a Provider (a channels.Provider for the email channel) from
// Options: the API key (only ever from the environment or a file, see
// APIKeyFromEnv), the From and Reply-To addresses, and optionally a base URL,
// an HTTP client, a logger, a rate limit and a clock. Deliver sends one
// rendered envelope.EmailMessage (subject, text, HTML, headers, tags) with
// POST /emails under the Idempotency-Key key.IdempotencyKey(), and tags the
// e-mail with "outbox_key" = the first 32 hex digits of key.Hash(), so that
// the e-mail can be matched with its delivery without revealing any
// envelope or user id, and with "outbox_tenant" = the tenant id (unpadded
// base64url, TenantTag), so that a bounce reported later suppresses the
// address in the tenant that sent it.
//
// resend-go turns most API errors into plain strings, so the provider reads
// the HTTP status and Resend's error name itself, through its own
// http.RoundTripper, scoped to each request by the request's context. The
// answer is mapped to an envelope.DeliveryError:
//
//	200                                    sent (receipt = the e-mail id)
//	409 concurrent_idempotent_requests     retryable  idempotency_conflict
//	409 invalid_idempotent_request         permanent  idempotency_conflict
//	429 rate_limit_exceeded                retryable  rate_limited, after retry-after
//	429 daily_quota_exceeded               retryable  quota_exceeded, after the next UTC midnight
//	429 monthly_quota_exceeded             retryable  quota_exceeded, after 24 h
//	400, 422 (and other 4xx)               permanent  invalid_request
//	401, 403                               permanent  auth_failed
//	451                                    permanent  invalid_request
//	5xx                                    retryable  provider_unavailable
//	3xx (a redirect is never followed)     retryable  provider_unavailable
//	no answer                              retryable  timeout | network_error | interrupted
//
// Resend's message text is never kept: returned errors, receipts and logs
// carry only the status, Resend's error name (when it is one of the
// documented names) and the stable class.
//
// # Reconciliation
//
// Resend keeps an idempotency key for 24 hours and answers a replay of the
// same request under the same key with the original e-mail id, without
// sending again. Reconcile therefore replays the request while the key is
// fresh: an id means Accepted, a validation error (400/422) means Rejected,
// 409 invalid_idempotent_request means Unknown. The provider remembers when
// it first sent each key (in memory, and through the optional
// Options.FirstAttempt hook for restarts); when it does not know, or the
// first attempt is older than IdempotencyWindow less a safety margin,
// Reconcile answers Unknown without calling Resend, because a replay could
// then send the e-mail a second time.
//
// # Bounces and complaints
//
// Resend reports bounces and complaints after the send, so they come back
// two ways, both writing suppression through a channels.Suppressor:
//
//   - a Poller (NewPoller) lists recent e-mails (GET /emails, newest first,
//     cursor pagination with after=<id>) every Interval and suppresses the
//     recipient of every e-mail whose last_event is bounced or complained;
//     its position inside a sweep is kept in a CursorStore (FileCursor keeps
//     it in a file), so a restart resumes where it stopped;
//   - a WebhookHandler (NewWebhookHandler) receives Resend's signed webhooks
//     (email.bounced, email.complained), verified with VerifyWebhook, and
//     suppresses in the tenant the event's "outbox_tenant" tag names (the
//     poller's listing has no tags: it suppresses in its configured
//     tenant).
//
// A suppression is of the address, for the whole tenant (see
// queue.Store.SuppressEmail): it holds for every user of the tenant, also
// when no envelope carries the address yet.
//
// All API calls of one Provider (send, reconcile, poll) share one rate
// limiter, since Resend's limit applies per team (DefaultRate).
package resend
