package envelope

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The fast path of ValidEncoding may say "not sure" about a valid envelope
// but must never accept one that the full check (the whole JSON Schema and
// the Go rules) rejects. These tests hold it to that on the fixtures, on
// mutations of every field, and under fuzzing.

func fixtureEnvelopes(tb testing.TB) (golden, invalid []*Envelope) {
	tb.Helper()
	load := func(pattern string) []*Envelope {
		names, err := filepath.Glob(pattern)
		if err != nil || len(names) == 0 {
			tb.Fatalf("no fixtures match %s", pattern)
		}
		var out []*Envelope
		for _, name := range names {
			data, err := os.ReadFile(name)
			if err != nil {
				tb.Fatal(err)
			}
			e := new(Envelope)
			if json.Unmarshal(data, e) == nil {
				out = append(out, e)
			}
		}
		return out
	}
	dir := filepath.Join("..", "testdata", "delivery")
	return load(filepath.Join(dir, "*.golden.json")), load(filepath.Join(dir, "invalid", "*.json"))
}

// checkFast fails t when the fast path accepts e but the full check does
// not; it reports what each said.
func checkFast(t *testing.T, what string, e *Envelope) (fast, full bool) {
	t.Helper()
	data, rows, fast := fastEncoding(e)
	fast = fast && len(encodingProblems(e)) == 0
	want, err := fullEncoding(e, encodingProblems(e))
	full = err == nil
	if fast && !full {
		t.Errorf("%s: the fast path accepts an envelope the full check rejects: %v", what, err)
	}
	if fast && full && string(data) != string(want) {
		t.Errorf("%s: the fast path encodes\n%s\nthe full check\n%s", what, data, want)
	}
	if fast && rows != Rows(e) {
		t.Errorf("%s: the fast path counts %d rows, Rows %d", what, rows, Rows(e))
	}
	return fast, full
}

func TestFastValid_Goldens(t *testing.T) {
	golden, invalid := fixtureEnvelopes(t)
	if len(golden) != 3 {
		t.Fatalf("%d golden fixtures decoded, want 3", len(golden))
	}
	for _, e := range golden {
		for _, tenant := range []string{"", DefaultTenant, "acme"} {
			cp := *e
			cp.TenantID = tenant
			if fast, full := checkFast(t, string(e.Template), &cp); !fast || !full {
				t.Errorf("%s (tenant %q): fast %v, full %v; want both to accept a golden fixture", e.Template, tenant, fast, full)
			}
		}
	}
	for i, e := range invalid {
		checkFast(t, "invalid fixture "+string(rune('a'+i)), e)
	}
}

