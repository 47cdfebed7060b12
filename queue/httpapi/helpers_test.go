package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

const testToken = "test-token-7c1e5d0f9a2b4c68"

// t0 is where every fixture's clock starts.
var t0 = time.Date(2026, time.March, 2, 9, 0, 0, 0, time.UTC)

// clock is a settable clock shared by the store and the handler.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fixture is a handler over a file-backed store in a temp directory.
type fixture struct {
	t     testing.TB
	dir   string
	q     *filestore.Queue
	cfg   Config
	h     http.Handler
	clock *clock
	logs  *syncBuffer
	unsub *Unsubscriber
}

// newFixture opens a store in t.TempDir() and builds the handler with the
// test token, an Unsubscriber and a VAPID key; mut adjusts the Config.
func newFixture(t testing.TB, mut ...func(*Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, dir: t.TempDir(), clock: &clock{t: t0}, logs: &syncBuffer{}}
	logger := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	q, err := filestore.Open(f.dir, &filestore.Options{Options: queue.Options{Now: f.clock.Now, Logger: logger}, NoSync: true, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { q.Close() })
	f.q = q
	key, err := LoadOrCreateKey(f.dir)
	if err != nil {
		t.Fatalf("unsubscribe key: %v", err)
	}
	f.unsub = NewUnsubscriber(key, "https://mail.example.org/outbox/")
	f.cfg = Config{
		Store: q, Token: testToken, Logger: logger, Unsub: f.unsub,
		VAPIDPublicKey: "BPublicVapidKeyForTests", Now: f.clock.Now,
	}
	for _, m := range mut {
		m(&f.cfg)
	}
	f.h, err = New(f.cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return f
}

// reopen builds a second handler over the same store (a restart of the
// HTTP layer: the seam's in-memory leases are gone).
func (f *fixture) reopen() {
	f.t.Helper()
	h, err := New(f.cfg)
	if err != nil {
		f.t.Fatalf("New: %v", err)
	}
	f.h = h
}

// reqOpt adjusts a request before it is served.
type reqOpt func(*http.Request)

// noAuth removes the bearer token.
func noAuth(r *http.Request) { r.Header.Del("Authorization") }

// withAuth sets the Authorization header.
func withAuth(v string) reqOpt { return func(r *http.Request) { r.Header.Set("Authorization", v) } }

// withHeader sets a header.
func withHeader(k, v string) reqOpt { return func(r *http.Request) { r.Header.Set(k, v) } }

// call serves one request, with the bearer token and a JSON content type
// unless opts change them.
func (f *fixture) call(method, target, body string, opts ...reqOpt) *httptest.ResponseRecorder {
	f.t.Helper()
	return serve(f.h, method, target, body, opts...)
}

// serve is call without a fixture (fuzz targets may not use the
// fixture's testing.F inside the fuzz function).
func serve(h http.Handler, method, target, body string, opts ...reqOpt) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, request(method, target, body, opts...))
	return w
}

// request is what serve serves: the bearer token and a JSON content type
// unless opts change them.
func request(method, target, body string, opts ...reqOpt) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+testToken)
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for _, o := range opts {
		o(r)
	}
	return r
}

// enqueue posts envelopes (one object, or an array when several) and
// fails unless the answer has status want.
func (f *fixture) enqueue(want int, envs ...*envelope.Envelope) *httptest.ResponseRecorder {
	f.t.Helper()
	var v any = envs
	if len(envs) == 1 {
		v = envs[0]
	}
	w := f.call("POST", "/v1/envelopes", mustJSON(f.t, v))
	if w.Code != want {
		f.t.Fatalf("POST /v1/envelopes: status %d, want %d; body %s", w.Code, want, w.Body)
	}
	return w
}

// grant gives a user every consent flag.
func (f *fixture) grant(tenant, user string) {
	f.t.Helper()
	err := f.q.SetConsent(context.Background(), tenant, user, queue.ConsentFlags{
		DigestEnabled: true, PushEnabled: true, EmailVerified: true, Cadence: "weekly",
	})
	if err != nil {
		f.t.Fatalf("grant consent: %v", err)
	}
}

// get returns an envelope's status from the store.
func (f *fixture) get(tenant, id string) *queue.EnvelopeStatus {
	f.t.Helper()
	st, err := f.q.Get(context.Background(), tenant, id)
	if err != nil {
		f.t.Fatalf("Get: %v", err)
	}
	return st
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return string(b)
}

// decode decodes a JSON response into v.
func decode(t testing.TB, w *httptest.ResponseRecorder, v any) {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json; body %s", ct, w.Body)
	}
	if err := json.Unmarshal(w.Body.Bytes(), v); err != nil {
		t.Fatalf("decode %s: %v", w.Body, err)
	}
}

