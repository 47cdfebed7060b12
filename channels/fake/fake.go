// Package fake provides a deterministic, scriptable channels.Provider for
// tests (SPEC §8): an application tests its own delivery logic against it
// without network or disk.
//
// Every Deliver plays one Step: a per-key script is consumed in order, then
// the default step (Succeed unless Default changes it) applies.
//
//	p := fake.New(envelope.ChannelEmail)
//	p.Script(key, fake.FailRetryable, fake.FailRetryable) // fail twice, then succeed
//	p.Script(other, fake.LoseReceipt)                     // sent, but the caller never learns it
//
// The provider records every call (Calls) and how often the "service"
// accepted each key (Delivered), and answers Reconcile from that record, so
// a test can check that a lost receipt is reconciled instead of being sent
// twice.
package fake

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
)

// Step is what the fake service does with one Deliver call.
type Step int

// The steps a script is made of.
const (
	// Succeed: the service accepts the message; Deliver returns a receipt
	// "fake-<n>".
	Succeed Step = iota
	// FailRetryable: a transient failure, class provider_unavailable (or
	// rate_limited with a RetryAfter when SetRetryAfter set one).
	FailRetryable
	// FailPermanent: the message can never be sent as is, class
	// invalid_request.
	FailPermanent
	// Gone: the recipient is dead; the class depends on the channel
	// (bounced for email, subscription_gone for push, blocked_by_user for
	// telegram, invalid_recipient otherwise).
	Gone
	// LoseReceipt: the service accepts the message (the side effect happens
	// and Delivered counts it) but Deliver returns a retryable timeout
	// error, as when a connection drops before the response arrives.
	LoseReceipt
	// Hang: Deliver blocks until its context is done, then returns the
	// context's error classified as a retryable timeout.
	Hang
	// Panic: Deliver panics with ErrScriptedPanic; the worker must contain
	// it.
	Panic
)

// String returns the step's name.
func (s Step) String() string {
	switch s {
	case Succeed:
		return "succeed"
	case FailRetryable:
		return "fail_retryable"
	case FailPermanent:
		return "fail_permanent"
	case Gone:
		return "gone"
	case LoseReceipt:
		return "lose_receipt"
	case Hang:
		return "hang"
	case Panic:
		return "panic"
	}
	return "step(" + strconv.Itoa(int(s)) + ")"
}

// Name is the provider name the fake reports in Capabilities.
const Name = "fake"

// Call ops.
const (
	OpDeliver   = "deliver"
	OpReconcile = "reconcile"
)

// ErrScriptedPanic is the value a Panic step panics with.
var ErrScriptedPanic = errors.New("fake: scripted panic")

// errScripted is the raw cause wrapped in the DeliveryErrors of failing steps.
var errScripted = errors.New("fake: scripted failure")

// Call is one recorded call to the provider.
type Call struct {
	// Op is OpDeliver or OpReconcile.
	Op string
	// Key is the delivery key the call was made with.
	Key envelope.Key
	// Message is the message the call was made with (not copied).
	Message *envelope.Message
	// Step is the step a Deliver played; it is Succeed (zero) for Reconcile.
	Step Step
	// Outcome is the answer a Reconcile gave (Unknown for Deliver, and for
	// a Reconcile that returned an error).
	Outcome channels.Outcome
}

// ReconcileFunc answers Reconcile for keys that have no reconcile script.
type ReconcileFunc func(key envelope.Key) (channels.Reconciliation, error)

// Provider is the scriptable fake. It is safe for concurrent use.
type Provider struct {
	ch envelope.Channel

	mu          sync.Mutex
	scripts     map[envelope.Key][]Step
	recScripts  map[envelope.Key][]channels.Outcome
	reconcileFn ReconcileFunc
	def         Step
	idempotent  bool
	oneService  bool
	retryAfter  time.Duration
	onDeliver   func(envelope.Key)
	calls       []Call
	accepted    map[envelope.Key]int
	receipts    map[envelope.Key]string
	seq         int
}

// New returns a fake provider for ch on which every call succeeds.
func New(ch envelope.Channel) *Provider {
	return &Provider{
		ch:         ch,
		scripts:    make(map[envelope.Key][]Step),
		recScripts: make(map[envelope.Key][]channels.Outcome),
		idempotent: true,
		accepted:   make(map[envelope.Key]int),
		receipts:   make(map[envelope.Key]string),
	}
}

// Script appends steps to key's script. Each Deliver of key consumes the
// next step; once the script is used up, the default step applies.
func (p *Provider) Script(key envelope.Key, steps ...Step) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.scripts[key] = append(p.scripts[key], steps...)
}

// Default sets the step played by Deliver calls whose key has no script
// left (initially Succeed).
func (p *Provider) Default(step Step) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.def = step
}

// SetIdempotent sets Capabilities().IdempotentRedelivery (initially true).
func (p *Provider) SetIdempotent(idempotent bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.idempotent = idempotent
}

// SetOneService sets Capabilities().OneService (initially false).
func (p *Provider) SetOneService(one bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.oneService = one
}

// SetRetryAfter sets the RetryAfter carried by FailRetryable errors
// (0, the initial value, means none). With a RetryAfter the class is
// rate_limited.
func (p *Provider) SetRetryAfter(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retryAfter = d
}

// OnDeliver sets a hook called at the start of every Deliver, before its
// step is played (nil removes it). Tests use it as a signal, e.g. to learn
// that a worker has started a call. It is called without the provider's
// lock held and may block.
func (p *Provider) OnDeliver(fn func(key envelope.Key)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onDeliver = fn
}

