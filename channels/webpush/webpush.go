// Package webpush is the push channel's provider: it delivers rendered
// envelope.PushMessage notifications over Web Push (RFC 8030, encrypted per
// RFC 8291, authenticated with VAPID per RFC 8292) using
// github.com/SherClockHolmes/webpush-go.
//
// # Configuration
//
// The caller passes the VAPID key pair (see KeysFromEnv and GenerateKeys;
// `outbox vapid-keys` prints or writes a pair) and a Subscriber contact, a
// bare e-mail address or an https URL. webpush-go adds "mailto:" itself, so
// a leading "mailto:" given here is stripped (a doubled prefix makes Apple
// answer 403 BadJwtToken).
//
// # What is sent
//
//   - TTL, Topic and Urgency come from the rendered message. A zero TTL is
//     replaced by DefaultTTL (a TTL of 0 means "deliver now or drop"); an
//     empty Topic by the first 32 hex digits of key.Hash(), so a redelivery
//     of the same key replaces the undelivered earlier one.
//   - The encrypted body is padded to Options.RecordSize (DefaultRecordSize,
//     2048: Firefox on Android rejects 4096-byte bodies with 413). A payload
//     longer than RecordSize−103 bytes fails at once, before any network
//     call, as a permanent payload_too_large error.
//   - The payload is copied for each send (webpush-go v1.4.0 writes its
//     padding into the caller's buffer).
//   - Endpoints must be https URLs of public hosts: the host is resolved and
//     every address checked against IANA's IPv4 and IPv6 special-purpose
//     registries (loopback, private, link-local, shared, documentation,
//     benchmarking, reserved, multicast, …; an IPv4-mapped, NAT64 or 6to4
//     address by the IPv4 address it embeds), and the default HTTP client
//     checks the address again when it connects. No client follows
//     redirects, a caller's included.
//     Options.AllowInsecureEndpoints lifts this for tests.
//
// # Outcomes
//
//	2xx            sent; the receipt is a hash of the Location header
//	404, 410       recipient gone (subscription_gone): drop that subscription
//	413            permanent (payload_too_large)
//	429            retryable (rate_limited), Retry-After honoured
//	400, other 4xx permanent (invalid_request)
//	401, 403       permanent (auth_failed); an operator hint is logged
//	5xx            retryable (provider_unavailable)
//	3xx            retryable (provider_unavailable); a redirect is never followed
//	network error  retryable (network_error, or timeout)
//
// # Reconciliation
//
// A push service cannot be asked whether a message was accepted, so
// Reconcile answers Unknown (the row becomes unresolved for an operator)
// unless Options.RedeliverOnReconcile is set. Then Reconcile sends the same
// message again under the same Topic, which replaces the earlier one if it
// is still undelivered (at worst the device shows it twice, when the first
// was already displayed), and answers Accepted on 2xx and Rejected on
// 404/410.
//
// Errors are envelope.DeliveryError values whose text (and whose wrapped
// cause's text) holds no endpoint, key, payload or raw service answer.
package webpush

import (
	"context"
	"crypto/ecdh"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	wp "github.com/SherClockHolmes/webpush-go"
	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
)

// Defaults.
const (
	// DefaultTTL is the TTL used when a message has none: 4 weeks, the
	// longest most push services keep a message.
	DefaultTTL = 28 * 24 * time.Hour
	// DefaultRecordSize is the default encrypted body size in bytes.
	DefaultRecordSize = 2048
	// MaxRecordSize is the largest RecordSize: push services must accept
	// bodies up to 4096 bytes (RFC 8030 §7.2), not more.
	MaxRecordSize = 4096
	// MinRecordSize is the smallest RecordSize accepted.
	MinRecordSize = 128
	// RecordOverhead is what encryption adds to a payload: an 86-byte
	// header, a 1-byte padding delimiter and a 16-byte tag. A payload fits
	// when len(payload) <= RecordSize - RecordOverhead.
	RecordOverhead = 103
	// DefaultRequestTimeout bounds one request of the default HTTP client.
	DefaultRequestTimeout = 30 * time.Second
	// maxTopicLen is RFC 8030 §5.4's limit.
	maxTopicLen = 32
	// drainLimit bounds how much of a response body is read before closing.
	drainLimit = 64 << 10
)

// Name is the provider's name in Capabilities, metrics and logs.
const Name = "webpush"

