package render

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// goldenOptions are the renderer options the golden files are made with.
var goldenOptions = Options{BaseURL: "https://app.example.org"}

// brandedOptions are goldenOptions with every Brand field set.
var brandedOptions = Options{BaseURL: "https://app.example.org", Brand: Brand{
	Name:           "Podcast Companion",
	SenderName:     "Podcast Companion Weekly",
	Color:          "#C2410C",
	LogoURL:        "https://cdn.example.org/brand/logo@2x.png",
	Address:        "Podcast Companion Ltd, 1 Market Street, Bristol BS1 4DJ, United Kingdom",
	PreferencesURL: "https://app.example.org/settings/notifications",
}}

// hostileBrandOptions are brand values with markup and quotes: they must
// come out as text wherever they are shown.
var hostileBrandOptions = Options{BaseURL: "https://app.example.org", Brand: Brand{
	Name:           `"Evil" <script>alert(1)</script> & Co`,
	Color:          "#FFD",
	LogoURL:        `https://cdn.example.org/logo.png?x="><script>alert(2)</script>`,
	Address:        `<b>1 Main St</b> & "Suite" 'B' <!--`,
	PreferencesURL: `https://app.example.org/prefs?a="><img/src=x/onerror=alert(3)>`,
}}

// mustLoadEnvelope reads one envelope from a JSON file.
func mustLoadEnvelope(t testing.TB, path string) *envelope.Envelope {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var e envelope.Envelope
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &e
}

// renderTime is the time an envelope is rendered at in golden tests: its
// not_before, else its created_at.
func renderTime(e *envelope.Envelope) time.Time {
	if !e.NotBefore.IsZero() {
		return e.NotBefore
	}
	return e.CreatedAt
}

// asEmail returns a copy of a (push) nudge envelope addressed by e-mail.
func asEmail(e *envelope.Envelope) *envelope.Envelope {
	cp := *e
	cp.Channel = envelope.ChannelEmail
	cp.Recipient = envelope.Recipient{Email: "ada.lovelace@example.org", EmailVerified: true}
	cp.ConsentSnapshot.UnsubscribeRef = "unsub_7f3c9a1e2b4d"
	return &cp
}

// goldenCase is one envelope whose rendering is pinned.
type goldenCase struct {
	name string // golden file stem under testdata/golden
	env  func(t testing.TB) *envelope.Envelope
	opts *Options // nil: goldenOptions
}

var goldenCases = []goldenCase{
	{"your-week-digest.v1.email", func(t testing.TB) *envelope.Envelope {
		return mustLoadEnvelope(t, "../testdata/delivery/your-week-digest.v1.golden.json")
	}, nil},
	{"resurface-nudge.v1.push", func(t testing.TB) *envelope.Envelope {
		return mustLoadEnvelope(t, "../testdata/delivery/resurface-nudge.v1.golden.json")
	}, nil},
	{"resurface-nudge.v1.email", func(t testing.TB) *envelope.Envelope {
		return asEmail(mustLoadEnvelope(t, "../testdata/delivery/resurface-nudge.v1.golden.json"))
	}, nil},
	{"reply-text.v1.telegram", func(t testing.TB) *envelope.Envelope {
		return mustLoadEnvelope(t, "../testdata/delivery/reply-text.v1.golden.json")
	}, nil},
	{"hostile-digest.email", func(t testing.TB) *envelope.Envelope {
		return mustLoadEnvelope(t, "testdata/envelopes/hostile-digest.json")
	}, nil},
	{"hostile-nudge.push", func(t testing.TB) *envelope.Envelope {
		return mustLoadEnvelope(t, "testdata/envelopes/hostile-nudge.json")
	}, nil},
	{"branded-digest.email", func(t testing.TB) *envelope.Envelope {
		return mustLoadEnvelope(t, "../testdata/delivery/your-week-digest.v1.golden.json")
	}, &brandedOptions},
	{"branded-nudge.email", func(t testing.TB) *envelope.Envelope {
		return asEmail(mustLoadEnvelope(t, "../testdata/delivery/resurface-nudge.v1.golden.json"))
	}, &brandedOptions},
	{"branded-nudge.push", func(t testing.TB) *envelope.Envelope {
		return mustLoadEnvelope(t, "../testdata/delivery/resurface-nudge.v1.golden.json")
	}, &brandedOptions},
	{"hostile-brand-digest.email", func(t testing.TB) *envelope.Envelope {
		return mustLoadEnvelope(t, "../testdata/delivery/your-week-digest.v1.golden.json")
	}, &hostileBrandOptions},
}

