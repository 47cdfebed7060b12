package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/httpapi/internal/openapigen"
	"github.com/outboxhq/outbox/queue/memstore"
)

// oasSchemaFile is the official JSON Schema of OpenAPI 3.1 documents,
// https://spec.openapis.org/oas/3.1/schema/2022-10-07, vendored unchanged
// (testdata/README.md says from where).
const oasSchemaFile = "testdata/openapi-3.1-schema.json"

// docURL is where the compiler keeps openapi.json; refs inside it resolve
// against it, and nothing is fetched from anywhere.
const docURL = "file:///outbox/queue/httpapi/openapi.json"

// oaDoc is openapi.json, parsed, with a compiler over it.
type oaDoc struct {
	root     map[string]any
	c        *jsonschema.Compiler
	compiled map[string]*jsonschema.Schema // by JSON pointer
}

func loadDoc(t testing.TB) *oaDoc {
	t.Helper()
	root, err := jsonschema.UnmarshalJSON(bytes.NewReader(openAPI))
	if err != nil {
		t.Fatalf("openapi.json is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(docURL, root); err != nil {
		t.Fatal(err)
	}
	return &oaDoc{root: root.(map[string]any), c: c, compiled: map[string]*jsonschema.Schema{}}
}

// schema compiles the schema at JSON pointer ptr ("#/...").
func (d *oaDoc) schema(t testing.TB, ptr string) *jsonschema.Schema {
	t.Helper()
	if s, ok := d.compiled[ptr]; ok {
		return s
	}
	s, err := d.c.Compile(docURL + ptr)
	if err != nil {
		t.Fatalf("compile %s: %v", ptr, err)
	}
	d.compiled[ptr] = s
	return s
}

// at returns the value at JSON pointer ptr ("#/a/b~1c"), or nil.
func (d *oaDoc) at(ptr string) any {
	var v any = d.root
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "#/"), "/") {
		switch x := v.(type) {
		case map[string]any:
			v = x[strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// deref follows the $ref of an object (response, parameter, ...) at ptr
// until a plain one, returning it and its pointer.
func (d *oaDoc) deref(ptr string) (map[string]any, string) {
	for range 10 {
		m, _ := d.at(ptr).(map[string]any)
		ref, ok := m["$ref"].(string)
		if !ok {
			return m, ptr
		}
		ptr = ref
	}
	return nil, ptr
}

func esc6901(s string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(s) }

var httpMethods = []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}

// operations maps "METHOD /path" of every operation to its JSON pointer.
func (d *oaDoc) operations() map[string]string {
	ops := map[string]string{}
	for path, item := range d.root["paths"].(map[string]any) {
		for _, m := range httpMethods {
			if _, ok := item.(map[string]any)[m]; ok {
				ops[strings.ToUpper(m)+" "+path] = "#/paths/" + esc6901(path) + "/" + m
			}
		}
	}
	return ops
}

// fullAPI is the handler with every route served: a token, an
// unsubscriber and a VAPID key (and no Config.User, as outbox serve runs).
// A route behind a new condition needs that condition set here.
func fullAPI(t testing.TB, store queue.Store, mut ...func(*Config)) *api {
	t.Helper()
	cfg := Config{
		Store: store, Token: testToken, VAPIDPublicKey: "BPublicVapidKeyForTests",
		Unsub:  NewUnsubscriber(bytes.Repeat([]byte{7}, KeySize), "https://mail.example.org/outbox/"),
		Logger: slog.New(slog.DiscardHandler),
	}
	for _, m := range mut {
		m(&cfg)
	}
	a, err := newAPI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The committed openapi.json is what go generate makes of openapi.in.json
// and the envelope schema, and GET /openapi.json serves it without a token.
func TestOpenAPI_GeneratedAndServed(t *testing.T) {
	src, err := os.ReadFile("openapi.in.json")
	if err != nil {
		t.Fatal(err)
	}
	want, err := openapigen.Build(src, envelope.Schema())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(openAPI, want) {
		t.Fatal("openapi.json is not what openapi.in.json and envelope/schema.json make: run go generate ./queue/httpapi")
	}
	env := loadDoc(t).at("#/components/schemas/Envelope")
	schema, _ := jsonschema.UnmarshalJSON(bytes.NewReader(envelope.Schema()))
	if !reflect.DeepEqual(env, schema) {
		t.Fatal("components.schemas.Envelope is not envelope/schema.json")
	}
	a := fullAPI(t, memstore.New(nil))
	w := serve(a.mux, "GET", "/openapi.json", "", noAuth)
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" || !bytes.Equal(w.Body.Bytes(), openAPI) {
		t.Fatalf("GET /openapi.json: %d %q, %d bytes", w.Code, w.Header().Get("Content-Type"), w.Body.Len())
	}
	if !bytes.Equal(OpenAPI(), openAPI) {
		t.Fatal("OpenAPI() differs from the served document")
	}
}

// The document is valid OpenAPI 3.1: it passes the official schema, every
// schema in it compiles (against the 2020-12 meta-schema), every local
// $ref resolves, and every example fits its schema.
func TestOpenAPI_ValidDocument(t *testing.T) {
	raw, err := os.ReadFile(oasSchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	oas, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	const oasID = "https://spec.openapis.org/oas/3.1/schema/2022-10-07"
	if id := oas.(map[string]any)["$id"]; id != oasID {
		t.Fatalf("%s has $id %v, want %s", oasSchemaFile, id, oasID)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource(oasID, oas); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(oasID)
	if err != nil {
		t.Fatal(err)
	}
	d := loadDoc(t)
	if err := sch.Validate(any(d.root)); err != nil {
		t.Fatalf("openapi.json is not a valid OpenAPI 3.1 document: %v", err)
	}
	if v := d.root["openapi"]; v != "3.1.0" {
		t.Fatalf("openapi %v", v)
	}
	for name := range d.root["components"].(map[string]any)["schemas"].(map[string]any) {
		d.schema(t, "#/components/schemas/"+esc6901(name))
	}
	var walk func(ptr string, v any)
	walk = func(ptr string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok && !strings.HasPrefix(ptr, "#/components/schemas/Envelope/") {
				if !strings.HasPrefix(ref, "#/") || d.at(ref) == nil {
					t.Errorf("%s: $ref %q does not resolve in the document", ptr, ref)
				}
			}
			if ex, ok := v["example"]; ok && v["schema"] != nil {
				if err := d.schema(t, ptr+"/schema").Validate(ex); err != nil {
					t.Errorf("%s: the example does not fit its schema: %v", ptr, err)
				}
			}
			for k, x := range v {
				walk(ptr+"/"+esc6901(k), x)
			}
		case []any:
			for i, x := range v {
				walk(ptr+"/"+strconv.Itoa(i), x)
			}
		}
	}
	walk("#", d.root)
}

// Every route the handler registers is described, with its method, path
// parameters and access, and the description has no route the handler
// lacks. The served list is what routes() registered.
func TestOpenAPI_RoutesMatch(t *testing.T) {
	d := loadDoc(t)
	a := fullAPI(t, memstore.New(nil))
	ops := d.operations()
	served := map[string]access{}
	for _, r := range a.served {
		if r.pattern == "/" {
			continue // no route: x-no-route-responses
		}
		if !strings.Contains(r.pattern, " ") {
			t.Errorf("route %q has no method: describe it or give it one", r.pattern)
		}
		served[r.pattern] = r.access
	}
	for p := range served {
		if _, ok := ops[p]; !ok {
			t.Errorf("the handler serves %s, which openapi.json does not describe", p)
		}
	}
	for p := range ops {
		if _, ok := served[p]; !ok {
			t.Errorf("openapi.json describes %s, which the handler does not serve", p)
		}
	}
	rootSec := d.root["security"]
	for p, ptr := range ops {
		acc, ok := served[p]
		if !ok {
			continue
		}
		op := d.at(ptr).(map[string]any)
		sec, ok := op["security"]
		if !ok {
			sec = rootSec
		}
		bearer := []any{map[string]any{"bearerAuth": []any{}}}
		switch {
		case acc == tokenOnly && !reflect.DeepEqual(sec, bearer):
			t.Errorf("%s needs the bearer token, but its security is %v", p, sec)
		case acc == public && !reflect.DeepEqual(sec, []any{}):
			t.Errorf("%s is public, but its security is %v (want [])", p, sec)
		}
		if _, ok := op["responses"].(map[string]any)["401"]; ok != (acc == tokenOnly) {
			t.Errorf("%s: 401 documented %v, bearer token %v", p, ok, acc == tokenOnly)
		}
		// Path parameters: exactly the pattern's wildcards, required.
		var want, got []string
		for _, m := range regexp.MustCompile(`\{([^}]+)\}`).FindAllStringSubmatch(p, -1) {
			want = append(want, m[1])
		}
		params, _ := op["parameters"].([]any)
		for i := range params {
			prm, _ := d.deref(fmt.Sprintf("%s/parameters/%d", ptr, i))
			if prm["in"] == "path" {
				got = append(got, prm["name"].(string))
				if prm["required"] != true {
					t.Errorf("%s: path parameter %v is not required", p, prm["name"])
				}
			}
		}
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(want, got) {
			t.Errorf("%s: path parameters %v, the pattern has %v", p, got, want)
		}
	}
}

// The lists the description spells out are the code's: states, channels,
// seam statuses, error codes, the batch limit, the page defaults.
func TestOpenAPI_ListsMatchCode(t *testing.T) {
	d := loadDoc(t)
	enum := func(ptr string) []string {
		var out []string
		for _, v := range d.at(ptr).([]any) {
			out = append(out, v.(string))
		}
		return out
	}
	names := func(xs any) []string {
		var out []string
		rv := reflect.ValueOf(xs)
		for i := range rv.Len() {
			out = append(out, rv.Index(i).String())
		}
		return out
	}
	num := func(ptr string) int {
		n, err := strconv.Atoi(fmt.Sprint(d.at(ptr)))
		if err != nil {
			t.Fatalf("%s: %v", ptr, err)
		}
		return n
	}
	for _, tc := range []struct {
		ptr  string
		want []string
	}{
		{"#/components/schemas/State/enum", names(envelope.States)},
		{"#/components/schemas/Channel/enum", names(envelope.Channels)},
		{"#/components/schemas/SeamStatus/enum", SeamStatuses},
		{"#/components/schemas/Error/properties/error/properties/code/enum", errorCodes(t)},
	} {
		if got := enum(tc.ptr); !slices.Equal(got, tc.want) {
			t.Errorf("%s is %v, the code has %v", tc.ptr, got, tc.want)
		}
	}
	for _, tc := range []struct {
		ptr  string
		want int
	}{
		{"#/components/schemas/EnvelopeBatch/maxItems", MaxBatch},
		{"#/components/parameters/limit/schema/default", queue.PageLimit(queue.ListFilter{})},
		{"#/paths/~1internal~1outbox~1pending/get/parameters/1/schema/default", DefaultPendingLimit},
	} {
		if got := num(tc.ptr); got != tc.want {
			t.Errorf("%s is %d, the code has %d", tc.ptr, got, tc.want)
		}
	}
}

// errorCodes returns the values of the Code* constants of errors.go, in
// their order.
func errorCodes(t testing.TB) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && strings.HasPrefix(n.Name, "Code") {
					s, _ := strconv.Unquote(lit.Value)
					codes = append(codes, s)
				}
			}
		}
	}
	if len(codes) == 0 {
		t.Fatal("no Code* constants in errors.go")
	}
	return codes
}

