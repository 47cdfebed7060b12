package webpush

import (
	"encoding/base64"
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
		endpointCanary = "canary-endpoint-3e1f9a"
		bodyCanary     = "canary-body-text-b7d2c4"
	)
	keys := mustKeys(t)
	uaPriv, auth := mustBrowserKeys(t)
	sub := envelope.PushSubscription{
		Endpoint: "https://push.example.com/wpush/v2/" + endpointCanary,
		Keys: envelope.PushKeys{
			P256dh: base64.RawURLEncoding.EncodeToString(uaPriv.PublicKey().Bytes()),
			Auth:   base64.RawURLEncoding.EncodeToString(auth),
		},
	}
	retryAfter := 3 * time.Second
	behaviours := map[channeltest.Behaviour]func(http.ResponseWriter, *http.Request){
		channeltest.Accept:        created,
		channeltest.FailRetryable: answer(http.StatusServiceUnavailable, nil, `{"code":503,"errno":202,"error":"Service Unavailable"}`),
		channeltest.FailPermanent: answer(http.StatusBadRequest, nil, `{"code":400,"errno":110,"error":"Bad Request","message":"`+bodyCanary+`"}`),
		channeltest.RecipientGone: answer(http.StatusGone, nil, `{"code":410,"errno":106,"error":"Gone","message":"`+endpointCanary+`"}`),
		channeltest.RateLimited:   answer(http.StatusTooManyRequests, map[string]string{"Retry-After": "3"}, `{"code":429,"errno":0}`),
		channeltest.Hang:          hang,
	}
	channeltest.Exercise(t, channeltest.Harness{
		Channel: envelope.ChannelPush,
		New: func(t testing.TB, b channeltest.Behaviour, logger *slog.Logger) channels.Provider {
			ps := newPushServiceFor(t, uaPriv, auth, behaviours[b])
			return mustProvider(t, ps, Options{
				VAPIDPublicKey:  keys.Public,
				VAPIDPrivateKey: keys.Private,
				HTTPClient:      ps.dialingClient(t),
				Logger:          logger,
			})
		},
		Message: func(key envelope.Key) *envelope.Message {
			payload := []byte(`{"title":"Resurface","body":"` + bodyCanary + `","url":"https://app.example/h/1","tag":"nudge"}`)
			return pushMessage(sub, payload, time.Hour, envelope.UrgencyNormal, "")
		},
		Secrets:    []string{string(keys.Private), endpointCanary, sub.Endpoint, sub.Keys.P256dh, sub.Keys.Auth, bodyCanary},
		RetryAfter: retryAfter,
	})
}
