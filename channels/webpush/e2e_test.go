package webpush

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// TestE2E_Deliver sends one real notification. It runs only when
// OUTBOX_E2E_PUSH_SUBSCRIPTION holds a browser's PushSubscription JSON
// (created with the VAPID public key below) and the VAPID keys are in
// OUTBOX_VAPID_PUBLIC_KEY / OUTBOX_VAPID_PRIVATE_KEY (or their _FILE
// variants). OUTBOX_E2E_PUSH_SUBSCRIBER optionally sets the VAPID contact.
//
//	OUTBOX_E2E_PUSH_SUBSCRIPTION='{"endpoint":"https://…","keys":{…}}' \
//	OUTBOX_VAPID_PUBLIC_KEY=… OUTBOX_VAPID_PRIVATE_KEY=… \
//	go test -run E2E -v ./channels/webpush
func TestE2E_Deliver(t *testing.T) {
	raw := os.Getenv("OUTBOX_E2E_PUSH_SUBSCRIPTION")
	if raw == "" {
		t.Skip("set OUTBOX_E2E_PUSH_SUBSCRIPTION (a PushSubscription JSON) and OUTBOX_VAPID_PUBLIC_KEY/OUTBOX_VAPID_PRIVATE_KEY to run")
	}
	keys, err := KeysFromEnv(os.Getenv)
	if err != nil {
		t.Fatalf("VAPID keys: %v", err)
	}
	var sub envelope.PushSubscription
	if err := json.Unmarshal([]byte(raw), &sub); err != nil {
		t.Fatalf("OUTBOX_E2E_PUSH_SUBSCRIPTION is not a PushSubscription JSON: %v", err)
	}
	subscriber := os.Getenv("OUTBOX_E2E_PUSH_SUBSCRIBER")
	if subscriber == "" {
		subscriber = "https://github.com/outboxhq/outbox"
	}
	p, err := New(Options{VAPIDPublicKey: keys.Public, VAPIDPrivateKey: keys.Private, Subscriber: subscriber})
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"title":"outbox e2e","body":"A test notification from outbox's opt-in tests.","tag":"outbox-e2e"}`)
	key := envelope.Key{Tenant: "e2e", EnvelopeID: "e2e-" + time.Now().UTC().Format("20060102T150405"), Segment: 0}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc, err := p.Deliver(ctx, key, &envelope.Message{Channel: envelope.ChannelPush, Push: &envelope.PushMessage{
		Subscription: sub, Payload: payload, TTL: 10 * time.Minute, Urgency: envelope.UrgencyNormal, Topic: "outbox-e2e",
	}})
	if err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	if rc.ID == "" {
		t.Errorf("empty receipt")
	}
	t.Logf("push accepted (receipt %s)", rc.ID)
}
