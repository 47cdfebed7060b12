package envelope_test

import (
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
)

// allocated returns the bytes allocated by f (runtime.MemStats.TotalAlloc
// before and after; the test runs no other goroutine meanwhile).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// rootRule returns the single root problem of a Parse error, failing
// unless there is exactly that.
func rootRule(t *testing.T, err error) string {
	t.Helper()
	var ve *envelope.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Path != "" {
		t.Fatalf("Parse error %v, want one problem at the root", err)
	}
	return ve.Problems[0].Rule
}

// tinyValues returns a reply envelope whose payload holds an array of
// about n bytes of zeros: many JSON values in few bytes.
func tinyValues(t *testing.T, n int) []byte {
	t.Helper()
	doc := fixtureDoc(t, "reply-text.v1.golden.json")
	doc["payload"] = map[string]any{"text": "hi", "x": json.RawMessage("[" + strings.TrimSuffix(strings.Repeat("0,", n/2), ",") + "]")}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParse_Limits(t *testing.T) {
	valid := readFixture(t, "reply-text.v1.golden.json")
	tests := []struct {
		name string
		doc  []byte
		want string // a part of the rule
	}{
		{"TooLarge", append(append([]byte(nil), valid...), strings.Repeat(" ", envelope.MaxEnvelopeBytes)...), "exceeds 1048576 bytes"},
		{"TooManyValues", tinyValues(t, 2*envelope.MaxValues), "more than 50000 JSON values"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := envelope.Parse(tt.doc)
			if rule := rootRule(t, err); !strings.Contains(rule, tt.want) {
				t.Fatalf("rule %q, want it to say %q", rule, tt.want)
			}
		})
	}
	// Within the limits the same document is valid (a reply payload may
	// carry the app's own fields).
	if _, err := envelope.Parse(tinyValues(t, envelope.MaxValues)); err != nil {
		t.Fatalf("Parse of a document within MaxValues = %v", err)
	}
}

// TestParse_LimitsBeforeDecoding measures what Parse allocates for a
// document of many tiny values: without the limits it decodes all of
// them (about 60 times the document's size); with them it refuses the
// document after one pass that allocates nothing.
func TestParse_LimitsBeforeDecoding(t *testing.T) {
	doc := tinyValues(t, envelope.MaxEnvelopeBytes-1024)
	var err error
	n := allocated(func() { _, err = envelope.Parse(doc) })
	rootRule(t, err)
	t.Logf("Parse of %d bytes holding %d values allocated %d bytes", len(doc), len(doc)/2, n)
	if n > uint64(len(doc))/16 {
		t.Fatalf("Parse of %d bytes of tiny values allocated %d bytes, want at most %d", len(doc), n, len(doc)/16)
	}
}

// A document within the limits whose encoding is not: json.Marshal writes
// '<' as \u003c.
func TestParse_EncodingTooLarge(t *testing.T) {
	doc := fixtureDoc(t, "your-week-digest.v1.golden.json")
	item := at(t, doc, "payload", "sections", 0, "items", 0).(map[string]any)
	item["quote"] = strings.Repeat("<", envelope.MaxEnvelopeBytes/5)
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	data = []byte(strings.ReplaceAll(string(data), `\u003c`, "<"))
	if len(data) > envelope.MaxEnvelopeBytes {
		t.Fatalf("document of %d bytes", len(data))
	}
	_, err = envelope.Parse(data)
	if rule := rootRule(t, err); !strings.Contains(rule, "encoding exceeds") {
		t.Fatalf("rule %q", rule)
	}
	// Validate refuses the same envelope built in Go.
	item["quote"] = strings.Repeat("<", 1000)
	small, _ := json.Marshal(doc)
	e, err := envelope.Parse(small)
	if err != nil {
		t.Fatal(err)
	}
	var p envelope.DigestPayload
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		t.Fatal(err)
	}
	p.Sections[0].Items[0].Quote = strings.Repeat("<", envelope.MaxEnvelopeBytes/5)
	e.Payload, _ = json.Marshal(p)
	if err := envelope.Validate(e); err == nil || !strings.Contains(err.Error(), "encoding exceeds") {
		t.Fatalf("Validate = %v", err)
	}
}
