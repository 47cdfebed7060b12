package httpapi

import (
	"fmt"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outboxhq/outbox/queue/memstore"
)

// docsFile is the user's reference of the API.
const docsFile = "../../docs/http-api.md"

var (
	docsMarker = regexp.MustCompile(`^<!-- openapi: ([A-Z]+) (\S+) (request|[0-9]{3}) -->$`)
	docsRoute  = regexp.MustCompile("^\\| `([A-Z]+) (/[^`]*)` \\|")
)

// docs/http-api.md matches the description: its route table lists every
// operation and no other, each JSON example names its operation and fits
// the documented schema, and every curl names a served route and sends a
// body that fits it.
func TestOpenAPI_DocsMatch(t *testing.T) {
	raw, err := os.ReadFile(docsFile)
	if err != nil {
		t.Fatal(err)
	}
	d := loadDoc(t)
	ops := d.operations()
	a := fullAPI(t, memstore.New(nil))
	lines := strings.Split(string(raw), "\n")
	tabled := map[string]bool{}
	examples, curls := 0, 0
	for i := 0; i < len(lines); i++ {
		if m := docsRoute.FindStringSubmatch(lines[i]); m != nil {
			tabled[m[1]+" "+m[2]] = true
		}
		fence, ok := strings.CutPrefix(lines[i], "```")
		if !ok || fence == "" {
			continue
		}
		start := i
		var block []string
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			block = append(block, lines[i])
		}
		switch fence {
		case "json":
			examples++
			m := docsMarker.FindStringSubmatch(prevLine(lines, start))
			if m == nil {
				t.Errorf("%s:%d: a JSON block without <!-- openapi: METHOD PATH request|STATUS --> before it", docsFile, start+1)
				continue
			}
			opPtr, ok := ops[m[1]+" "+m[2]]
			if !ok {
				t.Errorf("%s:%d: %s %s is no operation of openapi.json", docsFile, start+1, m[1], m[2])
				continue
			}
			ptr := opPtr + "/responses/" + m[3]
			if m[3] == "request" {
				ptr = opPtr + "/requestBody"
			}
			obj, ptr := d.deref(ptr)
			if obj == nil {
				t.Errorf("%s:%d: openapi.json has no %s for %s %s", docsFile, start+1, m[3], m[1], m[2])
				continue
			}
			v, err := jsonschema.UnmarshalJSON(strings.NewReader(strings.Join(block, "\n")))
			if err != nil {
				t.Errorf("%s:%d: not JSON: %v", docsFile, start+1, err)
				continue
			}
			if err := d.schema(t, ptr+"/content/application~1json/schema").Validate(v); err != nil {
				t.Errorf("%s:%d: the example does not fit %s: %v", docsFile, start+1, ptr, err)
			}
		case "sh":
			for j, line := range joinContinued(block) {
				if !strings.HasPrefix(strings.TrimSpace(line), "curl ") {
					continue
				}
				curls++
				where := fmt.Sprintf("%s:%d", docsFile, start+2+j)
				checkCurl(t, where, line, a, d, ops)
			}
		}
	}
	if examples == 0 || curls == 0 {
		t.Fatalf("%s: %d JSON examples and %d curls found", docsFile, examples, curls)
	}
	for p := range ops {
		if !tabled[p] {
			t.Errorf("%s: the route table lacks %s", docsFile, p)
		}
	}
	for p := range tabled {
		if _, ok := ops[p]; !ok {
			t.Errorf("%s: the route table lists %s, which openapi.json does not describe", docsFile, p)
		}
	}
}

func prevLine(lines []string, i int) string {
	for i--; i >= 0 && strings.TrimSpace(lines[i]) == ""; i-- {
	}
	if i < 0 {
		return ""
	}
	return lines[i]
}

// joinContinued joins the shell lines that end in a backslash.
func joinContinued(lines []string) []string {
	var out []string
	cur := ""
	for _, l := range lines {
		if s, ok := strings.CutSuffix(l, `\`); ok {
			cur += s
			continue
		}
		out = append(out, cur+l)
		cur = ""
	}
	return out
}

// checkCurl holds one curl command line of the docs to the handler's
// routes and the description's request bodies.
func checkCurl(t *testing.T, where, line string, a *api, d *oaDoc, ops map[string]string) {
	t.Helper()
	words := shellWords(line)
	method, body, target := "", "", ""
	hasBody := false
	for k := 0; k < len(words); k++ {
		switch w := words[k]; {
		case w == "-X" && k+1 < len(words):
			k++
			method = words[k]
		case (w == "-d" || w == "--data") && k+1 < len(words):
			k++
			body, hasBody = words[k], true
		case w == "-H" || w == "-o":
			k++
		case strings.HasPrefix(w, "localhost:8080/"):
			target = strings.TrimPrefix(w, "localhost:8080")
		}
	}
	if target == "" {
		t.Errorf("%s: a curl without a localhost:8080 URL: %s", where, line)
		return
	}
	if method == "" {
		method = "GET"
		if hasBody {
			method = "POST"
		}
	}
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	_, pattern := a.mux.Handler(r)
	opPtr, ok := ops[pattern]
	if !ok {
		t.Errorf("%s: %s %s is no route of the handler (routed to %q)", where, method, target, pattern)
		return
	}
	rb, rbPtr := d.deref(opPtr + "/requestBody")
	switch {
	case hasBody && rb == nil:
		t.Errorf("%s: %s sends a body, and no request body is documented", where, pattern)
	case !hasBody && rb != nil && rb["required"] == true:
		t.Errorf("%s: %s sends no body, and one is required", where, pattern)
	case hasBody:
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(body))
		if err != nil {
			t.Errorf("%s: the body is not JSON: %v", where, err)
			return
		}
		if err := d.schema(t, rbPtr+"/content/application~1json/schema").Validate(v); err != nil {
			t.Errorf("%s: the body does not fit %s: %v", where, rbPtr, err)
		}
	}
}

// shellWords splits a command line as sh would, quotes removed and
// variables left as they are (enough for the docs' curl lines).
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quote != 0 && ch == quote:
			quote = 0
		case quote != 0:
			cur.WriteByte(ch)
		case ch == '\'' || ch == '"':
			quote, in = ch, true
		case ch == ' ' || ch == '\t' || ch == ';':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(ch)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}
