package queuetest

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// CreatedAt is the created_at of every envelope the builders return.
var CreatedAt = time.Date(2026, time.March, 1, 7, 30, 0, 0, time.UTC)

// digestOf derives stable, opaque test data from parts.
func digestOf(parts ...string) []byte {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("queuetest: encode payload: " + err.Error())
	}
	return b
}

func tms(v int64) *int64 { return &v }

// DigestItems returns the sections of the digest the Digest builder makes:
// a revisit section with a user highlight and an automatic pick, new
// episodes from followed shows, and a trending topic. Every item carries
// graph refs and an https deep link (the moat rule).
func DigestItems() []envelope.Section {
	const base = "https://app.example.com/episodes/"
	return []envelope.Section{
		{Kind: envelope.SectionRevisit, Items: []envelope.Item{
			{
				Quote:        "The best way to predict the future is to invent it.",
				EpisodeSlug:  "ep-212-inventing-the-future",
				EpisodeTitle: "Inventing the Future",
				TMs:          tms(1_234_000),
				GraphRefs: []envelope.GraphRef{
					{ID: "person:alan-kay", Kind: "person", Label: "Alan Kay"},
					{ID: "topic:computing-history", Kind: "topic", Label: "Computing history"},
				},
				DeepLink: base + "ep-212-inventing-the-future?t=1234",
				Source:   "user",
			},
			{
				Quote:        "Simple is often erroneously mistaken for easy.",
				EpisodeSlug:  "ep-145-simple-made-easy",
				EpisodeTitle: "Simple Made Easy, Revisited",
				TMs:          tms(642_500),
				GraphRefs:    []envelope.GraphRef{{ID: "person:rich-hickey", Kind: "person", Label: "Rich Hickey"}},
				DeepLink:     base + "ep-145-simple-made-easy?t=642",
				Source:       "auto",
			},
		}},
		{Kind: envelope.SectionNewInFollows, Items: []envelope.Item{{
			EpisodeSlug:  "ep-301-the-log-is-the-database",
			EpisodeTitle: "The Log Is the Database",
			GraphRefs:    []envelope.GraphRef{{ID: "topic:databases", Kind: "topic", Label: "Databases"}},
			DeepLink:     base + "ep-301-the-log-is-the-database",
		}}},
		{Kind: envelope.SectionTrending, Items: []envelope.Item{{
			EpisodeSlug: "ep-077-consensus-without-tears",
			GraphRefs:   []envelope.GraphRef{{ID: "topic:distributed-systems", Kind: "topic", Label: "Distributed systems"}},
			DeepLink:    base + "ep-077-consensus-without-tears",
		}}},
	}
}

// EmailOf returns the address the Digest builder uses for user.
func EmailOf(user string) string {
	return "reader." + hex.EncodeToString(digestOf("email", user)[:5]) + "@example.com"
}

// EndpointOf returns the push endpoint the Nudge builder uses for user (one
// browser per user unless a test changes it).
func EndpointOf(user string) string {
	return "https://push.example.net/wpush/v2/" + base64.RawURLEncoding.EncodeToString(digestOf("endpoint", user)[:24])
}

// ChatIDOf returns the chat id the Reply builder uses for user.
func ChatIDOf(user string) string {
	return strconv.FormatUint(100_000_000+uint64(binary.BigEndian.Uint32(digestOf("chat", user)))%900_000_000, 10)
}

// Digest returns a valid your-week-digest.v1 email envelope for user, with
// a verified address and an unsubscribe_ref.
func Digest(id, user string) *envelope.Envelope {
	return &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion,
		ID:            id,
		UserID:        user,
		Channel:       envelope.ChannelEmail,
		Template:      envelope.TemplateDigest,
		Recipient:     envelope.Recipient{Email: EmailOf(user), EmailVerified: true},
		ConsentSnapshot: envelope.ConsentSnapshot{
			DigestEnabled:  true,
			Cadence:        "weekly",
			UnsubscribeRef: "unsub_" + hex.EncodeToString(digestOf("unsubscribe", user, id)[:12]),
		},
		Payload:   mustJSON(envelope.DigestPayload{Sections: DigestItems()}),
		CreatedAt: CreatedAt,
	}
}

// Nudge returns a valid resurface-nudge.v1 push envelope for user, to the
// push subscription EndpointOf(user) with plausible keys.
func Nudge(id, user string) *envelope.Envelope {
	p256dh := append([]byte{4}, digestOf("p256dh", user)...)
	p256dh = append(p256dh, digestOf("p256dh-y", user)...)
	lead := DigestItems()[0].Items[0]
	return &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion,
		ID:            id,
		UserID:        user,
		Channel:       envelope.ChannelPush,
		Template:      envelope.TemplateNudge,
		Recipient: envelope.Recipient{PushSubscription: &envelope.PushSubscription{
			Endpoint: EndpointOf(user),
			Keys: envelope.PushKeys{
				P256dh: base64.RawURLEncoding.EncodeToString(p256dh),
				Auth:   base64.RawURLEncoding.EncodeToString(digestOf("auth", user)[:16]),
			},
		}},
		ConsentSnapshot: envelope.ConsentSnapshot{DigestEnabled: true, Cadence: "daily"},
		Payload:         mustJSON(envelope.NudgePayload{HighlightCount: 3, Lead: lead}),
		CreatedAt:       CreatedAt,
	}
}

// Reply returns a valid reply-text.v1 telegram envelope for user with the
// given text (non-empty), to the chat ChatIDOf(user).
func Reply(id, user, text string) *envelope.Envelope {
	return &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion,
		ID:            id,
		UserID:        user,
		Channel:       envelope.ChannelTelegram,
		Template:      envelope.TemplateReply,
		Recipient:     envelope.Recipient{ChatID: ChatIDOf(user)},
		Payload:       mustJSON(envelope.ReplyPayload{Text: text}),
		CreatedAt:     CreatedAt,
	}
}

// GrantAll gives user in tenant every consent flag (digest, push, verified
// email, weekly cadence), failing the test on error.
func GrantAll(t testing.TB, s queue.Store, tenant, user string) {
	t.Helper()
	err := s.SetConsent(context.Background(), tenant, user, queue.ConsentFlags{
		DigestEnabled: true, PushEnabled: true, EmailVerified: true, Cadence: "weekly",
	})
	if err != nil {
		t.Fatalf("grant consent: %v", err)
	}
}

// ReplyText returns a chat reply text of several paragraphs (with accents,
// CJK and emoji) that envelope.SplitReply splits into exactly n segments
// (n ≥ 1): each paragraph is about 950 UTF-16 units, so four paragraphs
// fill one Telegram message and a fifth does not fit.
func ReplyText(n int) string {
	words := []string{
		"delivery", "café", "naïve", "queue", "日本語", "🚀", "lease", "fence",
		"retry", "Grüße", "segment", "🙂", "consent", "über", "outbox", "reply",
	}
	var b strings.Builder
	for p := range 4*max(n, 1) - 1 {
		if p > 0 {
			b.WriteString("\n\n")
		}
		para := "Paragraph " + strconv.Itoa(p+1) + ":"
		for i := 0; envelope.UTF16Len(para) < 940; i++ {
			para += " " + words[(i*7+p)%len(words)]
		}
		b.WriteString(para + ".")
	}
	return b.String()
}
