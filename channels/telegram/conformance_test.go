package telegram

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/channeltest"
	"github.com/outboxhq/outbox/envelope"
)

func TestProvider_Conformance(t *testing.T) {
	const (
		token  = "555000111:canary-conformance_TOKEN"
		chatID = "6100200300"
		text   = "canary conformance text 77c3"
	)
	behaviours := map[channeltest.Behaviour]func(http.ResponseWriter, *sentMessage, *http.Request){
		channeltest.Accept:        nil,
		channeltest.FailRetryable: apiError(502, "Bad Gateway", nil),
		channeltest.FailPermanent: apiError(400, `Bad Request: can't parse entities: Can't find end tag corresponding to start tag "b"`, nil),
		channeltest.RecipientGone: apiError(403, "Forbidden: bot was blocked by the user", nil),
		channeltest.RateLimited:   apiError(429, "Too Many Requests: retry after 3", map[string]any{"retry_after": 3}),
		channeltest.Hang:          hangAPI,
	}
	channeltest.Exercise(t, channeltest.Harness{
		Channel: envelope.ChannelTelegram,
		New: func(t testing.TB, b channeltest.Behaviour, logger *slog.Logger) channels.Provider {
			api := newBotAPI(t, token, behaviours[b])
			return mustProvider(t, api, Options{Logger: logger})
		},
		Message: func(key envelope.Key) *envelope.Message {
			return chat(chatID, text, envelope.ParseModeHTML)
		},
		Secrets:    []string{token, chatID, text},
		RetryAfter: 3 * time.Second,
	})
}
