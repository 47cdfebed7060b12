package resend

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/mail"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	resendapi "github.com/resend/resend-go/v2"
	"golang.org/x/time/rate"
)

// Defaults.
const (
	// DefaultBaseURL is Resend's API.
	DefaultBaseURL = "https://api.resend.com"
	// DefaultRate is the request rate shared by every API call of one
	// Provider (send, reconcile, poll): Resend's default team limit.
	DefaultRate rate.Limit = 2
	// DefaultBurst is the rate limiter's default burst.
	DefaultBurst = 1
	// DefaultTimeout is the timeout of the default HTTP client.
	DefaultTimeout = 30 * time.Second
	// IdempotencyWindow is how long Resend keeps an idempotency key.
	IdempotencyWindow = 24 * time.Hour
	// ReplayMargin is how long before the end of IdempotencyWindow the
	// provider stops replaying a key (clock skew, request latency).
	ReplayMargin = 5 * time.Minute
	// TagKey is the tag carrying key.Hash()[:32] on every e-mail.
	TagKey = "outbox_key"
	// TagTenant is the tag carrying the envelope's tenant on every e-mail
	// (TenantTag: unpadded base64url, Resend's tag alphabet), so that a
	// bounce or complaint webhook suppresses the address in the tenant
	// that sent the e-mail. A tenant id longer than 192 bytes gets none.
	TagTenant = "outbox_tenant"
)

// Environment variables read by APIKeyFromEnv.
const (
	EnvAPIKey     = "RESEND_API_KEY"
	EnvAPIKeyFile = "RESEND_API_KEY_FILE"
)

// redacted replaces a secret wherever it would be printed.
const redacted = "[redacted]"

// APIKey is a Resend API key. It prints, logs and marshals as "[redacted]";
// only the provider reads its value.
type APIKey string

// String returns "[redacted]".
func (APIKey) String() string { return redacted }

// GoString returns a redacted Go syntax representation.
func (APIKey) GoString() string { return `resend.APIKey("` + redacted + `")` }

// Format writes "[redacted]" for every verb.
func (APIKey) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redacted) }

// LogValue implements slog.LogValuer.
func (APIKey) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText implements encoding.TextMarshaler (and so JSON) as "[redacted]".
func (APIKey) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// APIKeyFromEnv returns the Resend API key from the environment: the value
// of RESEND_API_KEY, or the contents of the file RESEND_API_KEY_FILE names
// (surrounding white space trimmed). Setting both, neither, or an empty file
// is an error; errors never contain the key.
func APIKeyFromEnv(getenv func(string) string) (string, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	v, file := strings.TrimSpace(getenv(EnvAPIKey)), strings.TrimSpace(getenv(EnvAPIKeyFile))
	switch {
	case v != "" && file != "":
		return "", fmt.Errorf("resend: set only one of %s and %s", EnvAPIKey, EnvAPIKeyFile)
	case v != "":
		return v, nil
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("resend: read %s: %w", EnvAPIKeyFile, err)
		}
		k := strings.TrimSpace(string(b))
		if k == "" {
			return "", fmt.Errorf("resend: the file named by %s is empty", EnvAPIKeyFile)
		}
		return k, nil
	}
	return "", fmt.Errorf("resend: %s or %s must be set", EnvAPIKey, EnvAPIKeyFile)
}

// Options configure a Provider. APIKey and From are required.
type Options struct {
	// APIKey is the Resend API key (required). Read it with APIKeyFromEnv;
	// never take it from a flag.
	APIKey APIKey
	// From is the sender, "Name <addr@verified-domain>" or a bare address
	// (required).
	From string
	// ReplyTo is an optional Reply-To address.
	ReplyTo string
	// BaseURL is the API's base URL; default DefaultBaseURL. Tests point it
	// at a local server.
	BaseURL string
	// HTTPClient is the client to use; default one with DefaultTimeout. The
	// provider uses a copy whose transport records each response's status
	// and whose CheckRedirect refuses every redirect (the API key never
	// goes to where a 3xx points; the answer is a provider error).
	HTTPClient *http.Client
	// Logger receives operational logs (statuses and classes only); default
	// slog.Default().
	Logger *slog.Logger
	// Rate is the request rate shared by every API call; default
	// DefaultRate; rate.Inf disables the limit.
	Rate rate.Limit
	// Burst is the rate limiter's burst; default DefaultBurst.
	Burst int
	// Now is the clock; default time.Now.
	Now func() time.Time
	// FirstAttempt optionally tells Reconcile when key was first sent, for
	// keys sent before this Provider was created (e.g. before a restart).
	// The provider also remembers the first attempts it made itself; the
	// earlier of the two counts. When neither knows, the key is treated as
	// outside the idempotency window.
	FirstAttempt func(key envelope.Key) (time.Time, bool)
}

