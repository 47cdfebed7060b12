package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
)

// checkResponse fails on a 5xx and on an error response that is not the
// documented JSON error shape.
func checkResponse(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	if w.Code >= 500 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if w.Code >= 400 {
		var e errorBody
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
			t.Fatalf("status %d with a malformed error body %q", w.Code, w.Body)
		}
	}
}

// fixtureSeeds returns the shared delivery fixtures (valid and invalid).
func fixtureSeeds() [][]byte {
	var out [][]byte
	for _, pattern := range []string{"../../testdata/delivery/*.json", "../../testdata/delivery/invalid/*.json"} {
		files, _ := filepath.Glob(pattern)
		for _, file := range files {
			if b, err := os.ReadFile(file); err == nil {
				out = append(out, b)
			}
		}
	}
	return out
}

func FuzzEnvelopesBody(f *testing.F) {
	fx := newFixture(f, func(c *Config) { c.MaxBody = 64 << 10 })
	for _, u := range []string{"u_1", "u_42"} {
		fx.grant("", u)
	}
	d, _ := json.Marshal(digest("d/1", "u_1"))
	n, _ := json.Marshal(nudge("n/1", "u_1"))
	r, _ := json.Marshal(reply("r/1", "u_1", "hello"))
	for _, seed := range [][]byte{d, n, r, []byte("[" + string(d) + "," + string(n) + "]"), []byte("[]"), []byte("{"), []byte("null"), []byte("[1,2"), []byte("\xef\xbb\xbf{}")} {
		f.Add(seed)
	}
	for _, seed := range fixtureSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		w := serve(fx.h, "POST", "/v1/envelopes", string(body))
		checkResponse(t, w)
		if w.Code == http.StatusBadRequest {
			var e errorBody
			_ = json.Unmarshal(w.Body.Bytes(), &e)
			if e.Error.Code == CodeInvalidEnvelope && len(e.Error.Problems) == 0 {
				t.Fatalf("invalid_envelope without problems: %s", w.Body)
			}
		}
	})
}

func FuzzStatusBody(f *testing.F) {
	fx := newFixture(f)
	fx.grant("", "u_1")
	var envs []*envelope.Envelope
	for _, id := range []string{"e/1", "e/2", "e/3"} {
		envs = append(envs, digest(id, "u_1"))
	}
	body, _ := json.Marshal(envs)
	if w := serve(fx.h, "POST", "/v1/envelopes", string(body)); w.Code != http.StatusCreated {
		f.Fatalf("enqueue: %d", w.Code)
	}
	if w := serve(fx.h, "GET", "/internal/outbox/pending?channel=email&limit=2", ""); w.Code != http.StatusOK {
		f.Fatalf("pending: %d", w.Code)
	}
	for _, seed := range []string{
		`{"status":"delivered"}`, `{"status":"failed","error_class":"timeout"}`, `{"status":"bounced","fence":1}`,
		`{"status":"complaint","detail":{"x":1}}`, `{"status":"suppressed","fence":-1}`, `{"status":"delivered","fence":1e99}`,
		`{"status":null}`, `[]`, `{"status":"delivered"}{}`, ``, `{"fence":18446744073709551615,"status":"failed"}`,
	} {
		f.Add(seed, uint8(0))
	}
	ids := []string{"e/1", "e/2", "e/3", "nope"}
	f.Fuzz(func(t *testing.T, body string, which uint8) {
		id := ids[int(which)%len(ids)]
		w := serve(fx.h, "POST", "/internal/outbox/"+url.PathEscape(id)+"/status", body)
		checkResponse(t, w)
	})
}

func FuzzUnsubscribeToken(f *testing.F) {
	u := NewUnsubscriber(testKey(7), "https://mail.example.org")
	valid := []string{
		u.URL(digest("d/1", "u_1")),
		u.URL(nudge("n/1", "u_2")),
		u.Token("acme", "ユーザー", envelope.ChannelTelegram, strings.Repeat("r", 300)),
	}
	for i, v := range valid {
		valid[i] = v[strings.LastIndexByte(v, '/')+1:]
	}
	isValid := map[string]bool{}
	for _, v := range valid {
		isValid[v] = true
		f.Add(v, uint16(0), byte('A'))
		f.Add(v, uint16(len(v)-1), byte('B'))
	}
	f.Add("", uint16(3), byte(0))
	f.Add("AQ", uint16(1), byte('_'))
	h, err := New(Config{Store: newFixture(f).q, Unsub: u})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string, pos uint16, c byte) {
		// Arbitrary input: never panics, and only a token we signed verifies.
		if _, _, _, err := u.Verify(s); err == nil && !isValid[s] {
			t.Fatalf("Verify accepted a token that was never signed: %q", s)
		}
		// A mutated valid token fails.
		v := valid[int(pos)%len(valid)]
		b := []byte(v)
		b[int(pos)%len(b)] = c
		if m := string(b); m != v {
			if _, _, _, err := u.Verify(m); err == nil {
				t.Fatalf("mutated token %q (of %q) verified", m, v)
			}
		}
		// GET never changes anything and never fails with a 5xx.
		w := serve(h, "GET", "/unsubscribe/"+url.PathEscape(s), "")
		if w.Code >= 500 {
			t.Fatalf("GET unsubscribe: %d", w.Code)
		}
	})
}
