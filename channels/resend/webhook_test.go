package resend

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// testWebhookKey is the raw signing key; testWebhookSecret its whsec_ form.
var (
	testWebhookKey    = []byte("0123456789abcdef0123456789abcdef")
	testWebhookSecret = "whsec_" + base64.StdEncoding.EncodeToString(testWebhookKey)
)

// sign returns the v1 signature of (id, ts, body) under key.
func sign(key []byte, id, ts string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// signedHeader returns svix headers signing body at t.
func signedHeader(key []byte, id string, t time.Time, body []byte) http.Header {
	ts := strconv.FormatInt(t.Unix(), 10)
	h := http.Header{}
	h.Set("svix-id", id)
	h.Set("svix-timestamp", ts)
	h.Set("svix-signature", sign(key, id, ts, body))
	return h
}

func TestVerifyWebhook(t *testing.T) {
	now := time.Unix(1_770_000_000, 0)
	body := []byte(`{"type":"email.bounced","data":{"to":["a@example.net"]}}`)
	good := signedHeader(testWebhookKey, "msg_1", now, body)
	with := func(k, v string) http.Header {
		h := good.Clone()
		if v == "" {
			h.Del(k)
		} else {
			h.Set(k, v)
		}
		return h
	}
	otherKey := []byte("another key, not the right one!!")
	tests := []struct {
		name   string
		secret string
		header http.Header
		body   []byte
		now    time.Time
		want   error
	}{
		{"good", testWebhookSecret, good, body, now, nil},
		{"secret without prefix", strings.TrimPrefix(testWebhookSecret, "whsec_"), good, body, now, nil},
		{"several signatures, one good", testWebhookSecret,
			with("svix-signature", "v1,AAAA "+sign(otherKey, "msg_1", strconv.FormatInt(now.Unix(), 10), body)+" "+good.Get("svix-signature")), body, now, nil},
		{"v2 prefix ignored", testWebhookSecret,
			with("svix-signature", strings.Replace(good.Get("svix-signature"), "v1,", "v2,", 1)), body, now, ErrWebhookSignature},
		{"4m59s late", testWebhookSecret, good, body, now.Add(4*time.Minute + 59*time.Second), nil},
		{"stale", testWebhookSecret, good, body, now.Add(5*time.Minute + time.Second), ErrWebhookTimestamp},
		{"future", testWebhookSecret, good, body, now.Add(-6 * time.Minute), ErrWebhookTimestamp},
		{"wrong key", "whsec_" + base64.StdEncoding.EncodeToString(otherKey), good, body, now, ErrWebhookSignature},
		{"body altered", testWebhookSecret, good, append(append([]byte{}, body...), ' '), now, ErrWebhookSignature},
		{"id altered", testWebhookSecret, with("svix-id", "msg_2"), body, now, ErrWebhookSignature},
		{"missing id", testWebhookSecret, with("svix-id", ""), body, now, ErrWebhookHeaders},
		{"missing timestamp", testWebhookSecret, with("svix-timestamp", ""), body, now, ErrWebhookHeaders},
		{"missing signature", testWebhookSecret, with("svix-signature", ""), body, now, ErrWebhookHeaders},
		{"id too long", testWebhookSecret, with("svix-id", strings.Repeat("i", 300)), body, now, ErrWebhookHeaders},
		{"timestamp not a number", testWebhookSecret, with("svix-timestamp", "soon"), body, now, ErrWebhookHeaders},
		{"signature without version", testWebhookSecret,
			with("svix-signature", strings.TrimPrefix(good.Get("svix-signature"), "v1,")), body, now, ErrWebhookSignature},
		{"bad secret", "whsec_!!!not base64", good, body, now, ErrWebhookSecret},
		{"empty secret", "", good, body, now, ErrWebhookSecret},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := VerifyWebhook(tt.secret, tt.header, tt.body, tt.now)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("VerifyWebhook = %v, want %v", err, tt.want)
			}
		})
	}
}

// webhookFixture is a handler with a fixed clock, a recording suppressor
// and a captured log.
type webhookFixture struct {
	h    *WebhookHandler
	sup  *recordingSuppressor
	logs *lockedBuffer
	now  time.Time
}