// conformance runs requests through a handler and holds every answer to
// the description: its status must be documented for the operation the
// mux routed it to, its content type listed, its JSON body valid against
// the documented schema and its required headers present; the body of a
// request that succeeded must fit the documented request body.
type conformance struct {
	t   *testing.T
	doc *oaDoc
	a   *api
	ops map[string]string
	ok  map[string]bool // operations answered 2xx
}

func (c *conformance) do(method, target, body string, want int, opts ...reqOpt) *httptest.ResponseRecorder {
	c.t.Helper()
	r := request(method, target, body, opts...)
	_, pattern := c.a.mux.Handler(r)
	w := httptest.NewRecorder()
	c.a.mux.ServeHTTP(w, r)
	name := method + " " + target
	if w.Code != want {
		c.t.Fatalf("%s: status %d, want %d; body %s", name, w.Code, want, w.Body)
	}
	status := strconv.Itoa(w.Code)
	var respPtr string
	if pattern == "/" {
		respPtr = "#/x-no-route-responses/" + status
	} else {
		opPtr, ok := c.ops[pattern]
		if !ok {
			c.t.Fatalf("%s: routed to %s, which openapi.json does not describe", name, pattern)
		}
		respPtr = opPtr + "/responses/" + status
		if w.Code < 300 {
			c.ok[pattern] = true
			c.checkRequest(name, opPtr, r.Header.Get("Content-Type"), body)
		}
	}
	resp, respPtr := c.doc.deref(respPtr)
	if resp == nil {
		c.t.Errorf("%s: answered %d, which openapi.json does not list for %s", name, w.Code, pattern)
		return w
	}
	headers, _ := resp["headers"].(map[string]any)
	for h, v := range headers {
		if v.(map[string]any)["required"] == true && w.Header().Get(h) == "" {
			c.t.Errorf("%s: %d without the documented header %s", name, w.Code, h)
		}
	}
	content, _ := resp["content"].(map[string]any)
	mt, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type"))
	if w.Body.Len() == 0 {
		if _, isJSON := content["application/json"]; isJSON {
			c.t.Errorf("%s: %d with an empty body, documented as %v", name, w.Code, keys(content))
		}
		return w
	}
	if _, ok := content[mt]; !ok {
		c.t.Errorf("%s: %d answered %q, documented %v", name, w.Code, mt, keys(content))
		return w
	}
	if mt == "application/json" {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(w.Body.Bytes()))
		if err != nil {
			c.t.Fatalf("%s: body is not JSON: %v", name, err)
		}
		if err := c.doc.schema(c.t, respPtr+"/content/application~1json/schema").Validate(v); err != nil {
			c.t.Errorf("%s: the %d body does not fit %s: %v\nbody: %s", name, w.Code, respPtr, err, w.Body)
		}
	}
	return w
}

