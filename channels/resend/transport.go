package resend

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
)

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// exchange is what the capturing transport saw of one API call. Each call
// gets its own exchange through its request context, so concurrent calls
// never share one.
type exchange struct {
	status int
	header http.Header
	body   apiErrorBody
}

// apiErrorBody is Resend's error body. Message is parsed but never kept
// beyond the call: it is raw service text.
type apiErrorBody struct {
	StatusCode int    `json:"statusCode"`
	Name       string `json:"name"`
	Message    string `json:"message"`
}

type exchangeKey struct{}

// withExchange returns ctx carrying x, for the capturing transport.
func withExchange(ctx context.Context, x *exchange) context.Context {
	return context.WithValue(ctx, exchangeKey{}, x)
}

// noRedirect makes the client return a redirect answer instead of
// following it.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// capturingTransport records the status, headers and parsed error body of
// every response into the exchange found in the request's context. Requests
// without one pass through untouched.
type capturingTransport struct {
	base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *capturingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	x, _ := req.Context().Value(exchangeKey{}).(*exchange)
	if x == nil || err != nil {
		return resp, err
	}
	x.status = resp.StatusCode
	x.header = resp.Header.Clone()
	x.body = apiErrorBody{}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	// Read the error body (bounded), parse it, and hand resend-go a copy so
	// that it behaves as without us.
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	_ = resp.Body.Close()
	_ = json.Unmarshal(raw, &x.body)
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	return resp, nil
}
