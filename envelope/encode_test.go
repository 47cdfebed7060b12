package envelope

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// encodingCase builds a reply envelope from fuzzable parts: strings for
// the identifiers, the chat id, the consent snapshot and the text, and a
// zone offset for the timestamps.
func encodingCase(id, chat, ref, text string, offset int, flags uint8) *Envelope {
	payload, _ := json.Marshal(ReplyPayload{Text: text})
	e := &Envelope{
		SchemaVersion: SchemaVersion, ID: id, UserID: id + "-u",
		Channel: ChannelTelegram, Template: TemplateReply,
		Recipient: Recipient{ChatID: chat, EmailVerified: flags&1 != 0},
		Payload:   payload,
		CreatedAt: time.Date(2026, 11, 1, 2, 3, 4, int(offset)*7, time.FixedZone("", offset)),
	}
	if flags&2 != 0 {
		e.TenantID = "t" + id
	}
	if flags&4 != 0 {
		e.ConsentSnapshot = ConsentSnapshot{DigestEnabled: flags&8 != 0, Cadence: "weekly", UnsubscribeRef: ref}
	}
	if flags&16 != 0 {
		e.NotBefore = e.CreatedAt.Add(time.Hour)
		e.ExpiresAt = e.CreatedAt.Add(48 * time.Hour)
	}
	if flags&32 != 0 {
		e.Recipient.Email = ref
	}
	if flags&64 != 0 {
		e.Payload = nil
	}
	return e
}

// checkEncoding fails t when appendEncoding answers and its bytes are not
// json.Marshal's.
func checkEncoding(t *testing.T, e *Envelope) (ok bool) {
	t.Helper()
	text, _, plain := replyText(e)
	got, ok := appendEncoding(nil, e, text, plain)
	want, err := json.Marshal(e)
	if ok && err != nil {
		t.Fatalf("appendEncoding encodes what json.Marshal refuses (%v):\n%s", err, got)
	}
	if ok && string(got) != string(want) {
		t.Fatalf("appendEncoding:\n%s\njson.Marshal:\n%s", got, want)
	}
	return ok
}

func TestAppendEncoding(t *testing.T) {
	plain := []string{"", "x", "r-1", "é", "a<b>&c", "\u2028\u2029", "\u2027\u202a\u2030", "日本語 テキスト", "\U0001F600", "\x7f"}
	escaped := []string{"a\"b", `a\b`, "a\nb", "\x00", "\xff", "a\xe2\x80"}
	for _, s := range plain {
		for flags := range uint8(128) {
			if !checkEncoding(t, encodingCase(s, s, s, s, 3600, flags)) {
				t.Errorf("flags %d, string %q: appendEncoding gave up on an envelope it should encode", flags, s)
			}
		}
	}
	for _, s := range escaped {
		if checkEncoding(t, encodingCase(s, "1", "r", "hi", 0, 0)) {
			t.Errorf("id %q: appendEncoding encoded a string json.Marshal escapes", s)
		}
		if checkEncoding(t, encodingCase("i", "1", "r", s, 0, 0)) && s != "a\xe2\x80" {
			t.Errorf("text %q: appendEncoding encoded a text json.Marshal escapes", s)
		}
	}
	for _, off := range []int{-24 * 3600, 24 * 3600, 99 * 3600} {
		if checkEncoding(t, encodingCase("i", "1", "r", "hi", off, 0)) {
			t.Errorf("offset %d: appendEncoding encoded a time json.Marshal refuses", off)
		}
	}
	e := encodingCase("i", "1", "r", "hi", 0, 0)
	e.Recipient.PushSubscription = &PushSubscription{Endpoint: "https://push.example.org/p/1"}
	if checkEncoding(t, e) {
		t.Error("appendEncoding encoded a push subscription")
	}
	for _, p := range []string{`{"text": "hi"}`, `{"sections":[]}`, ``} {
		e.Recipient.PushSubscription = nil
		e.Payload = json.RawMessage(p)
		if checkEncoding(t, e) {
			t.Errorf("payload %q: appendEncoding copied a payload it does not know to be compact", p)
		}
	}
}

