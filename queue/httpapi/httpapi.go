package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/render"
)

// Defaults of Config.
const (
	DefaultMaxBody     = 1 << 20
	DefaultMaxInflight = 16 << 20
	DefaultSeamLease   = 5 * time.Minute
	// DefaultStoreTimeout is longer than pgstore's statement_timeout (30 s),
	// so that a statement the server ends says so first.
	DefaultStoreTimeout = 40 * time.Second
	// MinTokenBytes is the shortest Config.Token New accepts.
	MinTokenBytes = 16
	// MaxBatch is the most envelopes one POST /v1/envelopes may carry.
	MaxBatch = 1000
	// maxSeamLeases bounds the leases remembered for the seam.
	maxSeamLeases = 10_000
)

// Config configures the handler returned by New.
type Config struct {
	// Store is the queue the handlers work on (required).
	Store queue.Store
	// Token is INTERNAL_OUTBOX_TOKEN, the bearer token of /v1 and
	// /internal (at least MinTokenBytes long). When it is "", those routes
	// are not served (404); `outbox serve` then refuses to listen on
	// anything but loopback.
	Token string
	// Tokens, in place of Token, is a set of tokens that can be replaced
	// while the handler serves (a rotation); set one of the two.
	Tokens *Tokens
	// MaxBody bounds request bodies (default DefaultMaxBody, 1 MiB); a
	// larger body is answered 413 body_too_large.
	MaxBody int64
	// MaxInflight bounds the bytes of the request bodies being handled at
	// once (default DefaultMaxInflight, 16 MiB; negative: no bound). A
	// body counts its Content-Length (MaxBody when it has none), at least
	// MinInflightWeight and at most MaxInflight, from before it is read
	// until its answer is written; a request that does not fit is answered
	// at once 503 overloaded with Retry-After, without reading its body.
	// What a request allocates is about proportional to its body (see
	// envelope.MaxValues), so this bounds the memory of the requests in
	// flight.
	MaxInflight int64
	// Logger receives the handler's logs (default slog.Default() with
	// component=httpapi). Logs carry the route pattern, the status, a
	// request id and error types, never ids, addresses or bodies.
	Logger *slog.Logger
	// Unsub signs and verifies one-click unsubscribe links; nil leaves
	// /unsubscribe/ unserved.
	Unsub *Unsubscriber
	// Brand names the product, its colour, logo, postal address and
	// preferences link on the unsubscribe pages (the renderer's
	// Options.Brand; the zero value is render's default brand). New
	// refuses one that render.Brand.Normalize refuses.
	Brand render.Brand
	// VAPIDPublicKey is served by GET /api/app/push/vapid-key ("" → 404).
	VAPIDPublicKey string
	// User resolves the signed-in user of a request for the
	// push-subscription routes (the embedding app's own authentication);
	// an error is answered 401. When nil, those routes take ?user=&tenant=
	// and require the bearer token (and are not served without one).
	User func(r *http.Request) (tenant, user string, err error)
	// SeamLease is the lease of GET /internal/outbox/pending (default
	// DefaultSeamLease, 5 minutes).
	SeamLease time.Duration
	// StoreTimeout bounds the store calls of one request (default
	// DefaultStoreTimeout, 40 s; negative: no bound). A store that does
	// not answer (a database server stalled or partitioned away, which no
	// statement_timeout of its own can end) is answered 503 unavailable
	// instead of holding the request for as long as the client waits.
	StoreTimeout time.Duration
	// Ready reports readiness for /readyz (nil: always ready).
	Ready func() bool
	// Now returns the current time (default time.Now).
	Now func() time.Time
}

// api is the handler's state.
type api struct {
	cfg      Config
	log      *slog.Logger
	mux      *http.ServeMux
	tokens   *Tokens // nil: /v1 and /internal are not served
	pages    *pages  // the unsubscribe pages
	leases   *leaseCache
	inflight inflight // the bytes of request bodies in flight
	served   []route  // what routes registered, in order (the OpenAPI tests read it)
	doc      []byte   // GET /openapi.json: the description of what is served
}

