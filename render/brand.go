package render

import (
	"fmt"
	"math"
	"net/mail"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Brand is who the messages and the unsubscribe pages speak for. The zero
// value is the default brand: DefaultProductName, DefaultBrandColor, no
// logo, no address, no preferences link.
//
// The values are configuration, not payload: they are checked once
// (Normalize) and then escaped wherever they are shown like any other
// text. A value that cannot be shown safely (a line break in a name that
// goes into the From header, a logo that is not https) is refused.
type Brand struct {
	// Name is the product's name, shown in e-mail headers, footers and
	// subject-free texts (WeCom, the push data, the unsubscribe pages).
	// Default DefaultProductName.
	Name string
	// SenderName is the display name of the From header (SenderAddress).
	// Default: the name the From address already has, else Name.
	SenderName string
	// Color is the brand colour, "#rgb" or "#rrggbb": the call-to-action
	// buttons, and links where it is readable on white. Default
	// DefaultBrandColor.
	Color string
	// LogoURL is an optional https URL of a logo shown atop e-mails and
	// pages (with Name as its alternative text). The same URL for every
	// recipient: it tells nothing about who opened what.
	LogoURL string
	// Address is the sender's postal address, one line, shown in the
	// footer of every e-mail. CAN-SPAM requires one in commercial e-mail.
	Address string
	// PreferencesURL is an optional http(s) URL where a user manages what
	// they get: linked in e-mail footers and the unsubscribe pages, and
	// the digest's call to action.
	PreferencesURL string
}

// Brand defaults.
const (
	// DefaultBrandColor is Brand.Color when it is empty.
	DefaultBrandColor = "#0b57d0"
	// maxBrandText bounds Name and SenderName (runes), maxAddress the
	// postal address, maxBrandURL the URLs (bytes).
	maxBrandText = 80
	maxAddress   = 300
	maxBrandURL  = 2048
)

// BrandError is a Brand value that Normalize refuses. Field is the Go
// field name ("SenderName"), so that a command can name its own flag; the
// message never repeats the value.
type BrandError struct {
	Field   string
	Problem string
}

func (e *BrandError) Error() string {
	return "render: Brand." + e.Field + " " + e.Problem
}

// Normalize returns b with its defaults filled in, surrounding spaces
// trimmed and the colour as lower-case "#rrggbb", or a *BrandError naming
// the first field that is refused.
func (b Brand) Normalize() (Brand, error) {
	b.Name = strings.TrimSpace(b.Name)
	b.SenderName = strings.TrimSpace(b.SenderName)
	b.Color = strings.TrimSpace(b.Color)
	b.LogoURL = strings.TrimSpace(b.LogoURL)
	b.Address = strings.TrimSpace(b.Address)
	b.PreferencesURL = strings.TrimSpace(b.PreferencesURL)
	if b.Name == "" {
		b.Name = DefaultProductName
	}
	if b.Color == "" {
		b.Color = DefaultBrandColor
	}
	for _, f := range []struct {
		field, v string
		max      int
	}{{"Name", b.Name, maxBrandText}, {"SenderName", b.SenderName, maxBrandText}, {"Address", b.Address, maxAddress}} {
		if p := lineProblem(f.v, f.max); p != "" {
			return Brand{}, &BrandError{Field: f.field, Problem: p}
		}
	}
	c, ok := parseHexColor(b.Color)
	if !ok {
		return Brand{}, &BrandError{Field: "Color", Problem: "is not a hex colour like #0b57d0 or #06c"}
	}
	b.Color = c.String()
	if b.LogoURL != "" {
		if p := urlProblem(b.LogoURL, true); p != "" {
			return Brand{}, &BrandError{Field: "LogoURL", Problem: p}
		}
	}
	if b.PreferencesURL != "" {
		if p := urlProblem(b.PreferencesURL, false); p != "" {
			return Brand{}, &BrandError{Field: "PreferencesURL", Problem: p}
		}
	}
	return b, nil
}

// lineProblem says why s cannot be a one-line brand text, or "".
func lineProblem(s string, max int) string {
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.ContainsFunc(s, func(r rune) bool {
		return r == '\r' || r == '\n' || r == '\u2028' || r == '\u2029' || r == '\u0085'
	}):
		return "contains a line break; it must be one line"
	case strings.ContainsFunc(s, func(r rune) bool {
		return unicode.IsControl(r) || (r >= 0x202A && r <= 0x202E) || (r >= 0x2066 && r <= 0x2069)
	}):
		return "contains a control character"
	case utf8.RuneCountInString(s) > max:
		return fmt.Sprintf("is longer than %d characters", max)
	}
	return ""
}