func FuzzAppendEncoding(f *testing.F) {
	f.Add("r-1", "10001", "ref", "hello <b>&</b>\u2028", 19800, uint8(0))
	f.Add("\xe2\x80\xa8", "@chan_name", "\u0085", "x\xe2\x80\xa9y\xe2", -3600, uint8(255))
	f.Fuzz(func(t *testing.T, id, chat, ref, text string, offset int, flags uint8) {
		checkEncoding(t, encodingCase(id, chat, ref, text, offset%(30*3600), flags))
	})
}

// The Go checks that stand in for schema definitions on the fast path
// must accept nothing the definitions reject.
func TestGoChecksAgreeWithTheSchema(t *testing.T) {
	def := func(name string) *jsonschema.Schema {
		s, err := newCompiler().Compile(SchemaURL + "#/$defs/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	consent, timestamp := def("consent_snapshot"), def("timestamp")
	pattern := regexp.MustCompile(`^(-?[0-9]{1,20}|@[A-Za-z0-9_]{5,32})$`)
	strs := []string{"", "0", "-0", "-", "--1", "10001", "-10001", strings.Repeat("9", 20), strings.Repeat("9", 21), "-" + strings.Repeat("9", 20),
		"@", "@abcd", "@abcde", "@ab_de", "@ab-de", "@" + strings.Repeat("z", 32), "@" + strings.Repeat("z", 33), "@@abcde", "1@abcde",
		"１２３", "1 ", " 1", "1\n", "weekly", "daily", "Daily", "ref", "a\x1fb", "a\x7fb", "a\u0080b", "a\u009fb", "a\u00a0b", "é",
		strings.Repeat("r", 1024), strings.Repeat("é", 1024), strings.Repeat("r", 1025), strings.Repeat("é", 1025)}
	for _, v := range strs {
		if got, want := validChatID(v), pattern.MatchString(v); got != want {
			t.Errorf("validChatID(%q) = %v, the schema's pattern says %v", v, got, want)
		}
		for _, c := range []ConsentSnapshot{{Cadence: v}, {UnsubscribeRef: v}, {DigestEnabled: true, Cadence: "daily", UnsubscribeRef: v}} {
			if c == (ConsentSnapshot{}) || !utf8.ValidString(v) {
				continue
			}
			if got, want := validConsent(&c), consent.Validate(consentInstance(&c)) == nil; got != want {
				t.Errorf("validConsent(%+v) = %v, the schema says %v", c, got, want)
			}
		}
	}
	for _, tm := range []time.Time{
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(2026, 2, 28, 1, 2, 3, 4, time.FixedZone("", -(23*3600+59*60+59))),
		time.Date(2026, 2, 28, 1, 2, 3, 4, time.FixedZone("", 23*3600+59*60+59)),
		time.Date(2026, 2, 28, 1, 2, 3, 4, time.FixedZone("", 61)),
		time.Date(2026, 2, 28, 1, 2, 3, 4, time.FixedZone("", -24*3600)),
		time.Date(2026, 2, 28, 1, 2, 3, 4, time.FixedZone("", 30*3600)),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		if validTimestamp(tm) && timestamp.Validate(tm.Format(time.RFC3339Nano)) != nil {
			t.Errorf("validTimestamp accepts %s, the schema does not", tm.Format(time.RFC3339Nano))
		}
	}
}

// consentInstance is a non-zero snapshot as the validator sees its encoding.
func consentInstance(c *ConsentSnapshot) map[string]any {
	m := map[string]any{"digest_enabled": c.DigestEnabled}
	if c.Cadence != "" {
		m["cadence"] = c.Cadence
	}
	if c.UnsubscribeRef != "" {
		m["unsubscribe_ref"] = c.UnsubscribeRef
	}
	return m
}
