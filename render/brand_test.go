package render

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/outboxhq/outbox/envelope"
)

func TestBrand_Normalize(t *testing.T) {
	b, err := Brand{}.Normalize()
	if err != nil || b.Name != DefaultProductName || b.Color != DefaultBrandColor || b.SenderName != "" {
		t.Fatalf("zero brand: %+v %v", b, err)
	}
	b, err = Brand{Name: "  Podcast Companion ", Color: "#06C", LogoURL: "HTTPS://cdn.example.org/l.png", PreferencesURL: "http://127.0.0.1:3000/prefs"}.Normalize()
	if err != nil || b.Name != "Podcast Companion" || b.Color != "#0066cc" {
		t.Fatalf("brand: %+v %v", b, err)
	}
	if got := b.LogoOrigin(); got != "https://cdn.example.org" {
		t.Fatalf("LogoOrigin = %q", got)
	}

	long := strings.Repeat("é", maxBrandText+1)
	tests := []struct {
		name  string
		b     Brand
		field string
		says  string
	}{
		{"SenderCRLF", Brand{SenderName: "Evil\r\nBcc: victim@example.org"}, "SenderName", "line break"},
		{"SenderLF", Brand{SenderName: "Evil\nX"}, "SenderName", "line break"},
		{"SenderLineSeparator", Brand{SenderName: "Evil\u2028X"}, "SenderName", "line break"},
		{"NameNUL", Brand{Name: "a\x00b"}, "Name", "control character"},
		{"NameBidiOverride", Brand{Name: "abc\u202Egnp.exe"}, "Name", "control character"},
		{"NameTooLong", Brand{Name: long}, "Name", "longer than 80"},
		{"NameInvalidUTF8", Brand{Name: "a\xffb"}, "Name", "UTF-8"},
		{"AddressTwoLines", Brand{Address: "1 Main St\r\nTown"}, "Address", "one line"},
		{"ColorName", Brand{Color: "red"}, "Color", "hex colour"},
		{"ColorFive", Brand{Color: "#12345"}, "Color", "hex colour"},
		{"ColorNotHex", Brand{Color: "#ggg"}, "Color", "hex colour"},
		{"ColorCSS", Brand{Color: "#fff;background:url(https://evil.example/x)"}, "Color", "hex colour"},
		{"ColorSign", Brand{Color: "#+12345"}, "Color", "hex colour"},
		{"LogoHTTP", Brand{LogoURL: "http://cdn.example.org/l.png"}, "LogoURL", "https"},
		{"LogoJavascript", Brand{LogoURL: "javascript:alert(1)"}, "LogoURL", "https"},
		{"LogoRelative", Brand{LogoURL: "/logo.png"}, "LogoURL", "https"},
		{"LogoData", Brand{LogoURL: "data:image/png;base64,AAAA"}, "LogoURL", "https"},
		{"LogoUserInfo", Brand{LogoURL: "https://user:secret@cdn.example.org/l.png"}, "LogoURL", "user name"},
		{"LogoSpace", Brand{LogoURL: "https://cdn.example.org/a b.png"}, "LogoURL", "https"},
		{"LogoTooLong", Brand{LogoURL: "https://cdn.example.org/" + strings.Repeat("a", maxBrandURL)}, "LogoURL", "longer"},
		{"PrefsJavascript", Brand{PreferencesURL: "javascript:alert(1)"}, "PreferencesURL", "http or https"},
		{"PrefsCRLF", Brand{PreferencesURL: "https://app.example.org/\r\nX: y"}, "PreferencesURL", "http or https"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.b.Normalize()
			var be *BrandError
			if !errors.As(err, &be) || be.Field != tt.field || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("Normalize = %v, want a BrandError on %s saying %q", err, tt.field, tt.says)
			}
			if _, err := New(&Options{Brand: tt.b}); !errors.As(err, &be) {
				t.Fatalf("New accepted the brand: %v", err)
			}
		})
	}
}

func TestBrand_Colors(t *testing.T) {
	tests := []struct{ color, text, link string }{
		{"#0b57d0", "#ffffff", "#0b57d0"},
		{"#ffffdd", "#1f2328", defaultLink}, // too light for links on white
		{"#facc15", "#1f2328", defaultLink},
		{"#111111", "#ffffff", "#111111"},
		{"#c2410c", "#ffffff", "#c2410c"},
	}
	for _, tt := range tests {
		b := Brand{Color: tt.color}
		if got := b.ButtonText(); got != tt.text {
			t.Errorf("%s: ButtonText = %s, want %s", tt.color, got, tt.text)
		}
		if got := b.LinkColor(); got != tt.link {
			t.Errorf("%s: LinkColor = %s, want %s", tt.color, got, tt.link)
		}
	}
}

