package httpapi

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"net/http"
	"strings"
)

//go:generate go run ./internal/openapigen/gen openapi.in.json openapi.json

// openAPI is the OpenAPI 3.1 description of the handler, generated from
// openapi.in.json with the envelope's JSON Schema in it. Edit
// openapi.in.json, then run go generate; the tests hold it to the
// handlers.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3.1 description of the handler (JSON), the
// document GET /openapi.json serves.
func OpenAPI() []byte { return bytes.Clone(openAPI) }

func (a *api) openapi(w http.ResponseWriter, r *http.Request) error {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(a.doc)
	return nil
}

// tailor returns the description of what this handler serves: the
// operations of routes it does not register are left out (without a
// token, no /v1 and /internal), and those it serves without the bearer
// token although the full description asks for it (the push routes behind
// Config.User, the app's own sign-in) say so.
func tailor(full []byte, served []route) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(full, &doc); err != nil {
		return nil, err
	}
	acc := map[string]access{}
	for _, r := range served {
		acc[r.pattern] = r.access
	}
	changed := false
	paths, _ := doc["paths"].(map[string]any)
	for path, v := range paths {
		item, _ := v.(map[string]any)
		ops := 0
		for _, m := range []string{"get", "put", "post", "delete", "patch", "head", "options"} {
			op, ok := item[m].(map[string]any)
			if !ok {
				continue
			}
			a, served := acc[strings.ToUpper(m)+" "+path]
			if !served {
				delete(item, m)
				changed = true
				continue
			}
			ops++
			sec, own := op["security"]
			if !own {
				sec = doc["security"]
			}
			if a == public && sec != nil && !isPublic(sec) {
				desc, _ := op["description"].(string)
				op["security"] = []any{}
				op["description"] = strings.TrimSpace(desc + " Authenticated by the application's own sign-in (httpapi.Config.User), not by the bearer token.")
				changed = true
			}
		}
		if ops == 0 {
			delete(paths, path)
		}
	}
	if !changed {
		return full, nil
	}
	return json.MarshalIndent(doc, "", "  ")
}

// isPublic reports whether an operation's security says no authentication
// ([]).
func isPublic(sec any) bool {
	s, ok := sec.([]any)
	return ok && len(s) == 0
}
