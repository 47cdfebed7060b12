package resend

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"golang.org/x/time/rate"
)

// testAPIKey is the key the fake accepts.
const testAPIKey = "re_test_0123456789abcdef"

// sendBody is the JSON body of POST /emails as the fake reads it.
type sendBody struct {
	From    string            `json:"from"`
	To      []string          `json:"to"`
	Subject string            `json:"subject"`
	ReplyTo string            `json:"reply_to"`
	HTML    string            `json:"html"`
	Text    string            `json:"text"`
	Headers map[string]string `json:"headers"`
	Tags    []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"tags"`
}

// fakeSend is one POST /emails the fake received.
type fakeSend struct {
	Ctx            context.Context // the request's context (done when the client gives up)
	Auth           string
	IdempotencyKey string
	ContentType    string
	Body           sendBody
	Raw            []byte
}

// canned is a scripted answer.
type canned struct {
	status int
	header map[string]string
	body   string
}

// apiErr returns Resend's error answer.
func apiErr(status int, name, message string) *canned {
	b, _ := json.Marshal(map[string]any{"statusCode": status, "name": name, "message": message})
	return &canned{status: status, header: map[string]string{"Content-Type": "application/json; charset=utf-8"}, body: string(b)}
}

// listedEmail is one e-mail of GET /emails.
type listedEmail struct {
	ID        string   `json:"id"`
	Object    string   `json:"object"`
	To        []string `json:"to"`
	From      string   `json:"from"`
	CreatedAt string   `json:"created_at"`
	Subject   string   `json:"subject"`
	LastEvent string   `json:"last_event"`
}

type idem struct {
	raw []byte
	id  string
}

// fakeResend is a local server that behaves like Resend's API: POST
// /emails with Bearer auth, Idempotency-Key replay and conflicts, error
// bodies {statusCode,name,message}, 429 with retry-after and ratelimit-*
// headers, and GET /emails with cursor pagination.
type fakeResend struct {
	t   testing.TB
	srv *httptest.Server

	mu        sync.Mutex
	seq       int
	byKey     map[string]idem
	sends     []fakeSend
	emails    []listedEmail // newest first
	override  func(s *fakeSend) *canned
	loseNext  int            // the next n processed sends answer 503 instead of 200
	listFail  map[string]int // after value → status, answered once
	listCalls []string       // after value of every GET /emails
	listLimit []string
	requests  int
}

// newFakeResend starts a fake Resend; it is closed when the test ends.
func newFakeResend(t testing.TB) *fakeResend {
	t.Helper()
	f := &fakeResend{t: t, byKey: map[string]idem{}, listFail: map[string]int{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeResend) write(w http.ResponseWriter, c *canned) {
	for k, v := range c.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(c.status)
	_, _ = io.WriteString(w, c.body)
}

func (f *fakeResend) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	f.mu.Unlock()
	w.Header().Set("ratelimit-limit", "2")
	w.Header().Set("ratelimit-remaining", "1")
	w.Header().Set("ratelimit-reset", "1")
	if r.Header.Get("Authorization") != "Bearer "+testAPIKey {
		if r.Header.Get("Authorization") == "" {
			f.write(w, apiErr(401, "missing_api_key", "Missing API key in the authorization header."))
		} else {
			f.write(w, apiErr(403, "invalid_api_key", "API key is invalid."))
		}
		return
	}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/emails":
		f.send(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/emails":
		f.list(w, r)
	default:
		f.write(w, apiErr(404, "not_found", "The requested endpoint does not exist."))
	}
}

var tagRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,256}$`)

