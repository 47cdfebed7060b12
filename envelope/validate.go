package envelope

import (
	"bytes"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/mail"
	"net/url"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

//go:embed schema.json
var schemaJSON []byte

// SchemaURL is the $id of the envelope JSON Schema returned by Schema.
const SchemaURL = "https://raw.githubusercontent.com/outboxhq/outbox/main/envelope/schema.json"

// Limits the validator enforces beyond MaxIDBytes and MaxReplyTextBytes.
const (
	// MaxURLBytes is the longest deep link or push endpoint accepted.
	MaxURLBytes = 2048
	// MaxUnsubscribeRefBytes is the longest consent_snapshot.unsubscribe_ref
	// accepted.
	MaxUnsubscribeRefBytes = 1024
)

// MaxProblems is the most problems a ValidationError lists; beyond it, a
// last problem at the root says how many more were found.
const MaxProblems = 100

// Schema returns the envelope's JSON Schema (draft 2020-12), the document
// `outbox schema` prints. Producers in other languages validate against it;
// Parse and Validate apply it together with the rules a schema cannot state.
// The returned slice is a copy.
func Schema() []byte { return bytes.Clone(schemaJSON) }

// Problem is one reason an envelope is invalid: the JSON path of the
// offending value (like "payload.sections[0].items[2].deep_link"; "" for
// the whole document) and the rule it breaks. Neither holds the value
// itself, so a Problem is safe to log and to return to a client.
type Problem struct {
	Path string
	Rule string
}

// String returns "path: rule", with "(root)" for the empty path.
func (p Problem) String() string {
	path := p.Path
	if path == "" {
		path = "(root)"
	}
	return path + ": " + p.Rule
}

// ValidationError is returned by Parse and Validate for an invalid
// envelope. It lists every problem found, sorted by path (array indices
// numerically); past MaxProblems, a last problem says how many more there
// were. It matches ErrInvalid with errors.Is.
type ValidationError struct {
	Problems []Problem
}

// Error returns "invalid envelope: " followed by every problem, joined
// with "; ".
func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("invalid envelope: ")
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Is reports whether target is ErrInvalid.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// Parse decodes one envelope from a JSON object and validates it against
// the JSON Schema and the Go rules (the moat rule, deep links, the zero-item
// digest, times, channel and recipient agreement, id limits, reply text).
// A document beyond MaxEnvelopeBytes, MaxValues or MaxDepth is refused
// with that one problem before it is decoded, and so is a valid one whose
// JSON encoding would exceed MaxEnvelopeBytes.
//
// It returns every problem found in one *ValidationError, and the envelope
// only when it is valid. The returned envelope's Payload is the compact
// encoding json.Marshal would produce, so Parse(json.Marshal(e)) equals e.
// Parse is safe for concurrent use.
func Parse(data []byte) (*Envelope, error) {
	e, problems := check(data)
	if len(problems) == 0 {
		if p, ok := encodedSizeProblem(data, e); !ok {
			problems = []Problem{p}
		}
	}
	if len(problems) > 0 {
		return nil, &ValidationError{Problems: capProblems(problems)}
	}
	return e, nil
}

// Validate checks an envelope built in Go with the same rules as Parse: it
// encodes e and checks the encoding, and also checks the Go strings that
// encoding would silently repair (invalid UTF-8). It returns nil or a
// *ValidationError. e is not modified.
func Validate(e *Envelope) error {
	_, err := ValidEncoding(e)
	return err
}

// ValidEncoding validates e like Validate and returns its JSON encoding
// (what json.Marshal(e) produces) when it is valid, so that a caller that
// stores the envelope need not encode it twice.
func ValidEncoding(e *Envelope) ([]byte, error) {
	data, _, err := ValidEncodingRows(e)
	return data, err
}

// ValidEncodingRows is ValidEncoding that also returns Rows(e) when e is
// valid.
func ValidEncodingRows(e *Envelope) ([]byte, int, error) {
	if e == nil {
		return nil, 0, &ValidationError{Problems: []Problem{{Rule: "missing envelope"}}}
	}
	data, reply, err := encodeChecked(e)
	if err != nil {
		return nil, 0, err
	}
	if reply != nil { // Rows(e), from the text the checks decoded
		return data, replyRows(e.Channel, *reply), nil
	}
	return data, 1, nil
}

// Rows returns how many delivery rows an envelope materialises: the number
// of chat segments of a reply-text.v1 text, 1 otherwise.
func Rows(e *Envelope) int {
	if e.Template == TemplateReply {
		if p, err := e.ReplyPayload(); err == nil {
			return replyRows(e.Channel, p.Text)
		}
	}
	return 1
}

// replyRows is the row count of a reply text on channel ch (at least 1).
func replyRows(ch Channel, text string) int {
	return max(1, len(SplitReplyFor(ch, text)))
}

// encodingProblems finds the strings of e that encoding would silently
// repair (invalid UTF-8).
func encodingProblems(e *Envelope) []Problem {
	var pre []Problem
	for _, f := range []struct{ path, s string }{
		{"schema_version", e.SchemaVersion},
		{"id", e.ID},
		{"user_id", e.UserID},
		{"tenant_id", e.TenantID},
		{"channel", string(e.Channel)},
		{"template", string(e.Template)},
		{"recipient.email", e.Recipient.Email},
		{"recipient.chat_id", e.Recipient.ChatID},
		{"recipient.wecom_user", e.Recipient.WeComUser},
		{"recipient.wecom_agent", e.Recipient.WeComAgent},
		{"recipient.robot", e.Recipient.Robot},
		{"recipient.response_url", e.Recipient.ResponseURL},
		{"consent_snapshot.cadence", e.ConsentSnapshot.Cadence},
		{"consent_snapshot.unsubscribe_ref", e.ConsentSnapshot.UnsubscribeRef},
	} {
		if !utf8.ValidString(f.s) {
			pre = append(pre, Problem{f.path, ruleUTF8})
		}
	}
	if ps := e.Recipient.PushSubscription; ps != nil {
		for _, f := range []struct{ path, s string }{
			{"recipient.push_subscription.endpoint", ps.Endpoint},
			{"recipient.push_subscription.keys.p256dh", ps.Keys.P256dh},
			{"recipient.push_subscription.keys.auth", ps.Keys.Auth},
		} {
			if !utf8.ValidString(f.s) {
				pre = append(pre, Problem{f.path, ruleUTF8})
			}
		}
	}
	return pre
}

// encodeChecked encodes e with json.Marshal and runs every check on the
// encoding (checkDoc), together with the checks of Go values that encoding
// would silently repair (encodingProblems) or refuse (encodingRefusals),
// each reported at its path. It also returns the text of a reply-text.v1
// payload, as the checks decoded it.
func encodeChecked(e *Envelope) ([]byte, *string, error) {
	pre := encodingProblems(e)
	cp := *e
	data, err := json.Marshal(&cp)
	if err != nil {
		// Every value encodingRefusals finds fails json.Marshal, and only
		// those do: the copy is encoded again without them, so that every
		// other problem is found too.
		pre = append(pre, encodingRefusals(&cp)...)
		data, err = json.Marshal(&cp)
	}
	if err != nil { // unreachable after encodingRefusals; keep it safe
		return nil, nil, &ValidationError{Problems: sortProblems(append(pre, Problem{Rule: "cannot be encoded as JSON"}))}
	}
	var facts docFacts
	_, problems := checkDoc(data, &cp, &facts)
	problems = sortProblems(mergeProblems(pre, problems))
	if len(problems) > 0 {
		return nil, nil, &ValidationError{Problems: capProblems(problems)}
	}
	return data, facts.reply, nil
}

// docFacts is what the checks of a document decoded that a caller uses.
type docFacts struct {
	reply *string // the text of a reply-text.v1 payload
}

// encodingRefusals finds the values of cp that json.Marshal refuses to
// encode (a payload that is not JSON, a time RFC 3339 cannot write, a
// non-finite number) and clears them in cp, which is a copy: its push
// subscription is copied before it is changed.
func encodingRefusals(cp *Envelope) []Problem {
	var pre []Problem
	if len(cp.Payload) > 0 && !json.Valid(cp.Payload) {
		pre = append(pre, Problem{"payload", "must be valid JSON"})
		cp.Payload = nil
	}
	for _, f := range []struct {
		path string
		t    *time.Time
	}{{"not_before", &cp.NotBefore}, {"expires_at", &cp.ExpiresAt}, {"created_at", &cp.CreatedAt}} {
		if f.t.IsZero() {
			continue
		}
		_, off := f.t.Zone()
		switch y := f.t.Year(); {
		case y < 0 || y > 9999:
			pre = append(pre, Problem{f.path, "year must be within 0000-9999"})
		case off <= -24*3600 || off >= 24*3600:
			pre = append(pre, Problem{f.path, "zone offset must be less than 24 hours"})
		default:
			continue
		}
		*f.t = time.Time{}
	}
	if ps := cp.Recipient.PushSubscription; ps != nil && ps.ExpirationTime != nil {
		if x := *ps.ExpirationTime; math.IsNaN(x) || math.IsInf(x, 0) {
			pre = append(pre, Problem{"recipient.push_subscription.expirationTime", "must be a finite number"})
			psCopy := *ps
			psCopy.ExpirationTime = nil
			cp.Recipient.PushSubscription = &psCopy
		}
	}
	return pre
}

// Rule texts shared by several checks.
const (
	ruleUTF8       = "must be valid UTF-8"
	ruleDupKey     = "appears twice in its object (JSON readers disagree on which one counts)"
	ruleNoControl  = "must not contain control characters"
	ruleMoatRefs   = "required non-empty (moat rule)"
	ruleMoatLink   = "required (moat rule)"
	ruleHTTPURL    = "must be an absolute http(s) URL"
	ruleHTTPSURL   = "must be an absolute https URL"
	ruleNonEmpty   = "required non-empty"
	ruleZeroDigest = "digest has no items (zero-item digest)"
)

// check runs every check on one JSON document and returns the decoded
// envelope (meaningful only when there are no problems) and the problems,
// deduplicated and sorted.
func check(data []byte) (*Envelope, []Problem) { return checkDoc(data, nil, nil) }

// checkDoc is check; typed, when not nil, is the envelope data was encoded
// from (Validate): the document is then known to be well-formed JSON and
// the envelope need not be decoded again.
func checkDoc(data []byte, typed *Envelope, facts *docFacts) (*Envelope, []Problem) {
	// The limits first, before anything is decoded (see MaxValues).
	if p, ok := shapeProblem(data); !ok {
		if typed != nil && p.Rule == ruleTooLarge {
			p.Rule = ruleEncTooLong
		}
		return nil, []Problem{p}
	}
	if typed == nil {
		if p, ok := syntaxProblem(data); !ok {
			return nil, []Problem{p}
		}
	}
	var top map[string]json.RawMessage
	if typed != nil {
		// data is typed's encoding: the fields goRules looks at are known.
		top = map[string]json.RawMessage{"payload": typed.Payload}
		if typed.TenantID != "" {
			top["tenant_id"] = nil
		}
	} else if err := json.Unmarshal(data, &top); err != nil || top == nil {
		return nil, []Problem{{Rule: "must be a JSON object"}}
	}

	// The JSON Schema.
	inst, err := decodeInstance(data)
	if err != nil { // unreachable after the syntax check; keep it safe
		return nil, []Problem{{Rule: "malformed JSON"}}
	}
	schemaProbs := schemaProblems(inst)

	// Strings that decoding would silently repair, and names that
	// decoding would silently drop (a typed envelope's encoding has none).
	goProbs := utf8Problems(data)
	if typed == nil {
		goProbs = append(goProbs, duplicateKeyProblems(data)...)
	}

	// Decode into the Go types, field by field so that a failure is
	// attributed to its field.
	e := new(Envelope)
	failed := map[string]bool{}
	var decodeProbs []Problem
	if typed != nil {
		cp := *typed
		e = &cp
		goProbs = append(goProbs, goRules(e, top, failed, &decodeProbs, facts)...)
		return e, sortProblems(mergeProblems(mergeProblems(goProbs, schemaProbs), decodeProbs))
	}
	fields := map[string]any{
		"schema_version":   &e.SchemaVersion,
		"id":               &e.ID,
		"user_id":          &e.UserID,
		"tenant_id":        &e.TenantID,
		"channel":          &e.Channel,
		"template":         &e.Template,
		"recipient":        &e.Recipient,
		"consent_snapshot": &e.ConsentSnapshot,
		"not_before":       &e.NotBefore,
		"expires_at":       &e.ExpiresAt,
		"created_at":       &e.CreatedAt,
	}
	for name, raw := range top {
		if name == "payload" {
			e.Payload = canonicalJSON(raw)
			continue
		}
		dst, ok := fields[name]
		if !ok {
			continue // the schema reports unknown fields
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			failed[name] = true
			decodeProbs = append(decodeProbs, decodeProblems(name, raw, err)...)
		}
	}

	// The Go rules.
	goProbs = append(goProbs, goRules(e, top, failed, &decodeProbs, facts)...)

	// Decode problems matter where the schema accepts a value that the Go
	// types cannot hold (1.0 for an integer, a leap second); where the
	// schema already rejects the value, its rule is the clearer one.
	problems := mergeProblems(mergeProblems(goProbs, schemaProbs), decodeProbs)
	return e, sortProblems(problems)
}

// syntaxProblem reports malformed JSON with its line, column and byte
// offset, never quoting the document.
func syntaxProblem(data []byte) (Problem, bool) {
	if len(bytes.TrimSpace(data)) == 0 {
		return Problem{Rule: "empty document"}, false
	}
	var v json.RawMessage
	err := json.Unmarshal(data, &v)
	if err == nil {
		return Problem{}, true
	}
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return Problem{Rule: "malformed JSON"}, false
	}
	// Offset counts the bytes read, the offending one included.
	off := int(se.Offset)
	if off >= len(data) {
		off = len(data)
	} else if off > 0 {
		off--
	}
	line, col := lineCol(data, off)
	return Problem{Rule: fmt.Sprintf("malformed JSON: %s at line %d, column %d (byte offset %d)",
		syntaxReason(se.Error()), line, col, off)}, false
}

