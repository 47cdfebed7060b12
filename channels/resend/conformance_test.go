package resend

import (
	"log/slog"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/channeltest"
	"github.com/outboxhq/outbox/envelope"
)

// Canary values: none may appear in an error, a receipt or a log line.
const (
	canaryRecipient = "canary-rcpt-7f3a@example.net"
	canarySubject   = "CANARY-SUBJECT-55e1"
	canaryBody      = "CANARY-BODY-TEXT-91c2"
	canaryRaw       = "CANARY-RAW-RESEND-MESSAGE-0d4b"
)

// canaryMessage returns an e-mail whose recipient, subject and bodies are
// canaries.
func canaryMessage(envelope.Key) *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelEmail, Email: &envelope.EmailMessage{
		To:      canaryRecipient,
		Subject: canarySubject,
		HTML:    "<p>" + canaryBody + "</p>",
		Text:    canaryBody,
		Headers: []envelope.Header{{Name: "List-Unsubscribe", Value: "<https://example.com/u/" + canaryBody + ">"}},
	}}
}

func TestConformance(t *testing.T) {
	channeltest.Exercise(t, channeltest.Harness{
		Channel: envelope.ChannelEmail,
		New: func(t testing.TB, b channeltest.Behaviour, logger *slog.Logger) channels.Provider {
			f := newFakeResend(t)
			switch b {
			case channeltest.FailRetryable:
				f.setOverride(func(*fakeSend) *canned { return apiErr(500, "application_error", canaryRaw) })
			case channeltest.FailPermanent:
				f.setOverride(func(*fakeSend) *canned { return apiErr(422, "validation_error", canaryRaw) })
			case channeltest.RateLimited:
				f.setOverride(func(*fakeSend) *canned {
					c := apiErr(429, "rate_limit_exceeded", canaryRaw)
					c.header["Retry-After"] = "3"
					return c
				})
			case channeltest.Hang:
				f.setOverride(func(s *fakeSend) *canned {
					<-s.Ctx.Done()
					return apiErr(500, "application_error", canaryRaw)
				})
			}
			return mustProvider(t, f.options(t, logger))
		},
		Message:    canaryMessage,
		Secrets:    []string{testAPIKey, canaryRecipient, canarySubject, canaryBody, canaryRaw},
		RetryAfter: 3 * time.Second,
		Unsupported: map[channeltest.Behaviour]string{
			channeltest.RecipientGone: "Resend accepts a send to a dead address and reports the bounce later, " +
				"through the webhook or the poller (tested in webhook_test.go and poller_test.go)",
		},
	})
}