// Provider sends e-mail through Resend. It implements channels.Provider and
// is safe for concurrent use.
type Provider struct {
	client  *resendapi.Client
	limiter *rate.Limiter
	from    string
	replyTo string
	log     *slog.Logger
	now     func() time.Time
	hook    func(envelope.Key) (time.Time, bool)

	mu        sync.Mutex
	first     map[string]time.Time // key.Hash() → first attempt
	lastPrune time.Time
}

var _ channels.Provider = (*Provider)(nil)

// New returns a Provider for opts. Its errors name the missing or invalid
// setting, never a value.
func New(opts Options) (*Provider, error) {
	key := strings.TrimSpace(string(opts.APIKey))
	if key == "" {
		return nil, errors.New("resend: Options.APIKey is required (set RESEND_API_KEY or RESEND_API_KEY_FILE)")
	}
	if strings.ContainsAny(key, " \t\r\n") {
		return nil, errors.New("resend: Options.APIKey contains white space")
	}
	if strings.TrimSpace(opts.From) == "" {
		return nil, errors.New("resend: Options.From is required")
	}
	if _, err := mail.ParseAddress(opts.From); err != nil {
		return nil, errors.New("resend: Options.From is not a valid e-mail address")
	}
	if opts.ReplyTo != "" {
		if _, err := mail.ParseAddress(opts.ReplyTo); err != nil {
			return nil, errors.New("resend: Options.ReplyTo is not a valid e-mail address")
		}
	}
	base := opts.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, errors.New("resend: Options.BaseURL must be an absolute http(s) URL")
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	u.RawQuery, u.Fragment = "", ""
	if opts.Rate < 0 {
		return nil, errors.New("resend: Options.Rate must not be negative")
	}
	if opts.Burst < 0 {
		return nil, errors.New("resend: Options.Burst must not be negative")
	}
	limit, burst := opts.Rate, opts.Burst
	if limit == 0 {
		limit = DefaultRate
	}
	if burst == 0 {
		burst = DefaultBurst
	}

	var hc http.Client
	if opts.HTTPClient != nil {
		hc = *opts.HTTPClient
	} else {
		hc.Timeout = DefaultTimeout
	}
	// Never follow a redirect: resend-go would resend the request, API key
	// and all, wherever the answer points (a 3xx is classified as a
	// provider error instead).
	hc.CheckRedirect = noRedirect
	base2 := hc.Transport
	if base2 == nil {
		base2 = http.DefaultTransport
	}
	hc.Transport = &capturingTransport{base: base2}

	client := resendapi.NewCustomClient(&hc, key)
	client.BaseURL = u

	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Provider{
		client:  client,
		limiter: rate.NewLimiter(limit, burst),
		from:    opts.From,
		replyTo: opts.ReplyTo,
		log:     logger.With(slog.String("provider", "resend")),
		now:     now,
		hook:    opts.FirstAttempt,
		first:   make(map[string]time.Time),
	}, nil
}

// Capabilities reports Name "resend", Channel email and idempotent
// redelivery (Resend's Idempotency-Key).
func (p *Provider) Capabilities() channels.Capabilities {
	return channels.Capabilities{Name: "resend", Channel: envelope.ChannelEmail, IdempotentRedelivery: true, OneService: true}
}

// Deliver sends msg.Email under key.IdempotencyKey(). It returns the e-mail
// id as the receipt, or an *envelope.DeliveryError (see the package doc for
// the mapping). It waits for the shared rate limiter, honouring ctx.
func (p *Provider) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	req, err := p.request(key, msg)
	if err != nil {
		return channels.Receipt{}, err
	}
	p.noteFirstAttempt(key)
	id, x, err := p.send(ctx, key, req)
	if err != nil {
		return channels.Receipt{}, p.failure(ctx, "send", x, err)
	}
	p.log.LogAttrs(ctx, slog.LevelDebug, "resend accepted e-mail", slog.String("op", "send"), slog.Int("status", x.status))
	return channels.Receipt{ID: id}, nil
}

