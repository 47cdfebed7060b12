package resend

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/mail"
	"strconv"
	"strings"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
)

// Webhook defaults.
const (
	// WebhookTolerance is how far svix-timestamp may be from now.
	WebhookTolerance = 5 * time.Minute
	// DefaultWebhookMaxBody is the largest webhook body accepted (1 MiB).
	DefaultWebhookMaxBody = 1 << 20
	// DefaultWebhookDedupeSize is how many svix-ids are remembered.
	DefaultWebhookDedupeSize = 10000
	// DefaultWebhookDedupeTTL is how long a svix-id is remembered; it covers
	// Resend's retry schedule (about 28 h).
	DefaultWebhookDedupeTTL = 48 * time.Hour
)

// Webhook events the handler acts on.
const (
	EventEmailBounced    = "email.bounced"
	EventEmailComplained = "email.complained"
)

// Errors returned by VerifyWebhook. Their text never contains anything of
// the request.
var (
	// ErrWebhookSecret is returned when the secret is not a base64
	// ("whsec_…") key.
	ErrWebhookSecret = errors.New("resend: webhook secret is not a valid whsec_ base64 key")
	// ErrWebhookHeaders is returned when svix-id, svix-timestamp or
	// svix-signature is missing or malformed.
	ErrWebhookHeaders = errors.New("resend: webhook signature headers missing or malformed")
	// ErrWebhookTimestamp is returned when svix-timestamp is more than
	// WebhookTolerance away from now.
	ErrWebhookTimestamp = errors.New("resend: webhook timestamp outside the tolerance")
	// ErrWebhookSignature is returned when no v1 signature matches.
	ErrWebhookSignature = errors.New("resend: webhook signature does not match")
)

// maxWebhookID is the longest svix-id accepted (Svix ids are ~30 chars);
// it bounds the memory of the dedupe set.
const maxWebhookID = 256

// webhookKey decodes a webhook secret: base64 of the key, with an optional
// "whsec_" prefix.
func webhookKey(secret string) ([]byte, error) {
	s := strings.TrimPrefix(strings.TrimSpace(secret), "whsec_")
	if s == "" {
		return nil, ErrWebhookSecret
	}
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		if key, err = base64.RawStdEncoding.DecodeString(s); err != nil {
			return nil, ErrWebhookSecret
		}
	}
	if len(key) == 0 {
		return nil, ErrWebhookSecret
	}
	return key, nil
}

// VerifyWebhook checks a Resend (Svix) webhook: the svix-id,
// svix-timestamp and svix-signature headers, the timestamp within
// WebhookTolerance of now, and at least one of the space-separated
// "v1,<base64 sig>" values equal (in constant time) to
// base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")), where key is the
// base64-decoded secret without its "whsec_" prefix. body must be the raw
// request body. It returns nil or one of the ErrWebhook* errors.
func VerifyWebhook(secret string, header http.Header, body []byte, now time.Time) error {
	key, err := webhookKey(secret)
	if err != nil {
		return err
	}
	return verifyWebhook(key, header, body, now)
}

