package resend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"golang.org/x/time/rate"
)

// errorTexts returns every text an error chain can print.
func errorTexts(err error) []string {
	var out []string
	for e := err; e != nil; e = errors.Unwrap(e) {
		out = append(out, e.Error(), fmt.Sprintf("%+v", e), fmt.Sprintf("%#v", e))
	}
	return out
}

// TestCanary drives the provider, the poller and the webhook through every
// kind of answer with canary values for the API key, the recipient, the
// body and Resend's raw message text, and checks that none reaches a
// returned error (its whole chain), a receipt or the log output.
func TestCanary(t *testing.T) {
	const canaryKey = "re_CANARY_KEY_c4f1d2"
	secrets := []string{canaryKey, canaryRecipient, canarySubject, canaryBody, canaryRaw, "CANARY_NAME"}
	ctx := context.Background()
	logger, logs := bufLogger()
	var errs []error
	var receipts []channels.Receipt
	keep := func(rc channels.Receipt, err error) {
		receipts = append(receipts, rc)
		if err != nil {
			errs = append(errs, err)
		}
	}

	f := newFakeResend(t)
	opts := f.options(t, logger)
	opts.APIKey = canaryKey // the fake refuses it: 403 with the raw text
	wrongKey := mustProvider(t, opts)
	keep(wrongKey.Deliver(ctx, envelope.Key{EnvelopeID: "k"}, canaryMessage(envelope.Key{})))

	answers := []*canned{
		apiErr(409, "concurrent_idempotent_requests", canaryRaw),
		apiErr(409, "invalid_idempotent_request", canaryRaw),
		apiErr(429, "rate_limit_exceeded", canaryRaw),
		apiErr(429, "daily_quota_exceeded", canaryRaw),
		apiErr(429, "monthly_quota_exceeded", canaryRaw),
		apiErr(400, "validation_error", canaryRaw+" "+canaryRecipient),
		apiErr(422, "invalid_parameter", canaryRaw),
		apiErr(401, "missing_api_key", canaryRaw),
		apiErr(403, "invalid_api_key", canaryRaw),
		apiErr(451, "security_error", canaryRaw),
		apiErr(500, "CANARY_NAME", canaryRaw),
		{status: 502, header: map[string]string{"Content-Type": "text/plain"}, body: canaryRaw},
		{status: 200, header: map[string]string{"Content-Type": "application/json"}, body: `{"id":"` + canaryRaw + ` x"}`},
	}
	for i, a := range answers {
		f := newFakeResend(t)
		f.setOverride(func(*fakeSend) *canned { return a })
		p := mustProvider(t, f.options(t, logger))
		key := envelope.Key{Tenant: "t", EnvelopeID: fmt.Sprintf("canary-%d", i)}
		keep(p.Deliver(ctx, key, canaryMessage(key)))
		r, err := p.Reconcile(ctx, key, canaryMessage(key))
		keep(r.Receipt, err)
	}

	// No answer at all.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dead := mustProvider(t, Options{APIKey: canaryKey, From: "a@example.com", BaseURL: "http://" + addr, Rate: rate.Inf, Logger: logger})
	keep(dead.Deliver(ctx, envelope.Key{EnvelopeID: "dead"}, canaryMessage(envelope.Key{})))
	tctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-tctx.Done()
	keep(dead.Deliver(tctx, envelope.Key{EnvelopeID: "dead2"}, canaryMessage(envelope.Key{})))

	// Invalid messages.
	bad := canaryMessage(envelope.Key{})
	bad.Email.To = "not-an-address " + canaryRecipient
	keep(mustProvider(t, f.options(t, logger)).Deliver(ctx, envelope.Key{EnvelopeID: "bad"}, bad))

	// The poller: a failing list, then a bounce of the canary recipient
	// with a failing suppressor (the poller keeps its error in the chain for
	// errors.Is, so it is the suppressor's job to keep addresses out of it).
	pf := newFakeResend(t)
	pf.addEmail("e1", canaryRecipient, "bounced", time.Now())
	pf.failList("", 500)
	sup := &recordingSuppressor{}
	pl, err := NewPoller(mustProvider(t, pf.options(t, logger)), sup, PollerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keep(channels.Receipt{}, pl.PollOnce(ctx))
	sup.setErr(errors.New("store closed"))
	keep(channels.Receipt{}, pl.PollOnce(ctx))
	sup.setErr(nil)
	if err := pl.PollOnce(ctx); err != nil {
		t.Fatal(err)
	}

	// The webhook, with the canary recipient in the event.
	wh, err := NewWebhookHandler(testWebhookSecret, sup, WebhookOptions{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	fx := &webhookFixture{h: wh, sup: sup, now: time.Now()}
	b := event(EventEmailBounced, canaryRecipient)
	fx.post(b, signedHeader(testWebhookKey, "msg_canary", fx.now, b))
	fx.post(b, signedHeader([]byte("bad key bad key bad key bad key!"), "msg_canary2", fx.now, b))

	if len(errs) < len(answers)+5 {
		t.Fatalf("only %d errors gathered: the canary test would prove little", len(errs))
	}
	if len(sup.got()) != 2 {
		t.Fatalf("suppressions = %d, want 2 (poller and webhook)", len(sup.got()))
	}
	out := logs.String()
	if !strings.Contains(out, "error_class") {
		t.Fatalf("no log lines captured: %q", out)
	}
	for i, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("secret %d appears in the logs", i)
		}
		for _, err := range errs {
			for _, text := range errorTexts(err) {
				if strings.Contains(text, s) {
					t.Errorf("secret %d appears in an error text %q", i, text)
				}
			}
		}
		for _, rc := range receipts {
			if strings.Contains(rc.ID, s) {
				t.Errorf("secret %d appears in a receipt", i)
			}
		}
	}
	if strings.Contains(out, addr) {
		t.Errorf("the API address appears in the logs")
	}
}
