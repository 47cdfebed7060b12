package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// ConsentFlags are the user-settable consent flags (SPEC §5).
type ConsentFlags struct {
	DigestEnabled bool   `json:"digest_enabled"`
	PushEnabled   bool   `json:"push_enabled"`
	EmailVerified bool   `json:"email_verified"`
	Cadence       string `json:"cadence,omitempty"`
	// By says who set the flags (the app's word: "user", "admin", ...;
	// outbox consent set says "cli"), kept in the history.
	By string `json:"by,omitempty"`
}

// Consent is a user's current consent: the flags, the suppressions and
// the history of changes (newest last, at most MaxConsentHistory).
type Consent struct {
	ConsentFlags
	Suppressions []Suppression   `json:"suppressions,omitempty"`
	UpdatedAt    time.Time       `json:"updated_at,omitzero"`
	History      []ConsentChange `json:"history,omitempty"`
}

// ConsentChange is one entry of a user's consent history.
type ConsentChange struct {
	At     time.Time `json:"at"`
	By     string    `json:"by,omitempty"`
	Change string    `json:"change"`
}

// MaxConsentHistory bounds a user's consent history (older entries go).
const MaxConsentHistory = 50

func (c *Consent) note(at time.Time, by, format string, a ...any) {
	c.History = append(c.History, ConsentChange{At: at, By: by, Change: fmt.Sprintf(format, a...)})
	if n := len(c.History) - MaxConsentHistory; n > 0 {
		c.History = slices.Delete(c.History, 0, n)
	}
}

// optInFlag returns the flag of f that opts in to channel ch, or nil when
// ch has none (its unsubscribes are lifted by an operator: Lift).
func optInFlag(f *ConsentFlags, ch envelope.Channel) *bool {
	switch ch {
	case envelope.ChannelEmail, envelope.ChannelWeCom:
		return &f.DigestEnabled
	case envelope.ChannelPush:
		return &f.PushEnabled
	}
	return nil
}

// optsIn reports whether an explicit opt-in in f covers channel ch.
func (f ConsentFlags) optsIn(ch envelope.Channel) bool {
	p := optInFlag(&f, ch)
	return p != nil && *p
}

// OptIn returns f with channel ch's opt-in flag set, which Set takes as
// an explicit opt-in that lifts ch's unsubscribes; ok is false when ch
// has no such flag.
func (f ConsentFlags) OptIn(ch envelope.Channel) (_ ConsentFlags, ok bool) {
	p := optInFlag(&f, ch)
	if p == nil {
		return f, false
	}
	*p = true
	return f, true
}

// Set is the rule every store applies to SetConsent: the flags replace
// the old ones, and an explicit opt-in (digest_enabled for e-mail,
// push_enabled for push) lifts that channel's unsubscribes: the user
// asked again. Bounces, complaints and gone subscriptions stay (an
// operator lifts them: Lift). Both go into the history.
func (c *Consent) Set(f ConsentFlags, now time.Time) {
	c.ConsentFlags = f
	c.UpdatedAt = now
	c.note(now, f.By, "set digest_enabled=%v push_enabled=%v email_verified=%v cadence=%s", f.DigestEnabled, f.PushEnabled, f.EmailVerified, f.Cadence)
	c.Suppressions = slices.DeleteFunc(c.Suppressions, func(s Suppression) bool {
		if s.Reason == envelope.ClassUnsubscribed && f.optsIn(s.Channel) {
			c.note(now, f.By, "lifted %s %s: opted in again", s.Channel, s.Reason)
			return true
		}
		return false
	})
}

// Lift removes the user's suppressions of channel ch (of target only,
// when target is not ""), whatever their reason: an operator checked. It
// reports whether one was lifted.
func (c *Consent) Lift(ch envelope.Channel, target, by string, now time.Time) bool {
	n := len(c.Suppressions)
	c.Suppressions = slices.DeleteFunc(c.Suppressions, func(s Suppression) bool {
		if s.Channel == ch && (target == "" || s.Target == target) {
			c.note(now, by, "lifted %s %s", s.Channel, s.Reason)
			return true
		}
		return false
	})
	if len(c.Suppressions) != n {
		c.UpdatedAt = now
		return true
	}
	return false
}