// wantError checks an error response's status and code and returns it.
func wantError(t testing.TB, w *httptest.ResponseRecorder, status int, code string) errorBody {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %s", w.Code, status, w.Body)
	}
	var e errorBody
	decode(t, w, &e)
	if e.Error.Code != code {
		t.Fatalf("code %q, want %q; body %s", e.Error.Code, code, w.Body)
	}
	if e.Error.Message == "" {
		t.Fatalf("error without message: %s", w.Body)
	}
	return e
}

// esc escapes an id for a path.
func esc(id string) string { return url.PathEscape(id) }

func opaque(parts ...string) []byte {
	h := sha256.New()
	for _, p := range parts {
		io.WriteString(h, p+"\x00")
	}
	return h.Sum(nil)
}

func tms(v int64) *int64 { return &v }

// items returns digest sections that satisfy the moat rule.
func items(quote string) []envelope.Section {
	return []envelope.Section{
		{Kind: envelope.SectionRevisit, Items: []envelope.Item{{
			Quote: quote, EpisodeSlug: "ep-212", EpisodeTitle: "Inventing the Future", TMs: tms(1_234_000),
			GraphRefs: []envelope.GraphRef{{ID: "person:alan-kay", Kind: "person", Label: "Alan Kay"}},
			DeepLink:  "https://app.example.com/episodes/ep-212?t=1234", Source: "user",
		}}},
		{Kind: envelope.SectionTrending, Items: []envelope.Item{{
			EpisodeSlug: "ep-077",
			GraphRefs:   []envelope.GraphRef{{ID: "topic:distributed-systems", Kind: "topic", Label: "Distributed systems"}},
			DeepLink:    "https://app.example.com/episodes/ep-077",
		}}},
	}
}

func emailOf(user string) string {
	return "reader." + base64.RawURLEncoding.EncodeToString(opaque("email", user)[:5]) + "@example.com"
}

// digest returns a valid email digest envelope for user.
func digest(id, user string) *envelope.Envelope {
	p, _ := json.Marshal(envelope.DigestPayload{Sections: items("The best way to predict the future is to invent it.")})
	return &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion, ID: id, UserID: user,
		Channel: envelope.ChannelEmail, Template: envelope.TemplateDigest,
		Recipient: envelope.Recipient{Email: emailOf(user), EmailVerified: true},
		ConsentSnapshot: envelope.ConsentSnapshot{
			DigestEnabled: true, Cadence: "weekly",
			UnsubscribeRef: "unsub_" + base64.RawURLEncoding.EncodeToString(opaque("ref", user, id)[:9]),
		},
		Payload:   p,
		CreatedAt: t0.Add(-time.Hour),
	}
}

// pushSub returns a plausible push subscription with endpoint.
func pushSub(endpoint string) *envelope.PushSubscription {
	p256dh := append([]byte{4}, opaque("x", endpoint)...)
	p256dh = append(p256dh, opaque("y", endpoint)...)
	return &envelope.PushSubscription{
		Endpoint: endpoint,
		Keys: envelope.PushKeys{
			P256dh: base64.RawURLEncoding.EncodeToString(p256dh),
			Auth:   base64.RawURLEncoding.EncodeToString(opaque("auth", endpoint)[:16]),
		},
	}
}

func endpointOf(user string) string {
	return "https://push.example.net/wpush/v2/" + base64.RawURLEncoding.EncodeToString(opaque("endpoint", user)[:18])
}

// nudge returns a valid push nudge envelope for user.
func nudge(id, user string) *envelope.Envelope {
	p, _ := json.Marshal(envelope.NudgePayload{HighlightCount: 3, Lead: items("Simple is not easy.")[0].Items[0]})
	return &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion, ID: id, UserID: user,
		Channel: envelope.ChannelPush, Template: envelope.TemplateNudge,
		Recipient:       envelope.Recipient{PushSubscription: pushSub(endpointOf(user))},
		ConsentSnapshot: envelope.ConsentSnapshot{DigestEnabled: true, Cadence: "daily"},
		Payload:         p,
		CreatedAt:       t0.Add(-time.Hour),
	}
}

// reply returns a valid telegram reply envelope for user.
func reply(id, user, text string) *envelope.Envelope {
	p, _ := json.Marshal(envelope.ReplyPayload{Text: text})
	return &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion, ID: id, UserID: user,
		Channel: envelope.ChannelTelegram, Template: envelope.TemplateReply,
		Recipient: envelope.Recipient{ChatID: "123456789"},
		Payload:   p,
		CreatedAt: t0.Add(-time.Hour),
	}
}