// urlProblem says why s cannot be a brand URL, or "": it must be an
// absolute URL (https when httpsOnly, else http or https) with a host and
// no user info, spaces or control characters.
func urlProblem(s string, httpsOnly bool) string {
	want := "an absolute http or https URL"
	if httpsOnly {
		want = "an absolute https URL"
	}
	if len(s) > maxBrandURL {
		return fmt.Sprintf("is longer than %d bytes", maxBrandURL)
	}
	if safeLink(s) == "" {
		return "is not " + want
	}
	u, err := url.Parse(s)
	if err != nil {
		return "is not " + want
	}
	if httpsOnly && !strings.EqualFold(u.Scheme, "https") {
		return "is not " + want
	}
	if u.User != nil {
		return "must not carry a user name or password"
	}
	return ""
}

// LogoOrigin returns the scheme and host of the logo ("" without one):
// what a Content-Security-Policy img-src must allow for the logo.
func (b Brand) LogoOrigin() string {
	u, err := url.Parse(b.LogoURL)
	if b.LogoURL == "" || err != nil {
		return ""
	}
	return strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host)
}

// Text colours on a brand-coloured button.
const (
	lightText = "#ffffff"
	darkText  = "#1f2328"
	// defaultLink is the link colour when the brand colour is too light
	// to read on white.
	defaultLink = "#0b57d0"
)

// ButtonText returns the text colour for a button of the (normalized)
// brand colour: white or near-black, whichever contrasts more.
func (b Brand) ButtonText() string {
	c, ok := parseHexColor(b.Color)
	if !ok {
		return lightText
	}
	white, dark := rgb{255, 255, 255}, rgb{0x1f, 0x23, 0x28}
	if contrast(c, white) >= contrast(c, dark) {
		return lightText
	}
	return darkText
}

// LinkColor returns the brand colour when it reaches WCAG AA contrast
// (4.5:1) on white, else the default link colour.
func (b Brand) LinkColor() string {
	c, ok := parseHexColor(b.Color)
	if !ok || contrast(c, rgb{255, 255, 255}) < 4.5 {
		return defaultLink
	}
	return c.String()
}

// SenderAddress returns the From header value for the address from
// ("addr@example.org" or "Name <addr@example.org>") with the display
// name SenderName, else the name from already has, else Name; net/mail
// quotes and encodes it. b must be normalized.
func (b Brand) SenderAddress(from string) (string, error) {
	a, err := mail.ParseAddress(strings.TrimSpace(from))
	if err != nil {
		return "", fmt.Errorf("render: the From address is not a valid e-mail address")
	}
	switch {
	case b.SenderName != "":
		a.Name = b.SenderName
	case a.Name == "":
		a.Name = b.Name
	}
	return a.String(), nil
}

// rgb is a colour.
type rgb struct{ r, g, b uint8 }

func (c rgb) String() string { return fmt.Sprintf("#%02x%02x%02x", c.r, c.g, c.b) }

// parseHexColor parses "#rgb" or "#rrggbb".
func parseHexColor(s string) (rgb, bool) {
	if !strings.HasPrefix(s, "#") {
		return rgb{}, false
	}
	h := s[1:]
	if len(h) == 3 {
		h = string([]byte{h[0], h[0], h[1], h[1], h[2], h[2]})
	}
	if len(h) != 6 {
		return rgb{}, false
	}
	n, err := strconv.ParseUint(h, 16, 32)
	if err != nil {
		return rgb{}, false
	}
	return rgb{uint8(n >> 16), uint8(n >> 8), uint8(n)}, true
}

// luminance is the WCAG relative luminance of c.
func luminance(c rgb) float64 {
	ch := func(v uint8) float64 {
		s := float64(v) / 255
		if s <= 0.04045 {
			return s / 12.92
		}
		return math.Pow((s+0.055)/1.055, 2.4)
	}
	return 0.2126*ch(c.r) + 0.7152*ch(c.g) + 0.0722*ch(c.b)
}

// contrast is the WCAG contrast ratio of two colours.
func contrast(a, b rgb) float64 {
	la, lb := luminance(a), luminance(b)
	if la < lb {
		la, lb = lb, la
	}
	return (la + 0.05) / (lb + 0.05)
}
