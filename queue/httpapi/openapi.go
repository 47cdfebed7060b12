package httpapi

import (
	"bytes"
	_ "embed"
	"net/http"
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
	_, _ = w.Write(openAPI)
	return nil
}