// Reconcile finds out whether an earlier Deliver of key went through, by
// replaying the same request under the same idempotency key while Resend
// still keeps the key: the original id → Accepted; 400/422 → Rejected; 409
// invalid_idempotent_request → Unknown. Outside the window (or when the
// first attempt is not known) it answers Unknown without calling Resend.
// Other failures answer Unknown with the classified error.
func (p *Provider) Reconcile(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Reconciliation, error) {
	unknown := channels.Reconciliation{Outcome: channels.Unknown}
	first, ok := p.firstAttempt(key)
	if !ok || p.now().Sub(first) >= IdempotencyWindow-ReplayMargin {
		p.log.LogAttrs(ctx, slog.LevelInfo, "resend reconcile: idempotency window passed or first attempt unknown; outcome unknown",
			slog.String("op", "reconcile"), slog.Bool("first_attempt_known", ok))
		return unknown, nil
	}
	req, err := p.request(key, msg)
	if err != nil {
		return unknown, err
	}
	id, x, err := p.send(ctx, key, req)
	if err == nil {
		p.log.LogAttrs(ctx, slog.LevelInfo, "resend reconcile: accepted", slog.String("op", "reconcile"), slog.Int("status", x.status))
		return channels.Reconciliation{Outcome: channels.Accepted, Receipt: channels.Receipt{ID: id}}, nil
	}
	de := p.failure(ctx, "reconcile", x, err)
	if x != nil {
		switch {
		case x.status == http.StatusBadRequest || x.status == http.StatusUnprocessableEntity:
			return channels.Reconciliation{Outcome: channels.Rejected}, nil
		case x.status == http.StatusConflict && knownName(x.body.Name) == nameInvalidIdempotentRequest:
			return unknown, nil
		}
	}
	return unknown, de
}

// send waits for the limiter and posts req. x is the call's exchange (nil
// when the request never started).
func (p *Provider) send(ctx context.Context, key envelope.Key, req *resendapi.SendEmailRequest) (string, *exchange, error) {
	if err := p.wait(ctx); err != nil {
		return "", nil, err
	}
	x := &exchange{}
	resp, err := p.client.Emails.SendWithOptions(withExchange(ctx, x), req,
		&resendapi.SendEmailOptions{IdempotencyKey: key.IdempotencyKey()})
	if err != nil {
		return "", x, err
	}
	if resp == nil || !validID(resp.Id) {
		return "", x, errNoID
	}
	return resp.Id, x, nil
}

// wait takes a token from the shared rate limiter.
func (p *Provider) wait(ctx context.Context) error {
	if err := p.limiter.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errLimiter
	}
	return nil
}

// validID reports whether id looks like a Resend object id (a UUID): short,
// and only letters, digits, '-' and '_'. Anything else is not stored.
func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Local validation failures (no network call made).
var (
	errNoEmail      = errors.New("resend: message has no e-mail")
	errWrongChannel = errors.New("resend: message is not for the email channel")
	errNoRecipient  = errors.New("resend: message has no valid recipient")
	errNoSubject    = errors.New("resend: message has no subject")
	errNoBody       = errors.New("resend: message has neither text nor HTML")
	errBadHeader    = errors.New("resend: message has an invalid header")
)

// request builds the API request for msg. The same key and msg always give
// the same request body, so a replay matches the original.
func (p *Provider) request(key envelope.Key, msg *envelope.Message) (*resendapi.SendEmailRequest, error) {
	if msg == nil || msg.Email == nil {
		return nil, envelope.Permanent(envelope.ClassInvalidRequest, errNoEmail)
	}
	if msg.Channel != "" && msg.Channel != envelope.ChannelEmail {
		return nil, envelope.Permanent(envelope.ClassInvalidRequest, errWrongChannel)
	}
	m := msg.Email
	to := strings.TrimSpace(m.To)
	if to == "" {
		return nil, envelope.Permanent(envelope.ClassInvalidRecipient, errNoRecipient)
	}
	if _, err := mail.ParseAddress(to); err != nil {
		return nil, envelope.Permanent(envelope.ClassInvalidRecipient, errNoRecipient)
	}
	if strings.TrimSpace(m.Subject) == "" {
		return nil, envelope.Permanent(envelope.ClassInvalidRequest, errNoSubject)
	}
	if m.HTML == "" && m.Text == "" {
		return nil, envelope.Permanent(envelope.ClassInvalidRequest, errNoBody)
	}
	var headers map[string]string
	for _, h := range m.Headers {
		if !validHeaderName(h.Name) || strings.ContainsAny(h.Value, "\r\n\x00") {
			return nil, envelope.Permanent(envelope.ClassInvalidRequest, errBadHeader)
		}
		if headers == nil {
			headers = make(map[string]string, len(m.Headers))
		}
		headers[h.Name] = h.Value // a later header of the same name replaces an earlier one
	}
	return &resendapi.SendEmailRequest{
		From:    p.from,
		To:      []string{to},
		Subject: m.Subject,
		ReplyTo: p.replyTo,
		Html:    m.HTML,
		Text:    m.Text,
		Headers: headers,
		Tags:    tags(key, m.Tags),
	}, nil
}

