package webpush

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// errorTexts returns every text an error chain can show: Error() of each
// link, and the %v, %+v and %#v forms of the head.
func errorTexts(err error) []string {
	if err == nil {
		return nil
	}
	out := []string{fmt.Sprintf("%v", err), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)}
	for e := err; e != nil; e = errors.Unwrap(e) {
		out = append(out, e.Error())
	}
	return out
}

// TestProvider_Canary sends canary values through every outcome, including
// a network error whose net/http text holds the endpoint URL, and checks
// that none of them reaches an error (or its causes), a receipt or the log.
func TestProvider_Canary(t *testing.T) {
	const (
		endpointCanary = "canary-endpoint-5c0ffee"
		bodyCanary     = "canary-body-d00dfeed"
	)
	keys := mustKeys(t)
	uaPriv, auth := mustBrowserKeys(t)
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	payload := []byte(`{"title":"t","body":"` + bodyCanary + `"}`)

	var errs []error
	var receipts []string
	check := func(ctx context.Context, sub envelope.PushSubscription, client *http.Client, insecure bool) {
		t.Helper()
		p, err := New(Options{VAPIDPublicKey: keys.Public, VAPIDPrivateKey: keys.Private, Subscriber: "ops@example.com",
			HTTPClient: client, Logger: logger, AllowInsecureEndpoints: insecure, RedeliverOnReconcile: true})
		if err != nil {
			t.Fatal(err)
		}
		msg := pushMessage(sub, payload, time.Hour, "", "")
		rc, err := p.Deliver(ctx, testKey, msg)
		errs = append(errs, err)
		receipts = append(receipts, rc.ID)
		rec, err := p.Reconcile(ctx, testKey, msg)
		errs = append(errs, err)
		receipts = append(receipts, rec.Receipt.ID)
	}
	sub := func(ps *pushService) envelope.PushSubscription { return ps.subscription("/wpush/" + endpointCanary) }

	for _, respond := range []func(http.ResponseWriter, *http.Request){
		created,
		answer(410, nil, `{"message":"`+endpointCanary+`"}`),
		answer(403, nil, `{"reason":"BadJwtToken","detail":"`+bodyCanary+`"}`),
		answer(429, map[string]string{"Retry-After": "2"}, ""),
		answer(500, nil, bodyCanary),
		answer(413, nil, ""),
	} {
		ps := newPushServiceFor(t, uaPriv, auth, respond)
		check(context.Background(), sub(ps), ps.srv.Client(), true)
	}

	// A timeout.
	ps := newPushServiceFor(t, uaPriv, auth, hang)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	check(ctx, sub(ps), ps.srv.Client(), true)
	cancel()

	// A server that is gone (provider_unreachable). net/http's own error names
	// the URL; make sure of it, then that ours does not.
	gone := httptest.NewServer(http.NotFoundHandler())
	goneSub := sub(&pushService{srv: gone, uaPriv: uaPriv, auth: auth})
	gone.Close()
	client := &http.Client{Timeout: 5 * time.Second}
	if _, rawErr := client.Post(goneSub.Endpoint, "text/plain", nil); rawErr == nil || !strings.Contains(rawErr.Error(), endpointCanary) {
		t.Fatalf("precondition: net/http's error should name the URL, got %v", rawErr)
	}
	check(context.Background(), goneSub, client, true)

	// The endpoint guard.
	guarded := sub(ps)
	guarded.Endpoint = "https://127.0.0.1/wpush/" + endpointCanary
	check(context.Background(), guarded, nil, false)

	secrets := []string{string(keys.Private), endpointCanary, bodyCanary, goneSub.Endpoint, guarded.Endpoint,
		goneSub.Keys.P256dh, goneSub.Keys.Auth, testKey.EnvelopeID}
	var sawErrs int
	for _, err := range errs {
		if err != nil {
			sawErrs++
		}
		for _, text := range errorTexts(err) {
			for _, s := range secrets {
				if strings.Contains(text, s) {
					t.Errorf("error text %q contains a canary", text)
				}
			}
		}
	}
	if sawErrs < 8 {
		t.Errorf("only %d errors were produced; the canary test does not cover the failure paths", sawErrs)
	}
	for _, rc := range receipts {
		for _, s := range secrets {
			if strings.Contains(rc, s) {
				t.Errorf("receipt %q contains a canary", rc)
			}
		}
	}
	out := logs.String()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("log output contains a canary %q:\n%s", s, out)
		}
	}
	for _, want := range []string{`"error_class":"auth_failed"`, `"hint":`, `"error_class":"provider_unreachable"`, `"error_class":"timeout"`, `"status":410`} {
		if !strings.Contains(out, want) {
			t.Errorf("log output lacks %s (the test would not see a leak there):\n%s", want, out)
		}
	}
}
