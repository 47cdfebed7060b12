package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/render"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

func TestUnsubscriber_RoundTrip(t *testing.T) {
	u := NewUnsubscriber(testKey(1), "https://mail.example.org/x/")
	tests := []struct {
		name string
		e    *envelope.Envelope
	}{
		{"Email", digest("d/1", "u_1")},
		{"Push", nudge("n/1", "u_2")},
		{"Telegram", reply("r/1", "u_3", "hi")},
		{"Tenant", func() *envelope.Envelope { e := digest("d/2", "u_4"); e.TenantID = "acme"; return e }()},
		{"Unicode", digest("d/3", "ユーザー")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			link := u.URL(tt.e)
			prefix := "https://mail.example.org/x/unsubscribe/"
			if !strings.HasPrefix(link, prefix) {
				t.Fatalf("URL %q lacks prefix %q", link, prefix)
			}
			tok := strings.TrimPrefix(link, prefix)
			if strings.ContainsAny(tok, "=+/") {
				t.Fatalf("token %q is not base64url without padding", tok)
			}
			if _, err := url.Parse(link); err != nil {
				t.Fatal(err)
			}
			tenant, user, ch, err := u.Verify(tok)
			if err != nil || tenant != tt.e.Tenant() || user != tt.e.UserID || ch != tt.e.Channel {
				t.Fatalf("Verify = %q %q %q %v", tenant, user, ch, err)
			}
			if strings.Contains(link, tt.e.Recipient.Email) && tt.e.Recipient.Email != "" {
				t.Fatal("the link carries the email address")
			}
		})
	}
}

func TestUnsubscriber_Rejects(t *testing.T) {
	u := NewUnsubscriber(testKey(1), "https://mail.example.org")
	e := digest("d/1", "u_1")
	tok := u.Token(e.Tenant(), e.UserID, e.Channel, e.ConsentSnapshot.UnsubscribeRef)
	raw, _ := base64.RawURLEncoding.DecodeString(tok)
	flip := func(i int) string {
		b := bytes.Clone(raw)
		b[i] ^= 1
		return base64.RawURLEncoding.EncodeToString(b)
	}
	// A token signed by another key, and one for a bad channel.
	other := NewUnsubscriber(testKey(2), "https://mail.example.org").Token("default", "u_1", envelope.ChannelEmail, "r")
	badChannel := u.Token("default", "u_1", envelope.Channel("fax"), "r")
	noUser := u.Token("default", "", envelope.ChannelEmail, "r")
	tests := map[string]string{
		"Empty":          "",
		"NotBase64":      "!!!!",
		"Padded":         tok + "=",
		"Truncated":      tok[:len(tok)-1],
		"Short":          base64.RawURLEncoding.EncodeToString(raw[:20]),
		"FlipPayload":    flip(3),
		"FlipMAC":        flip(len(raw) - 1),
		"Appended":       base64.RawURLEncoding.EncodeToString(append(bytes.Clone(raw), 0)),
		"OtherKey":       other,
		"BadChannel":     badChannel,
		"NoUser":         noUser,
		"StdBase64":      base64.RawStdEncoding.EncodeToString(raw) + "+/",
		"Huge":           strings.Repeat("A", maxTokenLen+1),
		"TrailingBitsOn": trailingBits(tok),
	}
	for name, bad := range tests {
		t.Run(name, func(t *testing.T) {
			if bad == tok {
				t.Skip("mutation produced the valid token")
			}
			if _, _, _, err := u.Verify(bad); err != ErrInvalidToken {
				t.Fatalf("Verify(%s) err = %v, want ErrInvalidToken", name, err)
			}
		})
	}
	// Different refs give different tokens (a token is bound to its ref).
	if u.Token("default", "u_1", envelope.ChannelEmail, "a") == u.Token("default", "u_1", envelope.ChannelEmail, "b") {
		t.Fatal("tokens do not bind the unsubscribe_ref")
	}
}

// trailingBits changes the unused low bits of the token's last character,
// which a lenient base64 decoder would ignore.
func trailingBits(tok string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	if len(tok)%4 == 0 {
		return tok + "A" // not a valid length either way
	}
	last := strings.IndexByte(alphabet, tok[len(tok)-1])
	return tok[:len(tok)-1] + string(alphabet[last^1])
}

func TestNewUnsubscriber_ShortKeyPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic on a 4-byte key")
		}
	}()
	NewUnsubscriber([]byte("abcd"), "https://x.example")
}

func TestLoadOrCreateKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	k1, err := LoadOrCreateKey(dir)
	if err != nil || len(k1) != KeySize {
		t.Fatalf("create: %d bytes, %v", len(k1), err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	k2, err := LoadOrCreateKey(dir)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("reload differs: %v", err)
	}
	if bytes.Equal(k1, make([]byte, KeySize)) {
		t.Fatal("key is all zeros")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("stray files: %v", entries)
	}
	// Concurrent creators agree on one key.
	dir2 := t.TempDir()
	keys := make([][]byte, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := LoadOrCreateKey(dir2)
			if err != nil {
				t.Errorf("concurrent create: %v", err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if !bytes.Equal(k, keys[0]) {
			t.Fatal("concurrent callers got different keys")
		}
	}
	// A damaged key file is an error, not a silent new key.
	if err := os.WriteFile(filepath.Join(dir, KeyFile), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(dir); err == nil {
		t.Fatal("a 5-byte key file was accepted")
	}
}

// unsubFixture enqueues a digest for a user with full consent and returns
// the fixture and the envelope's unsubscribe path.
func unsubFixture(t *testing.T) (*fixture, *envelope.Envelope, string) {
	f := newFixture(t)
	f.grant("", "u_1")
	e := digest("d/1", "u_1")
	f.enqueue(http.StatusCreated, e)
	link := f.unsub.URL(e)
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	return f, e, strings.TrimPrefix(u.Path, "/outbox")
}

func (f *fixture) consent(tenant, user string) queue.Consent {
	f.t.Helper()
	c, err := f.q.Consent(context.Background(), tenant, user)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func TestUnsubscribe_GetChangesNothing(t *testing.T) {
	f, _, path := unsubFixture(t)
	before := f.consent("", "u_1")
	w := f.call("GET", path, "", noAuth)
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("GET: %d %s", w.Code, w.Header().Get("Content-Type"))
	}
	body := w.Body.String()
	for _, want := range []string{`<form method="post">`, `name="confirm" value="1"`, `<button type="submit">`, `lang="en"`, "digest and reminder e-mails"} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q:\n%s", want, body)
		}
	}
	if w.Header().Get("Referrer-Policy") != "no-referrer" || !strings.Contains(w.Header().Get("Content-Security-Policy"), "form-action 'self'") {
		t.Errorf("headers %v", w.Header())
	}
	after := f.consent("", "u_1")
	if !after.DigestEnabled || len(after.Suppressions) != len(before.Suppressions) {
		t.Fatalf("GET changed consent: %+v", after)
	}
	// HEAD (a link scanner) changes nothing either.
	f.call("HEAD", path, "", noAuth)
	if c := f.consent("", "u_1"); !c.DigestEnabled || len(c.Suppressions) != 0 {
		t.Fatalf("HEAD changed consent: %+v", c)
	}
}

func TestUnsubscribe_OneClick(t *testing.T) {
	f, e, path := unsubFixture(t)
	w := f.call("POST", path, "List-Unsubscribe=One-Click", noAuth, withHeader("Content-Type", "application/x-www-form-urlencoded"))
	if w.Code != 200 || w.Body.Len() != 0 || w.Header().Get("Location") != "" {
		t.Fatalf("one-click: %d %q location %q", w.Code, w.Body, w.Header().Get("Location"))
	}
	c := f.consent("", "u_1")
	if c.DigestEnabled || !c.PushEnabled || !c.EmailVerified || c.Cadence != "weekly" {
		t.Fatalf("flags after unsubscribe: %+v (digest off, others kept)", c.ConsentFlags)
	}
	if len(c.Suppressions) != 1 || c.Suppressions[0].Channel != envelope.ChannelEmail || c.Suppressions[0].Reason != envelope.ClassUnsubscribed {
		t.Fatalf("suppressions %+v", c.Suppressions)
	}
	// Nothing more is delivered: the seam does not hand the digest out.
	if p := f.pending("email", 10); len(p.Envelopes) != 0 {
		t.Fatalf("unsubscribed digest handed out")
	}
	if st := f.get("", e.ID); st.Status != string(envelope.StateSuppressed) {
		t.Fatalf("digest status %s", st.Status)
	}
	// Repeating is harmless.
	if w := f.call("POST", path, "List-Unsubscribe=One-Click", noAuth, withHeader("Content-Type", "application/x-www-form-urlencoded")); w.Code != 200 {
		t.Fatalf("repeat: %d", w.Code)
	}
	if c := f.consent("", "u_1"); len(c.Suppressions) != 1 {
		t.Fatalf("repeat added suppressions: %+v", c.Suppressions)
	}
}

func TestUnsubscribe_Multipart(t *testing.T) {
	f, _, path := unsubFixture(t)
	body := "--b\r\nContent-Disposition: form-data; name=\"List-Unsubscribe\"\r\n\r\nOne-Click\r\n--b--\r\n"
	w := f.call("POST", path, body, noAuth, withHeader("Content-Type", "multipart/form-data; boundary=b"))
	if w.Code != 200 || w.Body.Len() != 0 {
		t.Fatalf("multipart one-click: %d %q", w.Code, w.Body)
	}
	if c := f.consent("", "u_1"); c.DigestEnabled {
		t.Fatal("not unsubscribed")
	}
}

func TestUnsubscribe_BrowserForm(t *testing.T) {
	f, _, path := unsubFixture(t)
	w := f.call("POST", path, "confirm=1", noAuth, withHeader("Content-Type", "application/x-www-form-urlencoded"))
	if w.Code != 200 || !strings.Contains(w.Body.String(), "You are unsubscribed") || w.Header().Get("Location") != "" {
		t.Fatalf("form: %d %s", w.Code, w.Body)
	}
	if c := f.consent("", "u_1"); c.DigestEnabled || len(c.Suppressions) != 1 {
		t.Fatalf("not unsubscribed: %+v", c)
	}
}

func TestUnsubscribe_PushKeepsEmail(t *testing.T) {
	f := newFixture(t)
	f.grant("", "u_1")
	link, _ := url.Parse(f.unsub.URL(nudge("n/1", "u_1")))
	path := strings.TrimPrefix(link.Path, "/outbox")
	if w := f.call("POST", path, "List-Unsubscribe=One-Click", noAuth); w.Code != 200 {
		t.Fatalf("push unsubscribe: %d", w.Code)
	}
	c := f.consent("", "u_1")
	if !c.DigestEnabled || len(c.Suppressions) != 1 || c.Suppressions[0].Channel != envelope.ChannelPush {
		t.Fatalf("consent %+v", c)
	}
}

func TestUnsubscribe_Tampered(t *testing.T) {
	f, _, path := unsubFixture(t)
	tok := strings.TrimPrefix(path, "/unsubscribe/")
	raw, _ := base64.RawURLEncoding.DecodeString(tok)
	raw[5] ^= 0x20
	bad := "/unsubscribe/" + base64.RawURLEncoding.EncodeToString(raw)
	other := "/unsubscribe/" + NewUnsubscriber(testKey(9), "").Token("default", "u_1", envelope.ChannelEmail, "x")
	for _, p := range []string{bad, other, "/unsubscribe/garbage", "/unsubscribe/" + tok + "A"} {
		for _, m := range []string{"GET", "POST"} {
			w := f.call(m, p, "List-Unsubscribe=One-Click", noAuth, withHeader("Content-Type", "application/x-www-form-urlencoded"))
			if w.Code != http.StatusBadRequest || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") || w.Header().Get("Location") != "" {
				t.Errorf("%s %s: %d %s", m, p, w.Code, w.Header())
			}
		}
	}
	if c := f.consent("", "u_1"); !c.DigestEnabled || len(c.Suppressions) != 0 {
		t.Fatalf("a tampered token changed consent: %+v", c)
	}
}