func newWebhookFixture(t *testing.T, opts WebhookOptions) *webhookFixture {
	t.Helper()
	fx := &webhookFixture{sup: &recordingSuppressor{}, now: time.Unix(1_770_000_000, 0)}
	logger, logs := bufLogger()
	fx.logs = logs
	opts.Logger = logger
	opts.Now = func() time.Time { return fx.now }
	h, err := NewWebhookHandler(testWebhookSecret, fx.sup, opts)
	if err != nil {
		t.Fatalf("NewWebhookHandler: %v", err)
	}
	fx.h = h
	return fx
}

// post sends body signed with id at the fixture's clock (or with header).
func (fx *webhookFixture) post(body []byte, header http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/webhooks/resend", bytes.NewReader(body))
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	fx.h.ServeHTTP(rec, req)
	return rec
}

func event(typ string, to ...string) []byte {
	b, _ := json.Marshal(map[string]any{
		"type":       typ,
		"created_at": "2026-02-02T10:00:00.000Z",
		"data": map[string]any{
			"email_id": "4ef9a417-02e9-4d39-ad75-000000000001",
			"from":     "outbox@example.com",
			"to":       to,
			"subject":  "CANARY-SUBJECT",
			"bounce":   map[string]any{"type": "Permanent", "message": "CANARY-BOUNCE-TEXT"},
		},
	})
	return b
}

// errorCode decodes a JSON error answer.
func errorCode(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	var v struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("error body %q is not JSON: %v", rec.Body.String(), err)
	}
	if v.Error.Message == "" {
		t.Errorf("error body %q has no message", rec.Body.String())
	}
	return v.Error.Code
}

