package resend

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
)

// TestE2E_RealResend sends one real e-mail through Resend. It runs only
// with OUTBOX_E2E_RESEND_KEY (an API key), OUTBOX_E2E_RESEND_TO (a
// recipient you own, or delivered@resend.dev) and OUTBOX_E2E_RESEND_FROM
// (an address on a verified domain, or onboarding@resend.dev) set:
//
//	OUTBOX_E2E_RESEND_KEY=re_… OUTBOX_E2E_RESEND_TO=delivered@resend.dev \
//	OUTBOX_E2E_RESEND_FROM=onboarding@resend.dev go test -run E2E ./channels/resend/
func TestE2E_RealResend(t *testing.T) {
	key, to, from := os.Getenv("OUTBOX_E2E_RESEND_KEY"), os.Getenv("OUTBOX_E2E_RESEND_TO"), os.Getenv("OUTBOX_E2E_RESEND_FROM")
	if key == "" || to == "" || from == "" {
		t.Skip("set OUTBOX_E2E_RESEND_KEY, OUTBOX_E2E_RESEND_TO and OUTBOX_E2E_RESEND_FROM to run against the real Resend API")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := New(Options{APIKey: APIKey(key), From: from})
	if err != nil {
		t.Fatal(err)
	}
	k := envelope.Key{Tenant: "e2e", EnvelopeID: fmt.Sprintf("e2e-%d", time.Now().UnixNano())}
	msg := &envelope.Message{Channel: envelope.ChannelEmail, Email: &envelope.EmailMessage{
		To:      to,
		Subject: "outbox e2e test",
		Text:    "This is the outbox Resend end-to-end test.",
		HTML:    "<p>This is the outbox Resend end-to-end test.</p>",
		Headers: []envelope.Header{{Name: "X-Outbox-Test", Value: "e2e"}},
		Tags:    map[string]string{"suite": "e2e"},
	}}
	rc, err := p.Deliver(ctx, k, msg)
	if err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	if rc.ID == "" {
		t.Fatal("empty receipt")
	}
	// A replay under the same key returns the same id without sending.
	r, err := p.Reconcile(ctx, k, msg)
	if err != nil || r.Outcome != channels.Accepted || r.Receipt != rc {
		t.Fatalf("Reconcile = %+v, %v; want accepted with %q", r, err, rc.ID)
	}
	pl, err := NewPoller(p, &recordingSuppressor{}, PollerOptions{MaxPages: 1, PageSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := pl.PollOnce(ctx); err != nil {
		t.Fatalf("PollOnce: %v", err)
	}
}