// Suppression stops deliveries on a channel, or to one target on it.
type Suppression struct {
	Channel envelope.Channel `json:"channel"`
	// Target is "" for the whole channel, or TargetOf(recipient) for one
	// address, push subscription or chat (an opaque hash: no personal data).
	Target string              `json:"target,omitempty"`
	Reason envelope.ErrorClass `json:"reason"` // bounced, complaint, unsubscribed, subscription_gone, blocked_by_user
	At     time.Time           `json:"at"`
}

// ConsentSource supplies current consent from the embedding app instead of
// the store's own records. Consent is called inside the store's claim and
// enqueue paths: it must be fast and must not call back into the store.
// found=false means the app has no record for the user (treated as no
// consent for digests and nudges).
type ConsentSource interface {
	Consent(ctx context.Context, tenant, userID string) (c Consent, found bool, err error)
}

// TargetOf returns the opaque suppression target of an envelope's recipient
// on its channel: a hash of the address, the push endpoint or the chat id.
func TargetOf(e *envelope.Envelope) string {
	var v string
	switch e.Channel {
	case envelope.ChannelEmail:
		v = "email:" + e.Recipient.Email
	case envelope.ChannelPush:
		if e.Recipient.PushSubscription != nil {
			v = "push:" + e.Recipient.PushSubscription.Endpoint
		}
	case envelope.ChannelTelegram:
		v = "telegram:" + e.Recipient.ChatID
	case envelope.ChannelWeCom:
		// A member is reached through an app: suppressing one app's
		// recipient leaves the others.
		v = "wecom:" + e.Recipient.WeComAgent + ":" + e.Recipient.WeComUser
	case envelope.ChannelWeComRobot:
		v = "wecom_robot:" + e.Recipient.Robot
	case envelope.ChannelWeComBotReply:
		v = "wecom_bot_reply:" + e.Recipient.ResponseURL
	}
	if v == "" {
		return ""
	}
	return TargetOfValue(v)
}

// TargetOfValue hashes "channel:address" into a suppression target.
func TargetOfValue(v string) string {
	h := sha256.Sum256([]byte(v))
	return hex.EncodeToString(h[:16])
}

// ConsentRules says what each channel needs, for refusals and docs.
const ConsentRules = "email needs digest_enabled and email_verified; push needs push_enabled; telegram needs no opt-in; wecom needs digest_enabled for a digest or a nudge and no opt-in for a reply; wecom_robot and wecom_bot_reply need no opt-in"

// Allows reports whether current consent c (found says whether a record
// exists) allows delivering e, and if not, the class that says why
// (ConsentRules):
//
//   - email needs digest_enabled and email_verified;
//   - push needs push_enabled;
//   - telegram (chat replies answer the user) needs no opt-in;
//   - wecom needs digest_enabled for a digest or a nudge, and no opt-in
//     for a reply; wecom_robot and wecom_bot_reply (replies) need none;
//   - a suppression of the channel or of the recipient's target forbids;
//   - without a record, email, push and a wecom digest or nudge are
//     refused as no_consent.
func (c *Consent) Allows(found bool, e *envelope.Envelope) (bool, envelope.ErrorClass) {
	target := TargetOf(e)
	for _, s := range c.Suppressions {
		if s.Channel == e.Channel && (s.Target == "" || s.Target == target) {
			return false, s.Reason
		}
	}
	needs := false
	switch e.Channel {
	case envelope.ChannelEmail:
		needs = !c.DigestEnabled || !c.EmailVerified
	case envelope.ChannelPush:
		needs = !c.PushEnabled
	case envelope.ChannelWeCom:
		if e.Template == envelope.TemplateReply {
			return true, ""
		}
		needs = !c.DigestEnabled
	default:
		return true, ""
	}
	switch {
	case !found:
		return false, envelope.ClassNoConsent
	case needs:
		return false, envelope.ClassConsentWithdrawn
	}
	return true, ""
}