var quotedChar = regexp.MustCompile(`'(?:[^'\\]|\\.)*'\s*`)

// syntaxReason strips the quoted character from encoding/json's message,
// so that no byte of the document is echoed.
func syntaxReason(msg string) string {
	return strings.TrimSpace(quotedChar.ReplaceAllString(msg, ""))
}

// lineCol returns the 1-based line and column (in bytes) of offset off.
func lineCol(data []byte, off int) (line, col int) {
	if off > len(data) {
		off = len(data)
	}
	before := data[:off]
	line = 1 + bytes.Count(before, []byte{'\n'})
	col = off - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return line, col
}

// canonicalJSON returns raw as json.Marshal encodes a json.RawMessage
// (compact, HTML-escaped), so that decoded envelopes compare equal after a
// round trip.
func canonicalJSON(raw json.RawMessage) json.RawMessage {
	b, err := json.Marshal(raw)
	if err != nil {
		return bytes.Clone(raw)
	}
	return b
}

// decodeProblems turns an encoding/json error decoding top-level field
// name (whose JSON is raw) into problems, without the value. A type error
// is located at every value of the failing field that the Go type cannot
// hold, with array indices.
func decodeProblems(name string, raw json.RawMessage, err error) []Problem {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		target := name
		if te.Field != "" {
			for _, k := range strings.Split(te.Field, ".") {
				target = joinKey(target, k)
			}
		}
		rule := typeRule(te.Type)
		var out []Problem
		if te.Type != nil {
			walkJSON(raw, name, func(path string, v []byte, what walkKind) {
				if what != walkValue || indexInPath.ReplaceAllString(path, "") != target {
					return
				}
				if json.Unmarshal(v, reflect.New(te.Type).Interface()) != nil {
					out = append(out, Problem{path, rule})
				}
			})
		}
		if len(out) == 0 {
			out = []Problem{{target, rule}}
		}
		return out
	}
	switch name {
	case "not_before", "expires_at", "created_at":
		return []Problem{{name, "must be an RFC 3339 date-time"}}
	}
	return []Problem{{name, "cannot be decoded"}}
}