// checkRequest holds a request the handler accepted to the documented
// request body.
func (c *conformance) checkRequest(name, opPtr, contentType, body string) {
	c.t.Helper()
	rb, rbPtr := c.doc.deref(opPtr + "/requestBody")
	if rb == nil {
		if body != "" {
			c.t.Errorf("%s: accepted a body, but no request body is documented", name)
		}
		return
	}
	if body == "" {
		if rb["required"] == true {
			c.t.Errorf("%s: accepted no body, but the request body is documented as required", name)
		}
		return
	}
	mt, _, _ := mime.ParseMediaType(contentType)
	content := rb["content"].(map[string]any)
	if _, ok := content[mt]; !ok {
		c.t.Errorf("%s: accepted %q, documented %v", name, mt, keys(content))
		return
	}
	if mt != "application/json" {
		return
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(body))
	if err != nil {
		c.t.Fatalf("%s: request body is not JSON: %v", name, err)
	}
	if err := c.doc.schema(c.t, rbPtr+"/content/application~1json/schema").Validate(v); err != nil {
		c.t.Errorf("%s: the handler accepted a body the description refuses: %v", name, err)
	}
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Real requests, good and bad, through the real handler on memstore; every
// answer must be what openapi.json says of its operation, and every
// operation must have answered 2xx at least once.
func TestOpenAPI_ResponsesMatchHandlers(t *testing.T) {
	d := loadDoc(t)
	clk := &clock{t: t0}
	q := memstore.New(&queue.Options{Now: clk.Now})
	var notReady atomic.Bool
	a := fullAPI(t, q, func(cfg *Config) {
		cfg.MaxBody = 64 << 10
		cfg.Now = clk.Now
		cfg.Ready = func() bool { return !notReady.Load() }
	})
	c := &conformance{t: t, doc: d, a: a, ops: d.operations(), ok: map[string]bool{}}
	ctx := context.Background()
	js := func(v any) string { return mustJSON(t, v) }
	pathOf := func(id string) string { return "/v1/envelopes/" + esc(id) }

	// Health and this document.
	c.do("GET", "/healthz", "", 200, noAuth)
	c.do("GET", "/readyz", "", 200, noAuth)
	notReady.Store(true)
	c.do("GET", "/readyz", "", 503, noAuth)
	notReady.Store(false)
	c.do("GET", "/openapi.json", "", 200, noAuth)

	// No route, wrong method.
	c.do("GET", "/nope", "", 404)
	c.do("DELETE", "/v1/envelopes", "", 405)
	c.do("PUT", "/healthz", "", 405, noAuth)

	// Consent first: without a record an enqueue is refused.
	c.do("POST", "/v1/envelopes", js(digest("d/1", "u_1")), 401, noAuth)
	c.do("POST", "/v1/envelopes", js(digest("d/1", "u_1")), 409)
	c.do("GET", "/v1/consent/u_1", "", 200)
	c.do("PUT", "/v1/consent/u_1", `{"digest_enabled":true,"push_enabled":true,"email_verified":true,"cadence":"weekly"}`, 200)
	c.do("PUT", "/v1/consent/u_1", `{"digest_enabled":"yes"}`, 400)
	c.do("PUT", "/v1/consent/u_1", `{"cadence":"hourly"}`, 400)
	c.do("PUT", "/v1/consent/u_1", `{"colour":1}`, 400)
	c.do("GET", "/v1/consent/u_1?tenant=%01", "", 400)
	c.do("GET", "/v1/consent/u_1", "", 401, noAuth)

	// Enqueue: created, duplicate, a batch, invalid, expired, too large.
	c.do("POST", "/v1/envelopes", js(digest("d/1", "u_1")), 201)
	c.do("POST", "/v1/envelopes", js(digest("d/1", "u_1")), 200)
	c.do("POST", "/v1/envelopes", js([]*envelope.Envelope{digest("d/1", "u_1"), digest("d/2", "u_1")}), 201)
	bad := digest("d/bad", "u_1")
	bad.Channel = "fax"
	c.do("POST", "/v1/envelopes", js(bad), 400)
	c.do("POST", "/v1/envelopes", `{"schema_version":`, 400)
	c.do("POST", "/v1/envelopes", `[]`, 400)
	late := digest("d/late", "u_1")
	late.ExpiresAt = clk.Now()
	c.do("POST", "/v1/envelopes", js(late), 422)
	c.do("POST", "/v1/envelopes", `{"pad":"`+strings.Repeat("x", 64<<10)+`"}`, 413)
	other := reply("r/1", "u_2", "hello")
	other.TenantID = "podcast"
	c.do("POST", "/v1/envelopes", js(other), 201)

	// Look: get, list, stats.
	c.do("GET", pathOf("d/1"), "", 200)
	c.do("GET", pathOf("d/1")+"?full=1", "", 200)
	c.do("GET", pathOf("d/1")+"?full=maybe", "", 400)
	c.do("GET", pathOf("r/1"), "", 404)
	c.do("GET", pathOf("r/1")+"?tenant=podcast&full=true", "", 200)
	c.do("GET", pathOf("d/1"), "", 401, noAuth)
	var page queue.Page
	decode(t, c.do("GET", "/v1/envelopes?limit=1", "", 200), &page)
	if page.Next == "" {
		t.Fatal("a page of 1 of 3 rows has no next cursor")
	}
	c.do("GET", "/v1/envelopes?limit=1&cursor="+page.Next, "", 200)
	c.do("GET", "/v1/envelopes?state=pending&channel=email&tenant=default", "", 200)
	c.do("GET", "/v1/envelopes?state=lost", "", 400)
	c.do("GET", "/v1/envelopes?channel=fax", "", 400)
	c.do("GET", "/v1/envelopes?limit=0", "", 400)
	c.do("GET", "/v1/envelopes?cursor=nonsense", "", 400)
	c.do("GET", "/v1/stats", "", 200)
	c.do("GET", "/v1/stats?tenant=podcast", "", 200)
	c.do("GET", "/v1/stats?tenant=%01", "", 400)

	// Operator actions that do not apply, or to nothing.
	c.do("POST", pathOf("d/1")+"/requeue", "", 409)
	c.do("POST", pathOf("nope")+"/requeue", "", 404)
	c.do("POST", pathOf("d/1")+"/resolve", `{"as":"sent"}`, 409)
	c.do("POST", pathOf("d/1")+"/resolve", `{"as":"maybe"}`, 400)
	c.do("POST", pathOf("nope")+"/resolve", `{"as":"retry"}`, 404)

	// The seam: lease, report, again (a no-op), and what goes wrong.
	c.do("POST", "/v1/envelopes", js(nudge("n/1", "u_1")), 201)
	c.do("POST", "/v1/envelopes", js(nudge("n/2", "u_1")), 201)
	c.do("POST", "/internal/outbox/n%2F2/status", `{"status":"delivered"}`, 409) // no lease held
	var pend PendingReply
	decode(t, c.do("GET", "/internal/outbox/pending?channel=push&limit=5", "", 200), &pend)
	if len(pend.Leases) != 2 {
		t.Fatalf("pending leased %d envelopes, want 2", len(pend.Leases))
	}
	fence := map[string]uint64{}
	for _, l := range pend.Leases {
		fence[l.ID] = l.Fence
	}
	c.do("POST", "/internal/outbox/n%2F1/status", fmt.Sprintf(`{"status":"delivered","fence":%d}`, fence["n/1"]), 200)
	c.do("POST", "/internal/outbox/n%2F1/status", `{"status":"delivered"}`, 200) // settled: a no-op
	c.do("POST", "/internal/outbox/n%2F2/status", fmt.Sprintf(`{"status":"failed","fence":%d}`, fence["n/2"]+1), 409)
	c.do("POST", "/internal/outbox/n%2F2/status", `{"status":"lost"}`, 400)
	c.do("POST", "/internal/outbox/n%2F2/status", `{"status":"failed","error_class":"gremlins"}`, 400)
	c.do("POST", "/internal/outbox/n%2F2/status", `{"status":"failed","error_class":"invalid_recipient","detail":{"provider":"said no"}}`, 200)
	c.do("POST", "/internal/outbox/nope/status", `{"status":"delivered"}`, 404)
	c.do("GET", "/internal/outbox/pending?channel=fax", "", 400)
	c.do("GET", "/internal/outbox/pending?channel=email&limit=0", "", 400)
	c.do("GET", "/internal/outbox/pending?channel=email", "", 401, noAuth)

	// The dead letter goes back; an unresolved one is settled.
	c.do("POST", pathOf("n/2")+"/requeue", "", 200)
	leases, err := q.Claim(ctx, queue.ClaimRequest{Channels: []envelope.Channel{envelope.ChannelEmail}, Owner: "w", Lease: time.Minute, Limit: 1})
	if err != nil || len(leases) != 1 {
		t.Fatalf("claim: %v, %d leases", err, len(leases))
	}
	if err := q.Commit(ctx, leases[0], queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown}); err != nil {
		t.Fatal(err)
	}
	c.do("POST", pathOf(leases[0].Key.EnvelopeID)+"/resolve", `{"as":"sent"}`, 200)
	c.do("GET", pathOf(leases[0].Key.EnvelopeID), "", 200) // with its history

	// Push subscriptions (behind the token: no Config.User).
	sub := js(pushSub(endpointOf("u_1")))
	c.do("POST", "/api/app/push/subscribe?user=u_1", sub, 201)
	c.do("POST", "/api/app/push/subscribe?user=u_1", sub, 415, withHeader("Content-Type", "text/plain"))
	c.do("POST", "/api/app/push/subscribe?user=u_1", `{"endpoint":"http://push.example.net/x","keys":{"p256dh":"a","auth":"b"}}`, 400)
	c.do("POST", "/api/app/push/subscribe", sub, 400) // no user
	c.do("POST", "/api/app/push/subscribe?user=u_1", sub, 401, noAuth)
	unsubBody := js(map[string]string{"endpoint": endpointOf("u_1")})
	c.do("DELETE", "/api/app/push/subscribe?user=u_1", unsubBody, 200)
	c.do("DELETE", "/api/app/push/subscribe?user=u_1", unsubBody, 404)
	c.do("DELETE", "/api/app/push/subscribe?user=u_1", `{}`, 400)
	c.do("GET", "/api/app/push/vapid-key", "", 200, noAuth)

	// One-click unsubscribe: the page, the mail client's POST, the form.
	link := "/unsubscribe/" + a.cfg.Unsub.Token("default", "u_1", envelope.ChannelEmail, "ref")
	form := withHeader("Content-Type", "application/x-www-form-urlencoded")
	c.do("GET", link, "", 200, noAuth)
	c.do("GET", "/unsubscribe/not-a-token", "", 400, noAuth)
	c.do("POST", link, "List-Unsubscribe=One-Click", 200, noAuth, form)
	c.do("POST", link, "confirm=1", 200, noAuth, form)
	c.do("POST", link, "confirm=1&pad="+strings.Repeat("x", maxFormBytes), 413, noAuth, form)
	c.do("POST", "/unsubscribe/not-a-token", "List-Unsubscribe=One-Click", 400, noAuth, form)
	b := c.do("POST", "/v1/envelopes", js(digest("d/3", "u_1")), 409) // unsubscribed now
	var e errorBody
	decode(t, b, &e)
	if e.Error.Problems[0].Rule != string(envelope.ClassUnsubscribed) {
		t.Fatalf("after the unsubscribe: %s", b.Body)
	}

	// The page's way back, and a channel that has none.
	c.do("POST", link+"/resubscribe", "confirm=1", 200, noAuth, form)
	c.do("POST", "/unsubscribe/not-a-token/resubscribe", "confirm=1", 400, noAuth, form)
	c.do("POST", "/unsubscribe/"+a.cfg.Unsub.Token("default", "u_1", envelope.ChannelTelegram, "ref")+"/resubscribe", "confirm=1", 400, noAuth, form)
	c.do("POST", link+"/resubscribe", "confirm=1&pad="+strings.Repeat("x", maxFormBytes), 413, noAuth, form)
	c.do("POST", "/v1/envelopes", js(digest("d/3", "u_1")), 201) // subscribed again

	// A store that cannot write, or fails, says so.
	for _, tc := range []struct {
		errno  syscall.Errno
		status int
	}{
		{syscall.ENOSPC, 507}, {syscall.EROFS, 503}, {syscall.EACCES, 503}, {syscall.EIO, 500},
	} {
		c.a = fullAPI(t, storageFaultStore{Store: q, err: tc.errno})
		c.do("POST", "/v1/envelopes", js(digest("d/4", "u_1")), tc.status)
		c.do("PUT", "/v1/consent/u_1", `{"digest_enabled":true}`, tc.status)
		c.do("POST", pathOf("n/1")+"/requeue", "", tc.status)
		c.do("POST", link, "List-Unsubscribe=One-Click", tc.status, noAuth, form)
	}

	// A closed store: 503 unavailable.
	c.a = a
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	c.do("GET", "/v1/stats", "", 503)
	c.do("GET", pathOf("d/1"), "", 503)

	for p := range c.ops {
		if !c.ok[p] {
			t.Errorf("no request of this test answered %s with 2xx", p)
		}
	}
}

