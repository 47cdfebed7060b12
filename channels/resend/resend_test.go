package resend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// mustClass asserts err is a DeliveryError of kind and class.
func mustClass(t testing.TB, err error, kind envelope.Kind, class envelope.ErrorClass) *envelope.DeliveryError {
	t.Helper()
	var de *envelope.DeliveryError
	if !errors.As(err, &de) {
		t.Fatalf("error = %v (%T), want *envelope.DeliveryError", err, err)
	}
	if de.Kind != kind || de.Class != class {
		t.Fatalf("error = %s/%s, want %s/%s", de.Kind, de.Class, kind, class)
	}
	return de
}

func TestNew_Errors(t *testing.T) {
	const secretish = "re_SECRETVALUE_must_not_leak"
	good := Options{APIKey: "re_x", From: "a@example.com"}
	tests := []struct {
		name   string
		mutate func(o *Options)
		want   string
	}{
		{"no key", func(o *Options) { o.APIKey = "" }, "Options.APIKey"},
		{"blank key", func(o *Options) { o.APIKey = "  " }, "Options.APIKey"},
		{"key with space", func(o *Options) { o.APIKey = secretish + " x" }, "Options.APIKey"},
		{"no from", func(o *Options) { o.From = "" }, "Options.From"},
		{"bad from", func(o *Options) { o.From = secretish }, "Options.From"},
		{"bad reply-to", func(o *Options) { o.ReplyTo = secretish }, "Options.ReplyTo"},
		{"bad base url", func(o *Options) { o.BaseURL = "ftp://" + secretish }, "Options.BaseURL"},
		{"relative base url", func(o *Options) { o.BaseURL = "/v1" }, "Options.BaseURL"},
		{"negative rate", func(o *Options) { o.Rate = -1 }, "Options.Rate"},
		{"negative burst", func(o *Options) { o.Burst = -1 }, "Options.Burst"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := good
			tt.mutate(&o)
			_, err := New(o)
			if err == nil {
				t.Fatal("New succeeded, want an error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "SECRETVALUE") {
				t.Errorf("error %q contains the value", err)
			}
		})
	}
	if _, err := New(good); err != nil {
		t.Fatalf("New(good): %v", err)
	}
}