func TestUnsubscribe_BodyTooLarge(t *testing.T) {
	f, _, path := unsubFixture(t)
	w := f.call("POST", path, "x="+strings.Repeat("a", maxFormBytes), noAuth, withHeader("Content-Type", "application/x-www-form-urlencoded"))
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d", w.Code)
	}
	if c := f.consent("", "u_1"); !c.DigestEnabled {
		t.Fatal("unsubscribed despite the 413")
	}
}

func TestUnsubscribe_NotServedWithoutUnsubscriber(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Unsub = nil })
	if w := f.call("GET", "/unsubscribe/x", "", noAuth); w.Code != http.StatusNotFound {
		t.Fatalf("status %d", w.Code)
	}
}

// After a one-click unsubscribe, an explicit opt-in over the API lifts the
// unsubscribe: digests are accepted again, and the history says who.
func TestUnsubscribe_ReOptInLifts(t *testing.T) {
	f, _, path := unsubFixture(t)
	if w := f.call("POST", path, "List-Unsubscribe=One-Click", noAuth, withHeader("Content-Type", "application/x-www-form-urlencoded")); w.Code != 200 {
		t.Fatalf("one-click: %d", w.Code)
	}
	f.enqueue(http.StatusConflict, digest("d/2", "u_1"))
	w := f.call("PUT", "/v1/consent/u_1", `{"digest_enabled":true,"push_enabled":true,"email_verified":true}`)
	if w.Code != 200 {
		t.Fatalf("PUT consent: %d %s", w.Code, w.Body)
	}
	c := f.consent("", "u_1")
	if len(c.Suppressions) != 0 {
		t.Fatalf("the unsubscribe stayed after the opt-in: %+v", c.Suppressions)
	}
	f.enqueue(http.StatusCreated, digest("d/2", "u_1"))
	var bys []string
	for _, h := range c.History {
		bys = append(bys, h.By+":"+h.Change)
	}
	got := strings.Join(bys, "; ")
	for _, want := range []string{":suppressed email unsubscribed", "unsubscribe_link:set digest_enabled=false", "api:set digest_enabled=true", "api:lifted email unsubscribed"} {
		if !strings.Contains(got, want) {
			t.Fatalf("history %q lacks %q", got, want)
		}
	}
}