// validHeaderName reports whether s is an RFC 5322 field name.
func validHeaderName(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return true
}

// maxTagLen is Resend's limit on a tag name or value.
const maxTagLen = 256

// sanitizeTag maps s to Resend's tag alphabet (ASCII letters, digits, '_'
// and '-'): any other byte becomes '_', and the result is cut at 256 bytes.
func sanitizeTag(s string) string {
	b := []byte(s)
	if len(b) > maxTagLen {
		b = b[:maxTagLen]
	}
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	return string(b)
}

// tags returns the e-mail's tags: TagKey = key.Hash()[:32], TagTenant =
// TenantTag(key.Tenant) (when the tenant fits in a tag), then extra
// sanitised, sorted by name; a name that collides with TagKey, TagTenant
// or an earlier (sorted) name is dropped, as is an empty name.
func tags(key envelope.Key, extra map[string]string) []resendapi.Tag {
	out := []resendapi.Tag{{Name: TagKey, Value: key.Hash()[:32]}}
	if v, ok := TenantTag(key.Tenant); ok {
		out = append(out, resendapi.Tag{Name: TagTenant, Value: v})
	}
	names := make([]string, 0, len(extra))
	for n := range extra {
		names = append(names, n)
	}
	sort.Strings(names)
	seen := map[string]bool{TagKey: true, TagTenant: true}
	for _, n := range names {
		sn := sanitizeTag(n)
		if sn == "" || seen[sn] {
			continue
		}
		seen[sn] = true
		out = append(out, resendapi.Tag{Name: sn, Value: sanitizeTag(extra[n])})
	}
	return out
}

// TenantTag returns the value of the TagTenant tag for tenant ("" is
// envelope.DefaultTenant): its unpadded base64url encoding, whose alphabet
// is Resend's tag alphabet. ok is false when it would be longer than a tag
// may be (a tenant id of more than 192 bytes).
func TenantTag(tenant string) (string, bool) {
	if tenant == "" {
		tenant = envelope.DefaultTenant
	}
	v := base64.RawURLEncoding.EncodeToString([]byte(tenant))
	return v, len(v) <= maxTagLen
}

// TenantFromTag decodes a TagTenant value. ok is false when v is not the
// encoding of a valid tenant id (non-empty, at most envelope.MaxIDBytes,
// UTF-8 without control characters).
func TenantFromTag(v string) (string, bool) {
	if v == "" || len(v) > maxTagLen {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil || len(b) == 0 || len(b) > envelope.MaxIDBytes || !utf8.Valid(b) {
		return "", false
	}
	for _, r := range string(b) {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return "", false
		}
	}
	return string(b), true
}

// noteFirstAttempt remembers the first time key was sent, and prunes
// entries older than the idempotency window about once an hour.
func (p *Provider) noteFirstAttempt(key envelope.Key) {
	now := p.now()
	h := key.Hash()
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.first[h]; !ok {
		p.first[h] = now
	}
	if now.Sub(p.lastPrune) >= time.Hour {
		for k, t := range p.first {
			if now.Sub(t) >= IdempotencyWindow {
				delete(p.first, k)
			}
		}
		p.lastPrune = now
	}
}

// firstAttempt returns when key was first sent, as far as anyone knows.
func (p *Provider) firstAttempt(key envelope.Key) (time.Time, bool) {
	p.mu.Lock()
	t, ok := p.first[key.Hash()]
	p.mu.Unlock()
	if p.hook != nil {
		if ht, hok := p.hook(key); hok && (!ok || ht.Before(t)) {
			t, ok = ht, true
		}
	}
	return t, ok
}
