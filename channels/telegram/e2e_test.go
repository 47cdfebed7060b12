package telegram

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// TestE2E_Deliver sends one real message. It runs only when
// OUTBOX_E2E_TELEGRAM_TOKEN (a bot token) and OUTBOX_E2E_TELEGRAM_CHAT_ID (a
// chat that has pressed Start with the bot) are set:
//
//	OUTBOX_E2E_TELEGRAM_TOKEN=… OUTBOX_E2E_TELEGRAM_CHAT_ID=… go test -run E2E -v ./channels/telegram
func TestE2E_Deliver(t *testing.T) {
	token, chatID := os.Getenv("OUTBOX_E2E_TELEGRAM_TOKEN"), os.Getenv("OUTBOX_E2E_TELEGRAM_CHAT_ID")
	if token == "" || chatID == "" {
		t.Skip("set OUTBOX_E2E_TELEGRAM_TOKEN and OUTBOX_E2E_TELEGRAM_CHAT_ID to run")
	}
	p, err := New(Options{Token: Token(token), DisableWebPagePreview: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, text := range []string{
		"<b>outbox e2e</b> segment 1 of 2: a test message from outbox's opt-in tests.",
		"segment 2 of 2 &lt;escaped&gt; https://github.com/outboxhq/outbox",
	} {
		key := envelope.Key{Tenant: "e2e", EnvelopeID: "e2e", Segment: i}
		rc, err := p.Deliver(ctx, key, &envelope.Message{Channel: envelope.ChannelTelegram, Chat: &envelope.ChatMessage{
			ChatID: chatID, Text: text, ParseMode: envelope.ParseModeHTML, Segment: i, Segments: 2,
		}})
		if err != nil {
			t.Fatalf("segment %d: Deliver: %v", i, err)
		}
		if rc.ID == "" {
			t.Errorf("segment %d: empty receipt", i)
		}
		t.Logf("segment %d sent (message_id %s)", i, rc.ID)
	}
}