func TestFastValid_Mutations(t *testing.T) {
	golden, _ := fixtureEnvelopes(t)
	strs := []string{
		"", " ", "x", "a\x00b", "a\x1fb", "a\x7fb", "a\u0085b", "a\u009fb", "é", "\u2028", "\ufeff",
		strings.Repeat("a", 200), strings.Repeat("a", 201), strings.Repeat("é", 100), strings.Repeat("é", 101),
		"user@example.org", "not an email", "a@b", "@", "x@y.z\n", "mailto:user@example.org",
		"10001", "-10001", "123456789012345678901", "@channel", "@chan", "@chan-nel", "1 2",
		"https://push.example.org/p/1", "http://push.example.org/p/1", "https://u@push.example.org/",
		"https://push.example.org/a b", "HTTPS://X", "https://" + strings.Repeat("a", 2100),
		strings.Repeat("A", 87), strings.Repeat("A", 86) + "=", strings.Repeat("A", 87) + "=", strings.Repeat("A", 22), strings.Repeat("A", 22) + "==",
		"weekly", "daily", "monthly", "ref-1", "1", "2",
		"a<b>&c", "<script>", "x\u2028y\u2029", "\u2027\u202a", "a\"b", `a\b`, "tab\there",
	}
	times := []time.Time{
		{}, time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 0, 0, 0, 1, time.FixedZone("x", 5*3600+1800)),
		time.Date(2026, 11, 1, 0, 0, 0, 0, time.FixedZone("s", 61)), time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
	}
	payloads := []string{
		`{}`, `null`, `[]`, `"x"`, `{"text":""}`, `{"text":" "}`, `{"text":"hi"}`, `{"text":null}`, `{"Text":"hi"}`, `{"text":"hi","extra":[1,{"a":null}]}`,
		`{"text":"\ud800"}`, `{"text":"a<b>&c\u2028\u2029"}`, "{\"text\":\"a<b>&c\u2028\u2029\"}", `{"text":"\u003c"}`, `{"text":"a\"b"}`, `{ "text":"hi"}`, `{"text":1}`, `{"highlight_count":1}`, `{"highlight_count":-1,"lead":{}}`, `{"highlight_count":1.5,"lead":{}}`,
		`{"sections":[]}`, `{"sections":null}`, `{"sections":[{"kind":"revisit","items":[]}]}`,
	}
	exp := 1.5
	nan := math.NaN()
	type mutation struct {
		name string
		set  func(e *Envelope, s string)
	}
	muts := []mutation{
		{"schema_version", func(e *Envelope, s string) { e.SchemaVersion = s }},
		{"id", func(e *Envelope, s string) { e.ID = s }},
		{"user_id", func(e *Envelope, s string) { e.UserID = s }},
		{"tenant_id", func(e *Envelope, s string) { e.TenantID = s }},
		{"channel", func(e *Envelope, s string) { e.Channel = Channel(s) }},
		{"template", func(e *Envelope, s string) { e.Template = Template(s) }},
		{"email", func(e *Envelope, s string) { e.Recipient.Email = s }},
		{"chat_id", func(e *Envelope, s string) { e.Recipient.ChatID = s }},
		{"endpoint", func(e *Envelope, s string) {
			e.Recipient.PushSubscription = &PushSubscription{Endpoint: s, Keys: PushKeys{P256dh: strings.Repeat("B", 87), Auth: strings.Repeat("C", 22)}}
		}},
		{"p256dh", func(e *Envelope, s string) {
			if ps := e.Recipient.PushSubscription; ps != nil {
				cp := *ps
				cp.Keys.P256dh = s
				e.Recipient.PushSubscription = &cp
			}
		}},
		{"auth", func(e *Envelope, s string) {
			if ps := e.Recipient.PushSubscription; ps != nil {
				cp := *ps
				cp.Keys.Auth = s
				cp.ExpirationTime = &exp
				e.Recipient.PushSubscription = &cp
			}
		}},
		{"cadence", func(e *Envelope, s string) { e.ConsentSnapshot.Cadence = s }},
		{"unsubscribe_ref", func(e *Envelope, s string) { e.ConsentSnapshot.UnsubscribeRef = s }},
	}
	var fastN, fullN, n int
	try := func(what string, e *Envelope) {
		n++
		fast, full := checkFast(t, what, e)
		if fast {
			fastN++
		}
		if full {
			fullN++
		}
	}
	for _, g := range golden {
		for _, m := range muts {
			for _, s := range append(strs, string(g.Channel), string(g.Template), "email", "push", "telegram",
				string(TemplateDigest), string(TemplateNudge), string(TemplateReply)) {
				e := *g
				m.set(&e, s)
				try(string(g.Template)+" "+m.name+"="+s, &e)
			}
		}
		for i, tm := range times {
			for _, f := range []func(e *Envelope){
				func(e *Envelope) { e.CreatedAt = tm },
				func(e *Envelope) { e.NotBefore = tm },
				func(e *Envelope) { e.ExpiresAt = tm },
				func(e *Envelope) { e.NotBefore, e.ExpiresAt = tm, tm },
			} {
				e := *g
				f(&e)
				try(string(g.Template)+" time "+string(rune('0'+i)), &e)
			}
		}
		for _, p := range payloads {
			e := *g
			e.Payload = json.RawMessage(p)
			try(string(g.Template)+" payload "+p, &e)
		}
		e := *g
		e.ConsentSnapshot = ConsentSnapshot{}
		try(string(g.Template)+" no consent snapshot", &e)
		e = *g
		e.Recipient.PushSubscription = &PushSubscription{Endpoint: "https://push.example.org/p/1", ExpirationTime: &nan,
			Keys: PushKeys{P256dh: strings.Repeat("B", 87), Auth: strings.Repeat("C", 22)}}
		try(string(g.Template)+" NaN expirationTime", &e)
	}
	// The test means something only if both answers occur often.
	if fastN < n/10 || fullN-fastN > n/10 || fullN == n {
		t.Errorf("%d mutants: fast path accepted %d, full check %d; the mutations do not exercise the fast path", n, fastN, fullN)
	}
	t.Logf("%d mutants: fast path accepted %d, full check %d", n, fastN, fullN)
}

