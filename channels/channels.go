// Package channels holds the protocol-neutral provider contract (SPEC §8).
//
// A Provider talks to one external service for one channel. The worker
// hands it one rendered message under its stable key; the provider returns
// a Receipt or a classified error built with envelope.Retryable,
// envelope.RetryAfter, envelope.Permanent or envelope.RecipientGone (a plain
// error counts as retryable, class unknown). After a lost receipt (a crash, a
// timeout, an expired lease) the worker asks Reconcile under the same key
// before anything is redelivered.
//
// Implementations live below this package: channels/webpush,
// channels/resend, channels/telegram, channels/sink and the scriptable
// channels/fake for tests. channels/channeltest holds the conformance suite
// every provider passes.
package channels

import (
	"context"

	"github.com/outboxhq/outbox/envelope"
)

// Provider delivers messages for one channel.
//
// Implementations must be safe for concurrent use, must honour ctx
// cancellation, and must never put credentials, recipient addresses, message
// bodies or raw service error text into returned error strings, logs or
// receipts (wrap raw errors in an envelope.DeliveryError, whose text holds
// only the class).
type Provider interface {
	// Deliver sends msg under key. It returns the service's receipt, or a
	// classified error. Where the service has an idempotency mechanism,
	// key.IdempotencyKey() is passed to it.
	Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (Receipt, error)

	// Reconcile finds out whether an earlier Deliver of key (whose outcome
	// was lost) was accepted by the service. msg is the same rendered
	// message, for providers that reconcile by an idempotent replay.
	// A provider that cannot know answers Unknown; an error counts as Unknown.
	Reconcile(ctx context.Context, key envelope.Key, msg *envelope.Message) (Reconciliation, error)

	// Capabilities describes the provider.
	Capabilities() Capabilities
}

// Receipt is the service's acknowledgement of one delivery.
type Receipt struct {
	// ID is the service's message id (a Resend email id, a Telegram
	// message_id, a push message Location hash). It must not contain
	// personal data or credentials; it is stored.
	ID string `json:"id,omitempty"`
}

// Capabilities describes what a provider can promise.
type Capabilities struct {
	// Name is a low-cardinality provider name used in metrics and logs
	// ("webpush", "resend", "telegram", "sink", "fake").
	Name string
	// Channel is the channel the provider delivers on.
	Channel envelope.Channel
	// IdempotentRedelivery is true when delivering the same key twice has
	// the effect of delivering it once (a service idempotency key, a file
	// overwritten by name, a push Topic that replaces).
	IdempotentRedelivery bool
	// OneService is true when every delivery goes to one service under one
	// set of credentials (a bot token, an API key, an app's secret): a
	// refusal of the credentials, or the service out of reach, then holds
	// for every row of the channel, and the worker pauses the channel
	// instead of failing its backlog row by row. False where each message
	// has an endpoint or a key of its own (Web Push subscriptions, WeCom
	// robots, bot replies).
	OneService bool
}

// Outcome is Reconcile's answer.
type Outcome int

// Reconcile outcomes.
const (
	// Unknown: the provider cannot tell; the row becomes unresolved and is
	// never redelivered automatically.
	Unknown Outcome = iota
	// Accepted: the earlier delivery went through; the row becomes sent.
	Accepted
	// Rejected: the earlier delivery certainly did not go through; the row
	// becomes retryable.
	Rejected
)

func (o Outcome) String() string {
	switch o {
	case Accepted:
		return "accepted"
	case Rejected:
		return "rejected"
	}
	return "unknown"
}

// Reconciliation is Reconcile's result.
type Reconciliation struct {
	Outcome Outcome
	Receipt Receipt // set when Accepted and the service returned an id
}

// Suppressor receives suppression facts discovered outside a delivery (a
// Resend bounce webhook, a poller): the queue's consent store implements it.
type Suppressor interface {
	// SuppressEmail records that address must receive nothing more from
	// tenant, with reason one of envelope.ClassBounced, ClassComplaint,
	// ClassUnsubscribed.
	SuppressEmail(ctx context.Context, tenant, address string, reason envelope.ErrorClass) error
}
