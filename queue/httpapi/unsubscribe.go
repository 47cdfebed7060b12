package httpapi

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/internal/nofollow"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/render"
)

// KeyFile is the name of the unsubscribe signing key in the data directory.
const KeyFile = "unsubscribe.key"

// KeySize is the size of the unsubscribe signing key in bytes.
const KeySize = 32

// ErrInvalidToken is returned by Unsubscriber.Verify for a token that is
// malformed, tampered with or signed with another key.
var ErrInvalidToken = errors.New("httpapi: invalid unsubscribe token")

// LoadOrCreateKey returns the unsubscribe signing key kept in
// <dir>/unsubscribe.key, creating it (KeySize random bytes, mode 0600) when
// it does not exist. Creation is atomic: the key is written to a temporary
// file, synced, and linked into place, so a concurrent caller (or a crash)
// never sees a partial key and two callers end up with the same key.
func LoadOrCreateKey(dir string) ([]byte, error) {
	path := filepath.Join(dir, KeyFile)
	key, err := readKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return key, err
	}
	if key, err = createKey(dir, path); err != nil {
		// Name the file and what to do, without the temporary name.
		return nil, fmt.Errorf("unsubscribe key %s does not exist and cannot be made (%w): run serve once on a writable --data, or put the key there", path, cause(err))
	}
	return key, nil
}

// cause is the system's reason for a failed file operation, without the path.
func cause(err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return pe.Err
	}
	if le := (*os.LinkError)(nil); errors.As(err, &le) {
		return le.Err
	}
	return err
}

func createKey(dir, path string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key := make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(dir, KeyFile+".*.tmp")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	err = tmp.Chmod(0o600)
	if err == nil {
		_, err = tmp.Write(key)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	// link fails if the key appeared meanwhile: then that one wins.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return readKey(path)
		}
		return nil, err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return key, nil
}

// readKey reads the key, never through a symbolic link: a link planted
// as the key could point at a file whose bytes someone else knows, and
// let them forge unsubscribe tokens.
func readKey(path string) ([]byte, error) {
	key, err := nofollow.ReadFile(path, KeyFile, 4096)
	if err != nil {
		return nil, err
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("unsubscribe key %s: want %d bytes, found %d", path, KeySize, len(key))
	}
	return key, nil
}

// Unsubscriber signs and verifies one-click unsubscribe references with
// HMAC-SHA256. A token binds the tenant, the user, the channel and the
// envelope's consent_snapshot.unsubscribe_ref; it is base64url without
// padding, and cannot be forged or guessed without the key. The tenant and
// user ids travel in the token in the clear (signed, not encrypted); no
// address or other contact detail does. It is safe for concurrent use.
type Unsubscriber struct {
	key  []byte
	base string
}

// tokenVersion is the first byte of every token.
const tokenVersion = 1

// tokenDomain separates these MACs from any other use of the key.
const tokenDomain = "outbox/unsubscribe/v1\x00"

// maxTokenLen bounds the tokens Verify looks at.
const maxTokenLen = 4096

// NewUnsubscriber returns an Unsubscriber signing with key (at least 16
// bytes; LoadOrCreateKey makes one) whose links start with baseURL, the
// public URL under which the handler is mounted (a trailing "/" is
// ignored). It panics on a shorter key: that is a programming mistake.
func NewUnsubscriber(key []byte, baseURL string) *Unsubscriber {
	if len(key) < 16 {
		panic("httpapi: unsubscribe key shorter than 16 bytes")
	}
	return &Unsubscriber{key: append([]byte(nil), key...), base: strings.TrimRight(baseURL, "/")}
}

// URL returns the one-click unsubscribe link of e:
// baseURL + "/unsubscribe/" + token. The renderer's UnsubscribeURL is this
// method.
func (u *Unsubscriber) URL(e *envelope.Envelope) string {
	return u.base + "/unsubscribe/" + u.Token(e.Tenant(), e.UserID, e.Channel, e.ConsentSnapshot.UnsubscribeRef)
}