func TestAPIKey_Redacts(t *testing.T) {
	const k = "re_CANARY_API_KEY_123"
	opts := Options{APIKey: k, From: "a@example.com"}
	var logBuf strings.Builder
	slog.New(slog.NewTextHandler(&logBuf, nil)).Info("x", "key", opts.APIKey, "opts", opts)
	js, err := json.Marshal(map[string]any{"api_key": opts.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	outputs := map[string]string{
		"%v":   fmt.Sprintf("%v", opts.APIKey),
		"%s":   fmt.Sprintf("%s", opts.APIKey),
		"%q":   fmt.Sprintf("%q", opts.APIKey),
		"%x":   fmt.Sprintf("%x", opts.APIKey),
		"%#v":  fmt.Sprintf("%#v", opts.APIKey),
		"opts": fmt.Sprintf("%+v", opts),
		"#v":   fmt.Sprintf("%#v", opts),
		"json": string(js),
		"slog": logBuf.String(),
		"str":  opts.APIKey.String(),
	}
	for name, out := range outputs {
		if strings.Contains(out, "CANARY") {
			t.Errorf("%s output %q contains the key", name, out)
		}
		if !strings.Contains(out, "redacted") {
			t.Errorf("%s output %q does not say redacted", name, out)
		}
	}
}

func TestAPIKeyFromEnv(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte("  re_from_file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	emptyFile := filepath.Join(dir, "empty")
	if err := os.WriteFile(emptyFile, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		env     map[string]string
		want    string
		wantErr string
	}{
		{"env", map[string]string{EnvAPIKey: " re_env "}, "re_env", ""},
		{"file", map[string]string{EnvAPIKeyFile: keyFile}, "re_from_file", ""},
		{"both", map[string]string{EnvAPIKey: "re_env", EnvAPIKeyFile: keyFile}, "", "only one"},
		{"neither", nil, "", EnvAPIKey},
		{"empty file", map[string]string{EnvAPIKeyFile: emptyFile}, "", "empty"},
		{"missing file", map[string]string{EnvAPIKeyFile: filepath.Join(dir, "nope")}, "", EnvAPIKeyFile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := APIKeyFromEnv(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "re_env") || strings.Contains(err.Error(), "re_from_file") {
					t.Errorf("error %q contains a key", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("APIKeyFromEnv = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestProvider_Capabilities(t *testing.T) {
	p := mustProvider(t, Options{APIKey: "re_x", From: "a@example.com"})
	want := channels.Capabilities{Name: "resend", Channel: envelope.ChannelEmail, IdempotentRedelivery: true, OneService: true}
	if got := p.Capabilities(); got != want {
		t.Errorf("Capabilities = %+v, want %+v", got, want)
	}
}

func TestProvider_Deliver_RequestShape(t *testing.T) {
	f := newFakeResend(t)
	opts := f.options(t, nil)
	opts.ReplyTo = "replies@example.com"
	p := mustProvider(t, opts)
	key := envelope.Key{Tenant: "default", EnvelopeID: "digest/u_42/2026-W10", Segment: 0}
	msg := emailMessage("reader@example.net", "Your week")
	msg.Email.Tags = map[string]string{
		"template":      "your-week-digest.v1",
		"b@d name":      "ok",
		"outbox_key":    "spoofed",
		"outbox_tenant": "spoofed",
		"empty":         "",
	}

	rc, err := p.Deliver(context.Background(), key, msg)
	if err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	sends := f.sent()
	if len(sends) != 1 {
		t.Fatalf("fake got %d sends, want 1", len(sends))
	}
	s := sends[0]
	if rc.ID != f.idFor(key.IdempotencyKey()) {
		t.Errorf("receipt %q, want the fake's id %q", rc.ID, f.idFor(key.IdempotencyKey()))
	}
	if s.Auth != "Bearer "+testAPIKey {
		t.Errorf("Authorization = %q", s.Auth)
	}
	if s.IdempotencyKey != key.IdempotencyKey() {
		t.Errorf("Idempotency-Key = %q, want %q", s.IdempotencyKey, key.IdempotencyKey())
	}
	if !strings.HasPrefix(s.ContentType, "application/json") {
		t.Errorf("Content-Type = %q", s.ContentType)
	}
	b := s.Body
	if b.From != opts.From || len(b.To) != 1 || b.To[0] != "reader@example.net" || b.Subject != "Your week" ||
		b.HTML != "<p>Hello</p>" || b.Text != "Hello" || b.ReplyTo != "replies@example.com" {
		t.Errorf("body = %+v", b)
	}
	if b.Headers["List-Unsubscribe"] != "<https://example.com/u/abc>" ||
		b.Headers["List-Unsubscribe-Post"] != "List-Unsubscribe=One-Click" || len(b.Headers) != 2 {
		t.Errorf("headers = %v", b.Headers)
	}
	var gotTags []string
	for _, tg := range b.Tags {
		gotTags = append(gotTags, tg.Name+"="+tg.Value)
	}
	wantTags := []string{
		"outbox_key=" + key.Hash()[:32],
		"outbox_tenant=ZGVmYXVsdA", // base64url("default")
		"b_d_name=ok",
		"empty=",
		"template=your-week-digest_v1",
	}
	if strings.Join(gotTags, " ") != strings.Join(wantTags, " ") {
		t.Errorf("tags = %v, want %v", gotTags, wantTags)
	}
	if strings.Contains(string(s.Raw), key.EnvelopeID) {
		t.Errorf("request body contains the envelope id; tags must carry only the hash")
	}
}

func TestProvider_Deliver_ReplayReturnsSameID(t *testing.T) {
	f := newFakeResend(t)
	p := mustProvider(t, f.options(t, nil))
	key := envelope.Key{Tenant: "t", EnvelopeID: "e1"}
	msg := emailMessage("reader@example.net", "Hi")
	rc1, err := p.Deliver(context.Background(), key, msg)
	if err != nil {
		t.Fatal(err)
	}
	// A fresh message value with the same content (and tags in another
	// map instance) must produce a byte-identical request.
	rc2, err := p.Deliver(context.Background(), key, emailMessage("reader@example.net", "Hi"))
	if err != nil {
		t.Fatal(err)
	}
	if rc1 != rc2 {
		t.Errorf("replay receipt %q, want %q", rc2.ID, rc1.ID)
	}
	if f.created() != 1 {
		t.Errorf("fake created %d e-mails, want 1", f.created())
	}
	other, err := p.Deliver(context.Background(), envelope.Key{Tenant: "t", EnvelopeID: "e1", Segment: 1}, msg)
	if err != nil {
		t.Fatal(err)
	}
	if other == rc1 {
		t.Errorf("a different key got the same id")
	}
}

func TestProvider_Deliver_StatusMapping(t *testing.T) {
	// 2026-03-10 22:30 UTC: the next UTC midnight is 1h30m away.
	now := time.Date(2026, 3, 10, 22, 30, 0, 0, time.UTC)
	withHeader := func(c *canned, k, v string) *canned { c.header[k] = v; return c }
	tests := []struct {
		name       string
		answer     *canned
		kind       envelope.Kind
		class      envelope.ErrorClass
		retryAfter time.Duration
		status     int
		apiName    string
		logWant    string
	}{
		{"409 concurrent", apiErr(409, "concurrent_idempotent_requests", "in progress"),
			envelope.KindRetryable, envelope.ClassIdempotencyConflict, 0, 409, "concurrent_idempotent_requests", ""},
		{"409 invalid idempotent", apiErr(409, "invalid_idempotent_request", "payload differs"),
			envelope.KindPermanent, envelope.ClassIdempotencyConflict, 0, 409, "invalid_idempotent_request", "idempotency key"},
		{"429 retry-after seconds", withHeader(apiErr(429, "rate_limit_exceeded", "Too many requests"), "Retry-After", "7"),
			envelope.KindRetryable, envelope.ClassRateLimited, 7 * time.Second, 429, "rate_limit_exceeded", ""},
		{"429 retry-after date", withHeader(apiErr(429, "rate_limit_exceeded", "Too many requests"), "Retry-After", now.Add(42*time.Second).Format(http.TimeFormat)),
			envelope.KindRetryable, envelope.ClassRateLimited, 42 * time.Second, 429, "rate_limit_exceeded", ""},
		{"429 ratelimit-reset only", withHeader(apiErr(429, "rate_limit_exceeded", "Too many requests"), "Ratelimit-Reset", "3"),
			envelope.KindRetryable, envelope.ClassRateLimited, 3 * time.Second, 429, "rate_limit_exceeded", ""},
		{"429 daily quota", apiErr(429, "daily_quota_exceeded", "You have reached your daily email sending quota."),
			envelope.KindRetryable, envelope.ClassQuotaExceeded, 90 * time.Minute, 429, "daily_quota_exceeded", "quota exceeded"},
		{"429 monthly quota", apiErr(429, "monthly_quota_exceeded", "You have reached your monthly email sending quota."),
			envelope.KindRetryable, envelope.ClassQuotaExceeded, 24 * time.Hour, 429, "monthly_quota_exceeded", "quota exceeded"},
		{"400 validation", apiErr(400, "validation_error", "Invalid `to` field."),
			envelope.KindPermanent, envelope.ClassInvalidRequest, 0, 400, "validation_error", ""},
		{"400 idempotency key", apiErr(400, "invalid_idempotency_key", "bad key"),
			envelope.KindPermanent, envelope.ClassInvalidRequest, 0, 400, "invalid_idempotency_key", ""},
		{"422 from address", apiErr(422, "invalid_from_address", "Invalid `from` field."),
			envelope.KindPermanent, envelope.ClassInvalidRequest, 0, 422, "invalid_from_address", ""},
		{"401 missing key", apiErr(401, "missing_api_key", "Missing API key"),
			envelope.KindPermanent, envelope.ClassAuthFailed, 0, 401, "missing_api_key", "RESEND_API_KEY"},
		{"403 invalid key", apiErr(403, "invalid_api_key", "API key is invalid"),
			envelope.KindPermanent, envelope.ClassAuthFailed, 0, 403, "invalid_api_key", "RESEND_API_KEY"},
		{"451 security", apiErr(451, "security_error", "blocked"),
			envelope.KindPermanent, envelope.ClassInvalidRequest, 0, 451, "security_error", "security"},
		{"404 not found", apiErr(404, "not_found", "nope"),
			envelope.KindPermanent, envelope.ClassInvalidRequest, 0, 404, "not_found", ""},
		{"413 too large", apiErr(413, "", "too big"),
			envelope.KindPermanent, envelope.ClassPayloadTooLarge, 0, 413, "", ""},
		{"500 application", apiErr(500, "application_error", "oops"),
			envelope.KindRetryable, envelope.ClassProviderUnavailable, 0, 500, "application_error", ""},
		{"502 html", &canned{status: 502, header: map[string]string{"Content-Type": "text/html"}, body: "<html>bad gateway</html>"},
			envelope.KindRetryable, envelope.ClassProviderUnavailable, 0, 502, "", ""},
		{"503 internal", apiErr(503, "internal_server_error", "down"),
			envelope.KindRetryable, envelope.ClassProviderUnavailable, 0, 503, "internal_server_error", ""},
		{"unknown name dropped", apiErr(500, "weird_new_name", "x"),
			envelope.KindRetryable, envelope.ClassProviderUnavailable, 0, 500, "", ""},
		{"200 without id", &canned{status: 200, header: map[string]string{"Content-Type": "application/json"}, body: `{}`},
			envelope.KindRetryable, envelope.ClassProviderUnavailable, 0, 0, "", ""},
		{"200 garbled", &canned{status: 200, header: map[string]string{"Content-Type": "application/json"}, body: `{"id":`},
			envelope.KindRetryable, envelope.ClassProviderUnavailable, 0, 0, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeResend(t)
			f.setOverride(func(*fakeSend) *canned { return tt.answer })
			logger, logs := bufLogger()
			opts := f.options(t, logger)
			opts.Now = func() time.Time { return now }
			p := mustProvider(t, opts)
			rc, err := p.Deliver(context.Background(), envelope.Key{Tenant: "t", EnvelopeID: "e"}, emailMessage("r@example.net", "s"))
			de := mustClass(t, err, tt.kind, tt.class)
			if rc != (channels.Receipt{}) {
				t.Errorf("receipt %+v with an error", rc)
			}
			if de.RetryAfter != tt.retryAfter {
				t.Errorf("RetryAfter = %s, want %s", de.RetryAfter, tt.retryAfter)
			}
			if tt.status != 0 {
				var ae *APIError
				if !errors.As(err, &ae) {
					t.Fatalf("error does not wrap *APIError")
				}
				if ae.StatusCode != tt.status || ae.Name != tt.apiName {
					t.Errorf("APIError = %d %q, want %d %q", ae.StatusCode, ae.Name, tt.status, tt.apiName)
				}
			}
			if tt.logWant != "" && !strings.Contains(logs.String(), tt.logWant) {
				t.Errorf("log %q lacks an operator line mentioning %q", logs.String(), tt.logWant)
			}
			if !strings.Contains(logs.String(), `"error_class":"`+string(tt.class)+`"`) && tt.class != envelope.ClassQuotaExceeded {
				t.Errorf("log lacks error_class %s: %s", tt.class, logs.String())
			}
		})
	}
}

func TestProvider_Deliver_NoAnswer(t *testing.T) {
	t.Run("connection refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		p := mustProvider(t, Options{APIKey: testAPIKey, From: "a@example.com", BaseURL: "http://" + addr, Rate: rate.Inf,
			Logger: slog.New(slog.DiscardHandler)})
		_, err = p.Deliver(context.Background(), envelope.Key{EnvelopeID: "e"}, emailMessage("r@example.net", "s"))
		mustClass(t, err, envelope.KindRetryable, envelope.ClassUnreachable)
		if strings.Contains(err.Error(), addr) {
			t.Errorf("error %q contains the URL", err)
		}
	})
	t.Run("connection cut after the request", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = c.Read(make([]byte, 4096)) // the request reached the service
				c.Close()
			}
		}()
		p := mustProvider(t, Options{APIKey: testAPIKey, From: "a@example.com", BaseURL: "http://" + ln.Addr().String(), Rate: rate.Inf,
			Logger: slog.New(slog.DiscardHandler)})
		_, err = p.Deliver(context.Background(), envelope.Key{EnvelopeID: "e"}, emailMessage("r@example.net", "s"))
		mustClass(t, err, envelope.KindRetryable, envelope.ClassNetwork)
	})

	hanging := func(t *testing.T) (*fakeResend, chan struct{}) {
		f := newFakeResend(t)
		release := make(chan struct{})
		f.setOverride(func(*fakeSend) *canned { <-release; return apiErr(500, "application_error", "late") })
		t.Cleanup(func() { close(release) })
		return f, release
	}
	t.Run("client timeout", func(t *testing.T) {
		f, _ := hanging(t)
		opts := f.options(t, nil)
		opts.HTTPClient.Timeout = 50 * time.Millisecond
		p := mustProvider(t, opts)
		_, err := p.Deliver(context.Background(), envelope.Key{EnvelopeID: "e"}, emailMessage("r@example.net", "s"))
		mustClass(t, err, envelope.KindRetryable, envelope.ClassTimeout)
	})
	t.Run("context deadline", func(t *testing.T) {
		f, _ := hanging(t)
		p := mustProvider(t, f.options(t, nil))
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := p.Deliver(ctx, envelope.Key{EnvelopeID: "e"}, emailMessage("r@example.net", "s"))
		mustClass(t, err, envelope.KindRetryable, envelope.ClassTimeout)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("error does not wrap context.DeadlineExceeded")
		}
	})
	t.Run("context cancelled", func(t *testing.T) {
		f, release := hanging(t)
		p := mustProvider(t, f.options(t, nil))
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		// The service never answers (until the test ends): the only way
		// out for the client is the cancellation.
		f.setOverride(func(*fakeSend) *canned { close(started); <-release; return apiErr(500, "application_error", "late") })
		go func() { <-started; cancel() }()
		_, err := p.Deliver(ctx, envelope.Key{EnvelopeID: "e"}, emailMessage("r@example.net", "s"))
		mustClass(t, err, envelope.KindRetryable, envelope.ClassInterrupted)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error does not wrap context.Canceled")
		}
	})
}

