package render

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/outboxhq/outbox/envelope"
)

// PreviewJSON describes a rendered message as indented JSON for people
// (template authors, "outbox render"): for push the TTL in seconds,
// urgency, topic, payload size and the payload itself; for chat the
// segment, parse mode, length as Telegram counts it and the text; for
// e-mail the recipient, subject, headers and tags (the bodies are better
// read as .html, .txt or .eml). It leaves out push subscription endpoints
// and keys.
func PreviewJSON(m *envelope.Message) ([]byte, error) {
	var v any
	switch {
	case m.Channel == envelope.ChannelPush && m.Push != nil:
		if !json.Valid(m.Push.Payload) {
			return nil, fmt.Errorf("render: push payload is not JSON")
		}
		v = struct {
			TTLSeconds   int64           `json:"ttl_seconds"`
			Urgency      string          `json:"urgency"`
			Topic        string          `json:"topic"`
			PayloadBytes int             `json:"payload_bytes"`
			Payload      json.RawMessage `json:"payload"`
		}{int64(m.Push.TTL.Seconds()), m.Push.Urgency, m.Push.Topic, len(m.Push.Payload), m.Push.Payload}
	case m.Channel == envelope.ChannelTelegram && m.Chat != nil:
		visible, err := TelegramVisibleText(m.Chat.Text)
		if err != nil {
			return nil, fmt.Errorf("render: chat text: %w", err)
		}
		v = struct {
			Segment   int    `json:"segment"`
			Segments  int    `json:"segments"`
			ParseMode string `json:"parse_mode"`
			Units     int    `json:"telegram_length"`
			Text      string `json:"text"`
		}{m.Chat.Segment, m.Chat.Segments, m.Chat.ParseMode, envelope.UTF16Len(visible), m.Chat.Text}
	case m.WeCom != nil:
		v = struct {
			MsgType  string `json:"msgtype"`
			Segment  int    `json:"segment"`
			Segments int    `json:"segments"`
			Bytes    int    `json:"bytes"`
			Content  string `json:"content"`
		}{m.WeCom.MsgType, m.WeCom.Segment, m.WeCom.Segments, len(m.WeCom.Content), m.WeCom.Content}
	case m.Channel == envelope.ChannelEmail && m.Email != nil:
		v = struct {
			To        string            `json:"to"`
			Subject   string            `json:"subject"`
			Headers   []envelope.Header `json:"headers"`
			Tags      map[string]string `json:"tags,omitempty"`
			HTMLBytes int               `json:"html_bytes"`
			TextBytes int               `json:"text_bytes"`
		}{m.Email.To, m.Email.Subject, m.Email.Headers, m.Email.Tags, len(m.Email.HTML), len(m.Email.Text)}
	default:
		return nil, fmt.Errorf("render: message of channel %q has no content", m.Channel)
	}
	b, err := marshalIndent(v)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// marshalIndent encodes v indented, without escaping <, > and & (the
// preview is read by people, not embedded in HTML).
func marshalIndent(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
