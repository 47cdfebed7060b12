package envelope

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The fast path of ValidEncoding.
//
// Checking an envelope built in Go against the whole schema means decoding
// its encoding again and walking every keyword, which costs more than the
// rest of an enqueue's CPU put together. For a Go-built envelope most of
// the schema's top level is already guaranteed by the Go types (property
// names, types, additionalProperties); what is left is a few constants,
// enums and conditionals, checked here in Go, and the sub-objects whose
// rules are patterns and formats. A chat id, a consent snapshot and the
// timestamps are checked in Go too (TestGoChecksAgreeWithTheSchema holds
// each to its definition); an email address, a push subscription and the
// template's payload against the schema's own definitions, except a reply
// as Go encodes it, whose text is read without decoding the payload.
//
// On this path the envelope is also encoded by hand (encode.go) rather
// than by json.Marshal. Both cut the cold-cache CPU of an enqueue, which
// an idle worker's end-to-end latency waits on.
//
// fastValid only ever answers "valid" or "not sure": on any doubt,
// ValidEncoding runs the full check, which finds and words the problems.
// So fastValid may reject a valid envelope (costing time, not correctness)
// but must never accept one the full check rejects; TestFastValid and
// FuzzFastValid hold it to that.

// subschemas are the schema's definitions the fast path validates against.
type subschemas struct {
	recipient *jsonschema.Schema
	payload   map[Template]*jsonschema.Schema
}

var subs = sync.OnceValue(func() *subschemas {
	c := newCompiler()
	compile := func(def string) *jsonschema.Schema {
		s, err := c.Compile(SchemaURL + "#/$defs/" + def)
		if err != nil {
			panic("envelope: embedded schema.json: $defs/" + def + ": " + err.Error())
		}
		return s
	}
	return &subschemas{
		recipient: compile("recipient"),
		payload: map[Template]*jsonschema.Schema{
			TemplateDigest: compile("digest_payload"),
			TemplateNudge:  compile("nudge_payload"),
			TemplateReply:  compile("reply_payload"),
		},
	}
})

// fastValid reports whether e, whose encoding is data, is certainly valid,
// and if so the delivery rows it materialises (Rows). Invalid UTF-8 in e's
// strings has been ruled out by the caller; text, isReply and plain are
// what replyText read of e, once for the encoding and this check.
func fastValid(e *Envelope, data []byte, text string, isReply, plain bool) (bool, int) {
	const notSure = 0
	if len(data) == 0 || data[0] != '{' {
		return false, notSure
	}
	// The top level of the schema, as the Go encoding meets it.
	var c problemList
	checkIdentifier(&c, "id", e.ID)
	checkIdentifier(&c, "user_id", e.UserID)
	if e.TenantID != "" {
		checkIdentifier(&c, "tenant_id", e.TenantID)
	}
	if len(c.list) > 0 || e.SchemaVersion != SchemaVersion || !e.Channel.Valid() || e.CreatedAt.IsZero() {
		return false, notSure
	}
	allowed, ok := templateChannels[e.Template]
	if !ok {
		return false, notSure
	}
	ok = false
	for _, ch := range allowed {
		ok = ok || ch == e.Channel
	}
	if !ok || !isJSONObject(e.Payload) {
		return false, notSure
	}
	r := &e.Recipient
	switch e.Channel {
	case ChannelEmail:
		if r.Email == "" || e.ConsentSnapshot.UnsubscribeRef == "" {
			return false, notSure
		}
	case ChannelPush:
		if r.PushSubscription == nil {
			return false, notSure
		}
	case ChannelTelegram:
		if r.ChatID == "" {
			return false, notSure
		}
	}

	// The sub-objects: a chat id, a consent snapshot and the timestamps in
	// Go; the rest against the schema's definitions, as encoded.
	s := subs()
	if r.Email == "" && r.PushSubscription == nil {
		if r.ChatID != "" && !validChatID(r.ChatID) {
			return false, notSure
		}
	} else if s.recipient.Validate(recipientInstance(r)) != nil {
		return false, notSure
	}
	if e.ConsentSnapshot != (ConsentSnapshot{}) && !validConsent(&e.ConsentSnapshot) {
		return false, notSure
	}
	for _, t := range []time.Time{e.NotBefore, e.ExpiresAt, e.CreatedAt} {
		if !t.IsZero() && !validTimestamp(t) {
			return false, notSure
		}
	}
	// What the schema cannot say: escapes that decode to invalid UTF-8 in
	// the payload. A plain reply text has none (plainReplyText).
	if !plain && len(utf8Problems(e.Payload)) > 0 {
		return false, notSure
	}
	top := map[string]json.RawMessage{"payload": e.Payload}
	if e.TenantID != "" {
		top["tenant_id"] = nil
	}
	rows := 1
	if isReply {
		// A reply payload as Go builds it, {"text": "…"} and nothing else:
		// the schema asks for a string of 1 to 65536 code points, which
		// the Go rules (1 to 65536 bytes, not blank) imply. One read of the
		// payload instead of the schema's decode and Go's.
		if !replyTextOK(text) {
			return false, notSure
		}
		delete(top, "payload")
		rows = max(1, len(SplitReply(text)))
	} else {
		payload, err := jsonschema.UnmarshalJSON(bytes.NewReader(e.Payload))
		if err != nil || s.payload[e.Template].Validate(payload) != nil {
			return false, notSure
		}
		if e.Template == TemplateReply {
			// The reply's Go rules here rather than in goRules, decoding
			// the payload exactly as checkPayload does (Go's decoder, not
			// the schema's map: it matches keys case-insensitively and
			// fails on a repeated key of the wrong type), so that its
			// segments come from the same decode.
			var p ReplyPayload
			if json.Unmarshal(e.Payload, &p) != nil || !replyTextOK(p.Text) {
				return false, notSure
			}
			delete(top, "payload")
			rows = max(1, len(SplitReply(p.Text)))
		}
	}
	var decodeProbs []Problem
	if len(goRules(e, top, map[string]bool{}, &decodeProbs)) > 0 || len(decodeProbs) > 0 {
		return false, notSure
	}
	return true, rows
}