func TestProvider_Deliver_InvalidMessage(t *testing.T) {
	f := newFakeResend(t)
	p := mustProvider(t, f.options(t, nil))
	mod := func(fn func(m *envelope.Message)) *envelope.Message {
		m := emailMessage("r@example.net", "s")
		fn(m)
		return m
	}
	tests := []struct {
		name  string
		msg   *envelope.Message
		class envelope.ErrorClass
	}{
		{"nil message", nil, envelope.ClassInvalidRequest},
		{"no email", &envelope.Message{Channel: envelope.ChannelEmail}, envelope.ClassInvalidRequest},
		{"wrong channel", mod(func(m *envelope.Message) { m.Channel = envelope.ChannelPush }), envelope.ClassInvalidRequest},
		{"no recipient", mod(func(m *envelope.Message) { m.Email.To = " " }), envelope.ClassInvalidRecipient},
		{"bad recipient", mod(func(m *envelope.Message) { m.Email.To = "not an address" }), envelope.ClassInvalidRecipient},
		{"no subject", mod(func(m *envelope.Message) { m.Email.Subject = "" }), envelope.ClassInvalidRequest},
		{"no body", mod(func(m *envelope.Message) { m.Email.HTML, m.Email.Text = "", "" }), envelope.ClassInvalidRequest},
		{"header injection", mod(func(m *envelope.Message) {
			m.Email.Headers = append(m.Email.Headers, envelope.Header{Name: "X-A", Value: "v\r\nBcc: x@example.com"})
		}), envelope.ClassInvalidRequest},
		{"bad header name", mod(func(m *envelope.Message) {
			m.Email.Headers = append(m.Email.Headers, envelope.Header{Name: "X A:", Value: "v"})
		}), envelope.ClassInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := p.Deliver(context.Background(), envelope.Key{EnvelopeID: "e"}, tt.msg)
			mustClass(t, err, envelope.KindPermanent, tt.class)
		})
	}
	if n := f.requestCount(); n != 0 {
		t.Errorf("fake got %d requests for invalid messages, want 0", n)
	}
}

