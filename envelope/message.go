package envelope

import "time"

// Message is what the renderer makes of one delivery (one segment of an
// envelope) for its channel, and what a provider sends. Exactly one of
// Email, Push and Chat is set, matching Channel.
type Message struct {
	Channel Channel
	Email   *EmailMessage
	Push    *PushMessage
	Chat    *ChatMessage
}

// Header is one e-mail header.
type Header struct {
	Name  string
	Value string
}

// EmailMessage is a rendered e-mail.
type EmailMessage struct {
	To      string
	Subject string
	HTML    string
	Text    string
	// Headers are extra headers, in order (e.g. List-Unsubscribe and
	// List-Unsubscribe-Post for RFC 8058 one-click unsubscribe).
	Headers []Header
	// Tags are provider tags (name → value, ASCII letters, digits, _ and -).
	Tags map[string]string
}

// Push urgencies (RFC 8030 §5.3).
const (
	UrgencyVeryLow = "very-low"
	UrgencyLow     = "low"
	UrgencyNormal  = "normal"
	UrgencyHigh    = "high"
)

// PushMessage is a rendered Web Push notification.
type PushMessage struct {
	Subscription PushSubscription
	// Payload is the JSON the service worker receives:
	// {"title","body","url","tag","data"}.
	Payload []byte
	// TTL is how long the push service keeps the message (never 0 by default).
	TTL time.Duration
	// Urgency is one of the Urgency* constants.
	Urgency string
	// Topic (≤ 32 URL-safe base64 chars) makes a newer message replace an
	// undelivered one with the same topic.
	Topic string
}

// Telegram parse modes.
const (
	ParseModeNone = ""
	ParseModeHTML = "HTML"
)

// ChatMessage is one rendered chat segment.
type ChatMessage struct {
	ChatID    string
	Text      string
	ParseMode string
	// Segment and Segments locate this message in its reply (0-based index,
	// total count).
	Segment  int
	Segments int
}