// brandFixture is unsubFixture with a brand on the pages.
func brandFixture(t *testing.T, b render.Brand) (*fixture, string) {
	f := newFixture(t, func(c *Config) { c.Brand = b })
	f.grant("", "u_1")
	e := digest("d/1", "u_1")
	f.enqueue(http.StatusCreated, e)
	u, err := url.Parse(f.unsub.URL(e))
	if err != nil {
		t.Fatal(err)
	}
	return f, strings.TrimPrefix(u.Path, "/outbox")
}

var pageBrand = render.Brand{
	Name:           "Podcast Companion",
	Color:          "#C2410C",
	LogoURL:        "https://cdn.example.org/brand/logo.png",
	Address:        "Podcast Companion Ltd, 1 Market Street, Bristol",
	PreferencesURL: "https://app.example.org/settings/notifications",
}

// styleHashed reports whether the page's <style> is the one its CSP
// allows by hash (a brand colour in the style changes the hash).
func styleHashed(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	body := w.Body.String()
	i, j := strings.Index(body, "<style>"), strings.Index(body, "</style>")
	if i < 0 || j < i {
		t.Fatalf("no style in\n%s", body)
	}
	sum := sha256.Sum256([]byte(body[i+len("<style>") : j]))
	if want := "style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(w.Header().Get("Content-Security-Policy"), want) {
		t.Fatalf("CSP %q does not allow the page's style (%s)", w.Header().Get("Content-Security-Policy"), want)
	}
}

// The pages name the product and the list the link was for, in the
// brand's colour and logo, with the preferences link and the address.
func TestUnsubscribe_PagesBranded(t *testing.T) {
	f, path := brandFixture(t, pageBrand)
	w := f.call("GET", path, "", noAuth)
	body := w.Body.String()
	for _, want := range []string{
		"<title>Unsubscribe · Podcast Companion</title>",
		`<img src="https://cdn.example.org/brand/logo.png" alt="Podcast Companion"`,
		"stop receiving digest and reminder e-mails from Podcast Companion?",
		"background:#c2410c;color:#ffffff",
		`<a href="https://app.example.org/settings/notifications">Manage all your Podcast Companion preferences</a>`,
		"<footer>Podcast Companion Ltd, 1 Market Street, Bristol</footer>",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q:\n%s", want, body)
		}
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "img-src https://cdn.example.org;") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q", csp)
	}
	styleHashed(t, w)

	// A push link names push notifications; the default brand is outbox
	// and allows no images.
	g := newFixture(t)
	link, _ := url.Parse(g.unsub.URL(nudge("n/1", "u_1")))
	w = g.call("GET", strings.TrimPrefix(link.Path, "/outbox"), "", noAuth)
	if !strings.Contains(w.Body.String(), "stop receiving push notifications from outbox?") || strings.Contains(w.Header().Get("Content-Security-Policy"), "img-src") {
		t.Errorf("push page:\n%s\n%s", w.Header(), w.Body)
	}
	styleHashed(t, w)
}

