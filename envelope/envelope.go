// Package envelope holds the shared nouns of outbox: the DeliveryEnvelope
// contract (schema_version "1" with the v1.1 amendments), its payloads, the
// channel kinds, the delivery states and the stable error classes.
//
// It imports nothing of outbox's other packages, so every other package
// (queue, render, channels, the HTTP layer) can speak these types.
package envelope

import (
	"encoding/json"
	"time"
)

// SchemaVersion is the only envelope schema version this module accepts.
const SchemaVersion = "1"

// DefaultTenant is the tenant of an envelope that names none.
const DefaultTenant = "default"

// MaxIDBytes is the longest id, user_id or tenant_id accepted, in bytes.
const MaxIDBytes = 200

// MaxReplyTextBytes is the longest reply-text.v1 text accepted, in bytes.
const MaxReplyTextBytes = 64 << 10

// Channel names a delivery channel.
type Channel string

// The channels outbox delivers on.
const (
	ChannelEmail    Channel = "email"
	ChannelPush     Channel = "push"
	ChannelTelegram Channel = "telegram"
	// ChannelWeCom is a WeCom application message to one member
	// (recipient.wecom_user, optionally recipient.wecom_agent).
	ChannelWeCom Channel = "wecom"
	// ChannelWeComRobot is a post of a WeCom group robot configured on the
	// server (recipient.robot names it; its key never is in an envelope).
	ChannelWeComRobot Channel = "wecom_robot"
	// ChannelWeComBotReply is a WeCom AI bot's reply through the
	// callback's response_url (single use, valid one hour).
	ChannelWeComBotReply Channel = "wecom_bot_reply"
)

// Channels lists every known channel, in a stable order.
var Channels = []Channel{ChannelEmail, ChannelPush, ChannelTelegram, ChannelWeCom, ChannelWeComRobot, ChannelWeComBotReply}

// Valid reports whether c is a known channel.
func (c Channel) Valid() bool {
	switch c {
	case ChannelEmail, ChannelPush, ChannelTelegram, ChannelWeCom, ChannelWeComRobot, ChannelWeComBotReply:
		return true
	}
	return false
}

// Template names the payload shape and how it is rendered.
type Template string

// The templates of schema_version "1".
const (
	TemplateDigest Template = "your-week-digest.v1"
	TemplateNudge  Template = "resurface-nudge.v1"
	TemplateReply  Template = "reply-text.v1"
)

// Envelope is the unit an application enqueues (SPEC §2). Its ID is the
// idempotency key within its tenant.
//
// Payload is kept as raw JSON so that an envelope round-trips byte for byte;
// use DigestPayload, NudgePayload or ReplyPayload to read it.
type Envelope struct {
	SchemaVersion   string          `json:"schema_version"`
	ID              string          `json:"id"`
	UserID          string          `json:"user_id"`
	TenantID        string          `json:"tenant_id,omitempty"`
	Channel         Channel         `json:"channel"`
	Template        Template        `json:"template"`
	Recipient       Recipient       `json:"recipient"`
	ConsentSnapshot ConsentSnapshot `json:"consent_snapshot,omitzero"`
	Payload         json.RawMessage `json:"payload"`
	NotBefore       time.Time       `json:"not_before,omitzero"`
	ExpiresAt       time.Time       `json:"expires_at,omitzero"`
	CreatedAt       time.Time       `json:"created_at,omitzero"`
}

// Tenant returns the envelope's tenant, DefaultTenant when it names none.
func (e *Envelope) Tenant() string {
	if e.TenantID == "" {
		return DefaultTenant
	}
	return e.TenantID
}