// Options configures a Provider.
type Options struct {
	// VAPIDPublicKey is the VAPID public key (URL-safe base64 of the
	// uncompressed P-256 point); required.
	VAPIDPublicKey string
	// VAPIDPrivateKey is the matching private key; required. It prints as
	// "[redacted]".
	VAPIDPrivateKey Secret
	// Subscriber is the contact put in the VAPID JWT's "sub": a bare e-mail
	// address ("ops@example.com") or an https URL; required. A leading
	// "mailto:" is stripped. Apple rejects localhost addresses, so they are
	// refused here.
	Subscriber string
	// RecordSize is the encrypted body size in bytes, between MinRecordSize
	// and MaxRecordSize; 0 means DefaultRecordSize (2048).
	RecordSize int
	// HTTPClient sends the requests. nil means a client that dials only
	// public addresses, follows no redirects, uses no proxy and times out
	// after DefaultRequestTimeout. A caller's client is used through a
	// copy whose CheckRedirect refuses every redirect (a 3xx answer is a
	// provider error, never followed); the endpoint's addresses are still
	// checked before each send.
	HTTPClient *http.Client
	// Logger receives one record per delivery (status and error class
	// only). nil means slog.Default().
	Logger *slog.Logger
	// AllowInsecureEndpoints accepts http endpoints and loopback, private
	// and link-local addresses. For tests against a local server only.
	AllowInsecureEndpoints bool
	// RedeliverOnReconcile makes Reconcile re-send the message (same
	// Topic, so it replaces an undelivered earlier copy) instead of
	// answering Unknown. See the package documentation.
	RedeliverOnReconcile bool
}

// Provider delivers push messages. It is safe for concurrent use.
type Provider struct {
	keys       Keys
	subscriber string
	recordSize int
	client     *http.Client
	log        *slog.Logger
	insecure   bool
	redeliver  bool
	lookup     lookupFunc
}

var _ channels.Provider = (*Provider)(nil)

// New validates opts and returns a Provider. Its errors name the setting at
// fault, never its value.
func New(opts Options) (*Provider, error) {
	keys := Keys{Public: strings.TrimSpace(opts.VAPIDPublicKey), Private: Secret(strings.TrimSpace(string(opts.VAPIDPrivateKey)))}
	switch {
	case keys.Public == "":
		return nil, errors.New("webpush: Options.VAPIDPublicKey is empty (generate a pair with `outbox vapid-keys`)")
	case keys.Private == "":
		return nil, errors.New("webpush: Options.VAPIDPrivateKey is empty (generate a pair with `outbox vapid-keys`)")
	}
	if err := keys.checkNamed("Options.VAPIDPublicKey", "Options.VAPIDPrivateKey"); err != nil {
		return nil, err
	}
	sub, err := normalizeSubscriber(opts.Subscriber)
	if err != nil {
		return nil, err
	}
	rs := opts.RecordSize
	if rs == 0 {
		rs = DefaultRecordSize
	}
	if rs < MinRecordSize || rs > MaxRecordSize {
		return nil, fmt.Errorf("webpush: Options.RecordSize must be between %d and %d (0 = %d)", MinRecordSize, MaxRecordSize, DefaultRecordSize)
	}
	var client *http.Client
	switch {
	case opts.HTTPClient != nil:
		// A copy that never follows a redirect, whatever the caller's
		// client would do.
		c := *opts.HTTPClient
		c.CheckRedirect = noRedirect
		client = &c
	case opts.AllowInsecureEndpoints:
		client = &http.Client{Timeout: DefaultRequestTimeout, CheckRedirect: noRedirect}
	default:
		client = guardedClient()
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Provider{
		keys:       keys,
		subscriber: sub,
		recordSize: rs,
		client:     client,
		log:        log.With(slog.String("component", "channels/webpush"), slog.String("provider", Name)),
		insecure:   opts.AllowInsecureEndpoints,
		redeliver:  opts.RedeliverOnReconcile,
		lookup:     net.DefaultResolver.LookupNetIP,
	}, nil
}

// normalizeSubscriber checks a VAPID subscriber and strips a "mailto:"
// prefix (webpush-go adds its own).
func normalizeSubscriber(s string) (string, error) {
	s = strings.TrimSpace(s)
	if len(s) >= len("mailto:") && strings.EqualFold(s[:len("mailto:")], "mailto:") {
		s = strings.TrimSpace(s[len("mailto:"):])
	}
	if s == "" {
		return "", errors.New("webpush: Options.Subscriber is empty (set a contact e-mail address or https URL)")
	}
	if len(s) >= len("https:") && strings.EqualFold(s[:len("https:")], "https:") {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return "", errors.New("webpush: Options.Subscriber is not a valid https URL")
		}
		return "https:" + s[len("https:"):], nil
	}
	if strings.Contains(s, ":") || strings.ContainsAny(s, " \t\r\n<>") {
		return "", errors.New("webpush: Options.Subscriber must be an e-mail address or an https URL")
	}
	at := strings.LastIndexByte(s, '@')
	if at <= 0 || at == len(s)-1 {
		return "", errors.New("webpush: Options.Subscriber must be an e-mail address or an https URL")
	}
	if d := strings.ToLower(s[at+1:]); d == "localhost" || strings.HasSuffix(d, ".localhost") {
		return "", errors.New("webpush: Options.Subscriber must not be a localhost address (Apple answers 403 BadJwtToken)")
	}
	return s, nil
}

