package filestore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

// Open a store, enqueue a chat reply, lease it, and commit the outcome with
// the lease's fence — what the worker (queue/worker) does for you.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-example-")
	defer os.RemoveAll(dir)

	q, err := filestore.Open(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()

	payload, _ := json.Marshal(envelope.ReplyPayload{Text: "Your export is ready."})
	res, err := q.Enqueue(ctx, &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion,
		ID:            "reply/msg_1", // the idempotency key
		UserID:        "u_42",
		Channel:       envelope.ChannelTelegram,
		Template:      envelope.TemplateReply,
		Recipient:     envelope.Recipient{ChatID: "734519028"},
		Payload:       payload,
		CreatedAt:     time.Now(),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("duplicate:", res[0].Duplicate, "segments:", res[0].Segments)

	leases, err := q.Claim(ctx, queue.ClaimRequest{Owner: "example", Lease: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	l := leases[0]
	fmt.Println("leased:", l.Key.EnvelopeID, "attempt", l.Attempt)

	// ... deliver l.Envelope under l.Key, then:
	if err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: "msg-1001"}); err != nil {
		log.Fatal(err)
	}
	// A second commit with the same lease is refused: the row is no longer leased.
	fmt.Println("again:", q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent}))

	st, _ := q.Get(ctx, "", "reply/msg_1")
	fmt.Println("status:", st.Status)
	// Output:
	// duplicate: false segments: 1
	// leased: reply/msg_1 attempt 1
	// again: queue: lease lost
	// status: delivered
}
