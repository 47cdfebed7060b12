package envelope

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// The JSON Schema library's reading of schema.json, which the generated
// check (schema_gen.go) must agree with: see schemaparity_internal_test.go.

// librarySchema returns the compiled envelope schema, compiling it on first use.
var librarySchema = sync.OnceValue(func() *jsonschema.Schema {
	sch, err := newCompiler().Compile(SchemaURL)
	if err != nil {
		panic("envelope: embedded schema.json does not compile: " + err.Error())
	}
	return sch
})

// newCompiler returns a compiler holding the embedded schema.
func newCompiler() *jsonschema.Compiler {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schemaJSON))
	if err != nil {
		panic("envelope: embedded schema.json is not JSON: " + err.Error())
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(SchemaURL, doc); err != nil {
		panic("envelope: embedded schema.json: " + err.Error())
	}
	return c
}

// libraryProblems is what the library reports on inst, as problems.
func libraryProblems(inst any) []Problem {
	err := librarySchema().Validate(inst)
	if err == nil {
		return nil
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return []Problem{{Rule: "does not match the schema"}}
	}
	return convertSchemaError(ve, inst, nil)
}

// ---- schema errors ----

// convertSchemaError flattens a jsonschema error tree into problems at
// instance paths, with rule texts written here (the library's messages
// quote the offending values, which may be personal data).
func convertSchemaError(ve *jsonschema.ValidationError, inst any, out []Problem) []Problem {
	path := instancePath(inst, ve.InstanceLocation)
	switch k := ve.ErrorKind.(type) {
	case *kind.Schema, *kind.Group, *kind.AllOf, *kind.Reference:
		for _, c := range ve.Causes {
			out = convertSchemaError(c, inst, out)
		}
		return out
	case *kind.Required:
		for _, m := range k.Missing {
			out = append(out, Problem{joinKey(path, m), "required"})
		}
		return out
	case *kind.AdditionalProperties:
		for _, m := range k.Properties {
			out = append(out, Problem{joinKey(path, m), "unknown field"})
		}
		return out
	}
	return append(out, Problem{path, schemaRule(ve.ErrorKind)})
}

// schemaRule describes a leaf schema error without its value.
func schemaRule(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Type:
		want := make([]string, len(k.Want))
		for i, w := range k.Want {
			want[i] = article(w)
		}
		return "must be " + strings.Join(want, " or ") + " (got " + k.Got + ")"
	case *kind.Enum:
		return "must be one of " + displayValues(k.Want)
	case *kind.Const:
		return "must be " + displayValues([]any{k.Want})
	case *kind.Format:
		switch k.Want {
		case "date-time":
			return "must be an RFC 3339 date-time"
		case "email":
			return "must be a valid email address (addr-spec)"
		}
		return "must be a valid " + k.Want
	case *kind.Pattern:
		return "must match the pattern " + strconv.Quote(k.Want)
	case *kind.MinLength:
		if k.Want == 1 {
			return ruleNonEmpty
		}
		return fmt.Sprintf("must be at least %d characters", k.Want)
	case *kind.MaxLength:
		return fmt.Sprintf("must be at most %d characters", k.Want)
	case *kind.MinItems:
		if k.Want == 1 {
			return ruleNonEmpty
		}
		return fmt.Sprintf("must have at least %d elements", k.Want)
	case *kind.MaxItems:
		return fmt.Sprintf("must have at most %d elements", k.Want)
	case *kind.Minimum:
		return "must be at least " + ratString(k.Want)
	case *kind.Maximum:
		return "must be at most " + ratString(k.Want)
	case *kind.ExclusiveMinimum:
		return "must be greater than " + ratString(k.Want)
	case *kind.ExclusiveMaximum:
		return "must be less than " + ratString(k.Want)
	case *kind.Contains, *kind.MinContains:
		return "no element matches the required shape"
	case *kind.FalseSchema:
		return "not allowed"
	case *kind.AnyOf, *kind.OneOf:
		return "does not match any allowed shape"
	case *kind.Not:
		return "matches a forbidden shape"
	case *kind.UniqueItems:
		return "must not contain duplicates"
	}
	return "breaks schema keyword " + strings.Join(k.KeywordPath(), "/")
}

func article(jsonType string) string {
	switch jsonType {
	case "object", "array", "integer":
		return "an " + jsonType
	case "null":
		return "null"
	}
	return "a " + jsonType
}

func displayValues(vs []any) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		b, err := json.Marshal(v)
		if err != nil {
			b = []byte(fmt.Sprint(v))
		}
		s[i] = string(b)
	}
	return strings.Join(s, ", ")
}

func ratString(r *big.Rat) string {
	if r == nil {
		return "?"
	}
	if r.IsInt() {
		return r.Num().String()
	}
	return r.FloatString(6)
}

// instancePath renders a jsonschema instance location (JSON Pointer tokens)
// as a dotted path, walking the instance to tell indices from keys.
func instancePath(inst any, loc []string) string {
	path := ""
	cur := inst
	for _, tok := range loc {
		switch v := cur.(type) {
		case []any:
			i, err := strconv.Atoi(tok)
			if err == nil && i >= 0 && i < len(v) {
				path = joinIndex(path, i)
				cur = v[i]
				continue
			}
			path = joinKey(path, tok)
			cur = nil
		case map[string]any:
			path = joinKey(path, tok)
			cur = v[tok]
		default:
			path = joinKey(path, tok)
			cur = nil
		}
	}
	return path
}