// route is one registered pattern and who may call it.
type route struct {
	pattern string
	access  access
}

// New returns the HTTP handler of the API described in the package
// documentation. It fails when the Config is unusable.
func New(cfg Config) (http.Handler, error) {
	a, err := newAPI(cfg)
	if err != nil {
		return nil, err
	}
	return a.mux, nil
}

// newAPI builds the handler's state with its routes.
func newAPI(cfg Config) (*api, error) {
	if cfg.Store == nil {
		return nil, errors.New("httpapi: Config.Store is required")
	}
	if cfg.Token != "" && len(cfg.Token) < MinTokenBytes {
		return nil, fmt.Errorf("httpapi: Config.Token must be at least %d bytes", MinTokenBytes)
	}
	if cfg.Token != "" && cfg.Tokens != nil {
		return nil, errors.New("httpapi: set Config.Token or Config.Tokens, not both")
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxInflight == 0 {
		cfg.MaxInflight = DefaultMaxInflight
	}
	if cfg.SeamLease <= 0 {
		cfg.SeamLease = DefaultSeamLease
	}
	if cfg.StoreTimeout == 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default().With("component", "httpapi")
	}
	pg, err := newPages(cfg.Brand)
	if err != nil {
		return nil, err
	}
	a := &api{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), leases: newLeaseCache(maxSeamLeases),
		inflight: inflight{limit: cfg.MaxInflight}, pages: pg}
	a.tokens = cfg.Tokens
	if cfg.Token != "" {
		if a.tokens, err = NewTokens(cfg.Token); err != nil {
			return nil, err
		}
	}
	a.routes()
	if a.doc, err = tailor(openAPI, a.served); err != nil {
		return nil, fmt.Errorf("httpapi: the OpenAPI description: %w", err)
	}
	return a, nil
}

// access says who may call a route.
type access int

const (
	public    access = iota // anyone
	tokenOnly               // the bearer token
)

// handlerFunc is a route handler; a returned error is written by handle.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (a *api) routes() {
	a.handle("GET /healthz", public, a.healthz)
	a.handle("GET /readyz", public, a.readyz)
	a.handle("GET /openapi.json", public, a.openapi)
	if a.tokens != nil {
		a.handle("POST /v1/envelopes", tokenOnly, a.postEnvelopes)
		a.handle("GET /v1/envelopes", tokenOnly, a.listEnvelopes)
		a.handle("GET /v1/envelopes/{id}", tokenOnly, a.getEnvelope)
		a.handle("POST /v1/envelopes/{id}/requeue", tokenOnly, a.requeue)
		a.handle("POST /v1/envelopes/{id}/resolve", tokenOnly, a.resolve)
		a.handle("GET /v1/consent/{user_id}", tokenOnly, a.getConsent)
		a.handle("PUT /v1/consent/{user_id}", tokenOnly, a.putConsent)
		a.handle("GET /v1/stats", tokenOnly, a.stats)
		a.handle("GET /internal/outbox/pending", tokenOnly, a.pending)
		a.handle("POST /internal/outbox/{id}/status", tokenOnly, a.status)
	}
	if a.cfg.Unsub != nil {
		a.handle("GET /unsubscribe/{token}", public, a.unsubscribePage)
		a.handle("POST /unsubscribe/{token}", public, a.unsubscribe)
		a.handle("POST /unsubscribe/{token}/resubscribe", public, a.resubscribe)
	}
	if a.cfg.User != nil || a.tokens != nil {
		acc := public // Config.User authenticates
		if a.cfg.User == nil {
			acc = tokenOnly
		}
		a.handle("POST /api/app/push/subscribe", acc, a.pushSubscribe)
		a.handle("DELETE /api/app/push/subscribe", acc, a.pushUnsubscribe)
	}
	if a.cfg.VAPIDPublicKey != "" {
		a.handle("GET /api/app/push/vapid-key", public, a.vapidKey)
	}
	a.handle("/", public, a.noRoute)
}

