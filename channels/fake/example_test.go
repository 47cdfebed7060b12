package fake_test

import (
	"context"
	"fmt"

	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
)

// A script makes one key fail twice, then lose its receipt; Reconcile then
// reveals that the service did accept it.
func ExampleProvider_Script() {
	p := fake.New(envelope.ChannelEmail)
	key := envelope.Key{Tenant: "default", EnvelopeID: "digest-42"}
	p.Script(key, fake.FailRetryable, fake.FailRetryable, fake.LoseReceipt)

	msg := &envelope.Message{Channel: envelope.ChannelEmail, Email: &envelope.EmailMessage{To: "u@example.org"}}
	for range 3 {
		_, err := p.Deliver(context.Background(), key, msg)
		fmt.Println(err)
	}
	r, _ := p.Reconcile(context.Background(), key, msg)
	fmt.Println(r.Outcome, r.Receipt.ID, p.Delivered(key))
	// Output:
	// delivery failed: retryable (provider_unavailable)
	// delivery failed: retryable (provider_unavailable)
	// delivery failed: retryable (timeout)
	// accepted fake-1 1
}