func TestWebhookHandler(t *testing.T) {
	const rcpt = "canary-rcpt@example.net"
	t.Run("bounced and complained", func(t *testing.T) {
		fx := newWebhookFixture(t, WebhookOptions{Tenant: "acme"})
		b1 := event(EventEmailBounced, rcpt)
		if rec := fx.post(b1, signedHeader(testWebhookKey, "msg_1", fx.now, b1)); rec.Code != http.StatusOK {
			t.Fatalf("bounced: status %d %s", rec.Code, rec.Body)
		}
		b2 := event(EventEmailComplained, "Other <other@example.net>")
		if rec := fx.post(b2, signedHeader(testWebhookKey, "msg_2", fx.now, b2)); rec.Code != http.StatusOK {
			t.Fatalf("complained: status %d %s", rec.Code, rec.Body)
		}
		want := []suppression{{"acme", rcpt, envelope.ClassBounced}, {"acme", "other@example.net", envelope.ClassComplaint}}
		if got := fx.sup.got(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("suppressions = %v, want %v", got, want)
		}
		for _, c := range []string{rcpt, "other@example.net", "CANARY", "msg_1"} {
			if strings.Contains(fx.logs.String(), c) {
				t.Errorf("log contains %q: %s", c, fx.logs.String())
			}
		}
	})
	t.Run("other events ignored", func(t *testing.T) {
		fx := newWebhookFixture(t, WebhookOptions{})
		for i, typ := range []string{"email.delivered", "email.opened", "contact.created", "something.new"} {
			b := event(typ, rcpt)
			id := "msg_" + strconv.Itoa(i)
			if rec := fx.post(b, signedHeader(testWebhookKey, id, fx.now, b)); rec.Code != http.StatusOK {
				t.Errorf("%s: status %d", typ, rec.Code)
			}
		}
		if got := fx.sup.got(); len(got) != 0 {
			t.Errorf("suppressions = %v, want none", got)
		}
	})
	t.Run("bad signature", func(t *testing.T) {
		fx := newWebhookFixture(t, WebhookOptions{})
		b := event(EventEmailBounced, rcpt)
		h := signedHeader([]byte("wrong key wrong key wrong key !!"), "msg_CANARYID", fx.now, b)
		rec := fx.post(b, h)
		if rec.Code != http.StatusUnauthorized {
			t.Fatalf("status %d, want 401", rec.Code)
		}
		if code := errorCode(t, rec); code != "bad_signature" {
			t.Errorf("code = %q, want bad_signature", code)
		}
		for _, c := range []string{rcpt, "CANARY", h.Get("svix-signature"), h.Get("svix-timestamp")} {
			if strings.Contains(rec.Body.String(), c) {
				t.Errorf("401 body echoes %q: %s", c, rec.Body)
			}
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type = %q", ct)
		}
		if len(fx.sup.got()) != 0 {
			t.Errorf("a badly signed event was applied")
		}
	})
	t.Run("stale timestamp", func(t *testing.T) {
		fx := newWebhookFixture(t, WebhookOptions{})
		b := event(EventEmailBounced, rcpt)
		rec := fx.post(b, signedHeader(testWebhookKey, "msg_1", fx.now.Add(-10*time.Minute), b))
		if rec.Code != http.StatusUnauthorized || errorCode(t, rec) != "bad_signature" {
			t.Fatalf("status %d %s, want 401 bad_signature", rec.Code, rec.Body)
		}
		if len(fx.sup.got()) != 0 {
			t.Errorf("a stale event was applied")
		}
	})
	t.Run("duplicate svix-id", func(t *testing.T) {
		fx := newWebhookFixture(t, WebhookOptions{})
		b := event(EventEmailBounced, rcpt)
		for range 3 {
			if rec := fx.post(b, signedHeader(testWebhookKey, "msg_dup", fx.now, b)); rec.Code != http.StatusOK {
				t.Fatalf("status %d", rec.Code)
			}
		}
		if got := fx.sup.got(); len(got) != 1 {
			t.Errorf("suppressions = %d, want 1 (deduplicated on svix-id)", len(got))
		}
		// After the TTL the id is forgotten.
		fx.now = fx.now.Add(DefaultWebhookDedupeTTL + time.Minute)
		if rec := fx.post(b, signedHeader(testWebhookKey, "msg_dup", fx.now, b)); rec.Code != http.StatusOK {
			t.Fatalf("status %d", rec.Code)
		}
		if got := fx.sup.got(); len(got) != 2 {
			t.Errorf("suppressions = %d after the dedupe TTL, want 2", len(got))
		}
	})
	t.Run("dedupe set is bounded", func(t *testing.T) {
		fx := newWebhookFixture(t, WebhookOptions{DedupeSize: 3})
		b := event("email.delivered", rcpt)
		for i := range 10 {
			fx.post(b, signedHeader(testWebhookKey, "msg_"+strconv.Itoa(i), fx.now, b))
		}
		if n := fx.h.seen.len(); n != 3 {
			t.Errorf("dedupe set holds %d ids, want 3", n)
		}
	})
	t.Run("oversized body", func(t *testing.T) {
		fx := newWebhookFixture(t, WebhookOptions{})
		big := bytes.Repeat([]byte("x"), DefaultWebhookMaxBody+1)
		rec := fx.post(big, signedHeader(testWebhookKey, "msg_big", fx.now, big))
		if rec.Code != http.StatusRequestEntityTooLarge || errorCode(t, rec) != "body_too_large" {
			t.Fatalf("status %d %s, want 413 body_too_large", rec.Code, rec.Body)
		}
		// Without a Content-Length (chunked), the limit still holds.
		req := httptest.NewRequest(http.MethodPost, "/", struct{ *bytes.Reader }{bytes.NewReader(big)})
		req.ContentLength = -1
		for k, v := range signedHeader(testWebhookKey, "msg_big", fx.now, big) {
			req.Header[k] = v
		}
		rec = httptest.NewRecorder()
		fx.h.ServeHTTP(rec, req)
		if rec.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("chunked: status %d, want 413", rec.Code)
		}
		// Exactly the limit is fine (and then fails as bad JSON, 400).
		exact := bytes.Repeat([]byte(" "), DefaultWebhookMaxBody)
		rec = fx.post(exact, signedHeader(testWebhookKey, "msg_exact", fx.now, exact))
		if rec.Code != http.StatusBadRequest {
			t.Errorf("body of exactly the limit: status %d, want 400 (not JSON)", rec.Code)
		}
	})
	t.Run("method", func(t *testing.T) {
		fx := newWebhookFixture(t, WebhookOptions{})
		rec := httptest.NewRecorder()
		fx.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != http.MethodPost {
			t.Errorf("GET: status %d Allow %q", rec.Code, rec.Header().Get("Allow"))
		}
	})
	t.Run("suppressor failure is retried", func(t *testing.T) {
		fx := newWebhookFixture(t, WebhookOptions{})
		fx.sup.setErr(errors.New("disk full"))
		b := event(EventEmailBounced, rcpt)
		h := signedHeader(testWebhookKey, "msg_retry", fx.now, b)
		rec := fx.post(b, h)
		if rec.Code != http.StatusInternalServerError || errorCode(t, rec) != "internal" {
			t.Fatalf("status %d %s, want 500 internal", rec.Code, rec.Body)
		}
		if strings.Contains(rec.Body.String(), "disk full") {
			t.Errorf("500 body echoes the internal error")
		}
		fx.sup.setErr(nil)
		if rec := fx.post(b, h); rec.Code != http.StatusOK {
			t.Fatalf("retry: status %d", rec.Code)
		}
		if got := fx.sup.got(); len(got) != 1 {
			t.Errorf("suppressions after retry = %d, want 1 (a failed event is not marked seen)", len(got))
		}
	})
}