func TestBrand_SenderAddress(t *testing.T) {
	tests := []struct {
		name  string
		b     Brand
		from  string
		want  string
		isErr bool
	}{
		{"BareGetsName", Brand{Name: "Podcast Companion"}, "news@example.org", `"Podcast Companion" <news@example.org>`, false},
		{"FromNameKept", Brand{Name: "Podcast Companion"}, "The Team <news@example.org>", `"The Team" <news@example.org>`, false},
		{"SenderWins", Brand{Name: "P", SenderName: "Weekly"}, "The Team <news@example.org>", `"Weekly" <news@example.org>`, false},
		{"QuotesEscaped", Brand{SenderName: `Evil" <x@evil.example>, "y`}, "news@example.org", `"Evil\" <x@evil.example>, \"y" <news@example.org>`, false},
		{"NonASCIIEncoded", Brand{SenderName: "Café Radio"}, "news@example.org", "=?utf-8?q?Caf=C3=A9_Radio?= <news@example.org>", false},
		{"BadFrom", Brand{}, "not an address", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.b.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			got, err := b.SenderAddress(tt.from)
			if tt.isErr {
				if err == nil || strings.Contains(err.Error(), tt.from) {
					t.Fatalf("SenderAddress = %q, %v; want an error that does not repeat the input", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("SenderAddress = %q, %v; want %q", got, err, tt.want)
			}
			if strings.ContainsAny(got, "\r\n") {
				t.Fatalf("line break in %q", got)
			}
		})
	}
}

// Every e-mail and text rendering names the configured product, never
// "outbox", and the e-mails carry the address, the preferences link, the
// logo and the colour.
func TestRender_Brand(t *testing.T) {
	r := mustNew(t, &brandedOptions)
	digest := mustRender(t, r, fixture(t, "your-week-digest.v1"))
	nudge := mustRender(t, r, asEmail(fixture(t, "resurface-nudge.v1")))
	b := brandedOptions.Brand
	for name, m := range map[string]*envelope.EmailMessage{"digest": digest.Email, "nudge": nudge.Email} {
		for _, body := range []string{m.HTML, m.Text} {
			for _, w := range []string{b.Name, b.Address, b.PreferencesURL} {
				if !strings.Contains(body, w) {
					t.Errorf("%s lacks %q", name, w)
				}
			}
			if strings.Contains(strings.ToLower(body), "outbox") {
				t.Errorf("%s still says outbox", name)
			}
		}
		for _, w := range []string{`<img src="` + b.LogoURL + `" alt="Podcast Companion"`, "color:#c2410c;"} {
			if !strings.Contains(m.HTML, w) {
				t.Errorf("%s HTML lacks %q", name, w)
			}
		}
		if strings.Contains(m.HTML, "letter-spacing:0.04em; text-transform:uppercase") {
			t.Errorf("%s HTML upper-cases the product name", name)
		}
	}
	wecom := fixture(t, "your-week-digest.v1")
	wecom.Channel, wecom.Recipient = envelope.ChannelWeCom, envelope.Recipient{WeComUser: "u"}
	if m := mustRender(t, r, wecom); !strings.Contains(m.WeCom.Content, "Your week in Podcast Companion") {
		t.Errorf("wecom digest: %q", m.WeCom.Content[:60])
	}
	push := mustRender(t, r, fixture(t, "resurface-nudge.v1"))
	if !strings.Contains(string(push.Push.Payload), `"product":"Podcast Companion"`) {
		t.Errorf("push data lacks the product: %s", push.Push.Payload)
	}
}

// The digest's call to action is a table-based button of the brand
// colour linking to the preferences URL, and a plain link in the text;
// without a preferences URL there is none.
func TestRender_DigestCallToAction(t *testing.T) {
	m := mustRender(t, mustNew(t, &brandedOptions), fixture(t, "your-week-digest.v1"))
	prefs := brandedOptions.Brand.PreferencesURL
	button := `<td class="ob-cta" align="center" bgcolor="#c2410c" style="border-radius:6px; background-color:#c2410c;"><a href="` + prefs + `"`
	if !strings.Contains(m.Email.HTML, button) || !strings.Contains(m.Email.HTML, "color:#ffffff;") || !strings.Contains(m.Email.HTML, ">Manage your digest</a></td>") {
		t.Errorf("HTML lacks the button:\n%s", m.Email.HTML)
	}
	if !strings.Contains(m.Email.Text, "Manage your digest: "+prefs+"\n") {
		t.Errorf("text lacks the call to action:\n%s", m.Email.Text)
	}
	plain := mustRender(t, mustNew(t, &goldenOptions), fixture(t, "your-week-digest.v1"))
	if strings.Contains(plain.Email.HTML, "ob-cta") || strings.Contains(plain.Email.Text, "Manage your digest") {
		t.Error("a call to action without a URL for it")
	}
}

// An override that leaves the postal address out fails at New, even when
// no address is configured yet.
func TestNew_OverrideWithoutAddress(t *testing.T) {
	partials, err := EmbeddedTemplate(fileHTMLPartials)
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(string(partials), "<p style=\"margin:0 0 8px 0;\">{{.Address}}</p>", "", 1)
	if src == string(partials) {
		t.Fatal("the partials changed: update the test")
	}
	for _, opts := range []*Options{{}, {Brand: Brand{Address: "1 Main St"}}} {
		opts.Overrides = fstest.MapFS{fileHTMLPartials: {Data: []byte(src)}}
		_, err := New(opts)
		if err == nil || !strings.Contains(err.Error(), "postal address") || !strings.Contains(err.Error(), fileHTMLPartials+" (override)") {
			t.Fatalf("New = %v, want a refusal naming the partials and the postal address", err)
		}
	}
}