var indexInPath = regexp.MustCompile(`\[[0-9]+\]`)

// typeRule says which JSON value a Go type needs.
func typeRule(t reflect.Type) string {
	if t == nil {
		return "has the wrong type"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "must be a plain integer within 64-bit range (no fraction or exponent)"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "must be a plain non-negative integer within 64-bit range"
	case reflect.Float32, reflect.Float64:
		return "must be a number within float64 range"
	case reflect.String:
		return "must be a string"
	case reflect.Bool:
		return "must be a boolean"
	case reflect.Slice, reflect.Array:
		return "must be an array"
	case reflect.Struct, reflect.Map:
		return "must be an object"
	}
	return "has the wrong type"
}

// ---- the Go rules ----

// goRules checks what a JSON Schema cannot say, or says less clearly. top
// is the raw document (for presence); failed names top-level fields that
// did not decode, whose rules are skipped. A payload that does not decode
// into its Go type adds to decodeProbs.
func goRules(e *Envelope, top map[string]json.RawMessage, failed map[string]bool, decodeProbs *[]Problem, facts *docFacts) []Problem {
	var c problemList

	if !failed["schema_version"] && e.SchemaVersion != SchemaVersion {
		if e.SchemaVersion == "" {
			c.add("schema_version", "required")
		} else {
			c.add("schema_version", `unsupported version (want "1")`)
		}
	}
	if !failed["id"] {
		checkIdentifier(&c, "id", e.ID)
	}
	if !failed["user_id"] {
		checkIdentifier(&c, "user_id", e.UserID)
	}
	if _, present := top["tenant_id"]; present && !failed["tenant_id"] {
		checkIdentifier(&c, "tenant_id", e.TenantID)
	}

	channelOK := !failed["channel"] && e.Channel.Valid()
	if !failed["channel"] && !channelOK {
		if e.Channel == "" {
			c.add("channel", "required")
		} else {
			c.add("channel", "unknown channel (want email, push, telegram, wecom, wecom_robot or wecom_bot_reply)")
		}
	}
	templateOK := !failed["template"] && templateChannels[e.Template] != nil
	if !failed["template"] && !templateOK {
		if e.Template == "" {
			c.add("template", "required")
		} else {
			c.add("template", "unknown template (want your-week-digest.v1, resurface-nudge.v1 or reply-text.v1)")
		}
	}
	if channelOK && templateOK {
		allowed := templateChannels[e.Template]
		ok := false
		for _, ch := range allowed {
			ok = ok || ch == e.Channel
		}
		if !ok {
			names := make([]string, len(allowed))
			for i, ch := range allowed {
				names[i] = string(ch)
			}
			c.add("channel", fmt.Sprintf("not allowed for template %s (want %s)", e.Template, strings.Join(names, " or ")))
		}
	}

	if channelOK && !failed["recipient"] {
		checkRecipient(&c, e.Channel, &e.Recipient)
	}
	if channelOK && e.Channel == ChannelEmail && !failed["consent_snapshot"] {
		ref := e.ConsentSnapshot.UnsubscribeRef
		switch {
		case ref == "":
			c.add("consent_snapshot.unsubscribe_ref", "required for channel email (one-click unsubscribe)")
		case len(ref) > MaxUnsubscribeRefBytes:
			c.add("consent_snapshot.unsubscribe_ref", fmt.Sprintf("must be at most %d bytes", MaxUnsubscribeRefBytes))
		case hasControl(ref):
			c.add("consent_snapshot.unsubscribe_ref", ruleNoControl)
		}
	}

	if !failed["not_before"] && !failed["expires_at"] &&
		!e.NotBefore.IsZero() && !e.ExpiresAt.IsZero() && !e.NotBefore.Before(e.ExpiresAt) {
		c.add("expires_at", "must be after not_before")
	}
	if channelOK && e.Channel == ChannelWeComBotReply {
		checkBotReply(&c, e, top, failed)
	}

	if raw, ok := top["payload"]; ok && templateOK && isJSONObject(raw) {
		if err := checkPayload(&c, e.Template, raw, facts); err != nil {
			*decodeProbs = append(*decodeProbs, decodeProblems("payload", raw, err)...)
		}
	}
	return c.list
}

