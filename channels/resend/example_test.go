package resend_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"path/filepath"

	"github.com/outboxhq/outbox/channels/resend"
	"github.com/outboxhq/outbox/envelope"
)

// discard is a Suppressor for the example; the queue's consent store is
// the real one.
type discard struct{}

func (discard) SuppressEmail(context.Context, string, string, envelope.ErrorClass) error { return nil }

// Example wires the provider, the bounce poller and the webhook handler
// from the environment, as a daemon would.
func Example() {
	key, err := resend.APIKeyFromEnv(os.Getenv)
	if err != nil {
		log.Print(err) // names the variables, never a value
		return
	}
	p, err := resend.New(resend.Options{
		APIKey:  resend.APIKey(key),
		From:    "Digest <digest@example.com>",
		ReplyTo: "support@example.com",
	})
	if err != nil {
		log.Print(err)
		return
	}
	var suppressor discard // the queue implements channels.Suppressor

	poller, err := resend.NewPoller(p, suppressor, resend.PollerOptions{
		Cursor: resend.FileCursor(filepath.Join("data", "resend.cursor")),
	})
	if err != nil {
		log.Print(err)
		return
	}
	go func() { _ = poller.Run(context.Background()) }()

	if secret := os.Getenv("RESEND_WEBHOOK_SECRET"); secret != "" {
		h, err := resend.NewWebhookHandler(secret, suppressor, resend.WebhookOptions{})
		if err != nil {
			log.Print(err)
			return
		}
		http.Handle("POST /webhooks/resend", h)
	}
	_ = p // hand p to the worker as the email provider
}
