package main

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/mail"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var brandArgs = []string{
	"--brand-sender", "Podcast Companion Weekly",
	"--brand-color", "#C2410C",
	"--brand-logo-url", "https://cdn.example.org/brand/logo.png",
	"--brand-address", "Podcast Companion Ltd, 1 Market Street, Bristol BS1 4DJ",
	"--brand-preferences-url", "https://app.example.org/settings/notifications",
}

// brandVars set the product name through the environment, the rest by
// flags: both paths are used.
var brandVars = map[string]string{"OUTBOX_BRAND_NAME": "Podcast Companion"}

// readEML returns an .eml file's header and its text and HTML bodies,
// decoded.
func readEML(t *testing.T, b []byte) (mail.Header, string, string) {
	t.Helper()
	m, err := mail.ReadMessage(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	_, params, err := mime.ParseMediaType(m.Header.Get("Content-Type"))
	if err != nil {
		t.Fatal(err)
	}
	var text, html string
	mr := multipart.NewReader(m.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(p) // quoted-printable, decoded by NextPart
		if strings.HasPrefix(p.Header.Get("Content-Type"), "text/html") {
			html = string(body)
		} else {
			text = string(body)
		}
	}
	return m.Header, text, html
}

// checkBranded fails unless an e-mail's From, text and HTML carry the
// brand of brandArgs and brandVars.
func checkBranded(t *testing.T, h mail.Header, text, html, wantFrom string) {
	t.Helper()
	if got := h.Get("From"); got != wantFrom {
		t.Errorf("From = %q, want %q", got, wantFrom)
	}
	for _, body := range []string{text, html} {
		for _, want := range []string{"turned it on in Podcast Companion", "Podcast Companion Ltd, 1 Market Street, Bristol BS1 4DJ", "https://app.example.org/settings/notifications"} {
			if !strings.Contains(body, want) {
				t.Errorf("body lacks %q:\n%s", want, body)
			}
		}
	}
	for _, want := range []string{`<img src="https://cdn.example.org/brand/logo.png" alt="Podcast Companion"`, `bgcolor="#c2410c"`, ">Manage your digest</a>"} {
		if !strings.Contains(html, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
}

// outbox render takes serve's --brand-* flags and variables, so an author
// previews the e-mail users get; the .eml's From has the sender name.
func TestRender_BrandFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "preview")
	args := append([]string{digestFixture, "--out", dir, "--from", "news@example.org"}, brandArgs...)
	if code, _, errs := renderCmd(t, "", brandVars, args...); code != exitOK {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	b, err := os.ReadFile(filepath.Join(dir, "your-week-digest.v1.golden.email.eml"))
	if err != nil {
		t.Fatal(err)
	}
	h, text, html := readEML(t, b)
	checkBranded(t, h, text, html, `"Podcast Companion Weekly" <news@example.org>`)
}

// A brand value that cannot be shown safely is refused before anything
// starts, naming the flag and its variable, without repeating the value.
func TestBrandFlags_Refused(t *testing.T) {
	tests := []struct {
		name string
		args []string
		vars map[string]string
		want string
	}{
		{"SenderCRLF", []string{"--brand-sender", "Evil\r\nBcc: victim@example.org"}, nil, "--brand-sender (OUTBOX_BRAND_SENDER) contains a line break"},
		{"NameControl", []string{"--brand-name", "a\x1bb"}, nil, "--brand-name (OUTBOX_BRAND_NAME) contains a control character"},
		{"AddressFromEnv", nil, map[string]string{"OUTBOX_BRAND_ADDRESS": "1 Main St\nBcc: victim@example.org"}, "--brand-address (OUTBOX_BRAND_ADDRESS) contains a line break"},
		{"Color", []string{"--brand-color", "red"}, nil, "--brand-color (OUTBOX_BRAND_COLOR) is not a hex colour"},
		{"LogoHTTP", []string{"--brand-logo-url", "http://cdn.example.org/Bcc.png"}, nil, "--brand-logo-url (OUTBOX_BRAND_LOGO_URL) is not an absolute https URL"},
		{"PrefsScript", []string{"--brand-preferences-url", "javascript:Bcc()"}, nil, "--brand-preferences-url (OUTBOX_BRAND_PREFERENCES_URL) is not an absolute http or https URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errs := renderCmd(t, "", tt.vars, append([]string{digestFixture}, tt.args...)...)
			if code != exitUsage || !strings.Contains(errs, tt.want) || strings.Contains(errs, "Bcc") {
				t.Errorf("render: exit %d, stderr %q; want %d and %q", code, errs, exitUsage, tt.want)
			}
			url, errb, stop := startServeEnv(t, tt.vars, tt.args...)
			code = stop()
			if url != "" || code != exitUsage || !strings.Contains(errb.String(), tt.want) || strings.Contains(errb.String(), "Bcc") {
				t.Errorf("serve: started %v, exit %d, stderr %q; want %d and %q", url != "", code, errb.String(), exitUsage, tt.want)
			}
		})
	}
}

// serve passes the brand to the renderer (the sink's e-mail, its From),
// and to the unsubscribe pages, whose button re-opts the user in.
func TestServe_Brand(t *testing.T) {
	const token = "brand-token-5e1f7a9c3b2d"
	data := t.TempDir()
	vars := map[string]string{"INTERNAL_OUTBOX_TOKEN": token}
	for k, v := range brandVars {
		vars[k] = v
	}
	base, errb, stop := startServeEnv(t, vars, append([]string{"--data", data, "--email-from", "news@example.org", "--public-url", "https://mail.example.org"}, brandArgs...)...)
	if base == "" {
		t.Fatalf("serve exited:\n%s", errb.String())
	}
	defer func() {
		if code := stop(); code != exitOK {
			t.Errorf("serve = %d:\n%s", code, errb.String())
		}
		http.DefaultClient.CloseIdleConnections()
	}()
	if code, b := request(t, "PUT", base+"/v1/consent/u_42", token, []byte(`{"digest_enabled":true,"email_verified":true}`)); code != 200 {
		t.Fatalf("consent: %d %s", code, b)
	}
	raw, err := os.ReadFile(digestFixture)
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]any
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	env["created_at"], env["not_before"], env["expires_at"] = now.Format(time.RFC3339), now.Format(time.RFC3339), now.Add(24*time.Hour).Format(time.RFC3339)
	body, _ := json.Marshal(env)
	if code, b := request(t, "POST", base+"/v1/envelopes", token, body); code != http.StatusCreated {
		t.Fatalf("enqueue: %d %s", code, b)
	}
	var eml []byte
	eventually(t, "the digest in the sink", func() bool {
		files, _ := filepath.Glob(filepath.Join(data, "sink", "email", "*.eml"))
		if len(files) == 0 {
			return false
		}
		eml, err = os.ReadFile(files[0])
		return err == nil
	})
	h, text, html := readEML(t, eml)
	checkBranded(t, h, text, html, `"Podcast Companion Weekly" <news@example.org>`)

	link := strings.Trim(h.Get("List-Unsubscribe"), "<>")
	u, err := url.Parse(link)
	if err != nil || !strings.HasPrefix(link, "https://mail.example.org/unsubscribe/") {
		t.Fatalf("List-Unsubscribe %q", link)
	}
	code, page := request(t, "GET", base+u.Path, "", nil)
	if code != 200 || !strings.Contains(string(page), "stop receiving digest and reminder e-mails from Podcast Companion?") || !strings.Contains(string(page), "Podcast Companion Ltd") {
		t.Fatalf("unsubscribe page: %d\n%s", code, page)
	}
	resp, err := http.PostForm(base+u.Path, url.Values{"confirm": {"1"}})
	if err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `action="`+strings.TrimPrefix(u.Path, "/unsubscribe/")+`/resubscribe"`) {
		t.Fatalf("unsubscribed page: %d\n%s", resp.StatusCode, page)
	}
	resp, err = http.PostForm(base+u.Path+"/resubscribe", nil)
	if err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), "from Podcast Companion again") {
		t.Fatalf("resubscribed page: %d\n%s", resp.StatusCode, page)
	}
	code, b := request(t, "GET", base+"/v1/consent/u_42", token, nil)
	if code != 200 || !strings.Contains(string(b), `"by":"unsubscribe_page"`) || strings.Contains(string(b), `"suppressions"`) {
		t.Fatalf("consent after resubscribe: %d %s", code, b)
	}
}

