// Package worker is outbox's delivery loop (SPEC §4, §6, §10).
//
// # Overview
//
// A Worker leases deliverable rows from a queue.Store, renders each one with
// a Renderer, hands the message to the channel's channels.Provider under the
// row's stable key, and commits the outcome with the lease's fence:
//
//	claim (batch) → render → [rate limit] → Deliver (ctx with the lease deadline) → Commit
//
// It is woken at once by the store's Notify channel (in-process enqueues and
// the tailer), by its tasks (a freed slot, a committed retry), by a timer set
// to the earliest due time it knows of (the store's next due time, its own
// retries and leases), and by a slow safety tick; idle, it sleeps.
//
// # Outcomes
//
// A provider's error is classified with envelope.Classify:
//
//   - success → sent, with the receipt;
//   - retryable → retryable, honouring RetryAfter as a minimum delay (the
//     store turns it into dead_letter at the attempt limit);
//   - a timeout (the service may have accepted the message) → the row is left
//     sending: when its lease expires it is reconciled, never blindly resent;
//   - permanent → dead_letter;
//   - recipient gone → bounced, complaint (class complaint) or suppressed
//     (classes blocked_by_user, unsubscribed, consent_withdrawn); the store
//     writes the suppression in the same transaction;
//   - a render error → dead_letter with class render_failed;
//   - a provider panic is recovered → retryable with class provider_panic.
//
// # Reconciliation
//
// On every loop turn the worker asks Store.Recover for rows of its channels
// whose lease expired (a crashed or stopped worker, a lost receipt) and asks
// the provider's Reconcile under the same key: accepted → sent, rejected →
// retryable without counting an attempt, unknown or an error → unresolved
// (class reconcile_unknown), which an operator settles.
//
// # Claims ahead
//
// A claim leases rows for the free slots. When provider calls are quicker
// than claims (a sink, a local endpoint), that would make one store
// transaction for every row or two, so for channels whose provider
// redelivers idempotently (channels.Capabilities.IdempotentRedelivery) and
// that have no rate limit the worker also leases rows for slots not free
// yet: as many as its slots finish during about two claims, from moving
// averages of both, at most 32 per slot (128 in all with fewer slots). In
// front of a provider whose calls take tens of milliseconds that is none.
// They wait in the worker, oldest first; rows of the other channels
// claimed meanwhile go before them; one that has waited half its lease, or
// whose channel pauses, is released unused, and all are released when Run
// stops. A task whose call returns starts the oldest waiting lease in its
// own slot, without waiting for the loop (which may be inside a claim),
// unless the loop wants the slot: when it serves a channel not claimed
// ahead (whose rows go first), a paused channel's probe is due, or it has
// not looked for expired leases in the last 100 ms. Every lease is still written before its provider call. A worker killed with leases waiting leaves them
// to reconciliation, as it leaves its calls in flight.
//
// # Channels without a provider
//
// The worker claims only the channels it has providers for. Rows of other
// channels stay pending; the gauge outbox_channel_unconfigured{channel} is 1
// for them and one log line at start says so.
//
// # Shutdown
//
// When Run's context is cancelled (or Close is called) the worker stops
// claiming and cancels in-flight provider calls through the same context.
// A row whose call had not started is released (the attempt is not
// counted); a row whose call was interrupted is left sending, so that it is
// reconciled after its lease expires rather than resent. Run waits up to
// Config.ShutdownTimeout for the calls to return.
//
// # Observability
//
// Metrics (prefix outbox_) carry only the labels channel, outcome, class,
// result and state. Spans "outbox.deliver" and "outbox.reconcile" carry only
// outbox.channel, outbox.provider, outbox.status and outbox.error_class.
// Logs carry only component, operation, channel, provider, status,
// error_class and trace_id, and for a failed store call the reason the
// store marked safe to log (queue.Loggable: a database's answer, never a
// DSN). No id, address, message body or raw error text is ever logged,
// exported or returned.
package worker