// Capabilities reports Name "webpush", channel push and idempotent
// redelivery (a redelivery under the same Topic replaces the earlier
// message).
func (p *Provider) Capabilities() channels.Capabilities {
	return channels.Capabilities{Name: Name, Channel: envelope.ChannelPush, IdempotentRedelivery: true}
}

// PublicKey returns the VAPID public key, for an application to hand to
// browsers as applicationServerKey.
func (p *Provider) PublicKey() string { return p.keys.Public }

// Deliver encrypts msg.Push's payload for its subscription and posts it to
// the subscription's push service. See the package documentation for the
// outcome mapping. It blocks until the service answers or ctx is done.
func (p *Provider) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	rec, status, err := p.send(ctx, key, msg)
	p.logResult(ctx, "deliver", status, err)
	return rec, err
}

// Reconcile answers Unknown, unless Options.RedeliverOnReconcile is set: then
// it re-sends msg under the same Topic and answers Accepted on 2xx, Rejected
// on 404/410, and Unknown with the classified error otherwise.
func (p *Provider) Reconcile(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Reconciliation, error) {
	if !p.redeliver {
		return channels.Reconciliation{Outcome: channels.Unknown}, nil
	}
	rec, status, err := p.send(ctx, key, msg)
	p.logResult(ctx, "reconcile", status, err)
	if err == nil {
		return channels.Reconciliation{Outcome: channels.Accepted, Receipt: rec}, nil
	}
	if de := envelope.Classify(err); de.Kind == envelope.KindRecipientGone {
		return channels.Reconciliation{Outcome: channels.Rejected}, nil
	}
	return channels.Reconciliation{Outcome: channels.Unknown}, err
}

// send does one delivery; status is the HTTP status (0 when none).
func (p *Provider) send(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, int, error) {
	if msg == nil || msg.Push == nil || (msg.Channel != "" && msg.Channel != envelope.ChannelPush) {
		return channels.Receipt{}, 0, envelope.Permanent(envelope.ClassInvalidRequest, errNotPush)
	}
	pm := msg.Push
	sub := pm.Subscription
	u, err := parseEndpoint(sub.Endpoint, p.insecure)
	if err != nil {
		return channels.Receipt{}, 0, envelope.Permanent(envelope.ClassInvalidRecipient, err)
	}
	if err := checkSubscriptionKeys(sub.Keys); err != nil {
		return channels.Receipt{}, 0, envelope.Permanent(envelope.ClassInvalidRecipient, err)
	}
	if max := p.recordSize - RecordOverhead; len(pm.Payload) > max {
		return channels.Receipt{}, 0, envelope.Permanent(envelope.ClassPayloadTooLarge, wp.ErrMaxPadExceeded)
	}
	topic := pm.Topic
	if topic == "" {
		topic = key.Hash()[:maxTopicLen]
	}
	if !validTopic(topic) {
		return channels.Receipt{}, 0, envelope.Permanent(envelope.ClassInvalidRequest, errBadTopic)
	}
	urgency := wp.Urgency(pm.Urgency)
	switch pm.Urgency {
	case "", envelope.UrgencyVeryLow, envelope.UrgencyLow, envelope.UrgencyNormal, envelope.UrgencyHigh:
	default:
		return channels.Receipt{}, 0, envelope.Permanent(envelope.ClassInvalidRequest, errBadUrgency)
	}
	if err := ctx.Err(); err != nil {
		return channels.Receipt{}, 0, classifyNetErr(err)
	}
	if !p.insecure {
		if err := checkHost(ctx, p.lookup, u.Hostname()); err != nil {
			return channels.Receipt{}, 0, classifyNetErr(err)
		}
	}

	// webpush-go v1.4.0 appends its padding to the message slice, which
	// writes into the caller's array when it has spare capacity: send a
	// private copy.
	payload := make([]byte, len(pm.Payload))
	copy(payload, pm.Payload)
	resp, err := wp.SendNotificationWithContext(ctx, payload,
		&wp.Subscription{Endpoint: sub.Endpoint, Keys: wp.Keys{Auth: sub.Keys.Auth, P256dh: sub.Keys.P256dh}},
		&wp.Options{
			HTTPClient:      p.client,
			RecordSize:      uint32(p.recordSize),
			Subscriber:      p.subscriber,
			Topic:           topic,
			TTL:             ttlSeconds(pm.TTL),
			Urgency:         urgency,
			VAPIDPublicKey:  p.keys.Public,
			VAPIDPrivateKey: string(p.keys.Private),
		})
	if err != nil {
		if resp != nil && resp.Body != nil {
			drain(resp.Body)
		}
		if errors.Is(err, wp.ErrMaxPadExceeded) {
			return channels.Receipt{}, 0, envelope.Permanent(envelope.ClassPayloadTooLarge, wp.ErrMaxPadExceeded)
		}
		return channels.Receipt{}, 0, classifyNetErr(err)
	}
	defer drain(resp.Body)
	if err := classifyStatus(resp); err != nil {
		return channels.Receipt{}, resp.StatusCode, err
	}
	return channels.Receipt{ID: receiptID(resp.Header.Get("Location"), key)}, resp.StatusCode, nil
}