// Token returns the signed token for a user's channel and unsubscribe_ref.
func (u *Unsubscriber) Token(tenant, user string, ch envelope.Channel, ref string) string {
	b := []byte{tokenVersion}
	for _, s := range []string{tenant, user, string(ch), ref} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = append(b, u.mac(b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (u *Unsubscriber) mac(payload []byte) []byte {
	m := hmac.New(sha256.New, u.key)
	m.Write([]byte(tokenDomain))
	m.Write(payload)
	return m.Sum(nil)
}

// Verify checks a token made by URL or Token and returns what it binds.
// Any malformed, altered or foreign token is ErrInvalidToken.
func (u *Unsubscriber) Verify(token string) (tenant, user string, ch envelope.Channel, err error) {
	if len(token) == 0 || len(token) > maxTokenLen {
		return "", "", "", ErrInvalidToken
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(token)
	if err != nil || len(raw) < 1+sha256.Size {
		return "", "", "", ErrInvalidToken
	}
	payload, sum := raw[:len(raw)-sha256.Size], raw[len(raw)-sha256.Size:]
	if !hmac.Equal(sum, u.mac(payload)) {
		return "", "", "", ErrInvalidToken
	}
	if payload[0] != tokenVersion {
		return "", "", "", ErrInvalidToken
	}
	rest := payload[1:]
	var fields [4]string
	for i := range fields {
		n, k := binary.Uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k) {
			return "", "", "", ErrInvalidToken
		}
		fields[i] = string(rest[k : k+int(n)])
		rest = rest[k+int(n):]
	}
	ch = envelope.Channel(fields[2])
	if len(rest) != 0 || !ch.Valid() || fields[0] == "" || fields[1] == "" {
		return "", "", "", ErrInvalidToken
	}
	return fields[0], fields[1], ch, nil
}

// maxFormBytes bounds the body of an unsubscribe POST.
const maxFormBytes = 8 << 10

// byUnsubscribePage is who a resubscribe from the page is, in the
// consent history.
const byUnsubscribePage = "unsubscribe_page"

// unsubscribePage answers GET /unsubscribe/{token} with a confirmation page
// whose button POSTs to the same URL. It changes nothing, so link scanners
// that follow the link unsubscribe nobody.
func (a *api) unsubscribePage(w http.ResponseWriter, r *http.Request) error {
	_, _, ch, err := a.cfg.Unsub.Verify(r.PathValue("token"))
	if err != nil {
		writeText(w, http.StatusBadRequest, "This unsubscribe link is not valid.\n")
		return nil
	}
	a.pages.write(w, pageData{Step: stepConfirm, Title: "Unsubscribe", List: listName(ch)})
	return nil
}

// unsubscribe answers POST /unsubscribe/{token}: it suppresses the
// channel for the user and, for email, turns digest_enabled off (other
// flags kept). An RFC 8058 one-click POST (body List-Unsubscribe=One-Click)
// gets 200 with an empty body; the confirmation page's form (confirm=1)
// gets a small HTML page, which offers to subscribe again. Never a
// redirect.
func (a *api) unsubscribe(w http.ResponseWriter, r *http.Request) error {
	token := r.PathValue("token")
	tenant, user, ch, err := a.cfg.Unsub.Verify(token)
	if err != nil {
		writeText(w, http.StatusBadRequest, "This unsubscribe link is not valid.\n")
		return nil
	}
	browser, err := confirmed(w, r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeText(w, http.StatusRequestEntityTooLarge, "Request body too large.\n")
			return nil
		}
		// An unreadable body is still a one-click POST.
	}
	ctx := r.Context()
	err = a.cfg.Store.Suppress(ctx, tenant, user, queue.Suppression{Channel: ch, Reason: envelope.ClassUnsubscribed})
	if err == nil && ch == envelope.ChannelEmail {
		var c queue.Consent
		if c, err = a.cfg.Store.Consent(ctx, tenant, user); err == nil {
			f := c.ConsentFlags
			f.DigestEnabled, f.By = false, "unsubscribe_link"
			err = a.cfg.Store.SetConsent(ctx, tenant, user, f)
		}
	}
	if err != nil {
		a.pageError(w, r, "POST /unsubscribe/{token}", err, "unsubscribe")
		return nil
	}
	a.log.Info("unsubscribed", "operation", "POST /unsubscribe/{token}", "channel", string(ch))
	if browser {
		d := pageData{Step: stepUnsubscribed, Title: "You are unsubscribed", List: listName(ch)}
		if _, ok := (queue.ConsentFlags{}).OptIn(ch); ok {
			// Relative to /…/unsubscribe/{token}: the handler may be
			// mounted under a prefix. A token has no "/" or ":".
			d.Resubscribe = token + "/resubscribe"
		}
		a.pages.write(w, d)
		return nil
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	return nil
}

// resubscribe answers POST /unsubscribe/{token}/resubscribe, the button
// of the page shown after unsubscribing: it sets the channel's opt-in
// flag through SetConsent (Consent.Set, by "unsubscribe_page"), which
// lifts the channel's unsubscribe like any explicit opt-in; bounces and
// complaints stay. The token is the unsubscribe link's: whoever holds the
// link can unsubscribe and then see this button anyway.
func (a *api) resubscribe(w http.ResponseWriter, r *http.Request) error {
	tenant, user, ch, err := a.cfg.Unsub.Verify(r.PathValue("token"))
	if err != nil {
		writeText(w, http.StatusBadRequest, "This link is not valid.\n")
		return nil
	}
	if _, err := confirmed(w, r); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeText(w, http.StatusRequestEntityTooLarge, "Request body too large.\n")
			return nil
		}
	}
	const op = "POST /unsubscribe/{token}/resubscribe"
	if _, ok := (queue.ConsentFlags{}).OptIn(ch); !ok {
		writeText(w, http.StatusBadRequest, "These messages cannot be turned back on from this page.\n")
		return nil
	}
	ctx := r.Context()
	c, err := a.cfg.Store.Consent(ctx, tenant, user)
	if err == nil {
		f, _ := c.ConsentFlags.OptIn(ch)
		f.By = byUnsubscribePage
		err = a.cfg.Store.SetConsent(ctx, tenant, user, f)
	}
	if err == nil {
		c, err = a.cfg.Store.Consent(ctx, tenant, user)
	}
	if err != nil {
		a.pageError(w, r, op, err, "subscribe you again")
		return nil
	}
	a.log.Info("resubscribed", "operation", op, "channel", string(ch))
	d := pageData{Step: stepResubscribed, Title: "You are subscribed again", List: listName(ch)}
	for _, s := range c.Suppressions {
		d.Held = d.Held || s.Channel == ch
	}
	a.pages.write(w, d)
	return nil
}

// pageError answers a failed unsubscribe or resubscribe in words, logging
// it as fail does.
func (a *api) pageError(w http.ResponseWriter, r *http.Request, op string, err error, what string) {
	ae, unexpected := errorFor(err)
	if unexpected {
		a.logFailed(what+" failed", op, w.Header().Get("X-Request-Id"), ae, err)
	}
	writeText(w, ae.Status, "Sorry, we could not "+what+" right now. Please try again later.\n")
}

// confirmed reads the POST form and reports whether it came from the
// confirmation page (confirm=1) rather than a one-click mail client.
func confirmed(w http.ResponseWriter, r *http.Request) (bool, error) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var err error
	if mt == "multipart/form-data" {
		err = r.ParseMultipartForm(maxFormBytes)
	} else {
		err = r.ParseForm()
	}
	if err != nil {
		return false, err
	}
	return r.PostForm.Get("confirm") == "1", nil
}

