package envelope

import (
	"reflect"
	"strings"
	"testing"
)

func TestJoinKey(t *testing.T) {
	tests := []struct{ path, key, want string }{
		{"", "id", "id"},
		{"recipient", "email", "recipient.email"},
		{"", "a.b", `["a.b"]`},
		{"payload", "x y", `payload["x y"]`},
		{"", "bell\a", `["bell\a"]`},
		{"", strings.Repeat("k", 70), `["` + strings.Repeat("k", 64) + `…"]`},
		{"", strings.Repeat("é", 40), `["` + strings.Repeat("é", 32) + `…"]`},
	}
	for _, tc := range tests {
		if got := joinKey(tc.path, tc.key); got != tc.want {
			t.Errorf("joinKey(%q, %q) = %q, want %q", tc.path, tc.key, got, tc.want)
		}
	}
}

func TestComparePaths(t *testing.T) {
	sorted := []string{
		"",
		"id",
		"payload.sections",
		"payload.sections[0].items[2]",
		"payload.sections[0].items[2].deep_link",
		"payload.sections[0].items[10]",
		"payload.sections[1]",
		"payload.sections[1].kind",
		`payload.sections[1]["odd.key"]`,
		"recipient",
	}
	for i := range sorted {
		for j := range sorted {
			c := comparePaths(sorted[i], sorted[j])
			if (i < j && c >= 0) || (i == j && c != 0) || (i > j && c <= 0) {
				t.Errorf("comparePaths(%q, %q) = %d", sorted[i], sorted[j], c)
			}
		}
	}
}

func TestPathAncestors(t *testing.T) {
	tests := []struct {
		path string
		want []string
	}{
		{"", nil},
		{"id", nil},
		{"payload.sections[0].items[2].deep_link", []string{"payload", "payload.sections", "payload.sections[0]", "payload.sections[0].items", "payload.sections[0].items[2]"}},
		{`["a.b[0]"].c`, []string{`["a.b[0]"]`}},
		{`x["q\"[.]"]`, []string{"x"}},
	}
	for _, tc := range tests {
		if got := pathAncestors(tc.path); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("pathAncestors(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

func TestMergeProblems(t *testing.T) {
	primary := []Problem{{"recipient.push_subscription.keys.auth", "go"}, {"id", "go"}}
	secondary := []Problem{
		{"recipient.push_subscription.keys", "required"}, // above a primary: dropped
		{"id", "schema"},                                     // same path: dropped
		{"recipient.email", "schema"},                        // unrelated: kept
		{"", "schema at root"},                               // root: kept (no primary at root)
		{"recipient.push_subscription.keys.auth.x", "below"}, // below a primary: kept
	}
	got := mergeProblems(primary, secondary)
	want := []Problem{
		{"recipient.push_subscription.keys.auth", "go"}, {"id", "go"},
		{"recipient.email", "schema"}, {"", "schema at root"},
		{"recipient.push_subscription.keys.auth.x", "below"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestValidJSONString(t *testing.T) {
	tests := []struct {
		raw  string
		want bool
	}{
		{`"plain"`, true},
		{`"caf\u00e9 \ud83d\ude34"`, true},
		{`"\\ud800"`, true}, // an escaped backslash, then text
		{`"\ud800"`, false},
		{`"\udc00x"`, false},
		{`"\ud83d\u0041"`, false},
		{"\"\xff\"", false},
		{`"\u12"`, false},
	}
	for _, tc := range tests {
		if got := validJSONString([]byte(tc.raw)); got != tc.want {
			t.Errorf("validJSONString(%s) = %v, want %v", tc.raw, got, tc.want)
		}
	}
}

func TestShapeProblem_Boundaries(t *testing.T) {
	values := func(n int) []byte { // n values: the array and n-1 numbers
		return []byte("[" + strings.TrimSuffix(strings.Repeat("12,", n-1), ",") + "]")
	}
	for _, tt := range []struct {
		name string
		doc  []byte
		ok   bool
	}{
		{"MaxValues", values(MaxValues), true},
		{"MaxValues+1", values(MaxValues + 1), false},
		{"Nested", []byte(strings.Repeat("[", MaxValues) + strings.Repeat("]", MaxValues)), true},
		{"Nested+1", []byte(strings.Repeat("[", MaxValues+1) + strings.Repeat("]", MaxValues+1)), false},
		{"KeysCount", []byte("{" + strings.TrimSuffix(strings.Repeat(`"k":1,`, MaxValues/2), ",") + "}"), false},
		{"BracketsInStrings", []byte(`["` + strings.Repeat(`[{\"`, 1000) + `"]`), true},
		{"Literals", []byte("[" + strings.TrimSuffix(strings.Repeat("true,null,", MaxValues/2), ",") + "]"), false},
		{"MaxBytes", []byte(`"` + strings.Repeat("a", MaxEnvelopeBytes-2) + `"`), true},
		{"MaxBytes+1", []byte(`"` + strings.Repeat("a", MaxEnvelopeBytes-1) + `"`), false},
	} {
		if _, ok := shapeProblem(tt.doc); ok != tt.ok {
			t.Errorf("%s: shapeProblem ok = %v, want %v", tt.name, ok, tt.ok)
		}
	}
}
