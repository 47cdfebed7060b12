package envelope_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/outboxhq/outbox/envelope"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// deliveryDir holds the shared fixtures (SPEC §2).
const deliveryDir = "../testdata/delivery"

// goldenFixtures are the valid fixtures, by file name.
var goldenFixtures = []string{
	"your-week-digest.v1.golden.json",
	"resurface-nudge.v1.golden.json",
	"reply-text.v1.golden.json",
	"reply-text.v1.wecom.golden.json",
	"reply-text.v1.wecom_robot.golden.json",
	"reply-text.v1.wecom_bot_reply.golden.json",
	"your-week-digest.v1.wecom.golden.json",
	"resurface-nudge.v1.wecom.golden.json",
}

// invalidFixtures maps each invalid fixture to a substring that the path or
// rule of one of its problems must contain, and whether the JSON Schema
// alone rejects it (false: only the Go rules can).
var invalidFixtures = map[string]struct {
	want         string
	schemaAlone  bool
	wantPath     string // optional: the exact path of that problem
	wantProblems int    // optional: exact number of problems (0 = any)
}{
	"moat-rule-missing-deep-link.json":             {"deep_link: required (moat rule)", true, "payload.sections[1].items[0].deep_link", 1},
	"moat-rule-empty-graph-refs.json":              {"graph_refs: required non-empty (moat rule)", true, "payload.sections[2].items[0].graph_refs", 1},
	"moat-rule-nudge-lead-missing-graph-refs.json": {"graph_refs: required non-empty (moat rule)", true, "payload.lead.graph_refs", 1},
	"deep-link-not-http.json":                      {"must be an absolute http(s) URL", true, "payload.sections[0].items[1].deep_link", 1},
	"zero-item-digest.json":                        {"zero-item digest", true, "payload.sections", 1},
	"not-before-after-expires-at.json":             {"must be after not_before", false, "expires_at", 1},
	"email-without-address.json":                   {"required for channel email", true, "recipient.email", 1},
	"email-without-unsubscribe-ref.json":           {"one-click unsubscribe", true, "consent_snapshot.unsubscribe_ref", 1},
	"push-without-keys.json":                       {"keys", true, "recipient.push_subscription.keys.auth", 2},
	"push-endpoint-not-https.json":                 {"must be an absolute https URL", true, "recipient.push_subscription.endpoint", 1},
	"telegram-without-chat-id.json":                {"required for channel telegram", true, "recipient.chat_id", 1},
	"id-too-long.json":                             {"at most 200 bytes", true, "id", 1},
	"id-control-character.json":                    {"control characters", true, "id", 1},
	"unknown-schema-version.json":                  {"unsupported version", true, "schema_version", 1},
	"unknown-template.json":                        {"unknown template", true, "template", 1},
	"template-channel-mismatch.json":               {"not allowed for template reply-text.v1", true, "channel", 0},
	"empty-user-id.json":                           {"required non-empty", true, "user_id", 1},
	"reply-text-empty.json":                        {"required non-empty", true, "payload.text", 1},
	"unknown-field.json":                           {"unknown field", true, "priority", 1},
	"graph-ref-bad-id.json":                        {`must be "person:…" or "topic:…"`, true, "payload.sections[1].items[0].graph_refs[0].id", 1},
	"created-at-not-rfc3339.json":                  {"RFC 3339", true, "created_at", 1},
	"revisit-item-missing-quote.json":              {"required", true, "payload.sections[0].items[0].quote", 1},
	"highlight-count-negative.json":                {"must be at least 0", true, "payload.highlight_count", 1},
	"malformed-json.json":                          {"malformed JSON", false, "", 1},
	"wecom-without-user.json":                      {"required for channel wecom", true, "recipient.wecom_user", 1},
	"wecom-robot-bad-name.json":                    {"must be a robot name", true, "recipient.robot", 1},
	"wecom-bot-reply-without-expires-at.json":      {"required for channel wecom_bot_reply", true, "expires_at", 1},
	"wecom-bot-reply-expires-after-one-hour.json":  {"at most one hour after created_at", false, "expires_at", 1},
	"wecom-bot-reply-text-too-long.json":           {"at most 20480 bytes for channel wecom_bot_reply", false, "payload.text", 1},
}

// droppedByGoTypes are the invalid fixtures whose problem decoding into
// the Go types drops: json.Unmarshal ignores an unknown field.
var droppedByGoTypes = map[string]bool{"unknown-field.json": true}