// Recipient says where a delivery goes. Which field is needed depends on the
// channel: Email for email, PushSubscription for push, ChatID for telegram,
// WeComUser for wecom, Robot for wecom_robot, ResponseURL for
// wecom_bot_reply.
type Recipient struct {
	Email            string            `json:"email,omitempty"`
	EmailVerified    bool              `json:"email_verified,omitempty"`
	PushSubscription *PushSubscription `json:"push_subscription,omitempty"`
	ChatID           string            `json:"chat_id,omitempty"`
	// WeComUser is a WeCom member's userid; WeComAgent optionally names
	// the application (its agentid) configured on the server to send as.
	WeComUser  string `json:"wecom_user,omitempty"`
	WeComAgent string `json:"wecom_agent,omitempty"`
	// Robot names a group robot configured on the server
	// (OUTBOX_WECOM_ROBOT_<NAME>_KEY).
	Robot string `json:"robot,omitempty"`
	// ResponseURL is a WeCom AI bot callback's response_url: a secret,
	// usable once, within one hour.
	ResponseURL string `json:"response_url,omitempty"`
}

// PushSubscription is the W3C PushSubscription JSON a browser hands out.
type PushSubscription struct {
	Endpoint       string   `json:"endpoint"`
	ExpirationTime *float64 `json:"expirationTime,omitempty"`
	Keys           PushKeys `json:"keys"`
}

// PushKeys are a push subscription's encryption keys (base64url).
type PushKeys struct {
	P256dh string `json:"p256dh"`
	Auth   string `json:"auth"`
}

// ConsentSnapshot records the consent the app saw when it enqueued. It is
// informational only: delivery re-checks current consent.
type ConsentSnapshot struct {
	DigestEnabled  bool   `json:"digest_enabled"`
	Cadence        string `json:"cadence,omitempty"`
	UnsubscribeRef string `json:"unsubscribe_ref,omitempty"`
}

// GraphRef is a reference into the knowledge graph: a person or a topic.
type GraphRef struct {
	ID    string `json:"id"`
	Kind  string `json:"kind,omitempty"`
	Label string `json:"label,omitempty"`
}

// Item is one digest item (also the lead of a nudge).
type Item struct {
	Quote        string     `json:"quote,omitempty"`
	EpisodeSlug  string     `json:"episode_slug,omitempty"`
	EpisodeTitle string     `json:"episode_title,omitempty"`
	TMs          *int64     `json:"t_ms,omitempty"`
	GraphRefs    []GraphRef `json:"graph_refs"`
	DeepLink     string     `json:"deep_link"`
	Source       string     `json:"source,omitempty"`
}

// Auto reports whether the item was picked automatically (source "auto").
func (it *Item) Auto() bool { return it.Source == "auto" }

// Section kinds of a digest.
const (
	SectionRevisit      = "revisit"
	SectionNewInFollows = "new_in_follows"
	SectionTrending     = "trending_in_your_corpus"
)

// Section is one titled group of digest items.
type Section struct {
	Kind  string `json:"kind"`
	Items []Item `json:"items"`
}

// DigestPayload is the payload of your-week-digest.v1.
type DigestPayload struct {
	Sections []Section `json:"sections"`
}

// NudgePayload is the payload of resurface-nudge.v1.
type NudgePayload struct {
	HighlightCount int  `json:"highlight_count"`
	Lead           Item `json:"lead"`
}

// ReplyPayload is the payload of reply-text.v1.
type ReplyPayload struct {
	Text string `json:"text"`
}

// DigestPayload decodes the payload as your-week-digest.v1.
func (e *Envelope) DigestPayload() (*DigestPayload, error) {
	var p DigestPayload
	return &p, json.Unmarshal(e.Payload, &p)
}

// NudgePayload decodes the payload as resurface-nudge.v1.
func (e *Envelope) NudgePayload() (*NudgePayload, error) {
	var p NudgePayload
	return &p, json.Unmarshal(e.Payload, &p)
}

// ReplyPayload decodes the payload as reply-text.v1.
func (e *Envelope) ReplyPayload() (*ReplyPayload, error) {
	var p ReplyPayload
	return &p, json.Unmarshal(e.Payload, &p)
}

// Clone returns a deep copy of e.
func (e *Envelope) Clone() *Envelope {
	c := *e
	c.Payload = append(json.RawMessage(nil), e.Payload...)
	if ps := e.Recipient.PushSubscription; ps != nil {
		p := *ps
		if ps.ExpirationTime != nil {
			t := *ps.ExpirationTime
			p.ExpirationTime = &t
		}
		c.Recipient.PushSubscription = &p
	}
	return &c
}
