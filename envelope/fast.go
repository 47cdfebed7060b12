package envelope

import (
	"bytes"
	"encoding/json"
	"io"
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
// rules are patterns and formats (recipient, consent_snapshot, timestamps,
// the template's payload), checked by the schema's own definitions.
//
// fastValid only ever answers "valid" or "not sure": on any doubt,
// ValidEncoding runs the full check, which finds and words the problems.
// So fastValid may reject a valid envelope (costing time, not correctness)
// but must never accept one the full check rejects; TestFastValid and
// FuzzFastValid hold it to that.

// subschemas are the schema's definitions the fast path validates against.
type subschemas struct {
	recipient, consent, timestamp *jsonschema.Schema
	payload                       map[Template]*jsonschema.Schema
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
		consent:   compile("consent_snapshot"),
		timestamp: compile("timestamp"),
		payload: map[Template]*jsonschema.Schema{
			TemplateDigest: compile("digest_payload"),
			TemplateNudge:  compile("nudge_payload"),
			TemplateReply:  compile("reply_payload"),
		},
	}
})

// fastValid reports whether e, whose encoding is data, is certainly valid,
// and if so the delivery rows it materialises (Rows). Invalid UTF-8 in e's
// strings has been ruled out by the caller.
func fastValid(e *Envelope, data []byte) (bool, int) {
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

	// The sub-objects, against the schema's definitions, as encoded.
	s := subs()
	if s.recipient.Validate(recipientInstance(r)) != nil {
		return false, notSure
	}
	if e.ConsentSnapshot != (ConsentSnapshot{}) && s.consent.Validate(consentInstance(&e.ConsentSnapshot)) != nil {
		return false, notSure
	}
	for _, t := range []time.Time{e.NotBefore, e.ExpiresAt, e.CreatedAt} {
		if !t.IsZero() && s.timestamp.Validate(t.Format(time.RFC3339Nano)) != nil {
			return false, notSure
		}
	}
	// What the schema cannot say: escapes that decode to invalid UTF-8 in
	// the payload.
	if len(utf8Problems(e.Payload)) > 0 {
		return false, notSure
	}
	top := map[string]json.RawMessage{"payload": e.Payload}
	if e.TenantID != "" {
		top["tenant_id"] = nil
	}
	rows := 1
	if text, ok := replyText(e); ok {
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
// member, "text", holding a string; ok is false for anything else.
func replyText(e *Envelope) (text string, ok bool) {
	if e.Template != TemplateReply {
		return "", false
	}
	if text, ok := plainReplyText(e.Payload); ok {
		return text, true
	}
	return replyTextTokens(e.Payload)
}

// plainReplyText reads the payload Go encodes for a text without escapes,
// {"text":"…"} with nothing but valid UTF-8 other than '"', '\' and
// control characters between the quotes: its text is those bytes, as a
// JSON decoder reads them. Anything else is left to replyTextTokens.
func plainReplyText(p []byte) (string, bool) {
	const prefix, suffix = `{"text":"`, `"}`
	if len(p) < len(prefix)+len(suffix) || string(p[:len(prefix)]) != prefix || string(p[len(p)-len(suffix):]) != suffix {
		return "", false
	}
	raw := p[len(prefix) : len(p)-len(suffix)]
	for _, c := range raw {
		if c == '"' || c == '\\' || c < 0x20 {
			return "", false
		}
	}
	if !utf8.Valid(raw) {
		return "", false // a decoder would replace the invalid bytes
	}
	return string(raw), true
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

// consentInstance is a non-zero snapshot as the validator sees its encoding.
func consentInstance(c *ConsentSnapshot) map[string]any {
	m := map[string]any{"digest_enabled": c.DigestEnabled}
	if c.Cadence != "" {
		m["cadence"] = c.Cadence
	}
	if c.UnsubscribeRef != "" {
		m["unsubscribe_ref"] = c.UnsubscribeRef
	}
	return m
}