func readFixture(tb testing.TB, name string) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(deliveryDir, name))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// problemsOf returns the problems of err, failing unless it is a
// *ValidationError matching ErrInvalid.
func problemsOf(tb testing.TB, err error) []envelope.Problem {
	tb.Helper()
	if err == nil {
		tb.Fatal("got nil error, want a validation error")
	}
	if !errors.Is(err, envelope.ErrInvalid) {
		tb.Fatalf("errors.Is(%v, ErrInvalid) = false", err)
	}
	var ve *envelope.ValidationError
	if !errors.As(err, &ve) {
		tb.Fatalf("error %T is not a *ValidationError", err)
	}
	if len(ve.Problems) == 0 {
		tb.Fatal("ValidationError with no problems")
	}
	return ve.Problems
}

func TestContract_GoldenFixtures(t *testing.T) {
	for _, name := range goldenFixtures {
		t.Run(name, func(t *testing.T) {
			data := readFixture(t, name)
			e, err := envelope.Parse(data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if err := envelope.Validate(e); err != nil {
				t.Fatalf("Validate(Parse(fixture)): %v", err)
			}
			// Round trip: Parse → Marshal → Parse gives the same envelope.
			out, err := json.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			e2, err := envelope.Parse(out)
			if err != nil {
				t.Fatalf("Parse(Marshal(e)): %v", err)
			}
			if !reflect.DeepEqual(e, e2) {
				t.Errorf("round trip changed the envelope:\n got %+v\nwant %+v", e2, e)
			}
			// The payload means the same JSON as the fixture's.
			var raw struct{ Payload any }
			var back any
			if err := json.Unmarshal(data, &raw); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(e.Payload, &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(raw.Payload, back) {
				t.Error("decoded payload differs from the fixture's payload")
			}
		})
	}
}

func TestContract_GoldenFixtureContents(t *testing.T) {
	digest, err := envelope.Parse(readFixture(t, "your-week-digest.v1.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	if digest.TenantID != "" || digest.Tenant() != envelope.DefaultTenant {
		t.Errorf("digest tenant = %q, want absent", digest.TenantID)
	}
	if digest.NotBefore.IsZero() || digest.ExpiresAt.IsZero() || digest.CreatedAt.IsZero() {
		t.Error("digest must set not_before, expires_at and created_at")
	}
	p, err := digest.DigestPayload()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	var revisitUser, auto, person, topic bool
	for _, s := range p.Sections {
		kinds[s.Kind] = true
		for _, it := range s.Items {
			if s.Kind == envelope.SectionRevisit && it.Source == "user" && it.Quote != "" && it.TMs != nil {
				revisitUser = true
			}
			auto = auto || it.Auto()
			for _, r := range it.GraphRefs {
				person = person || strings.HasPrefix(r.ID, "person:")
				topic = topic || strings.HasPrefix(r.ID, "topic:")
			}
			if !strings.HasPrefix(it.DeepLink, "https://") {
				t.Errorf("deep link %q is not https", it.DeepLink)
			}
		}
	}
	if len(p.Sections) != 3 || len(kinds) != 3 {
		t.Errorf("digest has %d sections of %d kinds, want 3 of 3", len(p.Sections), len(kinds))
	}
	if !revisitUser || !auto || !person || !topic {
		t.Errorf("digest lacks a user revisit (%v), an auto pick (%v), a person ref (%v) or a topic ref (%v)",
			revisitUser, auto, person, topic)
	}

	nudge, err := envelope.Parse(readFixture(t, "resurface-nudge.v1.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	if nudge.Channel != envelope.ChannelPush || nudge.Recipient.PushSubscription == nil {
		t.Errorf("nudge: channel %q, subscription %v; want push with a subscription", nudge.Channel, nudge.Recipient.PushSubscription)
	}

	reply, err := envelope.Parse(readFixture(t, "reply-text.v1.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	rp, err := reply.ReplyPayload()
	if err != nil {
		t.Fatal(err)
	}
	units := len(utf16.Encode([]rune(rp.Text)))
	if units <= 2*4096 || units > 3*4096 {
		t.Errorf("reply text is %d UTF-16 units, want in (8192, 12288] for three Telegram segments", units)
	}
	if !strings.Contains(rp.Text, "\n\n") || len(rp.Text) == len([]rune(rp.Text)) {
		t.Error("reply text should have paragraphs and non-ASCII characters")
	}
	if reply.Channel != envelope.ChannelTelegram || reply.Recipient.ChatID == "" {
		t.Errorf("reply: channel %q, chat id set %v", reply.Channel, reply.Recipient.ChatID != "")
	}
}

func TestContract_InvalidFixtures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(deliveryDir, "invalid", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 12 {
		t.Fatalf("found %d invalid fixtures, want at least 12", len(files))
	}
	seen := map[string]bool{}
	for _, f := range files {
		name := filepath.Base(f)
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			tc, ok := invalidFixtures[name]
			if !ok {
				t.Fatalf("fixture %s has no entry in invalidFixtures", name)
			}
			e, err := envelope.Parse(readFixture(t, filepath.Join("invalid", name)))
			if e != nil {
				t.Error("Parse returned an envelope for an invalid document")
			}
			problems := problemsOf(t, err)
			found := false
			for _, p := range problems {
				if (strings.Contains(p.Rule, tc.want) || strings.Contains(p.String(), tc.want)) &&
					(tc.wantPath == "" || p.Path == tc.wantPath) {
					found = true
				}
			}
			if !found {
				t.Errorf("no problem matching %q at %q in %v", tc.want, tc.wantPath, problems)
			}
			if tc.wantProblems > 0 && len(problems) != tc.wantProblems {
				t.Errorf("got %d problems %v, want %d", len(problems), problems, tc.wantProblems)
			}
			if !strings.HasPrefix(err.Error(), "invalid envelope: ") {
				t.Errorf("Error() = %q, want the prefix %q", err.Error(), "invalid envelope: ")
			}

			// Decoded into the Go types, as an app's own code might build
			// it, the fixture is rejected by ValidEncoding (the enqueue
			// path) with the same problem.
			built := new(envelope.Envelope)
			if json.Unmarshal(readFixture(t, filepath.Join("invalid", name)), built) != nil {
				return // the Go types cannot hold it (malformed JSON, a bad time)
			}
			data, err := envelope.ValidEncoding(built)
			if droppedByGoTypes[name] {
				if err != nil {
					t.Errorf("ValidEncoding of the decoded fixture = %v, want nil (decoding drops the problem)", err)
				}
				return
			}
			if data != nil {
				t.Error("ValidEncoding returned an encoding with an error")
			}
			if !reflect.DeepEqual(problemsOf(t, err), problems) {
				t.Errorf("ValidEncoding reports %v, Parse %v", problemsOf(t, err), problems)
			}
		})
	}
	for name := range invalidFixtures {
		if !seen[name] {
			t.Errorf("invalidFixtures lists %s, which does not exist", name)
		}
	}
}

// compileSchema compiles envelope.Schema() on its own, as a producer in
// another language would use it.
func compileSchema(tb testing.TB) *jsonschema.Schema {
	tb.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(envelope.Schema()))
	if err != nil {
		tb.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("envelope.schema.json", doc); err != nil {
		tb.Fatal(err)
	}
	sch, err := c.Compile("envelope.schema.json")
	if err != nil {
		tb.Fatalf("compile schema: %v", err)
	}
	return sch
}

func TestContract_SchemaAlone(t *testing.T) {
	sch := compileSchema(t)
	for _, name := range goldenFixtures {
		t.Run(name, func(t *testing.T) {
			v, err := jsonschema.UnmarshalJSON(bytes.NewReader(readFixture(t, name)))
			if err != nil {
				t.Fatal(err)
			}
			if err := sch.Validate(v); err != nil {
				t.Errorf("schema rejects a golden fixture: %v", err)
			}
		})
	}
	for name, tc := range invalidFixtures {
		t.Run("invalid/"+name, func(t *testing.T) {
			v, err := jsonschema.UnmarshalJSON(bytes.NewReader(readFixture(t, filepath.Join("invalid", name))))
			if err != nil {
				if tc.schemaAlone {
					t.Fatalf("fixture is not JSON: %v", err)
				}
				return // malformed JSON: no schema can judge it
			}
			err = sch.Validate(v)
			switch {
			case tc.schemaAlone && err == nil:
				t.Error("the schema alone accepts this invalid fixture")
			case !tc.schemaAlone && err != nil:
				// Keep the table honest: the README lists the fixtures
				// only the Go rules reject.
				t.Errorf("the schema rejects this fixture, mark it schemaAlone: %v", err)
			}
		})
	}
}

func TestSchema_IsJSONAndACopy(t *testing.T) {
	a := envelope.Schema()
	var doc map[string]any
	if err := json.Unmarshal(a, &doc); err != nil {
		t.Fatalf("schema is not JSON: %v", err)
	}
	if doc["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("$schema = %v, want draft 2020-12", doc["$schema"])
	}
	if doc["$id"] != envelope.SchemaURL {
		t.Errorf("$id = %v, want %s", doc["$id"], envelope.SchemaURL)
	}
	a[0] = 'X'
	if envelope.Schema()[0] == 'X' {
		t.Error("Schema returns the embedded bytes, not a copy")
	}
}

// TestSchema_MatchesGoTypes checks that the schema names exactly the JSON
// fields of the Go types, and requires exactly those without omitempty or
// omitzero (plus created_at, which SPEC §2 requires).
func TestSchema_MatchesGoTypes(t *testing.T) {
	var doc map[string]any
	if err := json.Unmarshal(envelope.Schema(), &doc); err != nil {
		t.Fatal(err)
	}
	defs := doc["$defs"].(map[string]any)
	cases := []struct {
		name  string
		obj   map[string]any
		typ   reflect.Type
		extra []string // required although omitempty/omitzero in Go
	}{
		{"envelope", doc, reflect.TypeFor[envelope.Envelope](), []string{"created_at"}},
		{"recipient", defs["recipient"].(map[string]any), reflect.TypeFor[envelope.Recipient](), nil},
		{"push_subscription", defs["push_subscription"].(map[string]any), reflect.TypeFor[envelope.PushSubscription](), nil},
		{"keys", defs["push_subscription"].(map[string]any)["properties"].(map[string]any)["keys"].(map[string]any), reflect.TypeFor[envelope.PushKeys](), nil},
		{"consent_snapshot", defs["consent_snapshot"].(map[string]any), reflect.TypeFor[envelope.ConsentSnapshot](), nil},
		{"graph_ref", defs["graph_ref"].(map[string]any), reflect.TypeFor[envelope.GraphRef](), nil},
		{"item", defs["item"].(map[string]any), reflect.TypeFor[envelope.Item](), nil},
		{"section", defs["section"].(map[string]any), reflect.TypeFor[envelope.Section](), nil},
		{"digest_payload", defs["digest_payload"].(map[string]any), reflect.TypeFor[envelope.DigestPayload](), nil},
		{"nudge_payload", defs["nudge_payload"].(map[string]any), reflect.TypeFor[envelope.NudgePayload](), nil},
		{"reply_payload", defs["reply_payload"].(map[string]any), reflect.TypeFor[envelope.ReplyPayload](), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			props := map[string]bool{}
			for k := range tc.obj["properties"].(map[string]any) {
				props[k] = true
			}
			required := map[string]bool{}
			if r, ok := tc.obj["required"].([]any); ok {
				for _, k := range r {
					required[k.(string)] = true
				}
			}
			wantRequired := map[string]bool{}
			for _, k := range tc.extra {
				wantRequired[k] = true
			}
			for i := 0; i < tc.typ.NumField(); i++ {
				f := tc.typ.Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
				if !props[name] {
					t.Errorf("Go field %s (%q) is not in the schema", f.Name, name)
				}
				delete(props, name)
				if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
					wantRequired[name] = true
				}
			}
			for k := range props {
				t.Errorf("schema property %q has no Go field", k)
			}
			if !reflect.DeepEqual(required, wantRequired) {
				t.Errorf("required = %v, want %v", required, wantRequired)
			}
		})
	}
}

// ValidEncoding returns exactly json.Marshal's encoding of a valid envelope
// (the queue stores it as the log line) and nothing for an invalid one.
func TestValidEncoding(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "testdata", "delivery", "*.golden.json"))
	if len(files) == 0 {
		t.Fatal("no golden fixtures")
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		e, err := envelope.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := envelope.ValidEncoding(e)
		want, _ := json.Marshal(e)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: ValidEncoding = %s, %v; want %s", f, got, err, want)
		}
		e.Payload = json.RawMessage(`{}`)
		if b, err := envelope.ValidEncoding(e); err == nil || b != nil {
			t.Fatalf("%s with an empty payload: %s, %v", f, b, err)
		}
	}
}