func (f *fakeResend) send(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	s := fakeSend{
		Ctx:            r.Context(),
		Auth:           r.Header.Get("Authorization"),
		IdempotencyKey: r.Header.Get("Idempotency-Key"),
		ContentType:    r.Header.Get("Content-Type"),
		Raw:            raw,
	}
	if err := json.Unmarshal(raw, &s.Body); err != nil {
		f.write(w, apiErr(400, "validation_error", "Invalid JSON body."))
		return
	}
	f.mu.Lock()
	f.sends = append(f.sends, s)
	override := f.override
	f.mu.Unlock()
	if override != nil {
		if c := override(&s); c != nil {
			f.write(w, c)
			return
		}
	}
	if s.IdempotencyKey == "" || len(s.IdempotencyKey) > 256 {
		f.write(w, apiErr(400, "invalid_idempotency_key", "The key must be between 1-256 chars."))
		return
	}
	b := s.Body
	if b.From == "" || len(b.To) == 0 || b.Subject == "" || (b.HTML == "" && b.Text == "") {
		f.write(w, apiErr(422, "missing_required_field", "Missing `to`, `from` or `subject` field."))
		return
	}
	for _, tg := range b.Tags {
		if !tagRE.MatchString(tg.Name) || (tg.Value != "" && !tagRE.MatchString(tg.Value)) {
			f.write(w, apiErr(422, "validation_error", "Tags should only contain ASCII letters, numbers, underscores, or dashes."))
			return
		}
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	if prev, ok := f.byKey[s.IdempotencyKey]; ok {
		if !bytes.Equal(prev.raw, raw) {
			f.write(w, apiErr(409, "invalid_idempotent_request", "Same idempotency key used with a different request payload."))
			return
		}
		f.writeID(w, prev.id)
		return
	}
	f.seq++
	id := fmt.Sprintf("4ef9a417-02e9-4d39-ad75-%012d", f.seq)
	f.byKey[s.IdempotencyKey] = idem{raw: raw, id: id}
	f.emails = append([]listedEmail{{
		ID: id, Object: "email", To: b.To, From: b.From, Subject: b.Subject, LastEvent: "sent",
		CreatedAt: time.Now().UTC().Format("2006-01-02 15:04:05.999999+00"),
	}}, f.emails...)
	f.writeID(w, id)
}

// writeID answers 200 {"id":…}, or 503 when a receipt is to be lost. The
// caller holds f.mu.
func (f *fakeResend) writeID(w http.ResponseWriter, id string) {
	if f.loseNext > 0 {
		f.loseNext--
		f.write(w, apiErr(503, "internal_server_error", "Service unavailable."))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"id":%q}`, id)
}

func (f *fakeResend) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after := q.Get("after")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listCalls = append(f.listCalls, after)
	f.listLimit = append(f.listLimit, q.Get("limit"))
	if st, ok := f.listFail[after]; ok {
		delete(f.listFail, after)
		f.write(w, apiErr(st, "application_error", "Something went wrong listing."))
		return
	}
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			f.write(w, apiErr(422, "validation_error", "limit must be between 1 and 100"))
			return
		}
		limit = n
	}
	start := 0
	if after != "" {
		start = -1
		for i, e := range f.emails {
			if e.ID == after {
				start = i + 1
			}
		}
		if start < 0 {
			f.write(w, apiErr(422, "validation_error", "The after cursor does not exist."))
			return
		}
	}
	end := min(start+limit, len(f.emails))
	page := append([]listedEmail{}, f.emails[start:end]...)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "has_more": end < len(f.emails), "data": page})
}

// addEmail adds a listed e-mail as the newest one.
func (f *fakeResend) addEmail(id, to, lastEvent string, created time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.emails = append([]listedEmail{{
		ID: id, Object: "email", To: []string{to}, From: "outbox@example.com", Subject: "s",
		LastEvent: lastEvent, CreatedAt: created.UTC().Format("2006-01-02 15:04:05.999999+00"),
	}}, f.emails...)
}

func (f *fakeResend) setOverride(fn func(s *fakeSend) *canned) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.override = fn
}

func (f *fakeResend) setLoseNext(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loseNext = n
}

func (f *fakeResend) idFor(idempotencyKey string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byKey[idempotencyKey].id
}

func (f *fakeResend) failList(after string, status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listFail[after] = status
}

func (f *fakeResend) sent() []fakeSend {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeSend(nil), f.sends...)
}

func (f *fakeResend) created() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.byKey)
}

func (f *fakeResend) requestCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

func (f *fakeResend) lists() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.listCalls...)
}

// testOptions returns Options pointing at f, with no rate limit.
func (f *fakeResend) options(t testing.TB, logger *slog.Logger) Options {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return Options{
		APIKey:     testAPIKey,
		From:       "Outbox <outbox@example.com>",
		BaseURL:    f.srv.URL,
		HTTPClient: &http.Client{Transport: tr, Timeout: 10 * time.Second},
		Logger:     logger,
		Rate:       rate.Inf,
	}
}

// mustProvider returns a provider for opts or fails the test.
func mustProvider(t testing.TB, opts Options) *Provider {
	t.Helper()
	p, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// emailMessage returns a plain valid message for to.
func emailMessage(to, subject string) *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelEmail, Email: &envelope.EmailMessage{
		To: to, Subject: subject, HTML: "<p>Hello</p>", Text: "Hello",
		Headers: []envelope.Header{
			{Name: "List-Unsubscribe", Value: "<https://example.com/u/abc>"},
			{Name: "List-Unsubscribe-Post", Value: "List-Unsubscribe=One-Click"},
		},
		Tags: map[string]string{"template": "your-week-digest.v1", "kind": "digest"},
	}}
}

// lockedBuffer is an io.Writer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// bufLogger returns a debug-level JSON logger writing into a buffer.
func bufLogger() (*slog.Logger, *lockedBuffer) {
	b := &lockedBuffer{}
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// suppression is one SuppressEmail call.
type suppression struct {
	Tenant, Address string
	Reason          envelope.ErrorClass
}

// recordingSuppressor records SuppressEmail calls; err, when set, fails them.
type recordingSuppressor struct {
	mu     sync.Mutex
	calls  []suppression
	err    error
	notify chan struct{}
}

func (s *recordingSuppressor) SuppressEmail(_ context.Context, tenant, address string, reason envelope.ErrorClass) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.calls = append(s.calls, suppression{tenant, address, reason})
	if s.notify != nil {
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
	return nil
}

func (s *recordingSuppressor) got() []suppression {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]suppression(nil), s.calls...)
}

func (s *recordingSuppressor) setErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}
