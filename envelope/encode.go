package envelope

import (
	"time"
	"unicode/utf8"
)

// appendEncoding appends e's JSON encoding to b, byte for byte what
// json.Marshal(e) produces, for the envelopes an app builds in Go on the
// enqueue path: no string that needs an escape other than the HTML ones
// (no quote, backslash or control character), no push expiration time,
// timestamps json.Marshal accepts, and a payload that is the plain
// {"text":"…"} of a reply or none: plain and text are what replyText read
// of e. ok is false for anything else, and the caller uses json.Marshal.
//
// json.Marshal spends about half of its time re-reading a RawMessage
// payload to compact it; a plain reply text is already compact, so here it
// is only scanned for the characters Marshal escapes. TestAppendEncoding and
// FuzzAppendEncoding compare the two.
func appendEncoding(b []byte, e *Envelope, text string, plain bool) (_ []byte, ok bool) {
	str := func(key, s string) {
		if ok {
			b = append(b, key...)
			b, ok = appendPlainString(b, s)
		}
	}
	ok = true
	b = append(b, '{')
	str(`"schema_version":`, e.SchemaVersion)
	str(`,"id":`, e.ID)
	str(`,"user_id":`, e.UserID)
	if e.TenantID != "" {
		str(`,"tenant_id":`, e.TenantID)
	}
	str(`,"channel":`, string(e.Channel))
	str(`,"template":`, string(e.Template))

	r := &e.Recipient
	if r.PushSubscription != nil {
		return b, false
	}
	b = append(b, `,"recipient":{`...)
	sep := ""
	if r.Email != "" {
		str(`"email":`, r.Email)
		sep = ","
	}
	if r.EmailVerified {
		b = append(b, sep+`"email_verified":true`...)
		sep = ","
	}
	if r.ChatID != "" {
		str(sep+`"chat_id":`, r.ChatID)
	}
	b = append(b, '}')

	if c := &e.ConsentSnapshot; *c != (ConsentSnapshot{}) {
		b = append(b, `,"consent_snapshot":{"digest_enabled":`...)
		if c.DigestEnabled {
			b = append(b, "true"...)
		} else {
			b = append(b, "false"...)
		}
		if c.Cadence != "" {
			str(`,"cadence":`, c.Cadence)
		}
		if c.UnsubscribeRef != "" {
			str(`,"unsubscribe_ref":`, c.UnsubscribeRef)
		}
		b = append(b, '}')
	}

	b = append(b, `,"payload":`...)
	switch {
	case e.Payload == nil:
		b = append(b, "null"...)
	case plain:
		str(`{"text":`, text)
		b = append(b, '}')
	default:
		return b, false
	}

	for _, f := range []struct {
		key string
		t   time.Time
	}{{`,"not_before":`, e.NotBefore}, {`,"expires_at":`, e.ExpiresAt}, {`,"created_at":`, e.CreatedAt}} {
		if f.t.IsZero() {
			continue
		}
		// Marshal refuses these; the caller's json.Marshal says why.
		if y := f.t.Year(); y < 0 || y > 9999 {
			return b, false
		}
		if _, off := f.t.Zone(); off <= -24*3600 || off >= 24*3600 {
			return b, false
		}
		b = append(b, f.key...)
		b = append(b, '"')
		b = f.t.AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	return append(b, '}'), ok
}

// appendPlainString appends s as json.Marshal quotes it, when s is valid
// UTF-8 with no quote, backslash or control character; ok is false
// otherwise. Like Marshal it escapes <, > and & (so that the JSON is safe
// inside HTML) and U+2028 and U+2029 (so that it is safe inside JavaScript).
func appendPlainString(b []byte, s string) (_ []byte, ok bool) {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		var esc string
		switch {
		case c < 0x20 || c == '"' || c == '\\':
			return b, false
		case c == '<':
			esc = `\u003c`
		case c == '>':
			esc = `\u003e`
		case c == '&':
			esc = `\u0026`
		case c == 0xe2 && i+2 < len(s) && s[i+1] == 0x80 && s[i+2]&^1 == 0xa8:
			esc = `\u2028`
			if s[i+2] == 0xa9 {
				esc = `\u2029`
			}
		default:
			continue
		}
		b = append(b, s[start:i]...)
		b = append(b, esc...)
		if c == 0xe2 {
			i += 2
		}
		start = i + 1
	}
	if !utf8.ValidString(s) {
		return b, false
	}
	b = append(b, s[start:]...)
	return append(b, '"'), true
}