// Brand values with markup come out as text.
func TestUnsubscribe_PagesHostileBrand(t *testing.T) {
	f, path := brandFixture(t, render.Brand{
		Name:           `"Evil" <script>alert(1)</script>`,
		LogoURL:        `https://cdn.example.org/l.png?"><script>alert(2)</script>`,
		Address:        `<b>1 Main St</b>`,
		PreferencesURL: `https://app.example.org/p?"><script>alert(3)</script>`,
	})
	for _, w := range []*httptest.ResponseRecorder{
		f.call("GET", path, "", noAuth),
		f.call("POST", path, "confirm=1", noAuth, withHeader("Content-Type", "application/x-www-form-urlencoded")),
	} {
		body := w.Body.String()
		if w.Code != 200 || strings.Contains(body, "<script>") || strings.Contains(body, "<b>") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Fatalf("%d:\n%s", w.Code, body)
		}
	}
	_, err := New(Config{Store: f.q, Unsub: f.unsub, Brand: render.Brand{Name: "a\r\nb"}})
	if err == nil || !strings.Contains(err.Error(), "Config.Brand") || !strings.Contains(err.Error(), "Brand.Name") {
		t.Fatalf("New with a two-line brand name: %v", err)
	}
}

// resubscribeAction unsubscribes through the page's form and returns the
// path its "Subscribe again" form posts to ("" when it has none).
func resubscribeAction(t *testing.T, f *fixture, path string) string {
	t.Helper()
	w := f.call("POST", path, "confirm=1", noAuth, withHeader("Content-Type", "application/x-www-form-urlencoded"))
	if w.Code != 200 {
		t.Fatalf("unsubscribe: %d %s", w.Code, w.Body)
	}
	body := w.Body.String()
	i := strings.Index(body, `<form method="post" action="`)
	if i < 0 {
		return ""
	}
	action := body[i+len(`<form method="post" action="`):]
	action = action[:strings.IndexByte(action, '"')]
	base, _ := url.Parse("https://mail.example.org/outbox" + path)
	ref, err := url.Parse(action)
	if err != nil {
		t.Fatal(err)
	}
	u := base.ResolveReference(ref)
	if !strings.HasPrefix(u.Path, "/outbox/unsubscribe/") {
		t.Fatalf("the form posts to %s, outside the mount point", u.Path)
	}
	return strings.TrimPrefix(u.Path, "/outbox")
}

// After unsubscribing, the page offers a way back: its button re-opts the
// user in through SetConsent (history by unsubscribe_page), which lifts
// the unsubscribe the way an opt-in does; digests are accepted again.
func TestUnsubscribe_Resubscribe(t *testing.T) {
	f, path := brandFixture(t, pageBrand)
	action := resubscribeAction(t, f, path)
	if action != path+"/resubscribe" {
		t.Fatalf("resubscribe form posts to %q", action)
	}
	if c := f.consent("", "u_1"); c.DigestEnabled || len(c.Suppressions) != 1 {
		t.Fatalf("not unsubscribed: %+v", c)
	}
	f.enqueue(http.StatusConflict, digest("d/2", "u_1"))

	w := f.call("POST", action, "", noAuth, withHeader("Content-Type", "application/x-www-form-urlencoded"))
	body := w.Body.String()
	if w.Code != 200 || !strings.Contains(body, "You are subscribed again") || !strings.Contains(body, "receive digest and reminder e-mails from Podcast Companion again") || strings.Contains(body, "still paused") {
		t.Fatalf("resubscribe: %d\n%s", w.Code, body)
	}
	styleHashed(t, w)
	c := f.consent("", "u_1")
	if !c.DigestEnabled || !c.EmailVerified || !c.PushEnabled || len(c.Suppressions) != 0 {
		t.Fatalf("consent after resubscribe: %+v", c)
	}
	var hist []string
	for _, h := range c.History {
		hist = append(hist, h.By+":"+h.Change)
	}
	got := strings.Join(hist, "; ")
	for _, want := range []string{"unsubscribe_page:set digest_enabled=true", "unsubscribe_page:lifted email unsubscribed"} {
		if !strings.Contains(got, want) {
			t.Errorf("history %q lacks %q", got, want)
		}
	}
	f.enqueue(http.StatusCreated, digest("d/2", "u_1"))
	if !strings.Contains(f.logs.String(), "msg=resubscribed") || strings.Contains(f.logs.String(), "u_1") {
		t.Errorf("logs:\n%s", f.logs)
	}

	// One-click still works afterwards, unchanged: 200, empty body.
	w = f.call("POST", path, "List-Unsubscribe=One-Click", noAuth, withHeader("Content-Type", "application/x-www-form-urlencoded"))
	if w.Code != 200 || w.Body.Len() != 0 {
		t.Fatalf("one-click after resubscribe: %d %q", w.Code, w.Body)
	}
	if c := f.consent("", "u_1"); c.DigestEnabled || len(c.Suppressions) != 1 {
		t.Fatalf("one-click after resubscribe: %+v", c)
	}
}

