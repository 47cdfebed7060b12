package wecomreply

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/channeltest"
	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/envelope"
)

const testText = "canary reply text 你要的那句话"

var t0 = time.Date(2026, 5, 4, 20, 41, 17, 0, time.UTC)

// fakeAIBot answers response_urls like WeCom: HTTP 200 with errcode, a
// code usable once (a second use answers an errcode), scripted answers.
type fakeAIBot struct {
	srv *httptest.Server

	mu     sync.Mutex
	hits   map[string]int
	posted []string
	code   int  // errcode to answer
	status int  // HTTP status to answer instead of 200
	hang   bool // never answer
}

func newFake(t testing.TB) *fakeAIBot {
	f := &fakeAIBot{hits: map[string]int{}}
	f.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		code := r.URL.Query().Get("response_code")
		f.mu.Lock()
		f.hits[code]++
		n, hang, status, ec := f.hits[code], f.hang, f.status, f.code
		f.mu.Unlock()
		if hang {
			<-r.Context().Done()
			return
		}
		if status != 0 {
			w.WriteHeader(status)
			return
		}
		var req postRequest
		switch {
		case r.URL.Path != "/cgi-bin/aibot/response" || json.Unmarshal(body, &req) != nil || req.MsgType != "markdown":
			ec = 40008
		case n > 1:
			ec = 40001 // the code is spent
		case ec == 0:
			f.mu.Lock()
			f.posted = append(f.posted, req.Markdown.Content)
			f.mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(map[string]any{"errcode": ec, "errmsg": "errmsg canary-errmsg-aibot"})
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAIBot) url(code string) string {
	return f.srv.URL + "/cgi-bin/aibot/response?response_code=" + code
}

func (f *fakeAIBot) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, h := range f.hits {
		n += h
	}
	return n
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newProvider(t testing.TB, f *fakeAIBot, l Ledger, c *clock, logger *slog.Logger) *Provider {
	t.Helper()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p, err := New(Options{Ledger: l, Hosts: []string{f.srv.Listener.Addr().String()}, HTTPClient: f.srv.Client(), Clock: c.Now, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func reply(u, text string) *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelWeComBotReply, WeCom: &envelope.WeComMessage{
		ResponseURL: u, MsgType: envelope.WeComMarkdown, Content: text, NotAfter: t0.Add(time.Hour), Segments: 1}}
}

func TestProvider_Conformance(t *testing.T) {
	var mu sync.Mutex
	var current *fakeAIBot
	channeltest.Exercise(t, channeltest.Harness{
		Channel: envelope.ChannelWeComBotReply,
		New: func(t testing.TB, b channeltest.Behaviour, logger *slog.Logger) channels.Provider {
			f := newFake(t)
			switch b {
			case channeltest.FailRetryable:
				f.status = http.StatusBadGateway
			case channeltest.FailPermanent:
				f.code = 40008
			case channeltest.Hang:
				f.hang = true
			}
			mu.Lock()
			current = f
			mu.Unlock()
			return newProvider(t, f, NewMemoryLedger(), &clock{t: t0}, logger)
		},
		Message: func(key envelope.Key) *envelope.Message {
			mu.Lock()
			f := current
			mu.Unlock()
			base := "https://127.0.0.1:1"
			if f != nil {
				base = f.srv.URL
			}
			return reply(base+"/cgi-bin/aibot/response?response_code=canary-code-"+key.Hash()[:12], testText)
		},
		Secrets: []string{"canary-code-", testText, "canary-errmsg"},
		Unsupported: map[channeltest.Behaviour]string{
			channeltest.RateLimited:   "a response_url is single use: a frequency-limited reply is never retried (dead_letter rate_limited)",
			channeltest.RecipientGone: "no answer of a response_url says the conversation is gone",
		},
	})
}

// A response_url is used once: a second Deliver (a requeue, a retry,
// another envelope with the same URL) is refused without a request, also
// by a provider opened again on the same ledger file (a restart).
func TestDeliver_NeverTwice(t *testing.T) {
	f := newFake(t)
	c := &clock{t: t0}
	path := filepath.Join(t.TempDir(), "wecom-replies.spent")
	l, err := OpenLedger(path, c.Now())
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, f, l, c, nil)
	m := reply(f.url("code-1"), testText)
	if _, err := p.Deliver(context.Background(), envelope.Key{}, m); err != nil {
		t.Fatal(err)
	}
	_, err = p.Deliver(context.Background(), envelope.Key{}, m)
	if de := envelope.Classify(err); err == nil || de.Kind != envelope.KindPermanent || de.Class != envelope.ClassIdempotencyConflict {
		t.Fatalf("second use: %v", err)
	}
	_ = l.Close()
	l2, err := OpenLedger(path, c.Now().Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	_, err = newProvider(t, f, l2, c, nil).Deliver(context.Background(), envelope.Key{}, m)
	if envelope.Classify(err).Class != envelope.ClassIdempotencyConflict {
		t.Fatalf("after a restart: %v", err)
	}
	if n := f.total(); n != 1 {
		t.Fatalf("%d requests to the response_url, want 1", n)
	}
}

// After the hour: expired, no request.
func TestDeliver_AfterTheHour(t *testing.T) {
	f := newFake(t)
	c := &clock{t: t0.Add(time.Hour)}
	_, err := newProvider(t, f, NewMemoryLedger(), c, nil).Deliver(context.Background(), envelope.Key{}, reply(f.url("late"), testText))
	if de := envelope.Classify(err); err == nil || de.Kind != envelope.KindPermanent || de.Class != envelope.ClassExpired || f.total() != 0 {
		t.Fatalf("%v, %d requests", err, f.total())
	}
}

// An ambiguous failure (the answer lost) is retryable for the worker, which
// reconciles a non-idempotent provider instead of resending; Reconcile
// answers Unknown (unresolved) and the URL is never posted to again.
func TestDeliver_AmbiguousIsUnresolved(t *testing.T) {
	f := newFake(t)
	f.hang = true
	p := newProvider(t, f, NewMemoryLedger(), &clock{t: t0}, nil)
	m := reply(f.url("lost"), testText)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := p.Deliver(ctx, envelope.Key{}, m)
	if de := envelope.Classify(err); err == nil || de.Kind != envelope.KindRetryable {
		t.Fatalf("%v, want retryable", err)
	}
	if p.Capabilities().IdempotentRedelivery {
		t.Fatal("IdempotentRedelivery is true: the worker would resend")
	}
	if rec, err := p.Reconcile(context.Background(), envelope.Key{}, m); err != nil || rec.Outcome != channels.Unknown {
		t.Fatalf("Reconcile: %+v %v", rec, err)
	}
	f.mu.Lock()
	f.hang = false
	f.mu.Unlock()
	if _, err := p.Deliver(context.Background(), envelope.Key{}, m); envelope.Classify(err).Class != envelope.ClassIdempotencyConflict {
		t.Fatalf("retry after a lost answer: %v", err)
	}
	if n := f.total(); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}

func TestDeliver_Refusals(t *testing.T) {
	f := newFake(t)
	c := &clock{t: t0}
	var logs bytes.Buffer
	p := newProvider(t, f, NewMemoryLedger(), c, slog.New(slog.NewTextHandler(&logs, nil)))
	other := httptest.NewTLSServer(http.NotFoundHandler())
	defer other.Close()
	plain := strings.Replace(f.url("plain"), "https://", "http://", 1)
	for name, tt := range map[string]struct {
		m     *envelope.Message
		class envelope.ErrorClass
	}{
		"OtherHost":  {reply(other.URL+"/cgi-bin/aibot/response?response_code=canary-code-x", testText), envelope.ClassInvalidRecipient},
		"PlainHTTP":  {reply(plain, testText), envelope.ClassInvalidRecipient},
		"TooLong":    {reply(f.url("long"), strings.Repeat("好", MaxMarkdownBytes/3+1)), envelope.ClassPayloadTooLarge},
		"NoDeadline": {func() *envelope.Message { m := reply(f.url("nd"), testText); m.WeCom.NotAfter = time.Time{}; return m }(), envelope.ClassInvalidRequest},
	} {
		_, err := p.Deliver(context.Background(), envelope.Key{}, tt.m)
		if de := envelope.Classify(err); err == nil || de.Kind != envelope.KindPermanent || de.Class != tt.class {
			t.Errorf("%s: %v, want permanent %s", name, err, tt.class)
		}
	}
	if n := f.total(); n != 0 {
		t.Fatalf("%d requests", n)
	}
	// WeCom's errcodes are final: the URL is spent.
	for code, class := range map[int]envelope.ErrorClass{wxapi.CodeFreqLimit: envelope.ClassRateLimited, wxapi.CodeBusy: envelope.ClassProviderUnavailable, 40008: envelope.ClassInvalidRequest} {
		f.code = code
		_, err := p.Deliver(context.Background(), envelope.Key{}, reply(f.url(fmt.Sprint("canary-code-", code)), testText))
		if de := envelope.Classify(err); err == nil || de.Kind != envelope.KindPermanent || de.Class != class {
			t.Errorf("errcode %d: %v, want permanent %s", code, err, class)
		}
		for _, c := range []string{"canary-code-", testText, "canary-errmsg"} {
			if strings.Contains(logs.String(), c) || strings.Contains(fmt.Sprintf("%v %+v", err, err), c) {
				t.Errorf("canary %q leaked", c)
			}
		}
	}
}

// The ledger file: a torn last line is skipped, entries older than two
// hours are forgotten, the file is 0600, and a link is refused.
func TestLedger_File(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "spent")
	l, err := OpenLedger(path, t0)
	if err != nil {
		t.Fatal(err)
	}
	for i, u := range []string{"https://a/1", "https://a/2"} {
		if already, err := l.Spend(u, t0.Add(time.Duration(i)*time.Hour)); err != nil || already {
			t.Fatalf("%s: %v %v", u, already, err)
		}
	}
	_ = l.Close()
	fh, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	_, _ = fh.WriteString("0123")
	_ = fh.Close()
	b, _ := os.ReadFile(path)
	if bytes.Contains(b, []byte("https://a/")) {
		t.Fatal("the ledger holds a URL")
	}
	l, err = OpenLedger(path, t0.Add(150*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if already, _ := l.Spend("https://a/2", t0); !already {
		t.Error("a URL spent 90 minutes ago is forgotten")
	}
	if already, _ := l.Spend("https://a/1", t0); already {
		t.Error("a URL spent 150 minutes ago is remembered")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode().Perm())
	}
	link := filepath.Join(dir, "link")
	_ = os.Symlink(path, link)
	if _, err := OpenLedger(link, t0); err == nil {
		t.Error("a link was opened")
	}
}

// TestE2E_Deliver posts one real reply. It runs only with
// OUTBOX_E2E_WECOM_BOT_RESPONSE_URL (the response_url of an AI bot
// callback, less than an hour old and never used):
//
//	OUTBOX_E2E_WECOM_BOT_RESPONSE_URL=… go test -run E2E -v ./channels/wecomreply
func TestE2E_Deliver(t *testing.T) {
	u := os.Getenv("OUTBOX_E2E_WECOM_BOT_RESPONSE_URL")
	if u == "" {
		t.Skip("set OUTBOX_E2E_WECOM_BOT_RESPONSE_URL to run")
	}
	p, err := New(Options{Ledger: NewMemoryLedger()})
	if err != nil {
		t.Fatal(err)
	}
	m := reply(u, "**outbox e2e** "+time.Now().UTC().Format(time.RFC3339)+"\n> a test reply from outbox's opt-in tests")
	m.WeCom.NotAfter = time.Now().Add(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.Deliver(ctx, envelope.Key{Tenant: "e2e", EnvelopeID: "e2e"}, m); err != nil {
		t.Fatal(err)
	}
}
