package envelope

import "time"

// Message is what the renderer makes of one delivery (one segment of an
// envelope) for its channel, and what a provider sends. Exactly one of
// Email, Push, Chat and WeCom is set, matching Channel (WeCom for the three
// wecom channels).
type Message struct {
	Channel Channel
	Email   *EmailMessage
	Push    *PushMessage
	Chat    *ChatMessage
	WeCom   *WeComMessage
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

// WeCom message types.
const (
	WeComText     = "text"
	WeComMarkdown = "markdown"
)

// WeComMessage is one rendered WeCom message: an application message to
// User (as Agent, "" for the provider's default app), a post of Robot, or
// an AI bot reply to ResponseURL, by Channel.
type WeComMessage struct {
	User        string
	Agent       string
	Robot       string
	ResponseURL string
	// MsgType is WeComText or WeComMarkdown; Content its text.
	MsgType string
	Content string
	// NotAfter is when ResponseURL stops being usable (zero for the other
	// channels).
	NotAfter time.Time
	// Segment and Segments locate this message in its reply.
	Segment  int
	Segments int
}