// goldenFiles renders m into the files that pin it, by file suffix.
func goldenFiles(m *envelope.Message) map[string][]byte {
	files := map[string][]byte{}
	switch m.Channel {
	case envelope.ChannelEmail:
		files[".html"] = []byte(m.Email.HTML)
		files[".txt"] = []byte(m.Email.Text)
		files[".headers"] = emailHeaders(m.Email)
	case envelope.ChannelPush:
		b, err := PreviewJSON(m)
		if err != nil {
			panic(err)
		}
		files[".json"] = b
	case envelope.ChannelTelegram:
		panic("telegram messages are pinned per reply, see chatGolden")
	}
	return files
}

// emailHeaders lists an e-mail's recipient, subject, headers and tags.
func emailHeaders(m *envelope.EmailMessage) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "To: %s\nSubject: %s\n", m.To, m.Subject)
	for _, h := range m.Headers {
		fmt.Fprintf(&b, "%s: %s\n", h.Name, h.Value)
	}
	for _, k := range sortedKeys(m.Tags) {
		fmt.Fprintf(&b, "Tag %s: %s\n", k, m.Tags[k])
	}
	return b.Bytes()
}

// chatGolden renders every segment of a reply into one file.
func chatGolden(t testing.TB, r *Renderer, e *envelope.Envelope) []byte {
	t.Helper()
	var b bytes.Buffer
	n := Segments(e)
	for i := range n {
		m, err := r.Render(e, i, renderTime(e))
		if err != nil {
			t.Fatalf("segment %d: %v", i, err)
		}
		visible, err := TelegramVisibleText(m.Chat.Text)
		if err != nil {
			t.Fatalf("segment %d: %v", i, err)
		}
		fmt.Fprintf(&b, "=== segment %d/%d · %d characters as Telegram counts · parse_mode %s ===\n%s\n",
			m.Chat.Segment+1, m.Chat.Segments, envelope.UTF16Len(visible), m.Chat.ParseMode, m.Chat.Text)
	}
	return b.Bytes()
}

func TestGolden(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			if opts == nil {
				opts = &goldenOptions
			}
			r, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			e := c.env(t)
			if err := envelope.Validate(e); err != nil && !strings.HasPrefix(c.name, "hostile-") {
				t.Fatalf("the fixture is not a valid envelope: %v", err)
			}
			var files map[string][]byte
			if e.Channel == envelope.ChannelTelegram {
				files = map[string][]byte{".txt": chatGolden(t, r, e)}
			} else {
				m, err := r.Render(e, 0, renderTime(e))
				if err != nil {
					t.Fatal(err)
				}
				files = goldenFiles(m)
			}
			for _, suffix := range sortedKeys(files) {
				checkGolden(t, filepath.Join("testdata", "golden", c.name+suffix), files[suffix])
			}
		})
	}
}

// checkGolden compares got with the golden file path, or rewrites it
// under -update.
func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./render -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the rendering (run go test ./render -update if the change is intended):\n%s", path, firstDiff(want, got))
	}
}

// firstDiff shows the first differing line of two texts.
func firstDiff(want, got []byte) string {
	wl := strings.Split(string(want), "\n")
	gl := strings.Split(string(got), "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return fmt.Sprintf("line %d:\n  want %q\n  got  %q", i+1, w, g)
		}
	}
	return "(no line differs)"
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