// listName names what a channel's unsubscribe stops: the list the link
// was for (an e-mail unsubscribe turns digest_enabled off, which every
// e-mail needs).
func listName(ch envelope.Channel) string {
	switch ch {
	case envelope.ChannelEmail:
		return "digest and reminder e-mails"
	case envelope.ChannelPush:
		return "push notifications"
	case envelope.ChannelTelegram:
		return "Telegram messages"
	case envelope.ChannelWeCom, envelope.ChannelWeComRobot, envelope.ChannelWeComBotReply:
		return "WeCom messages"
	}
	return "messages"
}

// The steps of the unsubscribe pages.
const (
	stepConfirm      = "confirm"
	stepUnsubscribed = "unsubscribed"
	stepResubscribed = "resubscribed"
)

// pageData is what one unsubscribe page shows.
type pageData struct {
	Step  string
	Title string
	List  string // listName
	// Resubscribe is the relative URL of the resubscribe form ("": none).
	Resubscribe string
	// Held: the channel still has a suppression (a bounce, a complaint)
	// after the resubscribe.
	Held bool
	// Brand is filled in by pages.write.
	Brand render.Brand
}

// pages renders the unsubscribe pages of one brand. The style holds the
// brand colour and is allowed by its hash; the logo, when there is one,
// by its origin.
type pages struct {
	brand      render.Brand
	style, csp string
}