// SetReconcile makes fn answer Reconcile for keys without a reconcile
// script, instead of the record of accepted keys (nil restores the record).
func (p *Provider) SetReconcile(fn ReconcileFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reconcileFn = fn
}

// ScriptReconcile appends outcomes to key's reconcile script: each
// Reconcile of key consumes the next one (an Accepted answer carries the
// key's last receipt, if any). Once the script is used up, Reconcile answers
// from SetReconcile's function or the record.
func (p *Provider) ScriptReconcile(key envelope.Key, outcomes ...channels.Outcome) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.recScripts[key] = append(p.recScripts[key], outcomes...)
}

// Calls returns a copy of every Deliver and Reconcile call, in the order
// they were made.
func (p *Provider) Calls() []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Call, len(p.calls))
	copy(out, p.calls)
	return out
}

// Delivered reports how many times the service accepted key: Succeed and
// LoseReceipt steps both count, since the side effect happened.
func (p *Provider) Delivered(key envelope.Key) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted[key]
}

// Capabilities reports the name "fake", the provider's channel and the
// idempotency set by SetIdempotent.
func (p *Provider) Capabilities() channels.Capabilities {
	p.mu.Lock()
	defer p.mu.Unlock()
	return channels.Capabilities{Name: Name, Channel: p.ch, IdempotentRedelivery: p.idempotent, OneService: p.oneService}
}

// Deliver plays key's next step.
func (p *Provider) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	p.mu.Lock()
	hook := p.onDeliver
	p.mu.Unlock()
	if hook != nil {
		hook(key)
	}

	p.mu.Lock()
	step := p.def
	if s := p.scripts[key]; len(s) > 0 {
		step = s[0]
		if len(s) == 1 {
			delete(p.scripts, key)
		} else {
			p.scripts[key] = s[1:]
		}
	}
	p.calls = append(p.calls, Call{Op: OpDeliver, Key: key, Message: msg, Step: step})
	retryAfter := p.retryAfter
	var receipt string
	if step == Succeed || step == LoseReceipt {
		receipt = p.acceptLocked(key)
	}
	p.mu.Unlock()

	switch step {
	case Succeed:
		return channels.Receipt{ID: receipt}, nil
	case FailRetryable:
		if retryAfter > 0 {
			return channels.Receipt{}, envelope.RetryAfter(envelope.ClassRateLimited, retryAfter, errScripted)
		}
		return channels.Receipt{}, envelope.Retryable(envelope.ClassProviderUnavailable, errScripted)
	case FailPermanent:
		return channels.Receipt{}, envelope.Permanent(envelope.ClassInvalidRequest, errScripted)
	case Gone:
		return channels.Receipt{}, envelope.RecipientGone(goneClass(p.ch), errScripted)
	case LoseReceipt:
		return channels.Receipt{}, envelope.Retryable(envelope.ClassTimeout, context.DeadlineExceeded)
	case Hang:
		<-ctx.Done()
		return channels.Receipt{}, envelope.Retryable(envelope.ClassTimeout, ctx.Err())
	case Panic:
		panic(ErrScriptedPanic)
	}
	return channels.Receipt{}, envelope.Permanent(envelope.ClassInvalidRequest, errors.New("fake: unknown step "+step.String()))
}

// acceptLocked records that the service accepted key and returns the new
// receipt id. p.mu must be held.
func (p *Provider) acceptLocked(key envelope.Key) string {
	p.seq++
	id := "fake-" + strconv.Itoa(p.seq)
	p.accepted[key]++
	p.receipts[key] = id
	return id
}

// goneClass is the class of a Gone step on ch.
func goneClass(ch envelope.Channel) envelope.ErrorClass {
	switch ch {
	case envelope.ChannelEmail:
		return envelope.ClassBounced
	case envelope.ChannelPush:
		return envelope.ClassSubscriptionGone
	case envelope.ChannelTelegram:
		return envelope.ClassBlockedByUser
	}
	return envelope.ClassInvalidRecipient
}

// Reconcile answers whether the service accepted key earlier: from key's
// reconcile script first, then from SetReconcile's function, else Accepted
// (with the key's last receipt) when a Succeed or LoseReceipt step accepted
// it, Rejected when nothing did.
func (p *Provider) Reconcile(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Reconciliation, error) {
	p.mu.Lock()
	var (
		r   channels.Reconciliation
		err error
	)
	if s := p.recScripts[key]; len(s) > 0 {
		r.Outcome = s[0]
		if len(s) == 1 {
			delete(p.recScripts, key)
		} else {
			p.recScripts[key] = s[1:]
		}
		if r.Outcome == channels.Accepted {
			r.Receipt.ID = p.receipts[key]
		}
	} else if fn := p.reconcileFn; fn != nil {
		// Call fn without the lock, so it may use the provider.
		p.mu.Unlock()
		r, err = fn(key)
		p.mu.Lock()
	} else if p.accepted[key] > 0 {
		r = channels.Reconciliation{Outcome: channels.Accepted, Receipt: channels.Receipt{ID: p.receipts[key]}}
	} else {
		r.Outcome = channels.Rejected
	}
	c := Call{Op: OpReconcile, Key: key, Message: msg, Outcome: r.Outcome}
	if err != nil {
		c.Outcome = channels.Unknown
	}
	p.calls = append(p.calls, c)
	p.mu.Unlock()
	return r, err
}