func TestUnsubscribe_ResubscribeChannels(t *testing.T) {
	t.Run("Push", func(t *testing.T) {
		f := newFixture(t)
		f.grant("", "u_1")
		link, _ := url.Parse(f.unsub.URL(nudge("n/1", "u_1")))
		path := strings.TrimPrefix(link.Path, "/outbox")
		action := resubscribeAction(t, f, path)
		if action == "" {
			t.Fatal("no resubscribe form after a push unsubscribe")
		}
		if w := f.call("POST", action, "", noAuth); w.Code != 200 {
			t.Fatalf("resubscribe: %d %s", w.Code, w.Body)
		}
		if c := f.consent("", "u_1"); !c.PushEnabled || len(c.Suppressions) != 0 {
			t.Fatalf("push consent: %+v", c)
		}
	})
	t.Run("TelegramHasNoOptIn", func(t *testing.T) {
		f := newFixture(t)
		f.grant("", "u_1")
		link, _ := url.Parse(f.unsub.URL(reply("r/1", "u_1", "hi")))
		path := strings.TrimPrefix(link.Path, "/outbox")
		if action := resubscribeAction(t, f, path); action != "" {
			t.Fatalf("a resubscribe form (%s) for a channel without an opt-in flag", action)
		}
		if w := f.call("POST", path+"/resubscribe", "", noAuth); w.Code != http.StatusBadRequest {
			t.Fatalf("telegram resubscribe: %d", w.Code)
		}
		if c := f.consent("", "u_1"); len(c.Suppressions) != 1 {
			t.Fatalf("telegram suppression lifted: %+v", c)
		}
	})
	t.Run("ComplaintStays", func(t *testing.T) {
		f, path := brandFixture(t, render.Brand{})
		action := resubscribeAction(t, f, path)
		if err := f.q.Suppress(context.Background(), "", "u_1", queue.Suppression{Channel: envelope.ChannelEmail, Target: "t", Reason: envelope.ClassComplaint}); err != nil {
			t.Fatal(err)
		}
		w := f.call("POST", action, "", noAuth)
		if w.Code != 200 || !strings.Contains(w.Body.String(), "still paused") {
			t.Fatalf("resubscribe with a complaint: %d\n%s", w.Code, w.Body)
		}
		if c := f.consent("", "u_1"); len(c.Suppressions) != 1 || c.Suppressions[0].Reason != envelope.ClassComplaint {
			t.Fatalf("suppressions %+v", c.Suppressions)
		}
	})
	t.Run("Tampered", func(t *testing.T) {
		f, path := brandFixture(t, render.Brand{})
		action := resubscribeAction(t, f, path)
		bad := strings.Replace(action, "/unsubscribe/", "/unsubscribe/A", 1)
		other := "/unsubscribe/" + NewUnsubscriber(testKey(9), "").Token("default", "u_1", envelope.ChannelEmail, "x") + "/resubscribe"
		for _, p := range []string{bad, other} {
			if w := f.call("POST", p, "", noAuth); w.Code != http.StatusBadRequest {
				t.Errorf("%s: %d", p, w.Code)
			}
		}
		if w := f.call("GET", action, "", noAuth); w.Code != http.StatusMethodNotAllowed {
			t.Errorf("GET resubscribe: %d (a link scanner must not resubscribe)", w.Code)
		}
		if c := f.consent("", "u_1"); c.DigestEnabled || len(c.Suppressions) != 1 {
			t.Fatalf("consent changed: %+v", c)
		}
	})
}

// A key that does not exist in a directory that cannot be written (a
// read-only mount) is an error naming the key's file and what to do.
func TestLoadOrCreateKey_CannotBeMade(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(file, "data") // under a file: no directory can be made
	_, err := LoadOrCreateKey(dir)
	want := filepath.Join(dir, KeyFile) + " does not exist and cannot be made (not a directory): run serve once on a writable --data"
	if err == nil || !strings.Contains(err.Error(), want) || strings.Count(err.Error(), "unsubscribe key") != 1 {
		t.Fatalf("LoadOrCreateKey under a file = %v, want %q", err, want)
	}
}