// templateChannels lists the channels each template may be delivered on.
var templateChannels = map[Template][]Channel{
	TemplateDigest: {ChannelEmail, ChannelWeCom},
	TemplateNudge:  {ChannelPush, ChannelEmail, ChannelWeCom},
	TemplateReply:  {ChannelTelegram, ChannelWeCom, ChannelWeComRobot, ChannelWeComBotReply},
}

type problemList struct{ list []Problem }

func (l *problemList) add(path, rule string) { l.list = append(l.list, Problem{path, rule}) }

// checkIdentifier checks an id, user_id or (present) tenant_id.
func checkIdentifier(c *problemList, path, s string) {
	switch {
	case s == "":
		c.add(path, ruleNonEmpty)
	case len(s) > MaxIDBytes:
		c.add(path, fmt.Sprintf("must be at most %d bytes", MaxIDBytes))
	case !utf8.ValidString(s):
		c.add(path, ruleUTF8)
	case hasControl(s):
		c.add(path, ruleNoControl)
	}
}

// hasControl reports whether s holds a C0 control, DEL or a C1 control.
func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return true
		}
	}
	return false
}

var chatIDPattern = regexp.MustCompile(`^(-?[0-9]{1,20}|@[A-Za-z0-9_]{5,32})$`)

// checkRecipient checks that the recipient has what channel ch needs.
func checkRecipient(c *problemList, ch Channel, r *Recipient) {
	switch ch {
	case ChannelEmail:
		switch {
		case r.Email == "":
			c.add("recipient.email", "required for channel email")
		case !validEmail(r.Email):
			c.add("recipient.email", "must be a valid email address (addr-spec)")
		}
	case ChannelPush:
		ps := r.PushSubscription
		if ps == nil {
			c.add("recipient.push_subscription", "required for channel push")
			return
		}
		const p = "recipient.push_subscription."
		switch {
		case ps.Endpoint == "":
			c.add(p+"endpoint", "required for channel push")
		case len(ps.Endpoint) > MaxURLBytes:
			c.add(p+"endpoint", fmt.Sprintf("must be at most %d bytes", MaxURLBytes))
		case !validURL(ps.Endpoint, false):
			c.add(p+"endpoint", ruleHTTPSURL)
		}
		switch {
		case ps.Keys.P256dh == "":
			c.add(p+"keys.p256dh", "required for channel push")
		default:
			if k, ok := decodeB64(ps.Keys.P256dh); !ok || len(k) != 65 || k[0] != 4 {
				c.add(p+"keys.p256dh", "must be a base64url uncompressed P-256 public key (65 bytes)")
			}
		}
		switch {
		case ps.Keys.Auth == "":
			c.add(p+"keys.auth", "required for channel push")
		default:
			if k, ok := decodeB64(ps.Keys.Auth); !ok || len(k) != 16 {
				c.add(p+"keys.auth", "must be a base64url 16-byte secret")
			}
		}
	case ChannelTelegram:
		switch {
		case r.ChatID == "":
			c.add("recipient.chat_id", "required for channel telegram")
		case !chatIDPattern.MatchString(r.ChatID):
			c.add("recipient.chat_id", "must be a numeric chat id or an @username")
		}
	case ChannelWeCom, ChannelWeComRobot, ChannelWeComBotReply:
		checkWeComRecipient(c, ch, r)
	}
}

