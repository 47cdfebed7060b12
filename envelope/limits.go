package envelope

import (
	"encoding/json"
	"fmt"
)

// Size limits of one envelope document. Parse checks them with one pass
// over the bytes, allocating nothing, before anything is decoded: the
// decoding and the JSON Schema hold every value of a document in memory at
// once (about 130 bytes for each), so a document of many tiny values costs
// far more memory than its size. (Nesting is not limited apart from that:
// each level is a value, and encoding/json refuses more than 10000.)
const (
	// MaxEnvelopeBytes is the largest envelope accepted, in bytes: the
	// document Parse reads, and the JSON encoding Validate checks (what a
	// store appends to a log as one line).
	MaxEnvelopeBytes = 1 << 20
	// MaxValues is the most JSON values one envelope document may hold,
	// counting every object, array, string, number, true, false and null,
	// and every object key. A digest holds one for every 14 bytes or so.
	MaxValues = 50_000
)

// Rules of the limits, as a Problem at the root says them.
var (
	ruleTooLarge   = fmt.Sprintf("envelope exceeds %d bytes (the largest accepted)", MaxEnvelopeBytes)
	ruleTooMany    = fmt.Sprintf("envelope holds more than %d JSON values (keys included; the most accepted)", MaxValues)
	ruleEncTooLong = fmt.Sprintf("envelope's JSON encoding exceeds %d bytes (the largest accepted)", MaxEnvelopeBytes)
)

// shapeProblem checks data against MaxEnvelopeBytes and MaxValues without
// decoding it or allocating, and returns the first limit
// it breaks as a Problem at the root. It reads data as JSON lexically and
// stops at the first limit broken; it does not check that data is valid
// JSON (syntaxProblem does, after it).
func shapeProblem(data []byte) (Problem, bool) {
	if len(data) > MaxEnvelopeBytes {
		return Problem{Rule: ruleTooLarge}, false
	}
	values := 0
	inString, escaped, inScalar := false, false, false
	for _, c := range data {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString, inScalar = true, false
			values++
		case '{', '[':
			inScalar = false
			values++
		case '}', ']', ',', ':', ' ', '\t', '\r', '\n':
			inScalar = false
		default: // a number or a literal, one value for its run of bytes
			if !inScalar {
				inScalar = true
				values++
			}
		}
		if values > MaxValues {
			return Problem{Rule: ruleTooMany}, false
		}
	}
	return Problem{}, true
}

// encodedSizeProblem checks the size of the JSON encoding of e, an envelope
// Parse found valid in data: an encoding can be longer than the document
// (json.Marshal writes <, > and & as \u003c and so on, six bytes for one),
// and it is what a store appends to its log. Only a document larger than a
// sixth of the limit (and a margin for fields the encoding adds) can have
// such an encoding, so smaller ones are not encoded here.
func encodedSizeProblem(data []byte, e *Envelope) (Problem, bool) {
	if len(data) <= (MaxEnvelopeBytes-4096)/6 {
		return Problem{}, true
	}
	b, err := json.Marshal(e)
	if err == nil && len(b) > MaxEnvelopeBytes {
		return Problem{Rule: ruleEncTooLong}, false
	}
	return Problem{}, true
}
