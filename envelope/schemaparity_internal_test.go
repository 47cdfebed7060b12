package envelope

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope/internal/schemagen"
)

// The generated check is what the generator makes of schema.json now: a
// change to the schema without go generate fails here.
func TestSchemaGen_UpToDate(t *testing.T) {
	want, err := schemagen.Generate(schemaJSON, "envelope")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("schema_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("schema_gen.go is not what schema.json generates: run go generate ./envelope")
	}
}

// The generator refuses a keyword it does not turn into code, rather than
// generating a check that ignores it.
func TestSchemaGen_RefusesUnknownKeywords(t *testing.T) {
	for _, doc := range []string{
		`{"type":"object","properties":{"a":{"type":"string","uniqueItems":true}}}`,
		`{"oneOf":[{"type":"string"}]}`,
		`{"type":"object","additionalProperties":{"type":"string"}}`,
		`{"$ref":"#/$defs/missing"}`,
	} {
		if _, err := schemagen.Generate([]byte(doc), "x"); err == nil {
			t.Errorf("Generate(%s) succeeded", doc)
		}
	}
}

// parityFixtures are the documents the generated check and the library
// are compared on, and the bases of the variants.
func parityFixtures(tb testing.TB) [][]byte {
	tb.Helper()
	dir := filepath.Join("..", "testdata", "delivery")
	var docs [][]byte
	for _, pattern := range []string{"*.json", "invalid/*.json"} {
		names, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			tb.Fatal(err)
		}
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil {
				tb.Fatal(err)
			}
			docs = append(docs, b)
		}
	}
	if len(docs) < 20 {
		tb.Fatalf("only %d fixtures found", len(docs))
	}
	return docs
}

// checkParity fails unless both checks report the same problems on inst.
func checkParity(tb testing.TB, inst any) {
	tb.Helper()
	got := sortProblems(schemaProblems(inst))
	want := sortProblems(libraryProblems(inst))
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		doc, _ := json.Marshal(inst)
		tb.Fatalf("generated check and library disagree on %s\ngenerated: %v\nlibrary:   %v", doc, got, want)
	}
}

// replacements are the values every value of a fixture is replaced with in
// turn: each JSON type, and strings near the schema's patterns, formats
// and bounds.
var replacements = []any{
	nil, true, false, json.Number("0"), json.Number("-1"), json.Number("1.5"), json.Number("1.0"),
	json.Number("9007199254740991"), json.Number("9007199254740992"), json.Number("1e2"),
	"", "x", "1", "-12", "@abcde", "@abc", "email", "push", "telegram", "weekly", "person", "topic",
	"reply-text.v1", "your-week-digest.v1", "resurface-nudge.v1", "revisit", "new_in_follows", "auto",
	"2026-11-01T00:00:00Z", "2026-13-01T00:00:00Z", "2026-11-01 00:00:00Z", "2016-12-31T23:59:60Z",
	"a@example.org", "a@@example.org", "a..b@example.org", "\"q\"@example.org", "a@[127.0.0.1]",
	"https://example.org/x", "http://example.org", "https://user@example.org", "ftp://x",
	"person:ada", "topic:", "a\x01b", "a\u0085b", "é", strings.Repeat("x", 201), strings.Repeat("é", 200),
	"BAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
	"AAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAA==",
	[]any{}, []any{nil}, []any{map[string]any{}}, []any{map[string]any{"items": []any{}}},
	map[string]any{}, map[string]any{"id": "person:x"}, map[string]any{"unknown": json.Number("1")},
}

// variants calls fn with inst changed at one place: each value replaced
// by each replacement, each object member removed, an unknown member
// added to each object. fn must not keep its argument.
func variants(inst any, fn func(any)) {
	var walk func(v any, set func(any))
	walk = func(v any, set func(any)) {
		for _, r := range replacements {
			set(r)
			fn(inst)
		}
		set(v)
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				old := v[k]
				delete(v, k)
				fn(inst)
				v[k] = old
				walk(old, func(x any) { v[k] = x })
			}
			v["not_in_schema"] = "x"
			fn(inst)
			delete(v, "not_in_schema")
		case []any:
			for i := range v {
				walk(v[i], func(x any) { v[i] = x })
			}
			if len(v) > 0 {
				short := slices.Clone(v[:len(v)-1])
				set(short)
				fn(inst)
				set(v)
			}
		}
	}
	var root any = inst
	walk(inst, func(x any) { root = x; _ = root })
}

// The generated check reports what the library reports on every fixture
// and on every one-place variant of each (thousands of documents, valid
// and invalid at every path).
func TestSchemaParity_FixturesAndVariants(t *testing.T) {
	n := 0
	for _, doc := range parityFixtures(t) {
		inst, err := decodeInstance(doc)
		if err != nil {
			continue // the malformed fixture
		}
		checkParity(t, inst)
	}
	// The invalid fixtures are one-place variants of the golden ones.
	for _, name := range []string{"reply-text.v1.golden.json", "resurface-nudge.v1.golden.json", "your-week-digest.v1.golden.json"} {
		doc, err := os.ReadFile(filepath.Join("..", "testdata", "delivery", name))
		if err != nil {
			t.Fatal(err)
		}
		inst, err := decodeInstance(doc)
		if err != nil {
			t.Fatal(err)
		}
		m, ok := inst.(map[string]any)
		if !ok {
			t.Fatal("a fixture is not an object")
		}
		variants(m, func(v any) {
			n++
			checkParity(t, v)
		})
	}
	for _, r := range replacements { // the whole document replaced
		checkParity(t, r)
	}
	if n < 5000 {
		t.Fatalf("only %d variants checked", n)
	}
	t.Logf("%d variants", n)
}

// FuzzSchemaParity compares the generated check with the library on
// arbitrary documents.
func FuzzSchemaParity(f *testing.F) {
	for _, doc := range parityFixtures(f) {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		inst, err := decodeInstance(data)
		if err != nil {
			return
		}
		checkParity(t, inst)
	})
}

// Trials nested deeper than the check's fixed marks still pair up.
func TestSchemaCheck_DeepTrials(t *testing.T) {
	var c schemaCheck
	var outcomes []bool
	var nest func(depth int)
	nest = func(depth int) {
		if depth == 0 {
			c.add(nil, "x")
			return
		}
		if c.passes() {
			if depth%3 == 0 {
				c.add(nil, "y")
			}
			nest(depth - 1)
			outcomes = append(outcomes, c.passed())
		}
	}
	nest(20)
	if c.quiet != 0 || len(c.probs) != 0 || len(outcomes) != 20 {
		t.Fatalf("quiet %d, %d problems, %d trials", c.quiet, len(c.probs), len(outcomes))
	}
	for i, ok := range outcomes {
		if ok {
			t.Errorf("trial %d passed though a failure happened inside it", i)
		}
	}
	if !c.passes() || !c.passed() {
		t.Error("an empty trial failed")
	}
}
