package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/queue/httpapi"
	"github.com/outboxhq/outbox/queue/memstore"
)

// decodeBatch parses the one JSON object validate/enqueue --json print.
func decodeBatch(t *testing.T, stdout string) batchResult {
	t.Helper()
	var b batchResult
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s", err, stdout)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON value:\n%s", stdout)
	}
	return b
}

// withoutExpiry returns a golden fixture as one line, its expires_at
// removed, so that it can be enqueued on any day.
func withoutExpiry(t *testing.T, name string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(readFile(t, fixturePath(name))), &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "expires_at")
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func badNudge(t *testing.T) string {
	t.Helper()
	nudge := compactFixture(t, "resurface-nudge.v1.golden.json")
	bad := strings.Replace(nudge, `"deep_link":`, `"deep_link_x":`, 1)
	if bad == nudge {
		t.Fatal("mutation did not apply")
	}
	return bad
}

func TestValidate_JSON(t *testing.T) {
	good := writeTemp(t, "good.json", compactFixture(t, "your-week-digest.v1.golden.json"))
	lines := writeTemp(t, "batch.jsonl", compactFixture(t, "reply-text.v1.golden.json")+"\n"+badNudge(t)+"\n\n{\"schema_version\":\n")
	missing := filepath.Join(t.TempDir(), "missing.json")
	array := writeTemp(t, "array.json", "[\n{}\n{}\n]\n")

	code, stdout, stderr := runCLI(t, "", "validate", "--json", good, lines, missing, array)
	if code != exitFailure || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	got := decodeBatch(t, stdout)
	if got.OK || got.Error != "" {
		t.Errorf("ok %v error %q", got.OK, got.Error)
	}
	wantFiles := []fileResult{
		{File: good, OK: true, Envelopes: 1},
		{File: lines, Envelopes: 3},
		{File: missing, Problem: &fileProblem{Rule: "cannot read: no such file or directory"}},
		{File: array, Problem: &fileProblem{Line: 3, Rule: "malformed JSON array: invalid character after array element at column 1"}},
	}
	if !reflect.DeepEqual(got.Files, wantFiles) {
		t.Errorf("files:\n%+v\nwant\n%+v", got.Files, wantFiles)
	}
	if len(got.Envelopes) != 4 {
		t.Fatalf("%d envelopes: %+v", len(got.Envelopes), got.Envelopes)
	}
	want0 := envelopeResult{File: good, Line: 1, Index: 0, Tenant: "default", ID: "digest/u_42/2026-W18", OK: true}
	want1 := envelopeResult{File: lines, Line: 1, Index: 0, Tenant: "podcast-companion", ID: "reply/tg/734519028/msg_88412", OK: true}
	if !reflect.DeepEqual(got.Envelopes[0], want0) {
		t.Errorf("envelope 0 = %+v, want %+v", got.Envelopes[0], want0)
	}
	if !reflect.DeepEqual(got.Envelopes[1], want1) {
		t.Errorf("envelope 1 = %+v, want %+v", got.Envelopes[1], want1)
	}
	bad := got.Envelopes[2]
	if bad.OK || bad.Line != 2 || bad.Index != 1 || bad.ID != "nudge/u_42/hl_9b21/2026-05-04" || bad.Tenant != "default" ||
		!reflect.DeepEqual(bad.Problems[0], httpapi.Problem{Index: 1, Path: "payload.lead.deep_link", Rule: "required (moat rule)"}) {
		t.Errorf("the invalid envelope: %+v", bad)
	}
	if m := got.Envelopes[3]; m.OK || m.Line != 4 || m.Index != 2 || m.ID != "" || len(m.Problems) != 1 ||
		!strings.HasPrefix(m.Problems[0].Rule, "malformed JSON: ") || m.Problems[0].Index != 2 {
		t.Errorf("the malformed line: %+v", m)
	}

	// All valid: exit 0, ok.
	code, stdout, stderr = runCLI(t, "", "validate", good, "--json")
	if b := decodeBatch(t, stdout); code != exitOK || stderr != "" || !b.OK || len(b.Envelopes) != 1 || !b.Envelopes[0].OK {
		t.Errorf("exit %d, stderr %q, %+v", code, stderr, b)
	}
}

