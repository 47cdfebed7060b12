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

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/internal/nofollow"
	"github.com/outboxhq/outbox/queue"
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
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("unsubscribe key: %w", err)
	}
	key = make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("unsubscribe key: %w", err)
	}
	tmp, err := os.CreateTemp(dir, KeyFile+".*.tmp")
	if err != nil {
		return nil, fmt.Errorf("unsubscribe key: %w", err)
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
		return nil, fmt.Errorf("unsubscribe key: %w", err)
	}
	// link fails if the key appeared meanwhile: then that one wins.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return readKey(path)
		}
		return nil, fmt.Errorf("unsubscribe key: %w", err)
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

// unsubscribePage answers GET /unsubscribe/{token} with a confirmation page
// whose button POSTs to the same URL. It changes nothing, so link scanners
// that follow the link unsubscribe nobody.
func (a *api) unsubscribePage(w http.ResponseWriter, r *http.Request) error {
	_, _, ch, err := a.cfg.Unsub.Verify(r.PathValue("token"))
	if err != nil {
		writeText(w, http.StatusBadRequest, "This unsubscribe link is not valid.\n")
		return nil
	}
	writePage(w, pageData{Title: "Unsubscribe", What: describe(ch), Confirm: true})
	return nil
}

// unsubscribe answers POST /unsubscribe/{token}: it suppresses the
// channel for the user and, for email, turns digest_enabled off (other
// flags kept). An RFC 8058 one-click POST (body List-Unsubscribe=One-Click)
// gets 200 with an empty body; the confirmation page's form (confirm=1)
// gets a small HTML page. Never a redirect.
func (a *api) unsubscribe(w http.ResponseWriter, r *http.Request) error {
	tenant, user, ch, err := a.cfg.Unsub.Verify(r.PathValue("token"))
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
		ae, unexpected := errorFor(err)
		if unexpected {
			a.log.Error("unsubscribe failed", "operation", "POST /unsubscribe/{token}",
				"request_id", w.Header().Get("X-Request-Id"), "error_type", fmt.Sprintf("%T", err))
		}
		writeText(w, ae.Status, "Sorry, we could not unsubscribe you right now. Please try again later.\n")
		return nil
	}
	a.log.Info("unsubscribed", "operation", "POST /unsubscribe/{token}", "channel", string(ch))
	if browser {
		writePage(w, pageData{Title: "You are unsubscribed", What: describe(ch)})
		return nil
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	return nil
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

// describe names what a channel's unsubscribe stops.
func describe(ch envelope.Channel) string {
	switch ch {
	case envelope.ChannelEmail:
		return "digest emails"
	case envelope.ChannelPush:
		return "push notifications"
	}
	return "messages"
}

type pageData struct {
	Title   string
	What    string
	Confirm bool // show the confirmation form
}

const pageStyle = `body{font-family:system-ui,sans-serif;max-width:32rem;margin:3rem auto;padding:0 1rem;line-height:1.5;color:#1a1a1a;background:#fff}` +
	`button{font:inherit;padding:.6rem 1.2rem;border:2px solid #1a1a1a;border-radius:.4rem;background:#fff;cursor:pointer}` +
	`button:focus-visible{outline:3px solid #0b57d0;outline-offset:2px}`

var page = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>{{.Title}}</title>
<style>` + pageStyle + `</style>
</head>
<body>
<main>
<h1>{{.Title}}</h1>
{{if .Confirm}}<p>Do you want to stop receiving {{.What}}?</p>
<form method="post">
<input type="hidden" name="confirm" value="1">
<button type="submit">Unsubscribe</button>
</form>
{{else}}<p role="status">You will no longer receive {{.What}}.</p>
{{end}}</main>
</body>
</html>
`))

// pageCSP allows nothing but the page's own inline style (by hash) and a
// form posting back to this origin.
var pageCSP = func() string {
	sum := sha256.Sum256([]byte(pageStyle))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) +
		"'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
}()

func writePage(w http.ResponseWriter, d pageData) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer") // the URL holds the token
	h.Set("Content-Security-Policy", pageCSP)
	w.WriteHeader(http.StatusOK)
	_ = page.Execute(w, d)
}
