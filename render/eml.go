package render

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"mime"
	"mime/quotedprintable"
	"net/mail"
	"strings"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// EML returns m as an RFC 5322 message a mail client can open: From, To,
// Subject, Date, Message-ID, MIME-Version, m's extra headers (for example
// List-Unsubscribe and List-Unsubscribe-Post), and the body as
// multipart/alternative with a text/plain and a text/html part (a single
// part when m has only one of them), both UTF-8 and quoted-printable. Lines
// end in CRLF.
//
// from is the sender ("outbox <outbox@localhost>" when empty); messageID is
// the Message-ID, with or without angle brackets (derive it from the
// delivery key, e.g. key.Hash()+"@outbox", so that a redelivery carries the
// same id). The output is deterministic: the same arguments give the same
// bytes.
//
// Header values are sanitised: line breaks are removed (no header
// injection), non-ASCII text is RFC 2047 encoded, and an extra header that
// would replace one of the headers EML writes itself, or whose name is not a
// valid field name, is dropped.
func EML(m *envelope.EmailMessage, from string, date time.Time, messageID string) []byte {
	if from == "" {
		from = DefaultFrom
	}
	var b bytes.Buffer
	writeHeader(&b, "From", formatAddress(from))
	writeHeader(&b, "To", formatAddress(m.To))
	writeHeader(&b, "Subject", encodeText(m.Subject))
	writeHeader(&b, "Date", date.Format(time.RFC1123Z))
	if id := strings.Trim(oneLine(messageID), "<> "); id != "" {
		writeHeader(&b, "Message-ID", "<"+id+">")
	}
	writeHeader(&b, "MIME-Version", "1.0")
	for _, h := range m.Headers {
		if !validFieldName(h.Name) || reservedHeaders[strings.ToLower(h.Name)] {
			continue
		}
		writeHeader(&b, h.Name, encodeText(h.Value))
	}

	type part struct{ contentType, body string }
	var parts []part
	if m.Text != "" || m.HTML == "" {
		parts = append(parts, part{"text/plain; charset=utf-8", m.Text})
	}
	if m.HTML != "" {
		parts = append(parts, part{"text/html; charset=utf-8", m.HTML})
	}
	if len(parts) == 1 {
		writeHeader(&b, "Content-Type", parts[0].contentType)
		writeHeader(&b, "Content-Transfer-Encoding", "quoted-printable")
		b.WriteString("\r\n")
		b.Write(quotedPrintable(parts[0].body))
		return b.Bytes()
	}

	encoded := make([][]byte, len(parts))
	for i, p := range parts {
		encoded[i] = quotedPrintable(p.body)
	}
	boundary := mimeBoundary(encoded)
	writeHeader(&b, "Content-Type", `multipart/alternative; boundary="`+boundary+`"`)
	b.WriteString("\r\n")
	b.WriteString("This is a multi-part message in MIME format.\r\n")
	for i, p := range parts {
		b.WriteString("\r\n--" + boundary + "\r\n")
		writeHeader(&b, "Content-Type", p.contentType)
		writeHeader(&b, "Content-Transfer-Encoding", "quoted-printable")
		b.WriteString("\r\n")
		b.Write(encoded[i])
	}
	b.WriteString("\r\n--" + boundary + "--\r\n")
	return b.Bytes()
}

// DefaultFrom is the placeholder sender of EML and of "outbox render".
const DefaultFrom = "outbox <outbox@localhost>"

// reservedHeaders are written by EML itself; extra headers cannot replace them.
var reservedHeaders = map[string]bool{
	"from": true, "to": true, "cc": true, "bcc": true, "subject": true, "date": true,
	"message-id": true, "mime-version": true, "content-type": true,
	"content-transfer-encoding": true, "sender": true, "reply-to": true,
}

// validFieldName reports whether name is an RFC 5322 field name: printable
// US-ASCII except the colon.
func validFieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' || c == ':' {
			return false
		}
	}
	return true
}

// oneLine replaces line breaks and other control characters with spaces.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f || r == '\u2028' || r == '\u2029' || r == '\u0085' {
			return ' '
		}
		return r
	}, s)
}

// encodeText makes s a safe header value: one line, RFC 2047 encoded when
// it is not ASCII.
func encodeText(s string) string {
	s = oneLine(s)
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return mime.QEncoding.Encode("utf-8", s)
		}
	}
	return s
}

// formatAddress formats an address header value. A parsable address (with
// or without a display name) is re-encoded by net/mail; anything else is
// written as one sanitised line.
func formatAddress(s string) string {
	s = strings.TrimSpace(oneLine(s))
	if a, err := mail.ParseAddress(s); err == nil {
		return a.String()
	}
	return encodeText(s)
}

// maxHeaderLine is the length at which header lines are folded (RFC 5322
// §2.1.1 recommends 78 characters).
const maxHeaderLine = 78

// writeHeader writes "Name: value" folded at spaces so that lines stay near
// maxHeaderLine characters (a single word longer than that is not broken).
func writeHeader(b *bytes.Buffer, name, value string) {
	b.WriteString(name + ":")
	lineLen := len(name) + 1
	hasWord := false // the current line holds a word after the name or fold
	for i, word := range strings.Split(value, " ") {
		if word == "" && i > 0 {
			// Keep runs of spaces as they are on the current line.
			b.WriteByte(' ')
			lineLen++
			continue
		}
		if hasWord && lineLen+1+len(word) > maxHeaderLine {
			b.WriteString("\r\n")
			lineLen = 0
		}
		b.WriteByte(' ')
		b.WriteString(word)
		lineLen += 1 + len(word)
		hasWord = true
	}
	b.WriteString("\r\n")
}

// quotedPrintable encodes body as quoted-printable with CRLF line breaks.
func quotedPrintable(body string) []byte {
	var b bytes.Buffer
	w := quotedprintable.NewWriter(&b)
	// Normalise line breaks first: the writer turns "\n" into CRLF and
	// would encode a lone "\r" as "=0D".
	body = strings.ReplaceAll(body, "\r\n", "\n")
	w.Write([]byte(body)) // writes to a bytes.Buffer cannot fail
	w.Close()
	return b.Bytes()
}

// mimeBoundary derives a boundary from the encoded parts, so that the same
// message always gets the same boundary, and makes sure no part contains it.
func mimeBoundary(parts [][]byte) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write(p)
	}
	sum := h.Sum(nil)
	for n := 0; ; n++ {
		boundary := "=_outbox_" + hex.EncodeToString(sum[:12])
		if n > 0 {
			boundary += "_" + strings.Repeat("x", n)
		}
		clash := false
		for _, p := range parts {
			if bytes.Contains(p, []byte(boundary)) {
				clash = true
			}
		}
		if !clash {
			return boundary
		}
	}
}