// SuppressionFor returns the suppression a recipient-gone outcome writes
// for e: push suppresses only that subscription, email that address,
// telegram that chat.
func SuppressionFor(e *envelope.Envelope, reason envelope.ErrorClass, at time.Time) Suppression {
	return Suppression{Channel: e.Channel, Target: TargetOf(e), Reason: reason, At: at}
}

// Add adds suppression s to c unless c already has one for the same
// channel and target, and notes it in the history.
func (c *Consent) Add(s Suppression) {
	for _, x := range c.Suppressions {
		if x.Channel == s.Channel && x.Target == s.Target {
			return
		}
	}
	c.Suppressions = append(c.Suppressions, s)
	c.note(s.At, "", "suppressed %s %s", s.Channel, s.Reason)
}

// Resubscribed lifts a suppression of the push endpoint (left by an
// earlier 404/410): the browser subscribed again. It reports whether c
// changed.
func (c *Consent) Resubscribed(endpoint string) bool {
	target := TargetOfValue("push:" + endpoint)
	n := len(c.Suppressions)
	c.Suppressions = slices.DeleteFunc(c.Suppressions, func(s Suppression) bool {
		return s.Channel == envelope.ChannelPush && s.Target == target
	})
	return len(c.Suppressions) != n
}

// EmailSuppression is the suppression of one e-mail address (reason ""
// is ClassBounced).
func EmailSuppression(address string, reason envelope.ErrorClass, at time.Time) Suppression {
	if reason == "" {
		reason = envelope.ClassBounced
	}
	return Suppression{Channel: envelope.ChannelEmail, Target: TargetOfValue("email:" + address), Reason: reason, At: at}
}

// Address suppressions.
//
// A bounce or a complaint is a fact about an address, not about one user:
// the tenant keeps it as an address suppression, keyed by the address's
// target (TargetOfValue("email:"+address), never the address in clear),
// and it refuses every envelope of any user of the tenant to that address.
// Stores keep a tenant's address suppressions beside the consent records
// and apply them whatever the consent source (an app that keeps consent
// itself does not hear of bounces); Erase of a user keeps them (they name
// no user). SuppressEmail writes one; so does a committed bounce or
// complaint of an e-mail (Step.AddressSuppression).

// AddressTarget returns the target under which the tenant's address
// suppressions are looked up for e: TargetOf(e) for an e-mail envelope, ""
// for every other channel (a push subscription or a chat belongs to one
// user, and its suppression stays in that user's consent).
func AddressTarget(e *envelope.Envelope) string {
	if e.Channel != envelope.ChannelEmail {
		return ""
	}
	return TargetOf(e)
}

// Permits is the consent rule every store applies to an envelope it would
// store (Enqueue, an ingested append) and to a row it would lease (Claim,
// through Judge): the tenant's suppression of e's address (addr: the one
// stored under AddressTarget(e), nil when there is none or e has no
// address target) refuses first, whatever the user's consent says; then
// the user's current consent c (found: a record exists) decides (Allows).
// It returns whether e may go and, if not, the class that says why.
func Permits(e *envelope.Envelope, c *Consent, found bool, addr *Suppression) (bool, envelope.ErrorClass) {
	if addr != nil && addr.Target != "" && addr.Channel == e.Channel && addr.Target == AddressTarget(e) {
		if addr.Reason == "" {
			return false, envelope.ClassBounced
		}
		return false, addr.Reason
	}
	return c.Allows(found, e)
}

// CheckSubscription reports what a push subscription to be saved lacks.
func CheckSubscription(sub envelope.PushSubscription) error {
	if sub.Endpoint == "" || sub.Keys.P256dh == "" || sub.Keys.Auth == "" {
		return errors.New("queue: push subscription needs endpoint, keys.p256dh and keys.auth")
	}
	return nil
}

// ErrNoUser is returned by SetConsent, Suppress and Erase without a user id.
var ErrNoUser = errors.New("queue: user id is required")

// CheckSuppression reports what a suppression to be added lacks.
func CheckSuppression(s Suppression) error {
	if !s.Channel.Valid() {
		return fmt.Errorf("queue: suppression channel %q is not a known channel", s.Channel)
	}
	return nil
}