func TestSanitizeTag(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain_Tag-1", "plain_Tag-1"},
		{"your-week-digest.v1", "your-week-digest_v1"},
		{"a b/c", "a_b_c"},
		{"é", "__"},
		{strings.Repeat("x", 300), strings.Repeat("x", 256)},
		{"", ""},
	}
	for _, tt := range tests {
		if got := sanitizeTag(tt.in); got != tt.want {
			t.Errorf("sanitizeTag(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestProvider_Reconcile(t *testing.T) {
	key := envelope.Key{Tenant: "t", EnvelopeID: "env-1"}
	msg := func() *envelope.Message { return emailMessage("r@example.net", "Hello") }
	ctx := context.Background()

	t.Run("after accepted deliver", func(t *testing.T) {
		f := newFakeResend(t)
		p := mustProvider(t, f.options(t, nil))
		rc, err := p.Deliver(ctx, key, msg())
		if err != nil {
			t.Fatal(err)
		}
		r, err := p.Reconcile(ctx, key, msg())
		if err != nil || r.Outcome != channels.Accepted || r.Receipt != rc {
			t.Fatalf("Reconcile = %+v, %v; want accepted %q", r, err, rc.ID)
		}
		if f.created() != 1 {
			t.Errorf("fake created %d e-mails, want 1", f.created())
		}
	})
	t.Run("lost receipt", func(t *testing.T) {
		f := newFakeResend(t)
		f.setLoseNext(1)
		p := mustProvider(t, f.options(t, nil))
		_, err := p.Deliver(ctx, key, msg())
		mustClass(t, err, envelope.KindRetryable, envelope.ClassProviderUnavailable)
		r, err := p.Reconcile(ctx, key, msg())
		if err != nil || r.Outcome != channels.Accepted {
			t.Fatalf("Reconcile = %+v, %v; want accepted", r, err)
		}
		if want := f.idFor(key.IdempotencyKey()); r.Receipt.ID != want {
			t.Errorf("receipt %q, want the original id %q", r.Receipt.ID, want)
		}
		if f.created() != 1 {
			t.Errorf("fake created %d e-mails, want 1", f.created())
		}
	})
	t.Run("never reached resend", func(t *testing.T) {
		f := newFakeResend(t)
		f.setOverride(func(*fakeSend) *canned { return apiErr(502, "", "gateway") })
		p := mustProvider(t, f.options(t, nil))
		if _, err := p.Deliver(ctx, key, msg()); err == nil {
			t.Fatal("Deliver succeeded")
		}
		f.setOverride(nil)
		r, err := p.Reconcile(ctx, key, msg())
		if err != nil || r.Outcome != channels.Accepted || r.Receipt.ID == "" {
			t.Fatalf("Reconcile = %+v, %v; want accepted with an id", r, err)
		}
		if f.created() != 1 {
			t.Errorf("fake created %d e-mails, want 1", f.created())
		}
	})
	t.Run("changed payload", func(t *testing.T) {
		f := newFakeResend(t)
		p := mustProvider(t, f.options(t, nil))
		if _, err := p.Deliver(ctx, key, msg()); err != nil {
			t.Fatal(err)
		}
		r, err := p.Reconcile(ctx, key, emailMessage("r@example.net", "Different subject"))
		if err != nil || r.Outcome != channels.Unknown {
			t.Fatalf("Reconcile = %+v, %v; want unknown without error", r, err)
		}
	})
	statusCases := []struct {
		name    string
		answer  *canned
		outcome channels.Outcome
		wantErr bool
	}{
		{"validation rejected", apiErr(422, "validation_error", "bad"), channels.Rejected, false},
		{"400 rejected", apiErr(400, "validation_error", "bad"), channels.Rejected, false},
		{"server error unknown", apiErr(500, "application_error", "oops"), channels.Unknown, true},
		{"concurrent unknown", apiErr(409, "concurrent_idempotent_requests", "busy"), channels.Unknown, true},
		{"auth unknown", apiErr(401, "missing_api_key", "no"), channels.Unknown, true},
		{"rate limited unknown", apiErr(429, "rate_limit_exceeded", "slow"), channels.Unknown, true},
	}
	for _, tt := range statusCases {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeResend(t)
			p := mustProvider(t, f.options(t, nil))
			f.setOverride(func(*fakeSend) *canned { return apiErr(503, "internal_server_error", "down") })
			if _, err := p.Deliver(ctx, key, msg()); err == nil {
				t.Fatal("Deliver succeeded")
			}
			f.setOverride(func(*fakeSend) *canned { return tt.answer })
			r, err := p.Reconcile(ctx, key, msg())
			if r.Outcome != tt.outcome || (err != nil) != tt.wantErr {
				t.Fatalf("Reconcile = %s, %v; want %s (error %v)", r.Outcome, err, tt.outcome, tt.wantErr)
			}
			if r.Receipt != (channels.Receipt{}) {
				t.Errorf("receipt %+v with outcome %s", r.Receipt, r.Outcome)
			}
		})
	}
	t.Run("first attempt unknown", func(t *testing.T) {
		f := newFakeResend(t)
		p := mustProvider(t, f.options(t, nil))
		r, err := p.Reconcile(ctx, key, msg())
		if err != nil || r.Outcome != channels.Unknown {
			t.Fatalf("Reconcile = %+v, %v; want unknown", r, err)
		}
		if n := f.requestCount(); n != 0 {
			t.Errorf("Reconcile called Resend %d times without a known first attempt", n)
		}
	})
	t.Run("window passed", func(t *testing.T) {
		f := newFakeResend(t)
		c := &clock{t: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
		opts := f.options(t, nil)
		opts.Now = c.Now
		p := mustProvider(t, opts)
		f.setLoseNext(1)
		if _, err := p.Deliver(ctx, key, msg()); err == nil {
			t.Fatal("Deliver succeeded")
		}
		c.Add(IdempotencyWindow - ReplayMargin - time.Minute)
		before := f.requestCount()
		if r, err := p.Reconcile(ctx, key, msg()); err != nil || r.Outcome != channels.Accepted {
			t.Fatalf("Reconcile inside the window = %+v, %v; want accepted", r, err)
		}
		c.Add(2 * time.Minute)
		r, err := p.Reconcile(ctx, key, msg())
		if err != nil || r.Outcome != channels.Unknown {
			t.Fatalf("Reconcile after the window = %+v, %v; want unknown", r, err)
		}
		if n := f.requestCount() - before; n != 1 {
			t.Errorf("Resend called %d times by two reconciles, want 1 (none after the window)", n)
		}
	})
	t.Run("first attempt hook", func(t *testing.T) {
		now := time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC)
		tests := []struct {
			name string
			hook func(envelope.Key) (time.Time, bool)
			want channels.Outcome
		}{
			{"recent", func(k envelope.Key) (time.Time, bool) { return now.Add(-time.Hour), k == key }, channels.Accepted},
			{"expired", func(envelope.Key) (time.Time, bool) { return now.Add(-25 * time.Hour), true }, channels.Unknown},
			{"unknown", func(envelope.Key) (time.Time, bool) { return time.Time{}, false }, channels.Unknown},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				f := newFakeResend(t)
				opts := f.options(t, nil)
				opts.Now = func() time.Time { return now }
				opts.FirstAttempt = tt.hook
				p := mustProvider(t, opts)
				r, err := p.Reconcile(ctx, key, msg())
				if err != nil || r.Outcome != tt.want {
					t.Fatalf("Reconcile = %+v, %v; want %s", r, err, tt.want)
				}
			})
		}
	})
	t.Run("hook older than memory wins", func(t *testing.T) {
		c := &clock{t: time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC)}
		f := newFakeResend(t)
		opts := f.options(t, nil)
		opts.Now = c.Now
		start := c.Now()
		opts.FirstAttempt = func(envelope.Key) (time.Time, bool) { return start.Add(-23 * time.Hour), true }
		p := mustProvider(t, opts)
		if _, err := p.Deliver(ctx, key, msg()); err != nil {
			t.Fatal(err)
		}
		c.Add(time.Hour) // 24 h after the hook's first attempt, 1 h after ours
		r, err := p.Reconcile(ctx, key, msg())
		if err != nil || r.Outcome != channels.Unknown {
			t.Fatalf("Reconcile = %+v, %v; want unknown (the earlier first attempt counts)", r, err)
		}
	})
}