// validEmail reports whether s is a bare RFC 5322 addr-spec.
func validEmail(s string) bool {
	if len(s) > 254 || hasControl(s) {
		return false
	}
	a, err := mail.ParseAddress(s)
	return err == nil && a.Name == "" && a.Address == s
}

// validURL reports whether s is an absolute https URL (or http too, when
// allowHTTP) with a host, no user info and no whitespace or controls.
func validURL(s string, allowHTTP bool) bool {
	if strings.ContainsFunc(s, unicode.IsSpace) || hasControl(s) {
		return false
	}
	u, err := url.Parse(s)
	if err != nil || u.User != nil || u.Host == "" || u.Opaque != "" {
		return false
	}
	return u.Scheme == "https" || (allowHTTP && u.Scheme == "http")
}

// decodeB64 decodes base64url or base64, padded or not, as push services
// and webpush-go accept.
func decodeB64(s string) ([]byte, bool) {
	for _, enc := range []*base64.Encoding{base64.RawURLEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.StdEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, true
		}
	}
	return nil, false
}

func isJSONObject(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '{'
}

// checkPayload checks the payload of template t. It returns the decode
// error of a payload that does not fit the Go type, whose rules it skips.
func checkPayload(c *problemList, t Template, raw json.RawMessage, facts *docFacts) error {
	switch t {
	case TemplateDigest:
		var p DigestPayload
		if err := json.Unmarshal(raw, &p); err != nil {
			return err
		}
		n := 0
		for i, s := range p.Sections {
			for j := range s.Items {
				n++
				checkItem(c, fmt.Sprintf("payload.sections[%d].items[%d]", i, j), &s.Items[j])
			}
		}
		if n == 0 {
			c.add("payload.sections", ruleZeroDigest)
		}
	case TemplateNudge:
		var p NudgePayload
		if err := json.Unmarshal(raw, &p); err != nil {
			return err
		}
		var fields map[string]json.RawMessage
		_ = json.Unmarshal(raw, &fields)
		if p.HighlightCount < 0 {
			c.add("payload.highlight_count", "must be at least 0")
		}
		if lead, ok := fields["lead"]; !ok || !isJSONObject(lead) {
			c.add("payload.lead", "required (an item)")
		} else {
			checkItem(c, "payload.lead", &p.Lead)
		}
	case TemplateReply:
		var p ReplyPayload
		if err := json.Unmarshal(raw, &p); err != nil {
			return err
		}
		if facts != nil {
			facts.reply = &p.Text
		}
		switch {
		case strings.TrimSpace(p.Text) == "":
			c.add("payload.text", ruleNonEmpty)
		case len(p.Text) > MaxReplyTextBytes:
			c.add("payload.text", fmt.Sprintf("must be at most %d bytes", MaxReplyTextBytes))
		case !utf8.ValidString(p.Text):
			c.add("payload.text", ruleUTF8)
		}
	}
	return nil
}

