package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/sink"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/worker"
	"github.com/outboxhq/outbox/render"
)

// Embed the queue in a Go backend: open a store, run a worker with a
// provider per channel (the sink here; resend, webpush or telegram in
// production), enqueue, and watch the envelope get delivered.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-embed-")
	defer os.RemoveAll(dir)

	q, err := filestore.Open(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()
	r, err := render.New(&render.Options{BaseURL: "https://app.example.org"})
	if err != nil {
		log.Fatal(err)
	}
	chat, err := sink.New(dir, envelope.ChannelTelegram, nil)
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(worker.Config{
		Store: q, Renderer: r,
		Providers: map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: chat},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	payload, _ := json.Marshal(envelope.ReplyPayload{Text: "Your export is ready."})
	if _, err := q.Enqueue(ctx, &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion, ID: "reply/msg_1", UserID: "u_42",
		Channel: envelope.ChannelTelegram, Template: envelope.TemplateReply,
		Recipient: envelope.Recipient{ChatID: "734519028"}, Payload: payload,
		CreatedAt: time.Now(),
	}); err != nil {
		log.Fatal(err)
	}

	// The worker is woken by the enqueue; wait (bounded) for the outcome.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, err := q.Get(ctx, "", "reply/msg_1"); err == nil && st.Status == queue.StatusDelivered {
			break
		}
	}
	stop()
	<-done

	st, _ := q.Get(context.Background(), "", "reply/msg_1")
	_, err = os.Stat(chat.Path(envelope.Key{Tenant: envelope.DefaultTenant, EnvelopeID: "reply/msg_1"}))
	fmt.Println("status:", st.Status, "attempts:", st.Segments[0].Attempts, "written by the sink:", err == nil)
	// Output:
	// status: delivered attempts: 1 written by the sink: true
}