func TestProvider_RateLimitSharedAndHonoursContext(t *testing.T) {
	f := newFakeResend(t)
	opts := f.options(t, nil)
	opts.Rate = rate.Every(time.Hour)
	opts.Burst = 1
	p := mustProvider(t, opts)
	key := envelope.Key{EnvelopeID: "e"}
	if _, err := p.Deliver(context.Background(), key, emailMessage("r@example.net", "s")); err != nil {
		t.Fatalf("first Deliver: %v", err)
	}

	// Every later call waits for the shared limiter: a deadline shorter
	// than the wait fails at once, a cancelled context too.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := p.Deliver(ctx, envelope.Key{EnvelopeID: "e2"}, emailMessage("r@example.net", "s"))
	mustClass(t, err, envelope.KindRetryable, envelope.ClassTimeout)

	r, err := p.Reconcile(ctx, key, emailMessage("r@example.net", "s"))
	if r.Outcome != channels.Unknown || err == nil {
		t.Errorf("Reconcile = %s, %v; want unknown with a limiter error", r.Outcome, err)
	}

	poller, perr := NewPoller(p, &recordingSuppressor{}, PollerOptions{})
	if perr != nil {
		t.Fatal(perr)
	}
	if err := poller.PollOnce(ctx); err == nil {
		t.Errorf("PollOnce succeeded past the rate limit")
	}

	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	_, err = p.Deliver(cctx, envelope.Key{EnvelopeID: "e3"}, emailMessage("r@example.net", "s"))
	mustClass(t, err, envelope.KindRetryable, envelope.ClassInterrupted)

	if n := f.requestCount(); n != 1 {
		t.Errorf("fake got %d requests, want 1 (the rest held by the limiter)", n)
	}
}