// With e-mail sent through Resend and no postal address, serve says once
// at start that commercial e-mail needs one, and starts; with one, it
// says nothing.
func TestServe_WarnsWithoutAddress(t *testing.T) {
	vars := map[string]string{"RESEND_API_KEY": "re_test_0123456789abcdef"}
	args := []string{"--email-from", "news@example.org", "--resend-poll", "0"}
	for _, withAddress := range []bool{false, true} {
		a := args
		if withAddress {
			a = append(a, "--brand-address", "1 Market Street, Bristol")
		}
		url, errb, stop := startServeEnv(t, vars, a...)
		code := stop()
		if url == "" || code != exitOK {
			t.Fatalf("serve: started %v, exit %d:\n%s", url != "", code, errb.String())
		}
		n := strings.Count(errb.String(), "--brand-address (OUTBOX_BRAND_ADDRESS) is not set: commercial e-mail must show the sender's postal address (CAN-SPAM)")
		if want := map[bool]int{false: 1, true: 0}[withAddress]; n != want {
			t.Errorf("with address %v: the warning appears %d times, want %d:\n%s", withAddress, n, want, errb.String())
		}
		if strings.Contains(errb.String(), "re_test_") {
			t.Errorf("the API key is in the logs:\n%s", errb.String())
		}
	}
}