// noRoute answers what no route takes, in JSON like every other error: 405
// with Allow when the path has routes for other methods, else 404 (saying
// why the API routes are missing when the handler has no token).
func (a *api) noRoute(w http.ResponseWriter, r *http.Request) error {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		r2 := r.Clone(r.Context())
		r2.Method = m
		if _, pat := a.mux.Handler(r2); pat != "/" && pat != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		return newError(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "method "+r.Method+" not allowed here (allowed: "+strings.Join(allow, ", ")+")")
	}
	if a.tokens == nil && (strings.HasPrefix(r.URL.Path, "/v1/") || strings.HasPrefix(r.URL.Path, "/internal/")) {
		return newError(http.StatusNotFound, CodeNotFound, "the API is not served: no API token is configured (outbox serve: set INTERNAL_OUTBOX_TOKEN)")
	}
	return newError(http.StatusNotFound, CodeNotFound, "no such route")
}

// handle registers h on pattern behind the access check, with panic
// recovery, a request id, error writing and a debug access log. The log
// names the route by its pattern, never by the request's path (which holds
// ids and tokens).
func (a *api) handle(pattern string, acc access, h handlerFunc) {
	a.served = append(a.served, route{pattern, acc})
	a.mux.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rid := requestID()
		sw := &statusWriter{ResponseWriter: w}
		sw.Header().Set("X-Request-Id", rid)
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler { //nolint:errorlint // sentinel compared as net/http does
					panic(p)
				}
				a.log.Error("handler panicked", "operation", pattern, "request_id", rid, "panic_type", fmt.Sprintf("%T", p))
				if !sw.wrote {
					writeError(sw, newError(http.StatusInternalServerError, CodeInternal, "internal error"))
				}
			}
			a.log.Debug("request", "operation", pattern, "request_id", rid, "status", sw.code(),
				"duration_ms", time.Since(start).Milliseconds())
		}()
		if acc == tokenOnly && !a.authorized(r) {
			sw.Header().Set("WWW-Authenticate", `Bearer realm="outbox"`)
			writeError(sw, errUnauthorized)
			return
		}
		if n := a.bodyWeight(r); n > 0 {
			if !a.inflight.acquire(n) {
				a.overloaded(sw, pattern, rid)
				return
			}
			defer a.inflight.release(n)
		}
		if a.cfg.StoreTimeout > 0 {
			ctx, cancel := context.WithTimeout(r.Context(), a.cfg.StoreTimeout)
			defer cancel()
			r = r.WithContext(ctx)
		}
		if err := h(sw, r); err != nil {
			if errors.Is(err, context.DeadlineExceeded) && r.Context().Err() != nil && !errors.Is(err, queue.ErrUnavailable) {
				err = fmt.Errorf("%w: %w", queue.ErrUnavailable, err) // the store did not answer in time
			}
			a.fail(sw, pattern, rid, err)
		}
	}))
}

// fail writes err as a JSON error, logging unexpected ones (logFailed).
func (a *api) fail(w http.ResponseWriter, op, rid string, err error) {
	ae, unexpected := errorFor(err)
	if unexpected {
		a.logFailed("request failed", op, rid, ae, err)
	}
	writeError(w, ae)
}

// logFailed logs an unexpected error by its type, and the reason when the
// store marked it safe to log (queue.Loggable), never by its text.
func (a *api) logFailed(msg, op, rid string, ae *apiError, err error) {
	args := []any{"operation", op, "request_id", rid, "status", ae.Status, "code", ae.Code, "error_type", fmt.Sprintf("%T", err)}
	if r := queue.Reason(err); r != "" {
		args = append(args, "reason", r)
	}
	a.log.Error(msg, args...)
}

// authorized reports whether r carries one of the bearer tokens
// (Tokens.match: in constant time).
func (a *api) authorized(r *http.Request) bool {
	if a.tokens == nil {
		return false
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return a.tokens.match(strings.TrimSpace(tok))
}

func (a *api) healthz(w http.ResponseWriter, r *http.Request) error {
	writeText(w, http.StatusOK, "ok\n")
	return nil
}

func (a *api) readyz(w http.ResponseWriter, r *http.Request) error {
	if a.cfg.Ready != nil && !a.cfg.Ready() {
		writeText(w, http.StatusServiceUnavailable, "not ready\n")
		return nil
	}
	writeText(w, http.StatusOK, "ready\n")
	return nil
}

// statusWriter records whether and with what status a response started.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) code() int {
	if !w.wrote {
		return http.StatusOK
	}
	return w.status
}

