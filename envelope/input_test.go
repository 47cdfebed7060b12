package envelope_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/outboxhq/outbox/envelope"
)

func TestSplitInput(t *testing.T) {
	type in struct {
		Line int
		Data string
	}
	tests := []struct {
		name string
		doc  string
		want []in
	}{
		{"Empty", "", nil},
		{"OnlyWhitespace", "\n \r\n\t\n", nil},
		{"OneObjectOneLine", `{"id":"a"}`, []in{{1, `{"id":"a"}`}}},
		{"OneObjectPretty", "\n\n{\n  \"id\": \"a\",\n  \"user_id\": \"u\"\n}\n",
			[]in{{3, "\n\n{\n  \"id\": \"a\",\n  \"user_id\": \"u\"\n}\n"}}},
		{"ByteOrderMark", "\xef\xbb\xbf{\"id\":\"a\"}\n", []in{{1, "{\"id\":\"a\"}\n"}}},
		{"Array", "[\n  {\"id\": \"a\"},\n\n  {\n    \"id\": \"b\"\n  }, {\"id\": \"c\"}\n]\n",
			[]in{{2, `{"id": "a"}`}, {4, "{\n    \"id\": \"b\"\n  }"}, {6, `{"id": "c"}`}}},
		{"EmptyArray", "[ ]", nil},
		{"ArrayOfNonObjects", `[1, "x"]`, []in{{1, `1`}, {1, `"x"`}}},
		{"JSONLines", "{\"id\":\"a\"}\n\n{\"id\":\"b\"}\r\n   \n{\"id\":\"c\"}",
			[]in{{1, `{"id":"a"}`}, {3, `{"id":"b"}`}, {5, `{"id":"c"}`}}},
		{"JSONLinesWithABadLine", "{\"id\":\"a\"}\n{\"id\":\n{\"id\":\"c\"}\n",
			[]in{{1, `{"id":"a"}`}, {2, `{"id":`}, {3, `{"id":"c"}`}}},
		{"LeadingBlankLinesInJSONLines", "\n\n{\"id\":\"a\"}\n{\"id\":\"b\"}\n",
			[]in{{3, `{"id":"a"}`}, {4, `{"id":"b"}`}}},
		{"MalformedSingleObjectIsOneInput", "{\n  \"id\": \"a\",\n  oops\n}",
			[]in{{1, "{\n  \"id\": \"a\",\n  oops\n}"}}},
		{"Scalar", `"hello"`, []in{{1, `"hello"`}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := envelope.SplitInput([]byte(tc.doc))
			if err != nil {
				t.Fatalf("SplitInput: %v", err)
			}
			var gotIn []in
			for _, g := range got {
				gotIn = append(gotIn, in{g.Line, string(g.Data)})
			}
			if !reflect.DeepEqual(gotIn, tc.want) {
				t.Errorf("got  %+v\nwant %+v", gotIn, tc.want)
			}
		})
	}
}

func TestSplitInput_Errors(t *testing.T) {
	tests := []struct {
		name     string
		doc      string
		wantLine int
		wantText string
	}{
		{"UnclosedArray", "[\n  {\"id\": \"a\"},\n  {\"id\": \"b\"}\n", 4, "line 4: malformed JSON array: unexpected end of input"},
		{"BadElement", "[\n  {\"id\": \"a\"},\n  {\"id\" \"b\"}\n]", 3, "line 3: malformed JSON array: invalid character after object key at column 9"},
		{"MissingComma", "[\n  {\"id\": \"a\"}\n  {\"id\": \"b\"}\n]", 3, "line 3: malformed JSON array: invalid character after array element at column 3"},
		{"TrailingData", "[{\"id\": \"a\"}]\n\nmore", 3, "line 3: unexpected data after the JSON array"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := envelope.SplitInput([]byte(tc.doc))
			if err == nil {
				t.Fatalf("SplitInput = %v, want an error", got)
			}
			var ie *envelope.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("error %T is not an *InputError", err)
			}
			if ie.Line != tc.wantLine || err.Error() != tc.wantText {
				t.Errorf("got line %d %q, want line %d %q", ie.Line, err.Error(), tc.wantLine, tc.wantText)
			}
		})
	}
}

// TestSplitInput_ThenParse: every golden fixture survives being put in an
// array and in JSON Lines.
func TestSplitInput_ThenParse(t *testing.T) {
	var arr, lines []byte
	arr = append(arr, "[\n"...)
	for i, name := range goldenFixtures {
		e, err := envelope.Parse(readFixture(t, name))
		if err != nil {
			t.Fatal(err)
		}
		b := mustMarshal(t, e)
		if i > 0 {
			arr = append(arr, ",\n"...)
		}
		arr = append(arr, b...)
		lines = append(append(lines, b...), '\n')
	}
	arr = append(arr, "\n]\n"...)
	for name, doc := range map[string][]byte{"Array": arr, "JSONLines": lines} {
		t.Run(name, func(t *testing.T) {
			ins, err := envelope.SplitInput(doc)
			if err != nil {
				t.Fatal(err)
			}
			if len(ins) != len(goldenFixtures) {
				t.Fatalf("got %d inputs, want %d", len(ins), len(goldenFixtures))
			}
			for i, in := range ins {
				if in.Line != i+1+btoi(name == "Array") {
					t.Errorf("input %d starts on line %d", i, in.Line)
				}
				if _, err := envelope.Parse(in.Data); err != nil {
					t.Errorf("input %d: %v", i, err)
				}
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