func TestProvider_RateLimitPaces(t *testing.T) {
	f := newFakeResend(t)
	opts := f.options(t, nil)
	opts.Rate = 50 // one request every 20 ms
	opts.Burst = 1
	p := mustProvider(t, opts)
	start := time.Now()
	for i := range 4 {
		if _, err := p.Deliver(context.Background(), envelope.Key{EnvelopeID: fmt.Sprint(i)}, emailMessage("r@example.net", "s")); err != nil {
			t.Fatal(err)
		}
	}
	if el := time.Since(start); el < 55*time.Millisecond {
		t.Errorf("4 sends at 50/s took %s, want at least 60ms", el)
	}
}

// TestProvider_ConcurrentStatuses sends concurrently while the fake
// answers each request with a different status: the per-request capture
// must give every call its own answer.
func TestProvider_ConcurrentStatuses(t *testing.T) {
	f := newFakeResend(t)
	answers := map[string]*canned{
		"s409c": apiErr(409, "concurrent_idempotent_requests", "busy"),
		"s409i": apiErr(409, "invalid_idempotent_request", "differs"),
		"s429":  {status: 429, header: map[string]string{"Content-Type": "application/json", "Retry-After": "9"}, body: `{"statusCode":429,"name":"rate_limit_exceeded","message":"slow"}`},
		"s422":  apiErr(422, "validation_error", "bad"),
		"s401":  apiErr(401, "missing_api_key", "no"),
		"s500":  apiErr(500, "application_error", "oops"),
		"s200":  nil,
	}
	want := map[string]struct {
		kind  envelope.Kind
		class envelope.ErrorClass
		ra    time.Duration
	}{
		"s409c": {envelope.KindRetryable, envelope.ClassIdempotencyConflict, 0},
		"s409i": {envelope.KindPermanent, envelope.ClassIdempotencyConflict, 0},
		"s429":  {envelope.KindRetryable, envelope.ClassRateLimited, 9 * time.Second},
		"s422":  {envelope.KindPermanent, envelope.ClassInvalidRequest, 0},
		"s401":  {envelope.KindPermanent, envelope.ClassAuthFailed, 0},
		"s500":  {envelope.KindRetryable, envelope.ClassProviderUnavailable, 0},
	}
	f.setOverride(func(s *fakeSend) *canned {
		c := answers[s.Body.Subject]
		if c == nil {
			return nil
		}
		// Copy: the header map is shared by concurrent handlers.
		h := map[string]string{}
		for k, v := range c.header {
			h[k] = v
		}
		return &canned{status: c.status, header: h, body: c.body}
	})
	p := mustProvider(t, f.options(t, nil))
	subjects := []string{"s409c", "s409i", "s429", "s422", "s401", "s500", "s200"}
	const rounds = 12
	var wg sync.WaitGroup
	for i := range rounds * len(subjects) {
		subject := subjects[i%len(subjects)]
		wg.Go(func() {
			key := envelope.Key{EnvelopeID: fmt.Sprintf("c-%d", i)}
			rc, err := p.Deliver(context.Background(), key, emailMessage("r@example.net", subject))
			if subject == "s200" {
				if err != nil || rc.ID == "" {
					t.Errorf("%s: Deliver = %+v, %v; want success", subject, rc, err)
				}
				return
			}
			var de *envelope.DeliveryError
			if !errors.As(err, &de) {
				t.Errorf("%s: error %v is not classified", subject, err)
				return
			}
			w := want[subject]
			if de.Kind != w.kind || de.Class != w.class || de.RetryAfter != w.ra {
				t.Errorf("%s: got %s/%s/%s, want %s/%s/%s", subject, de.Kind, de.Class, de.RetryAfter, w.kind, w.class, w.ra)
			}
		})
	}
	wg.Wait()
}