// checkItem applies the moat rule and the link and graph-ref rules to one
// digest item or nudge lead.
func checkItem(c *problemList, path string, it *Item) {
	if len(it.GraphRefs) == 0 {
		c.add(path+".graph_refs", ruleMoatRefs)
	}
	for k, ref := range it.GraphRefs {
		rp := fmt.Sprintf("%s.graph_refs[%d]", path, k)
		prefix, rest, _ := strings.Cut(ref.ID, ":")
		if (prefix != "person" && prefix != "topic") || rest == "" {
			c.add(rp+".id", `must be "person:…" or "topic:…"`)
		} else if ref.Kind != "" && ref.Kind != prefix {
			c.add(rp+".kind", "must match the id's prefix")
		}
	}
	switch {
	case it.DeepLink == "":
		c.add(path+".deep_link", ruleMoatLink)
	case len(it.DeepLink) > MaxURLBytes:
		c.add(path+".deep_link", fmt.Sprintf("must be at most %d bytes", MaxURLBytes))
	case !validURL(it.DeepLink, true):
		c.add(path+".deep_link", ruleHTTPURL)
	}
}

// ---- raw UTF-8 ----

// utf8Problems finds strings (keys or values) holding invalid UTF-8 or a
// lone UTF-16 surrogate escape, which encoding/json would silently replace
// with U+FFFD. data is known to be syntactically valid.
func utf8Problems(data []byte) []Problem {
	if utf8.Valid(data) && !bytes.Contains(data, []byte(`\u`)) {
		return nil
	}
	var out []Problem
	walkJSON(data, "", func(path string, raw []byte, what walkKind) {
		// A string, a key, or a subtree too deep to walk: the check holds
		// for a whole subtree because escapes occur only inside strings.
		if (what != walkValue || raw[0] == '"') && !validJSONString(raw) {
			out = append(out, Problem{path, ruleUTF8})
		}
	})
	return out
}

