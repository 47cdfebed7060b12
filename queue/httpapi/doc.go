// Package httpapi is the HTTP seam of outbox (SPEC §9) as an importable
// http.Handler: the enqueue and operator API under /v1, the RFC's delivery
// seam for an external worker under /internal/outbox, the one-click
// unsubscribe endpoint, the push-subscription endpoints an embedding app
// mounts behind its own authentication, and /healthz and /readyz.
//
// New builds the handler from a Config; `outbox serve` mounts it next to
// /metrics, and a Go backend can mount it (or part of it) on its own mux.
//
// # Routes
//
//	POST   /v1/envelopes                     enqueue one envelope (object) or a batch (array)
//	GET    /v1/envelopes?state=&channel=&tenant=&limit=&cursor=
//	GET    /v1/envelopes/{id}?tenant=&full=1 one envelope with its segments and history
//	POST   /v1/envelopes/{id}/requeue?tenant=
//	POST   /v1/envelopes/{id}/resolve?tenant= {"as":"sent"|"retry"}
//	GET    /v1/consent/{user_id}?tenant=
//	PUT    /v1/consent/{user_id}?tenant=     {"digest_enabled","push_enabled","email_verified","cadence"}
//	GET    /v1/stats?tenant=
//	GET    /internal/outbox/pending?channel=email|push&limit=N&tenant=
//	POST   /internal/outbox/{id}/status?tenant= {"status","detail"?,"fence"?,"error_class"?}
//	GET    /unsubscribe/{token}              confirmation page (changes nothing)
//	POST   /unsubscribe/{token}              RFC 8058 one-click unsubscribe
//	POST   /unsubscribe/{token}/resubscribe  the page's "subscribe again" button
//	POST   /api/app/push/subscribe           save a W3C PushSubscription
//	DELETE /api/app/push/subscribe           {"endpoint"}
//	GET    /api/app/push/vapid-key           {"public_key"}
//	GET    /healthz, /readyz
//	GET    /openapi.json                     this API's OpenAPI 3.1 description (openapi.json)
//
// Envelope ids may contain "/": escape them in paths (url.PathEscape).
//
// # Authentication
//
// Everything under /v1 and /internal requires "Authorization: Bearer
// <token>" with Config.Token (INTERNAL_OUTBOX_TOKEN). The presented token
// is compared with the configured one by HMAC-SHA256 under a random
// per-handler key and crypto/subtle.ConstantTimeCompare, so neither its
// content nor its length leaks through timing. With no token configured
// those routes are not served at all (404). The unsubscribe endpoint is
// authorised by its signed token alone (see Unsubscriber). The push
// subscription routes use Config.User, the embedding app's own
// authentication; without it they take ?user=&tenant= and require the
// bearer token.
//
// # Errors
//
// Every JSON error has the shape
//
//	{"error":{"code":"…","message":"…","problems":[…]}}
//
// with one of the stable Code* codes. Messages are fixed texts: they never
// echo request content, ids, addresses or provider text. A store that
// cannot write says why (queue.StorageProblemOf): a full disk or used-up
// quota (ENOSPC, EDQUOT; a database server's full disk) is 507
// storage_full, a read-only file system (EROFS) or a database that is a
// standby or read-only 503 storage_read_only, a file it may not open
// (EACCES, EPERM) or a table its database role has no privilege on 503
// storage_permission_denied, each logged with its code. Other unexpected errors become 500
// internal_error, logged with their Go type only.
//
// # The seam
//
// GET /internal/outbox/pending leases envelopes to the caller (owner
// "seam", Config.SeamLease, ExpireToPending): the store filters on current
// consent and expiry and never hands one envelope to two callers. The
// handler remembers the leases it handed out (in memory, bounded) so that
// POST /internal/outbox/{id}/status can commit under them. It does not call
// Store.Recover: a seam lease that expires is returned to pending by the
// worker's own Recover pass (rows leased with ExpireToPending go straight
// back to pending), after which the envelope is offered again. A status
// that carries the fence /pending returned commits even after a restart of
// this process (the store checks the fence); one without a fence, for an
// envelope whose lease this process does not hold, is answered 409
// lease_lost: fetch /pending again. Chat envelopes (several segments) are
// never offered to the seam.
package httpapi
