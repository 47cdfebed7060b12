package envelope

import (
	"bytes"
	"encoding/json"
	"math/big"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

//go:generate go run ./internal/schemagen/gen schema.json schema_gen.go

// schemaProblems checks a decoded document (decodeInstance) against the
// schema with the code generated from schema.json (schema_gen.go): no
// schema is walked at run time. Its problems are the library's errors
// flattened as convertSchemaError does (a test holds them equal).
func schemaProblems(inst any) []Problem {
	var c schemaCheck
	schemaRoot(&c, inst, nil)
	return c.probs
}

// decodeInstance decodes a JSON document as the schema check reads it:
// numbers kept exact (json.Number).
func decodeInstance(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// schemaCheck collects the problems of one check. Inside passes/passed
// (the if of an if/then, the elements tried by contains) failures are only
// counted.
type schemaCheck struct {
	probs []Problem
	quiet int
	fails int
	marks [8]int // fails when each open trial started,
	more  []int  // past the eighth
}

func (c *schemaCheck) add(p *jpath, rule string) {
	c.fails++
	if c.quiet == 0 {
		c.probs = append(c.probs, Problem{p.String(), rule})
	}
}

// passes starts a trial (always true, so that it opens a block).
func (c *schemaCheck) passes() bool {
	if c.quiet < len(c.marks) {
		c.marks[c.quiet] = c.fails
	} else {
		c.more = append(c.more, c.fails)
	}
	c.quiet++
	return true
}

// passed ends the trial passes started: whether nothing failed in it.
func (c *schemaCheck) passed() bool {
	c.quiet--
	if c.quiet < len(c.marks) {
		return c.fails == c.marks[c.quiet]
	}
	start := c.more[len(c.more)-1]
	c.more = c.more[:len(c.more)-1]
	return c.fails == start
}

// jpath is the place of a value in the document, rendered only for a
// problem.
type jpath struct {
	up   *jpath
	name string
	idx  int // an array index when >= 0, else name is a key
}

func (p *jpath) key(k string) *jpath { return &jpath{up: p, name: k, idx: -1} }

func (p *jpath) index(i int) *jpath { return &jpath{up: p, idx: i} }

func (p *jpath) String() string {
	if p == nil {
		return ""
	}
	if p.idx >= 0 {
		return joinIndex(p.up.String(), p.idx)
	}
	return joinKey(p.up.String(), p.name)
}

func isBool(v any) bool   { _, ok := v.(bool); return ok }
func isString(v any) bool { _, ok := v.(string); return ok }
func isArray(v any) bool  { _, ok := v.([]any); return ok }
func isObject(v any) bool { _, ok := v.(map[string]any); return ok }
func isNumber(v any) bool { _, ok := v.(json.Number); return ok }

// isInteger: a number whose value is an integer (1.0 and 1e2 are).
func isInteger(v any) bool {
	n, ok := v.(json.Number)
	if !ok {
		return false
	}
	r, ok := new(big.Rat).SetString(string(n))
	return ok && r.IsInt()
}

// compareNumber compares a decoded number with a bound, exactly.
func compareNumber(n json.Number, bound string) int {
	r, ok := new(big.Rat).SetString(string(n))
	b, _ := new(big.Rat).SetString(bound)
	if !ok {
		return 0
	}
	return r.Cmp(b)
}

func jsonTypeOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "invalid"
}

// formatSchemas are the library's assertions of the formats schema.json
// names, each compiled alone: the formats keep the library's definitions.
var formatSchemas = sync.OnceValue(func() map[string]*jsonschema.Schema {
	out := map[string]*jsonschema.Schema{}
	for _, f := range []string{"date-time", "email"} {
		c := jsonschema.NewCompiler()
		c.DefaultDraft(jsonschema.Draft2020)
		c.AssertFormat()
		if err := c.AddResource("format.json", map[string]any{"format": f}); err != nil {
			panic("envelope: format " + f + ": " + err.Error())
		}
		sch, err := c.Compile("format.json")
		if err != nil {
			panic("envelope: format " + f + ": " + err.Error())
		}
		out[f] = sch
	}
	return out
})

func validFormat(name, s string) bool { return formatSchemas()[name].Validate(s) == nil }
