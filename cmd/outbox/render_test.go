package main

import (
	"bytes"
	"context"
	"encoding/json"
	"mime"
	"net/mail"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/render"
)

// renderCmd runs "outbox render args..." in-process with the given stdin
// and environment variables.
func renderCmd(tb testing.TB, stdin string, vars map[string]string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	var out, errb bytes.Buffer
	e := &env{
		Stdin:  strings.NewReader(stdin),
		Stdout: &out,
		Stderr: &errb,
		Getenv: func(k string) string { return vars[k] },
	}
	code = run(context.Background(), e, append([]string{"render"}, args...))
	return code, out.String(), errb.String()
}

const (
	digestFixture = "../../testdata/delivery/your-week-digest.v1.golden.json"
	nudgeFixture  = "../../testdata/delivery/resurface-nudge.v1.golden.json"
	replyFixture  = "../../testdata/delivery/reply-text.v1.golden.json"
)

func TestRender_Summary(t *testing.T) {
	code, out, errs := renderCmd(t, "", nil, digestFixture, nudgeFixture, replyFixture)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
	for _, want := range []string{
		"your-week-digest.v1 on email",
		"subject: Your week: 2 to revisit",
		"List-Unsubscribe: <http://127.0.0.1:8080/unsubscribe/unsub_7f3c9a1e2b4d>",
		"no List-Unsubscribe-Post",
		"resurface-nudge.v1 on push",
		"ttl: 24h0m0s, urgency: normal",
		"reply-text.v1 on telegram, 3 segment(s)",
		"segment 3/3",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
}

func TestRender_Out(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "preview")
	// Flags may follow the files.
	code, out, errs := renderCmd(t, "", map[string]string{"OUTBOX_PUBLIC_URL": "https://app.example.org"},
		digestFixture, nudgeFixture, replyFixture, "--out", dir)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
	want := []string{
		"index.html",
		"reply-text.v1.golden.telegram.json",
		"reply-text.v1.golden.telegram.txt",
		"resurface-nudge.v1.golden.push.json",
		"your-week-digest.v1.golden.email.eml",
		"your-week-digest.v1.golden.email.html",
		"your-week-digest.v1.golden.email.txt",
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ent := range entries {
		got = append(got, ent.Name())
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("files = %v, want %v", got, want)
	}
	if !strings.Contains(out, filepath.Join(dir, "index.html")) {
		t.Errorf("stdout does not point at the index:\n%s", out)
	}
	index := mustRead(t, filepath.Join(dir, "index.html"))
	for _, f := range want[1:] {
		if !strings.Contains(index, `href="`+f+`"`) {
			t.Errorf("index.html does not link %s", f)
		}
	}

	// The .eml is a real multipart/alternative message with the one-click
	// headers and a Message-ID derived from the key.
	msg, err := mail.ReadMessage(strings.NewReader(mustRead(t, filepath.Join(dir, "your-week-digest.v1.golden.email.eml"))))
	if err != nil {
		t.Fatal(err)
	}
	h := msg.Header
	if h.Get("From") != `"outbox" <outbox@localhost>` || h.Get("To") != "<ada.lovelace@example.org>" ||
		h.Get("Date") != "Sun, 03 May 2026 07:00:00 +0000" || !strings.HasSuffix(h.Get("Message-ID"), "@outbox>") ||
		h.Get("List-Unsubscribe") != "<https://app.example.org/unsubscribe/unsub_7f3c9a1e2b4d>" ||
		h.Get("List-Unsubscribe-Post") != "List-Unsubscribe=One-Click" {
		t.Errorf("eml headers: %v", h)
	}
	if mt, _, _ := mime.ParseMediaType(h.Get("Content-Type")); mt != "multipart/alternative" {
		t.Errorf("eml Content-Type %q", mt)
	}
	html := mustRead(t, filepath.Join(dir, "your-week-digest.v1.golden.email.html"))
	if !strings.Contains(html, "Trending in your corpus") {
		t.Error(".html is not the digest body")
	}

	var push struct {
		TTL     int64           `json:"ttl_seconds"`
		Bytes   int             `json:"payload_bytes"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal([]byte(mustRead(t, filepath.Join(dir, "resurface-nudge.v1.golden.push.json"))), &push); err != nil {
		t.Fatal(err)
	}
	if push.TTL != 86400 || push.Bytes == 0 || push.Bytes > render.MaxPushPayloadBytes || !json.Valid(push.Payload) {
		t.Errorf("push preview = %+v", push)
	}
	var segs []struct {
		Segment int    `json:"segment"`
		Units   int    `json:"telegram_length"`
		Text    string `json:"text"`
	}
	if err := json.Unmarshal([]byte(mustRead(t, filepath.Join(dir, "reply-text.v1.golden.telegram.json"))), &segs); err != nil {
		t.Fatal(err)
	}
	if len(segs) != 3 || segs[2].Segment != 2 || segs[0].Units > 4096 {
		t.Errorf("telegram preview = %d segments", len(segs))
	}
}

func TestRender_ChannelAndStdin(t *testing.T) {
	dir := t.TempDir()
	nudge := mustRead(t, nudgeFixture)
	code, _, errs := renderCmd(t, nudge, nil, "--channel", "email", "--out", dir, "--from", "Podcasts <hi@example.org>", "-")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
	for _, want := range []string{"rendering a push envelope on email", "recipient.email is a placeholder", "unsubscribe_ref is a placeholder"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	eml := mustRead(t, filepath.Join(dir, "stdin.email.eml"))
	if !strings.HasPrefix(eml, `From: "Podcasts" <hi@example.org>`) {
		t.Errorf("--from not used:\n%.200s", eml)
	}
}

func TestRender_Errors(t *testing.T) {
	tmp := t.TempDir()
	brokenTemplates := filepath.Join(tmp, "templates")
	if err := os.Mkdir(brokenTemplates, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(brokenTemplates, "your-week-digest.v1.email.html.tmpl"), []byte("{{.Nope"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"NoFile", nil, exitUsage, "no envelope file"},
		{"BadChannel", []string{"--channel", "fax", digestFixture}, exitUsage, `--channel "fax"`},
		{"BadNow", []string{"--now", "yesterday", digestFixture}, exitUsage, "--now"},
		{"UnknownFlag", []string{"--nope", digestFixture}, exitUsage, "nope"},
		{"MissingFile", []string{filepath.Join(tmp, "missing.json")}, exitFailure, "missing.json"},
		{"InvalidEnvelope", []string{"../../testdata/delivery/invalid/moat-rule-missing-deep-link.json"}, exitFailure, "moat-rule-missing-deep-link.json:1: payload."},
		{"UnsupportedChannel", []string{"--channel", "email", replyFixture}, exitFailure, "no rendering for this channel"},
		{"BrokenOverride", []string{"--templates", brokenTemplates, digestFixture}, exitFailure, "your-week-digest.v1.email.html.tmpl (override)"},
		{"TemplatesNotADir", []string{"--templates", digestFixture, digestFixture}, exitFailure, "not a directory"},
		{"BadBaseURL", []string{"--base-url", "ftp://x", digestFixture}, exitFailure, "BaseURL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errs := renderCmd(t, "", nil, tt.args...)
			if code != tt.wantCode || !strings.Contains(errs, tt.wantErr) {
				t.Fatalf("exit %d (want %d), stderr:\n%s\nwant it to contain %q", code, tt.wantCode, errs, tt.wantErr)
			}
		})
	}
}

func TestRender_Help(t *testing.T) {
	code, _, errs := renderCmd(t, "", nil, "-help")
	if code != exitOK || !strings.Contains(errs, "Usage: outbox render FILE") || !strings.Contains(errs, "OUTBOX_PUBLIC_URL") {
		t.Fatalf("exit %d, help:\n%s", code, errs)
	}
}

// mustRead returns a file's content.
func mustRead(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}