func TestNewWebhookHandler_Errors(t *testing.T) {
	if _, err := NewWebhookHandler("whsec_%%%SECRET", &recordingSuppressor{}, WebhookOptions{}); !errors.Is(err, ErrWebhookSecret) {
		t.Errorf("bad secret: %v", err)
	} else if strings.Contains(err.Error(), "SECRET") {
		t.Errorf("error %q contains the secret", err)
	}
	if _, err := NewWebhookHandler(testWebhookSecret, nil, WebhookOptions{}); err == nil {
		t.Errorf("nil suppressor accepted")
	}
	if _, err := NewWebhookHandler(testWebhookSecret, &recordingSuppressor{}, WebhookOptions{MaxBodyBytes: -1}); err == nil {
		t.Errorf("negative MaxBodyBytes accepted")
	}
}

func FuzzVerifyWebhook(f *testing.F) {
	now := time.Unix(1_770_000_000, 0)
	ts := strconv.FormatInt(now.Unix(), 10)
	body := []byte(`{"type":"email.bounced"}`)
	f.Add("msg_1", ts, sign(testWebhookKey, "msg_1", ts, body), body)
	f.Add("msg_1", ts, "v1,"+strings.Repeat("A", 44)+" v1,garbage", []byte{})
	f.Add("", "-1", "v1", []byte("x"))
	f.Add("id", "99999999999999999999", "v1,,,", []byte("\x00\xff"))
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		h := http.Header{}
		h.Set("svix-id", id)
		h.Set("svix-timestamp", ts)
		h.Set("svix-signature", sig)
		err := VerifyWebhook(testWebhookSecret, h, body, now)
		if err != nil && !errors.Is(err, ErrWebhookHeaders) && !errors.Is(err, ErrWebhookTimestamp) && !errors.Is(err, ErrWebhookSignature) {
			t.Fatalf("unexpected error %v", err)
		}
		if err == nil {
			// Only a correct signature may pass.
			want := sign(testWebhookKey, h.Get("svix-id"), h.Get("svix-timestamp"), body)
			found := false
			for _, f := range strings.Fields(h.Get("svix-signature")) {
				found = found || f == want
			}
			if !found {
				t.Fatalf("accepted a signature that is not the HMAC")
			}
		}
		// A correct signature over the same inputs verifies when the
		// headers are well formed and the time is right.
		if hid, hts := h.Get("svix-id"), h.Get("svix-timestamp"); hid != "" && hts != "" && len(hid) <= maxWebhookID {
			if sec, perr := strconv.ParseInt(hts, 10, 64); perr == nil && sec >= 0 && sec < 1<<40 {
				good := h.Clone()
				good.Set("svix-signature", sign(testWebhookKey, hid, hts, body))
				if err := VerifyWebhook(testWebhookSecret, good, body, time.Unix(sec, 0)); err != nil {
					t.Fatalf("a correct signature failed: %v", err)
				}
				if err := VerifyWebhook(testWebhookSecret, good, append(append([]byte{}, body...), 'x'), time.Unix(sec, 0)); err == nil {
					t.Fatalf("an altered body verified")
				}
			}
		}
	})
}
