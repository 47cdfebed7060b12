package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
)

const deliveryFixtures = "../../testdata/delivery"

// runCLI runs the binary in-process and returns its exit code and output.
func runCLI(tb testing.TB, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	var out, errb bytes.Buffer
	e := &env{
		Stdin:  strings.NewReader(stdin),
		Stdout: &out,
		Stderr: &errb,
		Getenv: func(string) string { return "" },
	}
	code = run(context.Background(), e, args)
	return code, out.String(), errb.String()
}

func fixturePath(name string) string { return filepath.Join(deliveryFixtures, name) }

func writeTemp(tb testing.TB, name, content string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

func readFile(tb testing.TB, p string) string {
	tb.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// compactFixture returns a golden fixture as one line of JSON.
func compactFixture(tb testing.TB, name string) string {
	tb.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(readFile(tb, fixturePath(name)))); err != nil {
		tb.Fatal(err)
	}
	return buf.String()
}

func TestValidate_GoldenFixtures(t *testing.T) {
	goldens, err := filepath.Glob(fixturePath("*.golden.json"))
	if err != nil || len(goldens) < 3 {
		t.Fatalf("golden fixtures: %v %v", goldens, err)
	}
	code, stdout, stderr := runCLI(t, "", append([]string{"validate"}, goldens...)...)
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, g := range goldens {
		if want := "ok " + g + ": 1 envelope(s)\n"; !strings.Contains(stdout, want) {
			t.Errorf("stdout %q lacks %q", stdout, want)
		}
	}
}

// TestValidate_InvalidFixtures: each invalid fixture exits 1 and names the
// rule its file name stands for, as FILE:LINE: path: rule.
func TestValidate_InvalidFixtures(t *testing.T) {
	want := map[string]string{
		"moat-rule-missing-deep-link.json":             "payload.sections[1].items[0].deep_link: required (moat rule)",
		"moat-rule-empty-graph-refs.json":              "payload.sections[2].items[0].graph_refs: required non-empty (moat rule)",
		"moat-rule-nudge-lead-missing-graph-refs.json": "payload.lead.graph_refs: required non-empty (moat rule)",
		"deep-link-not-http.json":                      "payload.sections[0].items[1].deep_link: must be an absolute http(s) URL",
		"zero-item-digest.json":                        "payload.sections: digest has no items (zero-item digest)",
		"not-before-after-expires-at.json":             "expires_at: must be after not_before",
		"email-without-address.json":                   "recipient.email: required for channel email",
		"email-without-unsubscribe-ref.json":           "consent_snapshot.unsubscribe_ref: required for channel email (one-click unsubscribe)",
		"push-without-keys.json":                       "recipient.push_subscription.keys.p256dh: required for channel push",
		"push-endpoint-not-https.json":                 "recipient.push_subscription.endpoint: must be an absolute https URL",
		"telegram-without-chat-id.json":                "recipient.chat_id: required for channel telegram",
		"id-too-long.json":                             "id: must be at most 200 bytes",
		"id-control-character.json":                    "id: must not contain control characters",
		"unknown-schema-version.json":                  `schema_version: unsupported version (want "1")`,
		"unknown-template.json":                        "template: unknown template",
		"template-channel-mismatch.json":               "channel: not allowed for template reply-text.v1 (want telegram or wecom or wecom_robot or wecom_bot_reply)",
		"empty-user-id.json":                           "user_id: required non-empty",
		"reply-text-empty.json":                        "payload.text: required non-empty",
		"unknown-field.json":                           "priority: unknown field",
		"graph-ref-bad-id.json":                        `payload.sections[1].items[0].graph_refs[0].id: must be "person:…" or "topic:…"`,
		"created-at-not-rfc3339.json":                  "created_at: must be an RFC 3339 date-time",
		"revisit-item-missing-quote.json":              "payload.sections[0].items[0].quote: required",
		"highlight-count-negative.json":                "payload.highlight_count: must be at least 0",
		"malformed-json.json":                          "(root): malformed JSON: invalid character after object key:value pair at line 2, column 22",
		"wecom-without-user.json":                      "recipient.wecom_user: required for channel wecom",
		"wecom-robot-bad-name.json":                    "recipient.robot: must be a robot name",
		"wecom-bot-reply-without-expires-at.json":      "expires_at: required for channel wecom_bot_reply",
		"wecom-bot-reply-expires-after-one-hour.json":  "expires_at: must be at most one hour after created_at",
		"wecom-bot-reply-text-too-long.json":           "payload.text: must be at most 20480 bytes for channel wecom_bot_reply",
	}
	files, err := filepath.Glob(fixturePath("invalid/*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(want) {
		t.Errorf("%d invalid fixtures, %d expectations: keep the table in step", len(files), len(want))
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			w, ok := want[name]
			if !ok {
				t.Fatalf("no expectation for %s", name)
			}
			code, stdout, stderr := runCLI(t, "", "validate", f)
			if code != exitFailure {
				t.Errorf("exit %d, want %d", code, exitFailure)
			}
			if stdout != "" {
				t.Errorf("stdout = %q, want nothing", stdout)
			}
			if line := f + ":1: " + w; !strings.Contains(stderr, line) {
				t.Errorf("stderr %q lacks %q", stderr, line)
			}
		})
	}
}