// requestID returns a random id for log correlation.
func requestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// writeJSON writes v as the JSON response with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal_error","message":"internal error"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeError writes e as the JSON error body.
func writeError(w http.ResponseWriter, e *apiError) {
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	var body errorBody
	body.Error.Code, body.Error.Message, body.Error.Problems = e.Code, e.Message, e.Problems
	writeJSON(w, e.Status, body)
}

// writeText writes a plain-text response.
func writeText(w http.ResponseWriter, status int, s string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, s)
}

// readBody reads the whole request body, at most Config.MaxBody bytes
// (an *http.MaxBytesError beyond, before anything is read when the
// Content-Length says so). A body of known length is read into one buffer
// of that length.
func (a *api) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > a.cfg.MaxBody {
		return nil, &http.MaxBytesError{Limit: a.cfg.MaxBody}
	}
	body := http.MaxBytesReader(w, r.Body, a.cfg.MaxBody)
	if r.ContentLength <= 0 {
		return io.ReadAll(body)
	}
	buf := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(body, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// decodeJSON decodes a body holding exactly one JSON value into v,
// rejecting unknown fields when strict.
func (a *api) decodeJSON(w http.ResponseWriter, r *http.Request, v any, strict bool) error {
	data, err := a.readBody(w, r)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return badJSON(err)
	}
	if _, err := dec.Token(); err != io.EOF { //nolint:errorlint // io.EOF is returned unwrapped
		return newError(http.StatusBadRequest, CodeBadJSON, "request body holds more than one JSON value")
	}
	return nil
}

// badJSON says what is wrong with a body and where: the field and the type
// it needs (names of our own fields), an unknown field's name when it is a
// plain identifier (anything else in it could be personal data), or the
// byte offset of a syntax error.
func badJSON(err error) *apiError {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	msg := errBadJSON.Message
	switch {
	case errors.As(err, &te) && te.Field != "":
		msg = fmt.Sprintf("field %q must be %s, not a JSON %s", te.Field, jsonKind(te.Type), te.Value)
	case errors.As(err, &te):
		msg = fmt.Sprintf("the body must be %s, not a JSON %s", jsonKind(te.Type), te.Value)
	case errors.As(err, &se):
		msg = fmt.Sprintf("request body is not valid JSON (at byte %d)", se.Offset)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		msg = "request body is empty or cut short"
	default:
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			if name, uerr := strconv.Unquote(name); uerr == nil && plainName.MatchString(name) {
				msg = fmt.Sprintf("unknown field %q", name)
			} else {
				msg = "the body has an unknown field"
			}
		}
	}
	return newError(http.StatusBadRequest, CodeBadJSON, msg)
}

var plainName = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// jsonKind names the JSON a Go type decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "another type"
}

// requireJSON fails unless the request declares a JSON body.
func requireJSON(r *http.Request) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return errWantJSON
	}
	return nil
}

// checkID validates an id taken from a request (envelope id, user id,
// tenant): non-empty unless optional, at most envelope.MaxIDBytes, valid
// UTF-8 without control characters (store keys use NUL as a separator).
func checkID(what, s string, optional bool) error {
	switch {
	case s == "" && optional:
		return nil
	case s == "":
		return badRequest(what + " is required")
	case len(s) > envelope.MaxIDBytes:
		return badRequest(what + " is too long")
	case !utf8.ValidString(s):
		return badRequest(what + " must be valid UTF-8")
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return badRequest(what + " must not contain control characters")
	}
	return nil
}

// tenantParam returns the validated ?tenant= ("" when absent).
func tenantParam(r *http.Request) (string, error) {
	t := r.URL.Query().Get("tenant")
	return t, checkID("tenant", t, true)
}

// tenantOr returns t, or the default tenant when t is "".
func tenantOr(t string) string {
	if t == "" {
		return envelope.DefaultTenant
	}
	return t
}