func TestEnqueue_JSON(t *testing.T) {
	data := t.TempDir()
	digest, nudge := withoutExpiry(t, "your-week-digest.v1.golden.json"), withoutExpiry(t, "resurface-nudge.v1.golden.json")
	f := writeTemp(t, "two.jsonl", digest+"\n"+nudge+"\n"+digest+"\n")

	code, stdout, stderr := runCLI(t, "", "enqueue", "--data", data, "--json", f)
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	got := decodeBatch(t, stdout)
	want := []envelopeResult{
		{File: f, Line: 1, Index: 0, Tenant: "default", ID: "digest/u_42/2026-W18", OK: true, Status: "queued"},
		{File: f, Line: 2, Index: 1, Tenant: "default", ID: "nudge/u_42/hl_9b21/2026-05-04", OK: true, Status: "queued"},
		{File: f, Line: 3, Index: 2, Tenant: "default", ID: "digest/u_42/2026-W18", OK: true, Status: "duplicate"},
	}
	if !got.OK || !reflect.DeepEqual(got.Envelopes, want) {
		t.Errorf("ok %v envelopes:\n%+v\nwant\n%+v", got.OK, got.Envelopes, want)
	}

	// Invalid: nothing appended, exit 1, the problems and why.
	empty := t.TempDir()
	bad := writeTemp(t, "bad.json", badNudge(t))
	code, stdout, stderr = runCLI(t, "", "enqueue", "--json", "--data", empty, bad)
	got = decodeBatch(t, stdout)
	if code != exitFailure || stderr != "" || got.OK || got.Error != "invalid envelopes: nothing was appended" ||
		len(got.Envelopes) != 1 || got.Envelopes[0].Status != "" || len(got.Envelopes[0].Problems) == 0 {
		t.Errorf("exit %d, stderr %q, %+v", code, stderr, got)
	}
	if m, _ := filepath.Glob(filepath.Join(empty, "logs", "*", "*")); len(m) != 0 {
		t.Fatalf("appended anyway: %v", m)
	}

	// Expired: refused with the HTTP API's problem.
	code, stdout, _ = runCLI(t, "", "enqueue", "--json", "--data", empty, fixturePath("reply-text.v1.golden.json"))
	got = decodeBatch(t, stdout)
	if code != exitFailure || got.OK || !strings.Contains(got.Error, "already past") || got.Files[0].OK ||
		!reflect.DeepEqual(got.Envelopes[0].Problems, []httpapi.Problem{{Index: 0, Path: "expires_at", Rule: "must be in the future"}}) {
		t.Errorf("exit %d, %+v", code, got)
	}

	// The text output is what it was.
	code, stdout, _ = runCLI(t, "", "enqueue", "--data", t.TempDir(), f)
	if code != exitOK || stdout != "queued default/digest/u_42/2026-W18\nqueued default/nudge/u_42/hl_9b21/2026-05-04\nduplicate default/digest/u_42/2026-W18\n" {
		t.Errorf("exit %d, stdout %q", code, stdout)
	}
}

// TestJSON_ProblemsAreTheHTTPAPIs: for the same envelope, validate --json
// and enqueue --json list the problems POST /v1/envelopes answers.
func TestJSON_ProblemsAreTheHTTPAPIs(t *testing.T) {
	const token = "json-shape-token-5d2c8e71a9"
	h, err := httpapi.New(httpapi.Config{Store: memstore.New(nil), Token: token})
	if err != nil {
		t.Fatal(err)
	}
	post := func(body string) []httpapi.Problem {
		req := httptest.NewRequest(http.MethodPost, "/v1/envelopes", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var answer struct {
			Error struct {
				Problems []httpapi.Problem `json:"problems"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil || len(answer.Error.Problems) == 0 {
			t.Fatalf("POST answered %d %s", rec.Code, rec.Body)
		}
		return answer.Error.Problems
	}

	bad := badNudge(t)
	_, stdout, _ := runCLI(t, "", "validate", "--json", writeTemp(t, "bad.json", bad))
	if got, want := decodeBatch(t, stdout).Envelopes[0].Problems, post(bad); !reflect.DeepEqual(got, want) {
		t.Errorf("validate --json problems %+v, the HTTP API's %+v", got, want)
	}
	expired := readFile(t, fixturePath("reply-text.v1.golden.json"))
	_, stdout, _ = runCLI(t, "", "enqueue", "--json", "--data", t.TempDir(), fixturePath("reply-text.v1.golden.json"))
	if got, want := decodeBatch(t, stdout).Envelopes[0].Problems, post(expired); !reflect.DeepEqual(got, want) {
		t.Errorf("enqueue --json problems %+v, the HTTP API's %+v", got, want)
	}
}