// walkKind says what walkJSON hands to its callback.
type walkKind int

const (
	walkValue  walkKind = iota // a value (containers included, after their contents)
	walkKey                    // an object key, with the path of its value
	walkOpaque                 // a subtree deeper than maxWalkDepth, not walked
)

// maxWalkDepth bounds how deep walkJSON descends; an envelope is about 8
// levels deep, so anything below this is opaque application data.
const maxWalkDepth = 32

// walkJSON calls fn for every value and key of the syntactically valid
// JSON value raw, in one pass, with the raw bytes (quotes included).
func walkJSON(raw []byte, path string, fn func(path string, raw []byte, what walkKind)) {
	w := jsonWalker{data: raw, fn: fn}
	w.value(path, 0)
}

type jsonWalker struct {
	data []byte
	i    int
	fn   func(path string, raw []byte, what walkKind)
	dup  func(path string) // a member whose name its object had already (nil: not looked for)
}

// duplicateKeyProblems finds the object members, down to maxWalkDepth,
// whose name their object holds already: encoding/json keeps the last,
// other readers of a log the first.
func duplicateKeyProblems(data []byte) []Problem {
	var out []Problem
	w := jsonWalker{data: data, fn: func(string, []byte, walkKind) {}, dup: func(path string) {
		out = append(out, Problem{path, ruleDupKey})
	}}
	w.value("", 0)
	return out
}

func (w *jsonWalker) space() {
	for w.i < len(w.data) {
		switch w.data[w.i] {
		case ' ', '\t', '\r', '\n':
			w.i++
		default:
			return
		}
	}
}

// str skips a string token starting at w.i.
func (w *jsonWalker) str() {
	for w.i++; w.i < len(w.data); w.i++ {
		switch w.data[w.i] {
		case '\\':
			w.i++
		case '"':
			w.i++
			return
		}
	}
}

// skip skips one value without calling fn.
func (w *jsonWalker) skip() {
	w.space()
	depth := 0
	for w.i < len(w.data) {
		switch c := w.data[w.i]; c {
		case '"':
			w.str()
			if depth == 0 {
				return
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 { // the end of the enclosing container
				return
			}
			depth--
			if depth == 0 {
				w.i++
				return
			}
		case ',', ' ', '\t', '\r', '\n':
			if depth == 0 {
				return
			}
		}
		w.i++
	}
}

func (w *jsonWalker) value(path string, depth int) {
	w.space()
	if w.i >= len(w.data) {
		return
	}
	start := w.i
	if depth > maxWalkDepth {
		w.skip()
		if w.i > start {
			w.fn(path, w.data[start:w.i], walkOpaque)
		}
		return
	}
	switch w.data[w.i] {
	case '{':
		w.i++
		var names map[string]bool
		for {
			w.space()
			if w.i >= len(w.data) || w.data[w.i] == '}' {
				break
			}
			ks := w.i
			w.str()
			keyRaw := w.data[ks:w.i]
			var key string
			_ = json.Unmarshal(keyRaw, &key)
			child := joinKey(path, key)
			if w.dup != nil {
				if names == nil {
					names = map[string]bool{}
				}
				if names[key] {
					w.dup(child)
				}
				names[key] = true
			}
			w.fn(child, keyRaw, walkKey)
			w.space()
			w.i++ // ':'
			w.value(child, depth+1)
			w.space()
			if w.i < len(w.data) && w.data[w.i] == ',' {
				w.i++
			}
		}
		w.i++ // '}'
	case '[':
		w.i++
		for n := 0; ; n++ {
			w.space()
			if w.i >= len(w.data) || w.data[w.i] == ']' {
				break
			}
			w.value(joinIndex(path, n), depth+1)
			w.space()
			if w.i < len(w.data) && w.data[w.i] == ',' {
				w.i++
			}
		}
		w.i++ // ']'
	case '"':
		w.str()
	default:
		w.skip()
	}
	if end := min(w.i, len(w.data)); end > start {
		w.fn(path, w.data[start:end], walkValue)
	}
}

// validJSONString reports whether a raw JSON string token is valid UTF-8
// and has no unpaired surrogate escapes.
func validJSONString(raw []byte) bool {
	if !utf8.Valid(raw) {
		return false
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if i >= len(raw) || raw[i] != 'u' {
			continue
		}
		r, ok := hex4(raw[i+1:])
		if !ok {
			return false
		}
		i += 4
		switch {
		case r >= 0xD800 && r <= 0xDBFF:
			if i+2 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
				if lo, ok := hex4(raw[i+3:]); ok && lo >= 0xDC00 && lo <= 0xDFFF {
					i += 6
					continue
				}
			}
			return false
		case r >= 0xDC00 && r <= 0xDFFF:
			return false
		}
	}
	return true
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 16)
	return rune(n), err == nil
}