func TestValidate_ArrayAndJSONLines(t *testing.T) {
	digest := compactFixture(t, "your-week-digest.v1.golden.json")
	nudge := compactFixture(t, "resurface-nudge.v1.golden.json")
	reply := compactFixture(t, "reply-text.v1.golden.json")
	bad := strings.Replace(nudge, `"deep_link":`, `"deep_link_x":`, 1)
	if bad == nudge {
		t.Fatal("mutation did not apply")
	}

	t.Run("ValidArray", func(t *testing.T) {
		p := writeTemp(t, "batch.json", "[\n"+digest+",\n"+nudge+",\n"+reply+"\n]\n")
		code, stdout, stderr := runCLI(t, "", "validate", p)
		if code != exitOK || stdout != "ok "+p+": 3 envelope(s)\n" || stderr != "" {
			t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	})
	t.Run("ArrayProblemsOnTheElementLine", func(t *testing.T) {
		p := writeTemp(t, "batch.json", "[\n"+digest+",\n\n"+bad+"\n]\n")
		code, stdout, stderr := runCLI(t, "", "validate", p)
		want := p + ":4: payload.lead.deep_link: required (moat rule)\n"
		if code != exitFailure || stdout != "" || stderr != want {
			t.Errorf("exit %d, stdout %q, stderr %q; want stderr %q", code, stdout, stderr, want)
		}
	})
	t.Run("JSONLines", func(t *testing.T) {
		p := writeTemp(t, "batch.jsonl", digest+"\n"+bad+"\n\n"+"{\"schema_version\":\n"+reply+"\n")
		code, _, stderr := runCLI(t, "", "validate", p)
		wantLines := []string{
			p + ":2: payload.lead.deep_link: required (moat rule)",
			p + ":4: (root): malformed JSON: unexpected end of JSON input at line 1, column 19 (byte offset 18)",
		}
		if code != exitFailure || stderr != strings.Join(wantLines, "\n")+"\n" {
			t.Errorf("exit %d, stderr %q, want %q", code, stderr, wantLines)
		}
	})
	t.Run("Stdin", func(t *testing.T) {
		code, stdout, stderr := runCLI(t, digest+"\n"+reply+"\n", "validate", "-")
		if code != exitOK || stdout != "ok <stdin>: 2 envelope(s)\n" || stderr != "" {
			t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	})
	t.Run("MalformedArray", func(t *testing.T) {
		p := writeTemp(t, "batch.json", "[\n"+digest+"\n"+nudge+"\n]\n")
		code, _, stderr := runCLI(t, "", "validate", p)
		want := p + ":3: (root): malformed JSON array: invalid character after array element at column 1\n"
		if code != exitFailure || stderr != want {
			t.Errorf("exit %d, stderr %q, want %q", code, stderr, want)
		}
	})
	t.Run("EmptyFile", func(t *testing.T) {
		p := writeTemp(t, "empty.jsonl", "\n\n")
		code, _, stderr := runCLI(t, "", "validate", p)
		if code != exitFailure || stderr != p+":1: (root): no envelope in the file\n" {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("MixedFiles", func(t *testing.T) {
		good := writeTemp(t, "good.json", digest)
		missing := filepath.Join(t.TempDir(), "missing.json")
		code, stdout, stderr := runCLI(t, "", "validate", good, missing)
		if code != exitFailure {
			t.Errorf("exit %d, want %d", code, exitFailure)
		}
		if stdout != "ok "+good+": 1 envelope(s)\n" {
			t.Errorf("stdout %q", stdout)
		}
		if !strings.HasPrefix(stderr, missing+": cannot read: ") {
			t.Errorf("stderr %q", stderr)
		}
	})
}

// TestValidate_OutputHasNoValues: problem lines never echo personal data.
func TestValidate_OutputHasNoValues(t *testing.T) {
	const canary = "canary-3b9e@example.net"
	doc := strings.Replace(compactFixture(t, "your-week-digest.v1.golden.json"),
		`"ada.lovelace@example.org"`, `"`+canary+` <x>"`, 1)
	doc = strings.Replace(doc, `"unsub_7f3c9a1e2b4d"`, `"`+canary+"\\u0000\"", 1)
	code, _, stderr := runCLI(t, doc, "validate", "-")
	if code != exitFailure || !strings.Contains(stderr, "recipient.email") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if strings.Contains(stderr, "canary") {
		t.Errorf("stderr echoes a value: %q", stderr)
	}
}

func TestValidate_Usage(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"NoFiles", []string{"validate"}, exitUsage, "Error: validate needs at least one FILE"},
		{"StdinTwice", []string{"validate", "-", "-"}, exitUsage, "given more than once"},
		{"UnknownFlag", []string{"validate", "-strict", "x.json"}, exitUsage, "Try: outbox help validate"},
		{"Help", []string{"help", "validate"}, exitOK, "Usage: outbox validate [--json] FILE..."},
		{"SchemaArgs", []string{"schema", "extra"}, exitUsage, "Error: schema takes no arguments"},
		{"SchemaHelp", []string{"help", "schema"}, exitOK, "Usage: outbox schema"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, "", tc.args...)
			if code != tc.wantCode || !strings.Contains(stderr, tc.wantErr) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, tc.wantCode, tc.wantErr)
			}
		})
	}
}

func TestSchemaCommand(t *testing.T) {
	code, stdout, stderr := runCLI(t, "", "schema")
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if stdout != string(envelope.Schema()) {
		t.Error("outbox schema does not print envelope.Schema()")
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("output is not JSON: %v", err)
	}
	if !regexp.MustCompile(`draft/2020-12`).MatchString(doc["$schema"].(string)) {
		t.Errorf("$schema = %v", doc["$schema"])
	}
}
