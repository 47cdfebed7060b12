package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Input is one envelope document cut from a larger input by SplitInput.
type Input struct {
	// Line is the 1-based line of the input where the document starts.
	Line int
	// Data is the document's JSON, to be passed to Parse.
	Data []byte
}

// InputError is returned by SplitInput when the input cannot be cut into
// documents. It says where, never quoting the input.
type InputError struct {
	Line   int
	Reason string
}

// Error returns "line N: reason".
func (e *InputError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Reason) }

// SplitInput cuts a document holding envelopes into one Input per envelope.
// The document is one JSON object (possibly spread over many lines), a JSON
// array of objects, or JSON Lines (one object per line; blank lines are
// skipped). A UTF-8 byte order mark is ignored.
//
// SplitInput does not validate the envelopes: a JSON Lines line or an array
// element that is not a valid envelope becomes an Input that Parse rejects,
// so that one bad line does not hide the others. A malformed array is an
// *InputError. A document with only whitespace yields no inputs.
func SplitInput(data []byte) ([]Input, error) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	start := firstNonSpace(data)
	if start == len(data) {
		return nil, nil
	}
	if data[start] == '[' {
		return splitArray(data, start)
	}
	if json.Valid(data) {
		return []Input{{Line: lineAt(data, start), Data: data}}, nil
	}
	// JSON Lines when the first line holds a complete value by itself;
	// otherwise one (malformed) document, for Parse to locate the error.
	first, _, _ := bytes.Cut(data[start:], []byte{'\n'})
	if !json.Valid(first) {
		return []Input{{Line: lineAt(data, start), Data: data}}, nil
	}
	var out []Input
	line := 0
	for rest := data; len(rest) > 0; {
		var l []byte
		l, rest, _ = bytes.Cut(rest, []byte{'\n'})
		line++
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		out = append(out, Input{Line: line, Data: bytes.TrimRight(l, "\r")})
	}
	return out, nil
}

// splitArray cuts a JSON array into its elements.
func splitArray(data []byte, start int) ([]Input, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	// fail locates a syntax error by decoding the whole document, whose
	// first error is the decoder's, with an offset from its start.
	fail := func(error) error {
		var v any
		err := json.Unmarshal(data, &v)
		var se *json.SyntaxError
		if !errors.As(err, &se) || int(se.Offset) >= len(data) {
			return &InputError{Line: lineAt(data, len(data)), Reason: "malformed JSON array: unexpected end of input"}
		}
		off := max(int(se.Offset)-1, 0)
		line, col := lineCol(data, off)
		return &InputError{Line: line, Reason: fmt.Sprintf("malformed JSON array: %s at column %d", syntaxReason(se.Error()), col)}
	}
	if _, err := dec.Token(); err != nil { // '['
		return nil, fail(err)
	}
	var out []Input
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fail(err)
		}
		begin := int(dec.InputOffset()) - len(raw)
		out = append(out, Input{Line: lineAt(data, begin), Data: raw})
	}
	if _, err := dec.Token(); err != nil { // ']'
		return nil, fail(err)
	}
	if end := int(dec.InputOffset()); firstNonSpace(data[end:]) != len(data[end:]) {
		off := end + firstNonSpace(data[end:])
		return nil, &InputError{Line: lineAt(data, off), Reason: "unexpected data after the JSON array"}
	}
	return out, nil
}

func firstNonSpace(b []byte) int {
	for i, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return i
	}
	return len(b)
}

// lineAt returns the 1-based line of byte offset off.
func lineAt(data []byte, off int) int {
	l, _ := lineCol(data, off)
	return l
}