// ttlSeconds converts a message TTL to the TTL header's whole seconds
// (rounded up, at least 1); a TTL ≤ 0 means DefaultTTL.
func ttlSeconds(ttl time.Duration) int {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	s := math.Ceil(ttl.Seconds())
	if s > math.MaxInt32 {
		return math.MaxInt32
	}
	return max(1, int(s))
}

// validTopic reports whether t is ≤ 32 characters of the URL-safe base64
// alphabet (RFC 8030 §5.4).
func validTopic(t string) bool {
	if t == "" || len(t) > maxTopicLen {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// checkSubscriptionKeys checks that p256dh is a P-256 public key and auth a
// 16-byte secret, in any base64 flavour webpush-go accepts.
func checkSubscriptionKeys(k envelope.PushKeys) error {
	dh, err := decodeSubscriptionKey(k.P256dh)
	if err != nil {
		return errBadSubscriptionKeys
	}
	if _, err := ecdh.P256().NewPublicKey(dh); err != nil {
		return errBadSubscriptionKeys
	}
	auth, err := decodeSubscriptionKey(k.Auth)
	if err != nil || len(auth) != 16 {
		return errBadSubscriptionKeys
	}
	return nil
}

// decodeSubscriptionKey decodes standard or URL-safe base64, padded or not.
func decodeSubscriptionKey(s string) ([]byte, error) {
	s = strings.TrimRight(s, "=")
	if b, err := base64.RawURLEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(s)
}

// receiptID is an opaque digest of the push message resource's Location
// (the URL itself identifies the subscription, so it is never stored). When
// the service sent none, the key's digest stands in.
func receiptID(location string, key envelope.Key) string {
	if location == "" {
		return "key-" + key.Hash()[:32]
	}
	sum := sha256.Sum256([]byte(location))
	return "loc-" + hex.EncodeToString(sum[:16])
}

// drain reads a bounded amount of body (so the connection can be reused)
// and closes it.
func drain(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, drainLimit))
	_ = body.Close()
}

// logResult writes one record for a send: operation, status and class only.
func (p *Provider) logResult(ctx context.Context, op string, status int, err error) {
	channels.LogRequest(ctx, p.log, "push", channels.Request{Operation: op, Status: status}, err,
		func(_ error, de *envelope.DeliveryError) (slog.Level, string) {
			if de.Class == envelope.ClassAuthFailed {
				return slog.LevelWarn, "the push service refused the VAPID credentials: check that " +
					EnvPublicKey + "/" + EnvPrivateKey + " are the pair the browsers subscribed with (rotating them strands every subscription) " +
					"and that the subscriber is a real mailto address or https URL, not localhost"
			}
			return slog.LevelInfo, ""
		})
}
