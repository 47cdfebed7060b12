package envelope_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/outboxhq/outbox/envelope"
)

// FuzzParse checks that Parse never panics, that every rejection is a
// well-formed *ValidationError, and that an accepted envelope re-validates
// and encodes to a fixed point.
func FuzzParse(f *testing.F) {
	seeds, err := filepath.Glob(filepath.Join(deliveryDir, "*.json"))
	if err != nil {
		f.Fatal(err)
	}
	invalid, err := filepath.Glob(filepath.Join(deliveryDir, "invalid", "*.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range append(seeds, invalid...) {
		rel, _ := filepath.Rel(deliveryDir, name)
		f.Add(readFixture(f, rel))
	}
	f.Add([]byte(`{"payload":{"sections":[{"kind":"revisit","items":[{"t_ms":1e3}]}]}}`))
	f.Add([]byte("{\"id\":\"\\ud800\",\"x\xff\":1}"))

	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = envelope.SplitInput(data)

		e, err := envelope.Parse(data)
		if err != nil {
			if e != nil {
				t.Fatal("Parse returned both an envelope and an error")
			}
			var ve *envelope.ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, envelope.ErrInvalid) || len(ve.Problems) == 0 {
				t.Fatalf("Parse error %T %v is not a ValidationError with problems", err, err)
			}
			for i, p := range ve.Problems {
				if p.Rule == "" {
					t.Fatalf("problem %d has no rule: %v", i, ve.Problems)
				}
				if i > 0 && p == ve.Problems[i-1] {
					t.Fatalf("duplicate problem %v", p)
				}
			}
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("error text is not valid UTF-8: %q", err.Error())
			}
			return
		}
		if e == nil {
			t.Fatal("Parse returned neither an envelope nor an error")
		}
		if err := envelope.Validate(e); err != nil {
			t.Fatalf("Validate(Parse(data)) = %v", err)
		}
		first, err := json.Marshal(e)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		e2, err := envelope.Parse(first)
		if err != nil {
			t.Fatalf("Parse(Marshal(e)) = %v\n%s", err, first)
		}
		second, err := json.Marshal(e2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, second) {
			t.Fatalf("encoding is not a fixed point:\n%s\n%s", first, second)
		}
		if strings.TrimSpace(string(e.Payload)) == "" {
			t.Fatal("valid envelope with an empty payload")
		}
	})
}