// ---- paths ----

var identKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// maxKeyInPath bounds how much of an unknown key a path shows.
const maxKeyInPath = 64

// joinKey appends an object key to a path: "a.b", or a["odd key"] for a key
// that is not a plain identifier (quoted, escaped, truncated).
func joinKey(path, key string) string {
	if identKey.MatchString(key) && len(key) <= maxKeyInPath {
		if path == "" {
			return key
		}
		return path + "." + key
	}
	if len(key) > maxKeyInPath {
		cut := maxKeyInPath
		for cut > 0 && !utf8.RuneStart(key[cut]) {
			cut--
		}
		key = key[:cut] + "…"
	}
	return path + "[" + strconv.Quote(key) + "]"
}

func joinIndex(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// pathToken is one step of a path: an object key or an array index.
type pathToken struct {
	key   string
	index int
	isIdx bool
}

// splitPath parses a path built by joinKey and joinIndex.
func splitPath(p string) []pathToken {
	var toks []pathToken
	for i := 0; i < len(p); {
		switch p[i] {
		case '.':
			i++
		case '[':
			if i+1 < len(p) && p[i+1] == '"' {
				q, err := strconv.QuotedPrefix(p[i+1:])
				if err != nil {
					toks = append(toks, pathToken{key: p[i:]})
					return toks
				}
				k, _ := strconv.Unquote(q)
				toks = append(toks, pathToken{key: k})
				i += 1 + len(q) + 1
				continue
			}
			end := strings.IndexByte(p[i:], ']')
			if end < 0 {
				toks = append(toks, pathToken{key: p[i:]})
				return toks
			}
			n, err := strconv.Atoi(p[i+1 : i+end])
			if err != nil {
				toks = append(toks, pathToken{key: p[i+1 : i+end]})
			} else {
				toks = append(toks, pathToken{index: n, isIdx: true})
			}
			i += end + 1
		default:
			end := strings.IndexAny(p[i:], ".[")
			if end < 0 {
				end = len(p) - i
			}
			toks = append(toks, pathToken{key: p[i : i+end]})
			i += end
		}
	}
	return toks
}

// comparePaths orders paths step by step, indices numerically.
func comparePaths(a, b string) int {
	ta, tb := splitPath(a), splitPath(b)
	for i := 0; i < len(ta) && i < len(tb); i++ {
		x, y := ta[i], tb[i]
		switch {
		case x.isIdx && y.isIdx:
			if x.index != y.index {
				return x.index - y.index
			}
		case x.isIdx != y.isIdx:
			if x.isIdx {
				return -1
			}
			return 1
		default:
			if c := strings.Compare(x.key, y.key); c != 0 {
				return c
			}
		}
	}
	return len(ta) - len(tb)
}

// pathAncestors returns the proper, non-root ancestors of path p: for
// "a.b[2]", "a" and "a.b". Separators inside quoted keys do not count.
func pathAncestors(p string) []string {
	var out []string
	inQuote := false
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && (c == '.' || c == '[') && i > 0:
			out = append(out, p[:i])
		}
	}
	return out
}

// mergeProblems returns primary plus each secondary problem that is not at
// or above a primary problem's path (the root only counts when a primary
// problem is at the root): the primary rule text is the more specific one.
func mergeProblems(primary, secondary []Problem) []Problem {
	covered := make(map[string]bool, len(primary))
	for _, p := range primary {
		covered[p.Path] = true
		for _, a := range pathAncestors(p.Path) {
			covered[a] = true
		}
	}
	out := append([]Problem(nil), primary...)
	for _, s := range secondary {
		if !covered[s.Path] {
			out = append(out, s)
		}
	}
	return out
}

// sortProblems sorts by path, then rule, and drops exact duplicates.
func sortProblems(ps []Problem) []Problem {
	sort.SliceStable(ps, func(i, j int) bool {
		if c := comparePaths(ps[i].Path, ps[j].Path); c != 0 {
			return c < 0
		}
		return ps[i].Rule < ps[j].Rule
	})
	out := ps[:0]
	for i, p := range ps {
		if i > 0 && p == ps[i-1] {
			continue
		}
		out = append(out, p)
	}
	return out
}

// capProblems keeps the first MaxProblems problems and says how many more
// there were.
func capProblems(ps []Problem) []Problem {
	if len(ps) <= MaxProblems {
		return ps
	}
	more := len(ps) - MaxProblems
	return append(ps[:MaxProblems:MaxProblems], Problem{Rule: fmt.Sprintf("%d more problems not shown", more)})
}