// GET /openapi.json describes what this handler serves: no operation it
// does not register (without a token, no /v1 and /internal; without an
// unsubscriber or a VAPID key, not their routes), and the push routes
// behind Config.User without the bearer token. The document stays a valid
// OpenAPI 3.1 document.
func TestOpenAPI_DescribesWhatIsServed(t *testing.T) {
	user := func(c *Config) {
		c.User = func(*http.Request) (string, string, error) { return "default", "u_1", nil }
	}
	for _, tc := range []struct {
		name string
		mut  []func(*Config)
	}{
		{"token and app sign-in", []func(*Config){user}},
		{"app sign-in only", []func(*Config){user, func(c *Config) { c.Token, c.Unsub, c.VAPIDPublicKey = "", nil, "" }}},
		{"token only", []func(*Config){func(c *Config) { c.Unsub, c.VAPIDPublicKey = nil, "" }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := fullAPI(t, memstore.New(nil), tc.mut...)
			w := httptest.NewRecorder()
			a.mux.ServeHTTP(w, httptest.NewRequest("GET", "/openapi.json", nil))
			var root map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &root); err != nil {
				t.Fatalf("GET /openapi.json: %d %v", w.Code, err)
			}
			d := &oaDoc{root: root}
			ops := d.operations()
			served := map[string]access{}
			for _, r := range a.served {
				if r.pattern != "/" {
					served[r.pattern] = r.access
				}
			}
			if len(ops) != len(served) {
				t.Errorf("%d operations described, %d routes served", len(ops), len(served))
			}
			bearer := []any{map[string]any{"bearerAuth": []any{}}}
			for p, acc := range served {
				ptr, ok := ops[p]
				if !ok {
					t.Errorf("%s is served, not described", p)
					continue
				}
				parts := strings.Split(strings.TrimPrefix(ptr, "#/paths/"), "/")
				path := strings.ReplaceAll(strings.ReplaceAll(parts[0], "~1", "/"), "~0", "~")
				op := root["paths"].(map[string]any)[path].(map[string]any)[parts[1]].(map[string]any)
				sec, own := op["security"]
				if !own {
					sec = root["security"]
				}
				if want := map[access]any{public: []any{}, tokenOnly: bearer}[acc]; !reflect.DeepEqual(sec, want) {
					t.Errorf("%s: security %v, want %v", p, sec, want)
				}
				if strings.Contains(p, "/push/subscribe") && a.cfg.User != nil && !strings.Contains(fmt.Sprint(op["description"]), "own sign-in") {
					t.Errorf("%s behind Config.User does not say how it is authenticated: %v", p, op["description"])
				}
			}
			raw, err := os.ReadFile(oasSchemaFile)
			if err != nil {
				t.Fatal(err)
			}
			oas, _ := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
			c := jsonschema.NewCompiler()
			const oasID = "https://spec.openapis.org/oas/3.1/schema/2022-10-07"
			if err := c.AddResource(oasID, oas); err != nil {
				t.Fatal(err)
			}
			sch, err := c.Compile(oasID)
			if err != nil {
				t.Fatal(err)
			}
			inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(w.Body.Bytes()))
			if err := sch.Validate(inst); err != nil {
				t.Errorf("the tailored description is not a valid OpenAPI 3.1 document: %v", err)
			}
		})
	}
}