// replyText returns the text of a reply whose payload is exactly one
// member, "text", holding a string; ok is false for anything else. plain
// reports that plainReplyText read it: the payload's only escapes are the
// HTML ones.
func replyText(e *Envelope) (text string, ok, plain bool) {
	if e.Template != TemplateReply {
		return "", false, false
	}
	if text, ok := plainReplyText(e.Payload); ok {
		return text, true, true
	}
	text, ok = replyTextTokens(e.Payload)
	return text, ok, false
}

// plainReplyText reads the payload Go encodes for a text without quotes,
// backslashes or control characters, {"text":"…"} with nothing but valid
// UTF-8 between the quotes, where the only escapes are the five that
// json.Marshal adds for HTML and JavaScript (\u003c, \u003e, \u0026,
// \u2028, \u2029): its text is those bytes with the escapes decoded, as a
// JSON decoder reads them. Anything else is left to replyTextTokens.
func plainReplyText(p []byte) (string, bool) {
	const prefix, suffix = `{"text":"`, `"}`
	if len(p) < len(prefix)+len(suffix) || string(p[:len(prefix)]) != prefix || string(p[len(p)-len(suffix):]) != suffix {
		return "", false
	}
	raw := p[len(prefix) : len(p)-len(suffix)]
	escapes := 0
	for i, c := range raw {
		switch {
		case c == '"' || c < 0x20:
			return "", false
		case c == '\\':
			if i+6 > len(raw) || htmlEscapes[string(raw[i:i+6])] == "" {
				return "", false
			}
			escapes++
		}
	}
	if !utf8.Valid(raw) {
		return "", false // a decoder would replace the invalid bytes
	}
	if escapes == 0 {
		return string(raw), true
	}
	var b strings.Builder
	b.Grow(len(raw))
	for len(raw) > 0 {
		i := bytes.IndexByte(raw, '\\')
		if i < 0 {
			b.Write(raw)
			break
		}
		b.Write(raw[:i])
		b.WriteString(htmlEscapes[string(raw[i:i+6])])
		raw = raw[i+6:]
	}
	return b.String(), true
}

// htmlEscapes are the escapes json.Marshal writes into strings that need
// none, so that its output is safe inside HTML and JavaScript, and what
// they decode to.
var htmlEscapes = map[string]string{
	`\u003c`: "<", `\u003e`: ">", `\u0026`: "&", `\u2028`: "\u2028", `\u2029`: "\u2029",
}

// replyTextTokens is replyText for any layout: one token read of the
// payload.
func replyTextTokens(payload []byte) (text string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	want := func(match func(json.Token) bool) bool {
		t, err := dec.Token()
		return err == nil && match(t)
	}
	delim := func(d json.Delim) func(json.Token) bool {
		return func(t json.Token) bool { return t == d }
	}
	if !want(delim('{')) || !want(func(t json.Token) bool { return t == "text" }) {
		return "", false
	}
	if !want(func(t json.Token) bool { text, ok = t.(string); return ok }) || !want(delim('}')) {
		return "", false
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", false
	}
	return text, true
}

// recipientInstance is r as the JSON Schema validator sees its encoding.
func recipientInstance(r *Recipient) map[string]any {
	m := map[string]any{}
	if r.Email != "" {
		m["email"] = r.Email
	}
	if r.EmailVerified {
		m["email_verified"] = true
	}
	if ps := r.PushSubscription; ps != nil {
		sub := map[string]any{
			"endpoint": ps.Endpoint,
			"keys":     map[string]any{"p256dh": ps.Keys.P256dh, "auth": ps.Keys.Auth},
		}
		if ps.ExpirationTime != nil {
			sub["expirationTime"] = *ps.ExpirationTime
		}
		m["push_subscription"] = sub
	}
	if r.ChatID != "" {
		m["chat_id"] = r.ChatID
	}
	return m
}

// validChatID is the schema's chat_id pattern,
// ^(-?[0-9]{1,20}|@[A-Za-z0-9_]{5,32})$, in Go.
func validChatID(id string) bool {
	if len(id) > 0 && id[0] == '@' {
		name := id[1:]
		if len(name) < 5 || len(name) > 32 {
			return false
		}
		for _, c := range []byte(name) {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
				return false
			}
		}
		return true
	}
	digits := strings.TrimPrefix(id, "-")
	if len(digits) < 1 || len(digits) > 20 {
		return false
	}
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// validConsent is the schema's consent_snapshot definition, in Go, for a
// snapshot of valid UTF-8 strings.
func validConsent(c *ConsentSnapshot) bool {
	if c.Cadence != "" && c.Cadence != "weekly" && c.Cadence != "daily" {
		return false
	}
	if ref := c.UnsubscribeRef; ref != "" {
		if utf8.RuneCountInString(ref) > 1024 {
			return false
		}
		for _, r := range ref {
			if r < 0x20 || 0x7f <= r && r <= 0x9f {
				return false
			}
		}
	}
	return true
}

// validTimestamp reports whether t, formatted as its encoding formats it,
// is certainly an RFC 3339 date-time: a four-digit year and a zone offset
// under 24 hours. The caller only asks about a non-zero t.
func validTimestamp(t time.Time) bool {
	_, off := t.Zone()
	y := t.Year()
	return 0 <= y && y <= 9999 && -24*3600 < off && off < 24*3600
}
