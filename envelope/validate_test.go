package envelope_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// fixtureDoc returns a golden fixture decoded as a generic JSON document,
// for tests to mutate.
func fixtureDoc(tb testing.TB, name string) map[string]any {
	tb.Helper()
	var doc map[string]any
	if err := json.Unmarshal(readFixture(tb, name), &doc); err != nil {
		tb.Fatal(err)
	}
	return doc
}

// at walks a generic JSON document along keys (string) and indices (int).
func at(tb testing.TB, v any, path ...any) any {
	tb.Helper()
	for _, p := range path {
		switch p := p.(type) {
		case string:
			v = v.(map[string]any)[p]
		case int:
			v = v.([]any)[p]
		}
	}
	return v
}

func obj(tb testing.TB, v any, path ...any) map[string]any {
	tb.Helper()
	return at(tb, v, path...).(map[string]any)
}

func mustMarshal(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func problemStrings(ps []envelope.Problem) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// TestParse_Rules mutates the golden fixtures and checks the exact list
// of problems, in order: every rule reports, several at once.
func TestParse_Rules(t *testing.T) {
	const (
		digest = "your-week-digest.v1.golden.json"
		nudge  = "resurface-nudge.v1.golden.json"
		reply  = "reply-text.v1.golden.json"
	)
	tests := []struct {
		name    string
		fixture string
		mutate  func(tb testing.TB, doc map[string]any)
		want    []string
	}{
		{
			name: "MoatRuleSeveralItemsAtOnce", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				delete(obj(tb, doc, "payload", "sections", 0, "items", 1), "deep_link")
				obj(tb, doc, "payload", "sections", 2, "items", 0)["graph_refs"] = []any{}
				delete(obj(tb, doc, "payload", "sections", 1, "items", 0), "graph_refs")
				obj(tb, doc, "payload", "sections", 1, "items", 0)["deep_link"] = ""
			},
			want: []string{
				"payload.sections[0].items[1].deep_link: required (moat rule)",
				"payload.sections[1].items[0].deep_link: required (moat rule)",
				"payload.sections[1].items[0].graph_refs: required non-empty (moat rule)",
				"payload.sections[2].items[0].graph_refs: required non-empty (moat rule)",
			},
		},
		{
			name: "MoatRuleNullGraphRefs", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "payload", "sections", 1, "items", 0)["graph_refs"] = nil
			},
			want: []string{"payload.sections[1].items[0].graph_refs: required non-empty (moat rule)"},
		},
		{
			name: "MoatRuleNudgeLead", fixture: nudge,
			mutate: func(tb testing.TB, doc map[string]any) {
				lead := obj(tb, doc, "payload", "lead")
				delete(lead, "deep_link")
				lead["graph_refs"] = []any{}
			},
			want: []string{
				"payload.lead.deep_link: required (moat rule)",
				"payload.lead.graph_refs: required non-empty (moat rule)",
			},
		},
		{
			name: "NudgeWithoutLead", fixture: nudge,
			mutate: func(tb testing.TB, doc map[string]any) {
				delete(obj(tb, doc, "payload"), "lead")
			},
			want: []string{"payload.lead: required (an item)"},
		},
		{
			name: "DeepLinks", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "payload", "sections", 0, "items", 0)["deep_link"] = "ftp://example.org/x"
				obj(tb, doc, "payload", "sections", 0, "items", 1)["deep_link"] = "https://example.org/" + strings.Repeat("a", 2048)
				obj(tb, doc, "payload", "sections", 1, "items", 0)["deep_link"] = "https://exa mple.org/x"
				obj(tb, doc, "payload", "sections", 2, "items", 0)["deep_link"] = "http://example.org/plain-http-is-allowed"
			},
			want: []string{
				"payload.sections[0].items[0].deep_link: must be an absolute http(s) URL",
				"payload.sections[0].items[1].deep_link: must be at most 2048 bytes",
				"payload.sections[1].items[0].deep_link: must be an absolute http(s) URL",
			},
		},
		{
			name: "ZeroItemDigestAllSectionsEmpty", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				for _, s := range at(tb, doc, "payload", "sections").([]any) {
					s.(map[string]any)["items"] = []any{}
				}
			},
			want: []string{"payload.sections: digest has no items (zero-item digest)"},
		},
		{
			name: "ZeroItemDigestNoSections", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "payload")["sections"] = []any{}
			},
			want: []string{"payload.sections: digest has no items (zero-item digest)"},
		},
		{
			name: "OneEmptySectionIsFine", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "payload", "sections", 1)["items"] = []any{}
			},
		},
		{
			name: "Times", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["not_before"] = "2026-05-05T07:00:00Z"
				doc["expires_at"] = "2026-05-05T09:00:00+02:00" // the same instant
			},
			want: []string{"expires_at: must be after not_before"},
		},
		{
			name: "OnlyExpiresAt", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				delete(doc, "not_before")
			},
		},
		{
			name: "TimesNotRFC3339", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["not_before"] = "2026-05-03 07:00:00"
				doc["created_at"] = "2026-05-02T23:59:60Z" // a leap second Go cannot hold
			},
			want: []string{
				"created_at: must be an RFC 3339 date-time",
				"not_before: must be an RFC 3339 date-time",
			},
		},
		{
			name: "EmailRecipientAndConsent", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "recipient")["email"] = "Ada <ada@example.org>"
				delete(doc, "consent_snapshot")
			},
			want: []string{
				"consent_snapshot.unsubscribe_ref: required for channel email (one-click unsubscribe)",
				"recipient.email: must be a valid email address (addr-spec)",
			},
		},
		{
			name: "EmailNotAnAddress", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "recipient")["email"] = "not an address"
			},
			want: []string{"recipient.email: must be a valid email address (addr-spec)"},
		},
		{
			name: "NudgeByEmailNeedsEmailAndUnsubscribe", fixture: nudge,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["channel"] = "email"
			},
			want: []string{
				"consent_snapshot.unsubscribe_ref: required for channel email (one-click unsubscribe)",
				"recipient.email: required for channel email",
			},
		},
		{
			name: "PushSubscriptionShape", fixture: nudge,
			mutate: func(tb testing.TB, doc map[string]any) {
				ps := obj(tb, doc, "recipient", "push_subscription")
				ps["endpoint"] = "http://push.example.net/x"
				keys := obj(tb, ps, "keys")
				keys["p256dh"] = "A" + keys["p256dh"].(string)[1:] // not an uncompressed point
				keys["auth"] = "c2hvcnQ"
			},
			want: []string{
				"recipient.push_subscription.endpoint: must be an absolute https URL",
				"recipient.push_subscription.keys.auth: must be a base64url 16-byte secret",
				"recipient.push_subscription.keys.p256dh: must be a base64url uncompressed P-256 public key (65 bytes)",
			},
		},
		{
			name: "PushWithoutSubscription", fixture: nudge,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["recipient"] = map[string]any{}
			},
			want: []string{"recipient.push_subscription: required for channel push"},
		},
		{
			name: "PushSubscriptionUnknownField", fixture: nudge,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "recipient", "push_subscription")["options"] = map[string]any{}
			},
			want: []string{"recipient.push_subscription.options: unknown field"},
		},
		{
			name: "TelegramChatID", fixture: reply,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "recipient")["chat_id"] = "my chat"
			},
			want: []string{"recipient.chat_id: must be a numeric chat id or an @username"},
		},
		{
			name: "TelegramChannelUsername", fixture: reply,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "recipient")["chat_id"] = "@podcast_companion"
			},
		},
		{
			name: "TemplateChannelMismatch", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["channel"] = "push"
				doc["recipient"] = obj(tb, fixtureDoc(tb, nudge), "recipient")
			},
			want: []string{"channel: not allowed for template your-week-digest.v1 (want email or wecom)"},
		},
		{
			name: "UnknownChannelAndTemplate", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["channel"] = "sms"
				doc["template"] = "your-month-digest.v1"
			},
			want: []string{
				"channel: unknown channel (want email, push, telegram, wecom, wecom_robot or wecom_bot_reply)",
				"template: unknown template (want your-week-digest.v1, resurface-nudge.v1 or reply-text.v1)",
			},
		},
		{
			name: "Identifiers", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["id"] = strings.Repeat("é", 101) // 101 characters, 202 bytes
				doc["user_id"] = ""
				doc["tenant_id"] = "acme\u0085corp" // a C1 control
			},
			want: []string{
				"id: must be at most 200 bytes",
				"tenant_id: must not contain control characters",
				"user_id: required non-empty",
			},
		},
		{
			name: "IdentifiersMayHoldSlashesDotsSpacesAndUnicode", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["id"] = "../digest/ü 42/./2026"
				doc["user_id"] = "用户 42"
				doc["tenant_id"] = "acme.example/prod"
			},
		},
		{
			name: "EmptyTenantWhenPresent", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["tenant_id"] = ""
			},
			want: []string{"tenant_id: required non-empty"},
		},
		{
			name: "MissingRequiredFields", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				delete(doc, "schema_version")
				delete(doc, "created_at")
				delete(doc, "payload")
			},
			want: []string{"created_at: required", "payload: required", "schema_version: required"},
		},
		{
			name: "UnknownFieldsAtEveryClosedLevel", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["priority"] = "high"
				obj(tb, doc, "recipient")["phone"] = "+4912345"
				obj(tb, doc, "consent_snapshot")["marketing"] = true
				obj(tb, doc, "payload", "sections", 0, "items", 0, "graph_refs", 1)["weight"] = 0.5
			},
			want: []string{
				"consent_snapshot.marketing: unknown field",
				"payload.sections[0].items[0].graph_refs[1].weight: unknown field",
				"priority: unknown field",
				"recipient.phone: unknown field",
			},
		},
		{
			name: "ItemsMayCarryExtraFields", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "payload", "sections", 0, "items", 0)["duration_ms"] = 3600000
			},
		},
		{
			name: "GraphRefs", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				refs := at(tb, doc, "payload", "sections", 0, "items", 0, "graph_refs").([]any)
				refs[0].(map[string]any)["id"] = "person:"
				refs[1].(map[string]any)["kind"] = "person" // id says topic
			},
			want: []string{
				`payload.sections[0].items[0].graph_refs[0].id: must be "person:…" or "topic:…"`,
				"payload.sections[0].items[0].graph_refs[1].kind: must match the id's prefix",
			},
		},
		{
			name: "RevisitItemFields", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				it := obj(tb, doc, "payload", "sections", 0, "items", 1)
				delete(it, "t_ms")
				it["source"] = "editor"
			},
			want: []string{
				`payload.sections[0].items[1].source: must be one of "user", "auto"`,
				"payload.sections[0].items[1].t_ms: required",
			},
		},
		{
			name: "IntegersGoCannotHold", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "payload", "sections", 0, "items", 1)["t_ms"] = json.Number("612000.0")
			},
			want: []string{"payload.sections[0].items[1].t_ms: must be a plain integer within 64-bit range (no fraction or exponent)"},
		},
		{
			name: "WrongTypes", fixture: digest,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["id"] = 42
				obj(tb, doc, "payload", "sections", 0, "items", 0)["t_ms"] = "1834200"
				obj(tb, doc, "recipient")["email_verified"] = "yes"
			},
			want: []string{
				"id: must be a string (got number)",
				"payload.sections[0].items[0].t_ms: must be an integer (got string)",
				"recipient.email_verified: must be a boolean (got string)",
			},
		},
		{
			name: "HighlightCount", fixture: nudge,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "payload")["highlight_count"] = -2
			},
			want: []string{"payload.highlight_count: must be at least 0"},
		},
		{
			name: "ReplyTextWhitespaceOnly", fixture: reply,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "payload")["text"] = " \n\t "
			},
			want: []string{"payload.text: required non-empty"},
		},
		{
			name: "ReplyTextTooLong", fixture: reply,
			mutate: func(tb testing.TB, doc map[string]any) {
				// 21846 characters of 3 bytes: under the schema's character
				// bound, over the 64 KiB byte bound.
				obj(tb, doc, "payload")["text"] = strings.Repeat("€", envelope.MaxReplyTextBytes/3+1)
			},
			want: []string{"payload.text: must be at most 65536 bytes"},
		},
		{
			name: "ReplyTextExactlyAtLimit", fixture: reply,
			mutate: func(tb testing.TB, doc map[string]any) {
				obj(tb, doc, "payload")["text"] = strings.Repeat("a", envelope.MaxReplyTextBytes)
			},
		},
		{
			name: "PayloadNotAnObject", fixture: reply,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["payload"] = "hello"
			},
			want: []string{"payload: must be an object (got string)"},
		},
		{
			name: "SchemaVersion", fixture: reply,
			mutate: func(tb testing.TB, doc map[string]any) {
				doc["schema_version"] = 1
			},
			want: []string{`schema_version: must be "1"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := fixtureDoc(t, tc.fixture)
			tc.mutate(t, doc)
			data := mustMarshal(t, doc)
			e, err := envelope.Parse(data)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if err := envelope.Validate(e); err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if e != nil {
				t.Error("Parse returned an envelope with an error")
			}
			got := problemStrings(problemsOf(t, err))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("problems:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestParse_MalformedJSON(t *testing.T) {
	tests := []struct {
		name, doc, want string
	}{
		{"Empty", "", "(root): empty document"},
		{"Whitespace", " \n\t", "(root): empty document"},
		{"Truncated", "{\n  \"id\": \"x\",\n  \"user_id\":", "(root): malformed JSON: unexpected end of JSON input at line 3, column 13 (byte offset 27)"},
		{"BadToken", "{\n  \"id\": x\n}", "(root): malformed JSON: invalid character looking for beginning of value at line 2, column 9 (byte offset 10)"},
		{"TrailingData", `{"id":"a"} {"id":"b"}`, "(root): malformed JSON: invalid character after top-level value at line 1, column 12 (byte offset 11)"},
		{"Array", `[{"id":"a"}]`, "(root): must be a JSON object"},
		{"Null", `null`, "(root): must be a JSON object"},
		{"String", `"hi"`, "(root): must be a JSON object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := envelope.Parse([]byte(tc.doc))
			got := problemStrings(problemsOf(t, err))
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("got %q, want [%q]", got, tc.want)
			}
		})
	}
}

// TestParse_NeverEchoesValues: no problem quotes the offending value, which
// may be personal data.
func TestParse_NeverEchoesValues(t *testing.T) {
	const canary = "CANARY-7d1f"
	doc := fixtureDoc(t, "your-week-digest.v1.golden.json")
	doc["id"] = canary + strings.Repeat("x", 300)
	doc["user_id"] = canary + "\x01"
	doc["channel"] = canary
	doc["created_at"] = canary
	obj(t, doc, "recipient")["email"] = canary + " at example"
	obj(t, doc, "consent_snapshot")["cadence"] = canary
	it := obj(t, doc, "payload", "sections", 0, "items", 0)
	it["deep_link"] = "javascript:" + canary
	it["source"] = canary
	it["t_ms"] = canary
	obj(t, it, "graph_refs", 0)["id"] = canary
	_, err := envelope.Parse(mustMarshal(t, doc))
	problems := problemsOf(t, err)
	if len(problems) < 10 {
		t.Errorf("got %d problems, want at least 10: %v", len(problems), problems)
	}
	if strings.Contains(err.Error(), canary) {
		t.Errorf("error text echoes a value: %v", err)
	}

	bad := []byte(`{"schema_version":"1","id":"a", "user_id": "` + canary + `" x}`)
	_, err = envelope.Parse(bad)
	if err == nil || strings.Contains(err.Error(), canary) || strings.Contains(err.Error(), "'x'") {
		t.Errorf("malformed JSON error echoes the document: %v", err)
	}
}

func TestParse_InvalidUTF8(t *testing.T) {
	data := readFixture(t, "your-week-digest.v1.golden.json")
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"RawByteInID", `"id": "digest/u_42/2026-W18"`, "\"id\": \"digest/\xff\"", "id: must be valid UTF-8"},
		{"LoneSurrogateInQuote", `"quote": "Sleep`, `"quote": "\udc00Sleep`, "payload.sections[0].items[1].quote: must be valid UTF-8"},
		{"HighSurrogateWithoutLow", `"label": "Sleep"`, `"label": "Sleep\ud83d"`, "payload.sections[0].items[1].graph_refs[0].label: must be valid UTF-8"},
		{"BadByteInUnknownKey", `"user_id"`, "\"user_id\": \"u\", \"x\xfe\"", "[\"x\uFFFD\"]: must be valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(string(data), tc.old, tc.new, 1)
			if doc == string(data) {
				t.Fatal("mutation did not apply")
			}
			_, err := envelope.Parse([]byte(doc))
			got := problemStrings(problemsOf(t, err))
			found := false
			for _, g := range got {
				found = found || g == tc.want
			}
			if !found {
				t.Errorf("got %q, want it to include %q", got, tc.want)
			}
		})
	}
	t.Run("SurrogatePairIsFine", func(t *testing.T) {
		doc := strings.Replace(string(data), `"label": "Sleep"`, `"label": "Sleep \ud83d\ude34"`, 1)
		e, err := envelope.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		p, _ := e.DigestPayload()
		if got := p.Sections[0].Items[1].GraphRefs[0].Label; got != "Sleep 😴" {
			t.Errorf("label = %q", got)
		}
	})
}

// TestParse_SortsPathsNumerically: items[10] comes after items[2].
func TestParse_SortsPathsNumerically(t *testing.T) {
	doc := fixtureDoc(t, "your-week-digest.v1.golden.json")
	sec := obj(t, doc, "payload", "sections", 1)
	base := at(t, sec, "items", 0).(map[string]any)
	var items []any
	for i := 0; i < 12; i++ {
		it := map[string]any{}
		for k, v := range base {
			it[k] = v
		}
		if i == 2 || i == 10 {
			delete(it, "deep_link")
		}
		items = append(items, it)
	}
	sec["items"] = items
	doc["id"] = ""
	_, err := envelope.Parse(mustMarshal(t, doc))
	got := problemStrings(problemsOf(t, err))
	want := []string{
		"id: required non-empty",
		"payload.sections[1].items[2].deep_link: required (moat rule)",
		"payload.sections[1].items[10].deep_link: required (moat rule)",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestValidate_GoBuiltEnvelope(t *testing.T) {
	good := func(tb testing.TB) *envelope.Envelope {
		tb.Helper()
		e, err := envelope.Parse(readFixture(tb, "reply-text.v1.golden.json"))
		if err != nil {
			tb.Fatal(err)
		}
		return e
	}
	if err := envelope.Validate(good(t)); err != nil {
		t.Fatalf("Validate(golden) = %v", err)
	}
	tests := []struct {
		name   string
		mutate func(e *envelope.Envelope)
		want   []string
	}{
		{"InvalidUTF8InIDs", func(e *envelope.Envelope) { e.ID = "reply/\xff"; e.UserID = "u\xc3" },
			[]string{"id: must be valid UTF-8", "user_id: must be valid UTF-8"}},
		{"InvalidPayloadJSON", func(e *envelope.Envelope) { e.Payload = []byte(`{"text":`) },
			[]string{"payload: must be valid JSON"}},
		{"NilPayload", func(e *envelope.Envelope) { e.Payload = nil },
			[]string{"payload: must be an object (got null)"}},
		{"YearOutOfRange", func(e *envelope.Envelope) { e.ExpiresAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
			[]string{"expires_at: year must be within 0000-9999"}},
		{"MissingCreatedAt", func(e *envelope.Envelope) { e.CreatedAt = time.Time{} },
			[]string{"created_at: required"}},
		{"ExpiresBeforeNotBefore", func(e *envelope.Envelope) { e.NotBefore = e.ExpiresAt.Add(time.Minute) },
			[]string{"expires_at: must be after not_before"}},
		{"WrongRecipientAndEmptyText", func(e *envelope.Envelope) {
			e.Recipient = envelope.Recipient{Email: "ada@example.org"}
			e.Payload = []byte(`{"text": ""}`)
		}, []string{"payload.text: required non-empty", "recipient.chat_id: required for channel telegram"}},
		{"TextInvalidUTF8", func(e *envelope.Envelope) { e.Payload = []byte("{\"text\": \"caf\xe9\"}") },
			[]string{"payload.text: must be valid UTF-8"}},
		{"Nothing", func(e *envelope.Envelope) { *e = envelope.Envelope{} },
			[]string{"channel: required", "created_at: required", "id: required non-empty",
				"payload: must be an object (got null)", "schema_version: required", "template: required",
				"user_id: required non-empty"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := good(t)
			tc.mutate(e)
			before := fmt.Sprintf("%#v", e)
			got := problemStrings(problemsOf(t, envelope.Validate(e)))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if after := fmt.Sprintf("%#v", e); after != before {
				t.Error("Validate modified the envelope")
			}
		})
	}
	t.Run("Nil", func(t *testing.T) {
		problemsOf(t, envelope.Validate(nil))
	})
}

// TestValidEncoding_RecipientConsentTimes holds Go-built envelopes to the
// rules on chat ids, consent snapshots, timestamps and push expiration
// times (the schema's, or the Go rule where the schema cannot say it or
// json.Marshal refuses the value): each problem is named with its path,
// and a valid envelope encodes as json.Marshal does.
func TestValidEncoding_RecipientConsentTimes(t *testing.T) {
	const (
		digest = "your-week-digest.v1.golden.json"
		nudge  = "resurface-nudge.v1.golden.json"
		reply  = "reply-text.v1.golden.json"
	)
	const chatIDRule = "recipient.chat_id: must be a numeric chat id or an @username"
	const chatIDPattern = `recipient.chat_id: must match the pattern "^(-?[0-9]{1,20}|@[A-Za-z0-9_]{5,32})$"`
	zone := func(sec int) *time.Location { return time.FixedZone("", sec) }
	inf, nan, exp := math.Inf(1), math.NaN(), 1.5e12
	withExpiration := func(e *envelope.Envelope, x *float64) {
		ps := *e.Recipient.PushSubscription
		ps.ExpirationTime = x
		e.Recipient.PushSubscription = &ps
	}
	tests := []struct {
		name    string
		fixture string
		mutate  func(e *envelope.Envelope)
		want    []string // nil: valid
	}{
		// Chat ids: the schema's pattern, worded by the Go rule for
		// channel telegram.
		{"ChatIDNumeric", reply, func(e *envelope.Envelope) { e.Recipient.ChatID = "-1001234567890" }, nil},
		{"ChatIDUsername", reply, func(e *envelope.Envelope) { e.Recipient.ChatID = "@" + strings.Repeat("z", 32) }, nil},
		{"ChatIDWords", reply, func(e *envelope.Envelope) { e.Recipient.ChatID = "my chat" }, []string{chatIDRule}},
		{"ChatIDTooManyDigits", reply, func(e *envelope.Envelope) { e.Recipient.ChatID = strings.Repeat("9", 21) }, []string{chatIDRule}},
		{"ChatIDUsernameTooShort", reply, func(e *envelope.Envelope) { e.Recipient.ChatID = "@abcd" }, []string{chatIDRule}},
		{"ChatIDUsernameTooLong", reply, func(e *envelope.Envelope) { e.Recipient.ChatID = "@" + strings.Repeat("z", 33) }, []string{chatIDRule}},
		{"ChatIDUsernameHyphen", reply, func(e *envelope.Envelope) { e.Recipient.ChatID = "@ab-de" }, []string{chatIDRule}},
		{"ChatIDTrailingNewline", reply, func(e *envelope.Envelope) { e.Recipient.ChatID = "10001\n" }, []string{chatIDRule}},
		{"ChatIDFullwidthDigits", reply, func(e *envelope.Envelope) { e.Recipient.ChatID = "１２３" }, []string{chatIDRule}},
		{"ChatIDInvalidUTF8", reply, func(e *envelope.Envelope) { e.Recipient.ChatID = "1\xff" }, []string{"recipient.chat_id: must be valid UTF-8"}},
		{"ChatIDOnAnotherChannel", digest, func(e *envelope.Envelope) { e.Recipient.ChatID = "my chat" }, []string{chatIDPattern}},

		// Consent snapshots: the schema's definition, and for channel
		// email the Go rules on unsubscribe_ref (in bytes).
		{"ConsentDaily", digest, func(e *envelope.Envelope) { e.ConsentSnapshot.Cadence = "daily" }, nil},
		{"ConsentCadenceUnknown", digest, func(e *envelope.Envelope) { e.ConsentSnapshot.Cadence = "monthly" },
			[]string{`consent_snapshot.cadence: must be one of "weekly", "daily"`}},
		{"ConsentCadenceCase", reply, func(e *envelope.Envelope) {
			e.ConsentSnapshot = envelope.ConsentSnapshot{DigestEnabled: true, Cadence: "Daily"}
		}, []string{`consent_snapshot.cadence: must be one of "weekly", "daily"`}},
		{"ConsentRefControl", digest, func(e *envelope.Envelope) { e.ConsentSnapshot.UnsubscribeRef = "ref\x1f1" },
			[]string{"consent_snapshot.unsubscribe_ref: must not contain control characters"}},
		{"ConsentRefC1Control", digest, func(e *envelope.Envelope) { e.ConsentSnapshot.UnsubscribeRef = "ref\u00851" },
			[]string{"consent_snapshot.unsubscribe_ref: must not contain control characters"}},
		{"ConsentRefAtLimit", digest, func(e *envelope.Envelope) { e.ConsentSnapshot.UnsubscribeRef = strings.Repeat("r", 1024) }, nil},
		{"ConsentRefTooLong", digest, func(e *envelope.Envelope) { e.ConsentSnapshot.UnsubscribeRef = strings.Repeat("r", 1025) },
			[]string{"consent_snapshot.unsubscribe_ref: must be at most 1024 bytes"}},
		{"ConsentRefTooLongInBytes", digest, func(e *envelope.Envelope) { e.ConsentSnapshot.UnsubscribeRef = strings.Repeat("é", 513) },
			[]string{"consent_snapshot.unsubscribe_ref: must be at most 1024 bytes"}},
		{"ConsentRefTooLongOffEmail", reply, func(e *envelope.Envelope) {
			e.ConsentSnapshot = envelope.ConsentSnapshot{UnsubscribeRef: strings.Repeat("é", 1025)}
		}, []string{"consent_snapshot.unsubscribe_ref: must be at most 1024 characters"}},
		{"ConsentRefControlOffEmail", reply, func(e *envelope.Envelope) {
			e.ConsentSnapshot = envelope.ConsentSnapshot{UnsubscribeRef: "a\u009fb"}
		}, []string{`consent_snapshot.unsubscribe_ref: must match the pattern "^[^\\x00-\\x1f\\x7f-\\x9f]*$"`}},
		{"ConsentRefInvalidUTF8", digest, func(e *envelope.Envelope) { e.ConsentSnapshot.UnsubscribeRef = "ref\xc3" },
			[]string{"consent_snapshot.unsubscribe_ref: must be valid UTF-8"}},
		{"ConsentWithoutRefOnEmail", digest, func(e *envelope.Envelope) { e.ConsentSnapshot = envelope.ConsentSnapshot{DigestEnabled: true} },
			[]string{"consent_snapshot.unsubscribe_ref: required for channel email (one-click unsubscribe)"}},
		{"NoConsentOffEmail", reply, func(e *envelope.Envelope) { e.ConsentSnapshot = envelope.ConsentSnapshot{} }, nil},

		// Timestamps: what RFC 3339 can write (json.Marshal refuses the
		// rest), and the schema's date-time.
		{"YearZero", reply, func(e *envelope.Envelope) { e.CreatedAt = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC) }, nil},
		{"YearNegative", digest, func(e *envelope.Envelope) { e.NotBefore = time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC) },
			[]string{"not_before: year must be within 0000-9999"}},
		{"YearPastInItsZone", reply, func(e *envelope.Envelope) {
			e.CreatedAt = time.Date(9999, 12, 31, 23, 30, 0, 0, time.UTC).In(zone(3600))
		}, []string{"created_at: year must be within 0000-9999"}},
		{"ZoneJustUnderADay", reply, func(e *envelope.Envelope) { e.CreatedAt = e.CreatedAt.In(zone(24*3600 - 1)) }, nil},
		{"ZoneOddSeconds", reply, func(e *envelope.Envelope) { e.CreatedAt = e.CreatedAt.In(zone(61)) }, nil},
		{"ZoneADay", reply, func(e *envelope.Envelope) { e.CreatedAt = e.CreatedAt.In(zone(24 * 3600)) },
			[]string{"created_at: zone offset must be less than 24 hours"}},
		{"ZonesPastADay", digest, func(e *envelope.Envelope) {
			e.NotBefore = e.NotBefore.In(zone(-25 * 3600))
			e.ExpiresAt = e.ExpiresAt.In(zone(100 * 3600))
		}, []string{
			"expires_at: zone offset must be less than 24 hours",
			"not_before: zone offset must be less than 24 hours",
		}},
		{"TimesAndOtherProblems", digest, func(e *envelope.Envelope) {
			e.CreatedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
			e.ExpiresAt = e.NotBefore
			e.Recipient.ChatID = "x"
		}, []string{
			"created_at: year must be within 0000-9999",
			"expires_at: must be after not_before",
			chatIDPattern,
		}},

		// A push subscription's expirationTime: a number, not NaN or ±Inf.
		{"ExpirationTimeSet", nudge, func(e *envelope.Envelope) { withExpiration(e, &exp) }, nil},
		{"ExpirationTimeNaN", nudge, func(e *envelope.Envelope) { withExpiration(e, &nan) },
			[]string{"recipient.push_subscription.expirationTime: must be a finite number"}},
		{"ExpirationTimeInf", nudge, func(e *envelope.Envelope) {
			withExpiration(e, &inf)
			e.Recipient.PushSubscription.Keys.Auth = "short"
		}, []string{
			"recipient.push_subscription.expirationTime: must be a finite number",
			"recipient.push_subscription.keys.auth: must be a base64url 16-byte secret",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := envelope.Parse(readFixture(t, tc.fixture))
			if err != nil {
				t.Fatal(err)
			}
			tc.mutate(e)
			before := fmt.Sprintf("%#v %#v", e, e.Recipient.PushSubscription)
			data, rows, err := envelope.ValidEncodingRows(e)
			if after := fmt.Sprintf("%#v %#v", e, e.Recipient.PushSubscription); after != before {
				t.Error("ValidEncodingRows modified the envelope")
			}
			if tc.want == nil {
				if err != nil {
					t.Fatalf("ValidEncodingRows: %v", err)
				}
				if want := mustMarshal(t, e); string(data) != string(want) {
					t.Errorf("encoding\n%s\nwant json.Marshal's\n%s", data, want)
				}
				if rows != envelope.Rows(e) {
					t.Errorf("rows = %d, Rows = %d", rows, envelope.Rows(e))
				}
				return
			}
			if data != nil || rows != 0 {
				t.Errorf("ValidEncodingRows returned %d bytes and %d rows with an error", len(data), rows)
			}
			got := problemStrings(problemsOf(t, err))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("problems:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestValidationError(t *testing.T) {
	err := &envelope.ValidationError{Problems: []envelope.Problem{
		{Path: "", Rule: "empty document"},
		{Path: "payload.sections[0].items[2].deep_link", Rule: "required (moat rule)"},
	}}
	want := "invalid envelope: (root): empty document; payload.sections[0].items[2].deep_link: required (moat rule)"
	if err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	if !errors.Is(err, envelope.ErrInvalid) {
		t.Error("errors.Is(err, ErrInvalid) = false")
	}
	if errors.Is(err, envelope.ErrNotFound) {
		t.Error("errors.Is(err, ErrNotFound) = true")
	}
	wrapped := fmt.Errorf("enqueue: %w", err)
	var ve *envelope.ValidationError
	if !errors.As(wrapped, &ve) || !errors.Is(wrapped, envelope.ErrInvalid) {
		t.Error("a wrapped ValidationError is not found")
	}
	if got := (envelope.Problem{Path: "id", Rule: "required"}).String(); got != "id: required" {
		t.Errorf("Problem.String() = %q", got)
	}
}

// TestParse_Concurrent runs Parse from many goroutines, first use of the
// lazily compiled schema included (run with -race).
func TestParse_Concurrent(t *testing.T) {
	docs := [][]byte{
		readFixture(t, "your-week-digest.v1.golden.json"),
		readFixture(t, "resurface-nudge.v1.golden.json"),
		readFixture(t, "invalid/moat-rule-missing-deep-link.json"),
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3*16)
	for g := 0; g < 16; g++ {
		for i, d := range docs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := envelope.Parse(d)
				if (err == nil) != (i < 2) {
					errs <- fmt.Errorf("doc %d: unexpected result %v", i, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestParse_ManyProblemsAreCapped(t *testing.T) {
	doc := fixtureDoc(t, "your-week-digest.v1.golden.json")
	var items []any
	for i := 0; i < envelope.MaxProblems+20; i++ {
		items = append(items, map[string]any{
			"graph_refs": []any{map[string]any{"id": "topic:x"}},
			"deep_link":  "mailto:x",
		})
	}
	obj(t, doc, "payload", "sections", 1)["items"] = items
	_, err := envelope.Parse(mustMarshal(t, doc))
	got := problemsOf(t, err)
	if len(got) != envelope.MaxProblems+1 {
		t.Fatalf("got %d problems, want %d", len(got), envelope.MaxProblems+1)
	}
	if want := (envelope.Problem{Rule: "20 more problems not shown"}); got[len(got)-1] != want {
		t.Errorf("last problem = %v, want %v", got[len(got)-1], want)
	}
	if got[99].Path != "payload.sections[1].items[99].deep_link" {
		t.Errorf("problem 99 is at %q", got[99].Path)
	}
}

// TestParse_DeepApplicationData: a payload may carry deeply nested extra
// data; it is checked for UTF-8 without walking it level by level.
func TestParse_DeepApplicationData(t *testing.T) {
	const depth = 5000
	deep := strings.Repeat("[", depth) + `"caf\u00e9"` + strings.Repeat("]", depth)
	data := readFixture(t, "reply-text.v1.golden.json")
	good := strings.Replace(string(data), `"payload": {`, `"payload": {"extra": `+deep+`,`, 1)
	if _, err := envelope.Parse([]byte(good)); err != nil {
		t.Fatalf("Parse: %v", err)
	}
	bad := strings.Replace(good, `caf\u00e9`, `caf\udce9`, 1)
	_, err := envelope.Parse([]byte(bad))
	got := problemsOf(t, err)
	if len(got) != 1 || got[0].Rule != "must be valid UTF-8" || !strings.HasPrefix(got[0].Path, "payload.extra[0][0]") {
		t.Errorf("got %v, want one UTF-8 problem inside payload.extra", got)
	}
}

func BenchmarkParse(b *testing.B) {
	for _, name := range goldenFixtures {
		data := readFixture(b, name)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := envelope.Parse(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// ValidEncodingRows counts the segments of a reply from the text its
// checks decoded: the same count as Rows, one for the other templates.
func TestValidEncodingRows_Segments(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		text    string
	}{
		{"reply-text.v1.golden.json", "short"},
		{"reply-text.v1.golden.json", strings.Repeat("a sentence of a long reply. ", 600)},
		// The limit is the channel's: 2048 bytes on wecom, 4096 on telegram.
		{"reply-text.v1.wecom.golden.json", strings.Repeat("a sentence of a long reply. ", 250)},
		{"reply-text.v1.wecom_robot.golden.json", strings.Repeat("a sentence of a long reply. ", 250)},
		{"your-week-digest.v1.golden.json", ""},
	} {
		e, err := envelope.Parse(readFixture(t, tc.fixture))
		if err != nil {
			t.Fatal(err)
		}
		if tc.text != "" {
			e.Payload, _ = json.Marshal(envelope.ReplyPayload{Text: tc.text})
		}
		_, rows, err := envelope.ValidEncodingRows(e)
		if err != nil {
			t.Fatal(err)
		}
		if want := envelope.Rows(e); rows != want {
			t.Errorf("%s, %d bytes of text: rows = %d, Rows = %d", tc.fixture, len(tc.text), rows, want)
		}
		if len(tc.text) > 10000 && rows < 2 {
			t.Errorf("a %d-byte reply gives %d rows", len(tc.text), rows)
		}
	}
}

// A name twice in one object is refused where it is (encoding/json keeps
// the last, other readers of a log the first), its escaped spelling too;
// the same name in two objects is fine.
func TestParse_DuplicateKeys(t *testing.T) {
	good := string(readFixture(t, "reply-text.v1.golden.json"))
	for _, tc := range []struct {
		name, doc string
		want      []string // paths
	}{
		{"top level", strings.Replace(good, `"user_id": "u_42",`, `"user_id": "u_42", "user_id": "u_43",`, 1), []string{"user_id"}},
		{"escaped", strings.Replace(good, `"user_id": "u_42",`, `"user_id": "u_42", "user\u005fid": "u_42",`, 1), []string{"user_id"}},
		{"nested", strings.Replace(good, `"chat_id": "734519028"`, `"chat_id": "734519028", "chat_id": "1"`, 1), []string{"recipient.chat_id"}},
		{"in two objects", strings.Replace(good, `"chat_id": "734519028"`, `"chat_id": "734519028", "id": "x"`, 1), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.doc == good {
				t.Fatal("the fixture did not change")
			}
			_, err := envelope.Parse([]byte(tc.doc))
			var got []string
			if err != nil {
				for _, p := range problemsOf(t, err) {
					if strings.Contains(p.Rule, "appears twice") {
						got = append(got, p.Path)
					}
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("duplicate problems at %q, want %q (err %v)", got, tc.want, err)
			}
		})
	}
}
