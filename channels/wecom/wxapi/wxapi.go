// Package wxapi holds what the WeCom providers share: the secret type and
// its loading from the environment, an HTTP client that never follows a
// redirect, one JSON call to a WeCom endpoint (always HTTP 200 with errcode
// and errmsg) and the redaction of transport errors.
//
// Nothing here puts a URL, a secret, a body or errmsg into an error or a
// log: WeCom's URLs carry the access token, the robot key or the
// response_url's code.
package wxapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
)

// DefaultBaseURL is WeCom's API server.
const DefaultBaseURL = "https://qyapi.weixin.qq.com"

// DefaultRequestTimeout bounds one request of the default HTTP client.
const DefaultRequestTimeout = 30 * time.Second

// maxResponseBytes bounds how much of an answer is read.
const maxResponseBytes = 1 << 20

const redacted = "[redacted]"

// Secret is a credential (an app secret, a robot key, an access token, a
// response_url). It prints, logs and marshals as "[redacted]"; use
// string(s) to read it.
type Secret string

// String returns "[redacted]".
func (Secret) String() string { return redacted }

// GoString returns "[redacted]".
func (Secret) GoString() string { return redacted }

// LogValue makes a Secret log as "[redacted]".
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText makes a Secret marshal as "[redacted]".
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// ErrNotSet is returned (wrapped) by FromEnv when neither the variable nor
// its _FILE form is set.
var ErrNotSet = errors.New("not set")

// FromEnv reads a secret from the variable name or from the file named by
// name+"_FILE", trimmed. Errors name the variable, never the value; when
// neither is set the error wraps ErrNotSet.
func FromEnv(getenv func(string) string, name string) (Secret, error) {
	direct := strings.TrimSpace(getenv(name))
	path := strings.TrimSpace(getenv(name + "_FILE"))
	switch {
	case direct != "" && path != "":
		return "", fmt.Errorf("set only one of %s and %s_FILE", name, name)
	case direct != "":
		return Secret(direct), nil
	case path == "":
		return "", fmt.Errorf("%s: %w", name, ErrNotSet)
	}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("%s_FILE: file does not exist", name)
	case errors.Is(err, os.ErrPermission):
		return "", fmt.Errorf("%s_FILE: permission denied", name)
	case err != nil:
		return "", fmt.Errorf("%s_FILE: cannot read the file", name)
	}
	s := string(bytes.TrimSpace(b))
	if s == "" {
		return "", fmt.Errorf("%s_FILE: the file is empty", name)
	}
	return Secret(s), nil
}

// CheckBaseURL checks a base URL option (http(s), a host, nothing else).
func CheckBaseURL(base string) (string, error) {
	base = strings.TrimSpace(base)
	if base == "" {
		base = DefaultBaseURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", errors.New("must be an http(s) URL without query, fragment or user info")
	}
	return strings.TrimRight(base, "/"), nil
}

// Client returns a copy of c (or a client with DefaultRequestTimeout) that
// never follows a redirect: a 3xx is an answer, classified as a provider
// error, so a URL's secret never goes where a redirect points.
func Client(c *http.Client) *http.Client {
	var out *http.Client
	if c != nil {
		cp := *c
		out = &cp
	} else {
		out = &http.Client{Timeout: DefaultRequestTimeout}
	}
	out.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return out
}

// Result is WeCom's answer: the HTTP status, errcode and the raw JSON
// (errmsg is never kept). OK is true for HTTP 200 with a JSON body.
type Result struct {
	Status  int
	ErrCode int
	OK      bool
	Body    json.RawMessage
}

// APIError is the cause kept in a DeliveryError for a WeCom answer: status
// and errcode only.
type APIError struct {
	Status  int
	ErrCode int
}

func (e *APIError) Error() string {
	return "wecom: answered HTTP " + strconv.Itoa(e.Status) + " errcode " + strconv.Itoa(e.ErrCode)
}

// Cause returns the APIError of r.
func (r *Result) Cause() error { return &APIError{Status: r.Status, ErrCode: r.ErrCode} }

// Call sends method to u (the secret is in u: never log it) with body as
// JSON (nil for GET) and decodes the answer's errcode. A transport error
// is returned redacted (channels.ClassifyTransport).
func Call(ctx context.Context, c *http.Client, method, u string, body []byte) (Result, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return Result{}, envelope.Permanent(envelope.ClassInvalidRequest, errBuild)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return Result{}, channels.ClassifyTransport(err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return Result{Status: resp.StatusCode}, channels.ClassifyTransport(err)
	}
	r := Result{Status: resp.StatusCode, Body: data}
	var head struct {
		ErrCode *int `json:"errcode"`
	}
	if resp.StatusCode == http.StatusOK && json.Unmarshal(data, &head) == nil && head.ErrCode != nil {
		r.OK, r.ErrCode = true, *head.ErrCode
	}
	return r, nil
}

// Redacted causes.
var (
	errBuild = errors.New("wecom: cannot build the request")
)

// NotAnswer classifies an answer that is not WeCom's JSON (a proxy's page,
// a redirect, a 5xx): retryable provider_unavailable.
func NotAnswer(r *Result) error {
	return envelope.Retryable(envelope.ClassProviderUnavailable, r.Cause())
}

// Frequency limit errcodes (retry later).
const (
	CodeBusy         = -1
	CodeFreqLimit    = 45009
	CodeConcurrency  = 45033
	CodeInvalidToken = 40014
	CodeExpired      = 42001
	CodeCredential   = 40001
	CodeIPNotTrusted = 60020
	CodeNoPrivilege  = 48001
	CodeAppMismatch  = 301002
	CodeAllInvalid   = 81013
	CodeRobotKey     = 93000
	CodeCorpID       = 40013
	CodeSecret       = 40091
)
