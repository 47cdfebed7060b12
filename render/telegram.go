package render

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/outboxhq/outbox/envelope"
)

// replyChat renders segment segment of a reply-text.v1 reply.
func (r *Renderer) replyChat(e *envelope.Envelope, segment int) (*envelope.Message, error) {
	if strings.TrimSpace(e.Recipient.ChatID) == "" {
		return nil, fmt.Errorf("%w: telegram envelope has no recipient.chat_id", ErrPayload)
	}
	p, err := e.ReplyPayload()
	if err != nil {
		return nil, decodeError(e.Template, err)
	}
	segs := envelope.SplitReply(p.Text)
	if segment < 0 || segment >= len(segs) {
		return nil, fmt.Errorf("%w: segment %d of %d", ErrSegment, segment, len(segs))
	}
	text, err := r.chatText(replyView{Text: segs[segment], Segment: segment, Segments: len(segs)})
	if err != nil {
		return nil, err
	}
	return &envelope.Message{
		Channel: envelope.ChannelTelegram,
		Chat: &envelope.ChatMessage{
			ChatID:    e.Recipient.ChatID,
			Text:      text,
			ParseMode: envelope.ParseModeHTML,
			Segment:   segment,
			Segments:  len(segs),
		},
	}, nil
}

// chatText executes the reply template and checks that Telegram will
// accept the result: well-formed HTML of the tags Telegram knows, and at
// most envelope.MaxSegmentUnits characters once entities are parsed.
func (r *Renderer) chatText(v replyView) (string, error) {
	out, err := r.t.execText(r.t.reply, v)
	if err != nil {
		return "", err
	}
	// Telegram trims a message's surrounding whitespace; so do we, so
	// that a template's final newline does not count.
	out = strings.TrimSpace(out)
	visible, err := TelegramVisibleText(out)
	if err != nil {
		return "", fmt.Errorf("render: template %s (%s) renders invalid Telegram HTML: %w", fileReply, r.t.origin(fileReply), err)
	}
	if n := envelope.UTF16Len(visible); n > envelope.MaxSegmentUnits {
		return "", fmt.Errorf("render: template %s (%s) renders %d characters, more than Telegram's %d", fileReply, r.t.origin(fileReply), n, envelope.MaxSegmentUnits)
	}
	if strings.TrimSpace(visible) == "" {
		return "", fmt.Errorf("render: template %s (%s) renders an empty message", fileReply, r.t.origin(fileReply))
	}
	return out, nil
}

// telegramEscape escapes s for Telegram's HTML parse mode: <, > and &
// become &lt;, &gt; and &amp;; nothing else changes, so the text Telegram
// shows (and counts) is s itself.
func telegramEscape(s string) string {
	return telegramEscaper.Replace(s)
}

var telegramEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// telegramTags are the tags Telegram's HTML parse mode accepts.
var telegramTags = map[string]bool{
	"b": true, "strong": true, "i": true, "em": true, "u": true, "ins": true,
	"s": true, "strike": true, "del": true, "span": true, "tg-spoiler": true,
	"a": true, "tg-emoji": true, "code": true, "pre": true, "blockquote": true,
}

// Errors of TelegramVisibleText.
var (
	errBadEntity = errors.New("unknown or unterminated entity")
	errBadTag    = errors.New("malformed or unsupported tag")
	errNesting   = errors.New("unbalanced tags")
)

// TelegramVisibleText returns the text Telegram shows for s sent with
// parse_mode HTML: tags removed, the entities &lt; &gt; &amp; &quot; and
// numeric entities decoded. It returns an error where Telegram would answer
// "can't parse entities": a bare < or &, an unknown entity, a tag Telegram
// does not support, or unbalanced tags.
func TelegramVisibleText(s string) (string, error) {
	var out strings.Builder
	var stack []string
	for i := 0; i < len(s); {
		switch s[i] {
		case '&':
			end := strings.IndexByte(s[i:], ';')
			if end < 0 || end > 12 {
				return "", errBadEntity
			}
			r, ok := decodeEntity(s[i+1 : i+end])
			if !ok {
				return "", errBadEntity
			}
			out.WriteRune(r)
			i += end + 1
		case '<':
			end := strings.IndexByte(s[i:], '>')
			if end < 0 {
				return "", errBadTag
			}
			tag := s[i+1 : i+end]
			closing := strings.HasPrefix(tag, "/")
			tag = strings.TrimPrefix(tag, "/")
			name, _, _ := strings.Cut(tag, " ")
			name = strings.ToLower(name)
			if !telegramTags[name] || (closing && name != strings.TrimSpace(tag)) || strings.ContainsAny(tag, "<") {
				return "", errBadTag
			}
			if closing {
				if len(stack) == 0 || stack[len(stack)-1] != name {
					return "", errNesting
				}
				stack = stack[:len(stack)-1]
			} else {
				stack = append(stack, name)
			}
			i += end + 1
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			out.WriteRune(r)
			i += size
		}
	}
	if len(stack) > 0 {
		return "", errNesting
	}
	return out.String(), nil
}

// decodeEntity decodes the body of an entity (between & and ;).
func decodeEntity(name string) (rune, bool) {
	switch name {
	case "lt":
		return '<', true
	case "gt":
		return '>', true
	case "amp":
		return '&', true
	case "quot":
		return '"', true
	}
	if strings.HasPrefix(name, "#") {
		num, base := name[1:], 10
		if strings.HasPrefix(num, "x") || strings.HasPrefix(num, "X") {
			num, base = num[1:], 16
		}
		n, err := strconv.ParseUint(num, base, 32)
		if err != nil || n == 0 || n > utf8.MaxRune || (n >= 0xD800 && n <= 0xDFFF) {
			return 0, false
		}
		return rune(n), true
	}
	return 0, false
}