func newPages(b render.Brand) (*pages, error) {
	b, err := b.Normalize()
	if err != nil {
		return nil, fmt.Errorf("httpapi: Config.Brand: %w", err)
	}
	style := `body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;max-width:32rem;margin:3rem auto;padding:0 1rem;line-height:1.5;color:#1a1a1a;background:#fff}` +
		`.brand{margin:0 0 2rem;font-weight:700;font-size:1.1rem}.brand img{display:block;height:32px;width:auto;max-width:240px}` +
		`h1{font-size:1.6rem;line-height:1.25;margin:0 0 .75rem}` +
		`form{margin:1.25rem 0}` +
		`button{font:inherit;font-weight:600;padding:.6rem 1.2rem;border:2px solid ` + b.Color + `;border-radius:.4rem;background:` + b.Color + `;color:` + b.ButtonText() + `;cursor:pointer}` +
		`.secondary button{background:#fff;color:#1a1a1a;border-color:#1a1a1a}` +
		`button:focus-visible{outline:3px solid #1a1a1a;outline-offset:2px}` +
		`a{color:` + b.LinkColor() + `}.note{color:#57606a;font-size:.95rem}` +
		`footer{margin-top:2.5rem;padding-top:1rem;border-top:1px solid #d8dee4;color:#57606a;font-size:.85rem}`
	sum := sha256.Sum256([]byte(style))
	csp := "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	if o := b.LogoOrigin(); o != "" {
		csp += "; img-src " + o
	}
	csp += "; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
	return &pages{brand: b, style: style, csp: csp}, nil
}

var pageTemplate = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>{{.Title}} · {{.Brand.Name}}</title>
<style>{{.Style}}</style>
</head>
<body>
<header class="brand">{{if .Brand.LogoURL}}<img src="{{.Brand.LogoURL}}" alt="{{.Brand.Name}}" height="32">{{else}}{{.Brand.Name}}{{end}}</header>
<main>
<h1>{{.Title}}</h1>
{{- if eq .Step "confirm"}}
<p>Do you want to stop receiving {{.List}} from {{.Brand.Name}}?</p>
<form method="post">
<input type="hidden" name="confirm" value="1">
<button type="submit">Unsubscribe</button>
</form>
{{- else if eq .Step "unsubscribed"}}
<p role="status">You will no longer receive {{.List}} from {{.Brand.Name}}.</p>
{{- if .Resubscribe}}
<form method="post" action="{{.Resubscribe}}" class="secondary">
<p class="note">Unsubscribed by mistake?</p>
<button type="submit">Subscribe again</button>
</form>
{{- end}}
{{- else}}
<p role="status">You will receive {{.List}} from {{.Brand.Name}} again.</p>
{{- if .Held}}
<p class="note">Deliveries to you are still paused after a bounce or a spam report; contact {{.Brand.Name}} to resume them.</p>
{{- end}}
{{- end}}
{{- if .Brand.PreferencesURL}}
<p><a href="{{.Brand.PreferencesURL}}">Manage all your {{.Brand.Name}} preferences</a></p>
{{- end}}
</main>
{{- if .Brand.Address}}
<footer>{{.Brand.Address}}</footer>
{{- end}}
</body>
</html>
`))

func (p *pages) write(w http.ResponseWriter, d pageData) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer") // the URL holds the token
	h.Set("Content-Security-Policy", p.csp)
	w.WriteHeader(http.StatusOK)
	d.Brand = p.brand
	_ = pageTemplate.Execute(w, struct {
		pageData
		Style template.CSS
	}{d, template.CSS(p.style)})
}
