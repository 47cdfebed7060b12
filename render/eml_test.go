package render

import (
	"bytes"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// mustReadEML parses raw as a message and returns it with its decoded parts
// by media type.
func mustReadEML(t testing.TB, raw []byte) (*mail.Message, map[string]string) {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("not an RFC 5322 message: %v", err)
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil {
		t.Fatalf("Content-Type: %v", err)
	}
	parts := map[string]string{}
	if !strings.HasPrefix(mt, "multipart/") {
		body, err := io.ReadAll(quotedprintable.NewReader(msg.Body))
		if err != nil {
			t.Fatal(err)
		}
		parts[mt] = string(body)
		return msg, parts
	}
	if mt != "multipart/alternative" {
		t.Fatalf("Content-Type %q, want multipart/alternative", mt)
	}
	r := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := r.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("multipart: %v", err)
		}
		pt, _, err := mime.ParseMediaType(p.Header.Get("Content-Type"))
		if err != nil {
			t.Fatalf("part Content-Type: %v", err)
		}
		body, err := io.ReadAll(p) // NextPart decodes quoted-printable
		if err != nil {
			t.Fatal(err)
		}
		parts[pt] = string(body)
	}
	return msg, parts
}

func TestEML(t *testing.T) {
	date := time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC)
	long := strings.Repeat("a fairly long line of plain text that needs soft breaks ", 6)
	m := &envelope.EmailMessage{
		To:      "Zoë Example <zoe@example.com>",
		Subject: "Your week: 3 to revisit — Grüße",
		Text:    "Hello\n\n" + long + "\nUnsubscribe: https://x.example/unsubscribe/r%2F1\n",
		HTML:    `<!DOCTYPE html><html><body><p style="color:#111">Hello = world</p><a href="https://x.example/e?a=1&amp;b=2">go</a></body></html>`,
		Headers: []envelope.Header{
			{Name: "List-Unsubscribe", Value: "<https://x.example/unsubscribe/r%2F1>"},
			{Name: "List-Unsubscribe-Post", Value: "List-Unsubscribe=One-Click"},
			{Name: "Subject", Value: "replaced?"},       // reserved: dropped
			{Name: "Bad Name", Value: "x"},              // invalid name: dropped
			{Name: "X-Inject", Value: "a\r\nBcc: evil"}, // line break removed
		},
	}
	raw := EML(m, "", date, "abc123@outbox")
	if !bytes.Equal(raw, EML(m, "", date, "<abc123@outbox>")) {
		t.Fatal("EML is not deterministic (or brackets on the Message-ID matter)")
	}
	for i, line := range strings.Split(string(raw), "\r\n") {
		if strings.Contains(line, "\n") || strings.Contains(line, "\r") {
			t.Fatalf("line %d has a bare line break", i)
		}
		if len(line) > 998 {
			t.Fatalf("line %d is %d octets long", i, len(line))
		}
	}
	msg, parts := mustReadEML(t, raw)
	h := msg.Header
	dec := new(mime.WordDecoder)
	tests := []struct{ name, want string }{
		{"From", "\"outbox\" <outbox@localhost>"},
		{"Date", "Mon, 02 Mar 2026 09:30:00 +0000"},
		{"Message-ID", "<abc123@outbox>"},
		{"MIME-Version", "1.0"},
		{"List-Unsubscribe", "<https://x.example/unsubscribe/r%2F1>"},
		{"List-Unsubscribe-Post", "List-Unsubscribe=One-Click"},
		{"X-Inject", "a  Bcc: evil"},
	}
	for _, tt := range tests {
		if got := h.Get(tt.name); got != tt.want {
			t.Errorf("%s = %q, want %q", tt.name, got, tt.want)
		}
	}
	if h.Get("Bcc") != "" || len(h["Subject"]) != 1 || h.Get("Bad Name") != "" {
		t.Errorf("extra headers were not sanitised: %v", h)
	}
	subject, err := dec.DecodeHeader(h.Get("Subject"))
	if err != nil || subject != m.Subject {
		t.Errorf("Subject decodes to %q (%v), want %q", subject, err, m.Subject)
	}
	to, err := h.AddressList("To")
	if err != nil || len(to) != 1 || to[0].Address != "zoe@example.com" || to[0].Name != "Zoë Example" {
		t.Errorf("To = %v (%v)", to, err)
	}
	if got, want := parts["text/plain"], strings.ReplaceAll(m.Text, "\n", "\r\n"); got != want {
		t.Errorf("text part:\n%q\nwant\n%q", got, want)
	}
	if got := parts["text/html"]; got != m.HTML {
		t.Errorf("html part:\n%q\nwant\n%q", got, m.HTML)
	}
}

func TestEML_SinglePart(t *testing.T) {
	m := &envelope.EmailMessage{To: "a@example.com", Subject: "s", Text: "only text"}
	msg, parts := mustReadEML(t, EML(m, "Sender <s@example.com>", time.Unix(0, 0).UTC(), "id@x"))
	if len(parts) != 1 || parts["text/plain"] != "only text" {
		t.Fatalf("parts = %q", parts)
	}
	if got := msg.Header.Get("From"); got != `"Sender" <s@example.com>` {
		t.Fatalf("From = %q", got)
	}
}

func TestWriteHeader_Folds(t *testing.T) {
	var b bytes.Buffer
	writeHeader(&b, "Subject", strings.Repeat("word ", 40)+strings.Repeat("x", 100))
	lines := strings.Split(strings.TrimSuffix(b.String(), "\r\n"), "\r\n")
	if len(lines) < 3 {
		t.Fatalf("not folded: %q", b.String())
	}
	for i, l := range lines {
		if i > 0 && !strings.HasPrefix(l, " ") {
			t.Fatalf("continuation line %d does not start with a space: %q", i, l)
		}
		if len(l) > maxHeaderLine && !strings.Contains(l, strings.Repeat("x", 100)) {
			t.Fatalf("line %d is %d long", i, len(l))
		}
	}
	unfolded := strings.ReplaceAll(b.String(), "\r\n ", " ")
	if want := "Subject: " + strings.Repeat("word ", 40) + strings.Repeat("x", 100) + "\r\n"; unfolded != want {
		t.Fatalf("unfolding does not give the value back:\n%q", unfolded)
	}
}