func verifyWebhook(key []byte, header http.Header, body []byte, now time.Time) error {
	id := header.Get("svix-id")
	ts := header.Get("svix-timestamp")
	sigs := header.Get("svix-signature")
	if id == "" || ts == "" || sigs == "" || len(id) > maxWebhookID {
		return ErrWebhookHeaders
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sec < 0 || sec > 1<<40 {
		return ErrWebhookHeaders
	}
	if d := now.Sub(time.Unix(sec, 0)); d > WebhookTolerance || d < -WebhookTolerance {
		return ErrWebhookTimestamp
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	want := []byte(base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	ok := 0
	for _, part := range strings.Fields(sigs) {
		version, sig, found := strings.Cut(part, ",")
		if !found || version != "v1" {
			continue
		}
		ok |= subtle.ConstantTimeCompare([]byte(sig), want)
	}
	if ok != 1 {
		return ErrWebhookSignature
	}
	return nil
}

// WebhookOptions configure a WebhookHandler. All fields are optional.
type WebhookOptions struct {
	// Tenant is the tenant suppressions are written for when an event does
	// not name one in its TagTenant tag (an e-mail sent without it: by an
	// older outbox, by another sender on the account, or for a tenant id
	// too long for a tag); default envelope.DefaultTenant.
	Tenant string
	// Logger receives operational logs (event types and outcomes only);
	// default slog.Default().
	Logger *slog.Logger
	// Now is the clock for the timestamp window and deduplication; default
	// time.Now.
	Now func() time.Time
	// MaxBodyBytes is the largest body accepted (larger → 413); default
	// DefaultWebhookMaxBody.
	MaxBodyBytes int64
	// DedupeSize is how many svix-ids are remembered; default
	// DefaultWebhookDedupeSize.
	DedupeSize int
	// DedupeTTL is how long a svix-id is remembered; default
	// DefaultWebhookDedupeTTL.
	DedupeTTL time.Duration
}

// WebhookHandler is an http.Handler for Resend's signed webhooks. It
// verifies every request (VerifyWebhook), ignores a svix-id it has already
// handled, and on email.bounced / email.complained suppresses each address
// of data.to with reason envelope.ClassBounced / envelope.ClassComplaint,
// in the tenant that sent the e-mail: the one its TagTenant tag names
// (data.tags), else WebhookOptions.Tenant.
// Other events are answered 200 and ignored. A failed suppression answers
// 500 so that Resend retries. Error answers are JSON
// {"error":{"code":…,"message":…}} and echo nothing of the request.
type WebhookHandler struct {
	key     []byte
	sup     channels.Suppressor
	tenant  string
	log     *slog.Logger
	now     func() time.Time
	maxBody int64
	seen    *seenSet
}

var _ http.Handler = (*WebhookHandler)(nil)

// NewWebhookHandler returns a handler verifying with secret (Resend's
// "whsec_…" signing secret) and writing suppressions to s.
func NewWebhookHandler(secret string, s channels.Suppressor, opts WebhookOptions) (*WebhookHandler, error) {
	key, err := webhookKey(secret)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, errors.New("resend: NewWebhookHandler: suppressor is required")
	}
	if opts.MaxBodyBytes < 0 || opts.DedupeSize < 0 || opts.DedupeTTL < 0 {
		return nil, errors.New("resend: WebhookOptions.MaxBodyBytes, DedupeSize and DedupeTTL must not be negative")
	}
	h := &WebhookHandler{key: key, sup: s, tenant: opts.Tenant, log: opts.Logger, now: opts.Now, maxBody: opts.MaxBodyBytes}
	if h.tenant == "" {
		h.tenant = envelope.DefaultTenant
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.log = h.log.With(slog.String("provider", "resend"), slog.String("component", "webhook"))
	if h.now == nil {
		h.now = time.Now
	}
	if h.maxBody == 0 {
		h.maxBody = DefaultWebhookMaxBody
	}
	size, ttl := opts.DedupeSize, opts.DedupeTTL
	if size == 0 {
		size = DefaultWebhookDedupeSize
	}
	if ttl == 0 {
		ttl = DefaultWebhookDedupeTTL
	}
	h.seen = newSeenSet(size, ttl)
	return h, nil
}

// webhookEvent is the part of a Resend event the handler reads.
type webhookEvent struct {
	Type string `json:"type"`
	Data struct {
		To   json.RawMessage `json:"to"`
		Tags json.RawMessage `json:"tags"`
	} `json:"data"`
}

// tenant returns the tenant the event's TagTenant tag names. Resend sends
// data.tags as an object of name → value; a list of {name, value} is
// accepted too. ok is false when there is no valid such tag.
func (e *webhookEvent) tenant() (string, bool) {
	if len(e.Data.Tags) == 0 {
		return "", false
	}
	var v string
	var obj map[string]json.RawMessage
	var list []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	switch {
	case json.Unmarshal(e.Data.Tags, &obj) == nil:
		if raw, ok := obj[TagTenant]; !ok || json.Unmarshal(raw, &v) != nil {
			return "", false
		}
	case json.Unmarshal(e.Data.Tags, &list) == nil:
		for _, t := range list {
			if t.Name == TagTenant {
				v = t.Value
			}
		}
	}
	return TenantFromTag(v)
}

// recipients returns data.to, which Resend sends as an array (a single
// string is accepted too).
func (e *webhookEvent) recipients() []string {
	var list []string
	if err := json.Unmarshal(e.Data.To, &list); err == nil {
		return list
	}
	var one string
	if err := json.Unmarshal(e.Data.To, &one); err == nil && one != "" {
		return []string{one}
	}
	return nil
}

// ServeHTTP implements http.Handler.
func (h *WebhookHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
		return
	}
	if r.ContentLength > h.maxBody {
		writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", "the request body is too large")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", "the request body is too large")
			return
		}
		writeError(w, http.StatusBadRequest, "bad_request", "the request body could not be read")
		return
	}
	now := h.now()
	if err := verifyWebhook(h.key, r.Header, body, now); err != nil {
		h.log.LogAttrs(r.Context(), slog.LevelWarn, "resend webhook rejected", slog.String("reason", verifyReason(err)))
		writeError(w, http.StatusUnauthorized, "bad_signature", "the webhook signature could not be verified")
		return
	}
	id := r.Header.Get("svix-id")
	if h.seen.has(id, now) {
		h.log.LogAttrs(r.Context(), slog.LevelDebug, "resend webhook duplicate ignored")
		writeJSON(w, http.StatusOK, map[string]string{"status": "duplicate"})
		return
	}
	var ev webhookEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "the body is not a JSON event")
		return
	}
	var reason envelope.ErrorClass
	switch ev.Type {
	case EventEmailBounced:
		reason = envelope.ClassBounced
	case EventEmailComplained:
		reason = envelope.ClassComplaint
	default:
		h.seen.add(id, now)
		h.log.LogAttrs(r.Context(), slog.LevelDebug, "resend webhook event ignored", slog.String("event", eventLabel(ev.Type)))
		writeJSON(w, http.StatusOK, map[string]string{"status": "ignored"})
		return
	}
	tenant, tagged := ev.tenant()
	if !tagged {
		tenant = h.tenant
	}
	n := 0
	for _, to := range ev.recipients() {
		addr, err := mail.ParseAddress(to)
		if err != nil {
			h.log.LogAttrs(r.Context(), slog.LevelWarn, "resend webhook recipient is not an address; skipped",
				slog.String("event", ev.Type))
			continue
		}
		if err := h.sup.SuppressEmail(r.Context(), tenant, addr.Address, reason); err != nil {
			h.log.LogAttrs(r.Context(), slog.LevelError, "resend webhook: recording a suppression failed; Resend will retry",
				slog.String("event", ev.Type))
			writeError(w, http.StatusInternalServerError, "internal", "the event could not be recorded")
			return
		}
		n++
	}
	h.seen.add(id, now)
	h.log.LogAttrs(r.Context(), slog.LevelInfo, "resend webhook processed",
		slog.String("event", ev.Type), slog.Int("suppressed", n), slog.Bool("tenant_tagged", tagged))
	writeJSON(w, http.StatusOK, map[string]string{"status": "processed"})
}

// eventLabel returns t when it is a known Resend event type (a bounded
// label for logs), else "other".
func eventLabel(t string) string {
	switch t {
	case "email.sent", "email.delivered", "email.delivery_delayed", EventEmailBounced, EventEmailComplained,
		"email.opened", "email.clicked", "email.failed", "email.scheduled", "email.suppressed", "email.received":
		return t
	}
	if strings.HasPrefix(t, "contact.") {
		return "contact"
	}
	if strings.HasPrefix(t, "domain.") {
		return "domain"
	}
	return "other"
}

func verifyReason(err error) string {
	switch {
	case errors.Is(err, ErrWebhookHeaders):
		return "headers"
	case errors.Is(err, ErrWebhookTimestamp):
		return "timestamp"
	}
	return "signature"
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