// FuzzFastValid decodes arbitrary documents into the Go types (leniently,
// as an app's own code might build them) and checks the fast path against
// the full check.
func FuzzFastValid(f *testing.F) {
	for _, pattern := range []string{"*.golden.json", filepath.Join("invalid", "*.json")} {
		names, _ := filepath.Glob(filepath.Join("..", "testdata", "delivery", pattern))
		for _, name := range names {
			data, err := os.ReadFile(name)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	// Payload keys that the schema and Go's decoder read differently.
	for _, payload := range []string{`{"text":"hi","TEXT":5}`, `{"text":5,"text":"hi"}`} {
		f.Add([]byte(`{"schema_version":"1","id":"r1","user_id":"u1","channel":"telegram","template":"reply-text.v1","recipient":{"chat_id":"42"},"payload":` + payload + `,"created_at":"2026-05-04T20:41:17Z"}`))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e := new(Envelope)
		if json.Unmarshal(data, e) != nil {
			return
		}
		checkFast(t, "fuzzed", e)
	})
}

// Payload keys that the JSON Schema and Go's decoder read differently: a
// key equal to "text" but for case, and a repeated "text". The schema
// takes the exact, last key; Go's decoder matches keys case-insensitively
// and fails on any value of the wrong type. The fast path must not accept
// what the Go rules reject.
func TestFastValid_ReplyPayloadKeysGoReadsDifferently(t *testing.T) {
	golden, _ := fixtureEnvelopes(t)
	var reply *Envelope
	for _, e := range golden {
		if e.Template == TemplateReply {
			reply = e
		}
	}
	if reply == nil {
		t.Fatal("no reply golden fixture")
	}
	for _, payload := range []string{
		`{"text":"hi","TEXT":5}`,
		`{"Text":5,"text":"hi"}`,
		`{"text":5,"text":"hi"}`,
		`{"text":"hi","text":"  "}`,
		`{"tExt":"hi"}`,
		`{"text":""}`, `{"text":" \n"}`, `{"text":null}`, `{"text":1}`, `{"text":["a"]}`,
		`{"text":{"a":"b"}}`, `{"text":"hi","x":1}`, `{"x":1,"text":"hi"}`, `{"text":"\ud800"}`,
		`{"text":"te\u0078t"}`, `{"te\u0078t":"hi"}`, `{}`,
		`{"text":"` + strings.Repeat("a", MaxReplyTextBytes) + `"}`,
		`{"text":"` + strings.Repeat("a", MaxReplyTextBytes+1) + `"}`,
		`{"text":"` + strings.Repeat("é", 40000) + `"}`,
	} {
		cp := *reply
		cp.Payload = json.RawMessage(payload)
		checkFast(t, payload, &cp)
	}
}

func TestReplyText_OnlyTheCanonicalPayload(t *testing.T) {
	for payload, want := range map[string]bool{
		`{"text":"hi"}`: true, `{ "text" : "h\u00e9" }`: true,
		`{"text":"hi","x":1}`: false, `{"Text":"hi"}`: false, `{"text":1}`: false,
		`{"text":"hi"}{}`: false, `[]`: false, `{}`: false,
	} {
		e := &Envelope{Template: TemplateReply, Payload: json.RawMessage(payload)}
		if _, ok, _ := replyText(e); ok != want {
			t.Errorf("replyText(%s) ok = %v, want %v", payload, ok, want)
		}
	}
	if _, ok, _ := replyText(&Envelope{Template: TemplateNudge, Payload: json.RawMessage(`{"text":"hi"}`)}); ok {
		t.Error("replyText takes a nudge's payload")
	}
}

// The shortcut for a text without escapes reads what the token reader
// reads, whenever it answers; Go's encoding of a plain text takes it.
func TestPlainReplyText_AgreesWithTheTokenReader(t *testing.T) {
	texts := []string{
		"hi", "héllo wörld 🎉", strings.Repeat("a", 5000), `say "hi"`, `back\slash`,
		"tab\there", "line\nbreak", "<b>&amp;</b>", "\u2028", "\x00", "\xff\xfe", " ", "",
	}
	var payloads []string
	for _, s := range texts {
		b, _ := json.Marshal(ReplyPayload{Text: s})
		payloads = append(payloads, string(b), `{"text":"`+s+`"}`)
	}
	payloads = append(payloads, `{"text":"hi"} `, ` {"text":"hi"}`, `{"text":"hi"}}`, `{"text":"a","b":"c"}`,
		`{"text":"hi","text":"x"}`, `{"text":""}`, `{"text":"`, `{"text":"}`)
	payloads = append(payloads, `{"text":"\u003C"}`, `{"text":"\u003"}`, `{"text":"a\u0026"}`, `{"text":"\u2028\u2029\u2027"}`)
	for _, p := range payloads {
		text, ok := plainReplyText([]byte(p))
		want, wantOK := replyTextTokens([]byte(p))
		if ok && (!wantOK || text != want) {
			t.Errorf("%q: plainReplyText = %q, %v; the token reader %q, %v", p, text, ok, want, wantOK)
		}
	}
	for _, s := range []string{"hi", "héllo wörld 🎉", strings.Repeat("a", 5000), "Q&A <b>x</b>", "a\u2028b\u2029c"} {
		b, _ := json.Marshal(ReplyPayload{Text: s})
		if text, ok := plainReplyText(b); !ok || text != s {
			t.Errorf("plainReplyText(%s) = %q, %v; want the text", b, text, ok)
		}
	}
}

func FuzzPlainReplyText(f *testing.F) {
	for _, s := range []string{`{"text":"hi"}`, `{"text":"a\"b"}`, `{"text":"\u00e9"}`, `{"text":"\u003c\u0026\u2029"}`, "{\"text\":\"\xff\"}", `{"text":"a","b":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		text, ok := plainReplyText(p)
		want, wantOK := replyTextTokens(p)
		if ok && (!wantOK || text != want) {
			t.Fatalf("%q: plainReplyText = %q; the token reader %q, %v", p, text, want, wantOK)
		}
	})
}
