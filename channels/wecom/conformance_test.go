package wecom

import (
	"log/slog"
	"testing"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/channeltest"
	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/envelope"
)

func TestProvider_Conformance(t *testing.T) {
	channeltest.Exercise(t, channeltest.Harness{
		Channel: envelope.ChannelWeCom,
		New: func(t testing.TB, b channeltest.Behaviour, logger *slog.Logger) channels.Provider {
			f := newFake(t, newClock(), testCorp, testSecret)
			switch b {
			case channeltest.FailRetryable:
				f.script = []int{wxapi.CodeBusy}
			case channeltest.FailPermanent:
				f.script = []int{44004}
			case channeltest.RecipientGone:
				f.members = map[string]bool{}
			case channeltest.RateLimited:
				f.script = []int{wxapi.CodeFreqLimit}
			case channeltest.Hang:
				f.hang = true
			}
			p, _ := newProvider(t, f, func(o *Options) { o.Logger = logger })
			return p
		},
		Message:    func(envelope.Key) *envelope.Message { return textTo(testUser, testText) },
		Secrets:    []string{testSecret, testUser, testText, "canary-token-", "canary-errmsg"},
		RetryAfter: MinFreqRetry,
	})
}
