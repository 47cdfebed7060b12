// Package openapigen builds queue/httpapi/openapi.json from the
// hand-written openapi.in.json: the envelope's JSON Schema
// (envelope/schema.json, one truth) takes the place of the one reference
// to it, components.schemas.Envelope, so that the document served at
// /openapi.json stands alone.
package openapigen

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// EnvelopeRef is the reference in openapi.in.json that Build replaces
// with the envelope schema (compacted; the path is relative to the source).
const EnvelopeRef = `{"$ref":"../../envelope/schema.json"}`

// Build returns the OpenAPI document: src with EnvelopeRef replaced by
// envelopeSchema, indented by two spaces. The order of src's keys stays.
func Build(src, envelopeSchema []byte) ([]byte, error) {
	var doc, env bytes.Buffer
	if err := json.Compact(&doc, src); err != nil {
		return nil, fmt.Errorf("openapi.in.json: %w", err)
	}
	if err := json.Compact(&env, envelopeSchema); err != nil {
		return nil, fmt.Errorf("envelope schema: %w", err)
	}
	if n := bytes.Count(doc.Bytes(), []byte(EnvelopeRef)); n != 1 {
		return nil, fmt.Errorf("openapi.in.json holds %s %d times, want once (components.schemas.Envelope)", EnvelopeRef, n)
	}
	joined := bytes.Replace(doc.Bytes(), []byte(EnvelopeRef), env.Bytes(), 1)
	var out bytes.Buffer
	if err := json.Indent(&out, joined, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
