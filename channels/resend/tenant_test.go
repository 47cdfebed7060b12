package resend

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

func TestTenantTag(t *testing.T) {
	for _, tenant := range []string{"default", "acme", "Ünïcode tenant/with spaces", "a", strings.Repeat("x", 192)} {
		v, ok := TenantTag(tenant)
		if !ok {
			t.Fatalf("TenantTag(%q) did not fit a tag", tenant)
		}
		if sanitizeTag(v) != v {
			t.Errorf("TenantTag(%q) = %q: not in Resend's tag alphabet", tenant, v)
		}
		if got, ok := TenantFromTag(v); !ok || got != tenant {
			t.Errorf("TenantFromTag(TenantTag(%q)) = %q, %v", tenant, got, ok)
		}
	}
	if v, _ := TenantTag(""); v != "ZGVmYXVsdA" {
		t.Errorf(`TenantTag("") = %q, want the default tenant's`, v)
	}
	if _, ok := TenantTag(strings.Repeat("x", 193)); ok {
		t.Errorf("a 193-byte tenant fits a 256-character tag?")
	}
	for _, bad := range []string{"", "!!", "AA", "YQ=", "Cg" /* "\n" */, strings.Repeat("A", 300)} {
		if got, ok := TenantFromTag(bad); ok {
			t.Errorf("TenantFromTag(%q) = %q, want refused", bad, got)
		}
	}
}

// taggedEvent is a Resend event for to whose data.tags are tags, as an
// object of name → value (Resend's form) or, with list, as [{name, value}].
func taggedEvent(typ string, tags map[string]string, list bool, to ...string) []byte {
	var v any = tags
	if list {
		var l []map[string]string
		for n, x := range tags {
			l = append(l, map[string]string{"name": n, "value": x})
		}
		v = l
	}
	b, _ := json.Marshal(map[string]any{
		"type": typ,
		"data": map[string]any{"email_id": "4ef9a417-02e9-4d39-ad75-000000000002", "to": to, "tags": v},
	})
	return b
}

func TestWebhookHandler_TenantFromTag(t *testing.T) {
	const rcpt = "reader@example.net"
	acme, _ := TenantTag("acme")
	tests := []struct {
		name string
		body []byte
		want string
	}{
		{"object", taggedEvent(EventEmailBounced, map[string]string{TagKey: "x", TagTenant: acme}, false, rcpt), "acme"},
		{"list", taggedEvent(EventEmailBounced, map[string]string{TagTenant: acme, "kind": "digest"}, true, rcpt), "acme"},
		{"no tenant tag", taggedEvent(EventEmailBounced, map[string]string{TagKey: "x"}, false, rcpt), "fallback"},
		{"invalid tenant tag", taggedEvent(EventEmailBounced, map[string]string{TagTenant: "!!"}, false, rcpt), "fallback"},
		{"no tags", event(EventEmailBounced, rcpt), "fallback"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fx := newWebhookFixture(t, WebhookOptions{Tenant: "fallback"})
			id := "msg_t" + string(rune('a'+i))
			if rec := fx.post(tc.body, signedHeader(testWebhookKey, id, fx.now, tc.body)); rec.Code != http.StatusOK {
				t.Fatalf("status %d %s", rec.Code, rec.Body)
			}
			want := suppression{tc.want, rcpt, envelope.ClassBounced}
			if got := fx.sup.got(); len(got) != 1 || got[0] != want {
				t.Errorf("suppressions = %v, want %v", got, want)
			}
		})
	}
}

// TestWebhook_SuppressesTheAddressInTheStore: end to end through a real
// store. An e-mail of tenant acme is sent through the fake Resend; the
// bounce webhook Resend then sends (data.tags as the fake recorded them)
// suppresses the address in acme, though no envelope in the store carries
// it: every acme user's later envelope to it is refused, the default
// tenant's is not.
func TestWebhook_SuppressesTheAddressInTheStore(t *testing.T) {
	const rcpt = "family.inbox@example.net"
	ctx := context.Background()
	f := newFakeResend(t)
	p := mustProvider(t, f.options(t, nil))
	if _, err := p.Deliver(ctx, envelope.Key{Tenant: "acme", EnvelopeID: "sent-elsewhere"}, emailMessage(rcpt, "Hi")); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	sends := f.sent()
	if len(sends) != 1 {
		t.Fatalf("fake got %d sends, want 1", len(sends))
	}
	tags := map[string]string{}
	for _, tg := range sends[0].Body.Tags {
		tags[tg.Name] = tg.Value
	}

	store := memstore.New(nil)
	defer store.Close()
	for _, tn := range []string{"acme", envelope.DefaultTenant} {
		for _, u := range []string{"u-1", "u-2"} {
			queuetest.GrantAll(t, store, tn, u)
		}
	}
	fx := newWebhookFixture(t, WebhookOptions{})
	h, err := NewWebhookHandler(testWebhookSecret, store, WebhookOptions{Now: fx.h.now})
	if err != nil {
		t.Fatal(err)
	}
	fx.h = h
	body := taggedEvent(EventEmailBounced, tags, false, rcpt)
	if rec := fx.post(body, signedHeader(testWebhookKey, "msg_e2e", fx.now, body)); rec.Code != http.StatusOK {
		t.Fatalf("webhook: status %d %s", rec.Code, rec.Body)
	}

	list, err := store.AddressSuppressions(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Target != queue.TargetOfValue("email:"+rcpt) || list[0].Reason != envelope.ClassBounced {
		t.Fatalf("acme's address suppressions = %+v, want the bounced address", list)
	}
	for _, u := range []string{"u-1", "u-2"} {
		e := queuetest.Digest("d-"+u, u)
		e.TenantID, e.Recipient.Email = "acme", rcpt
		_, err := store.Enqueue(ctx, e)
		var ee *queue.EnqueueError
		if !errors.As(err, &ee) || !errors.Is(err, queue.ErrConsentDenied) || ee.Reason != envelope.ClassBounced {
			t.Errorf("acme/%s: Enqueue to the bounced address = %v, want refused (bounced)", u, err)
		}
	}
	e := queuetest.Digest("d-1", "u-1")
	e.Recipient.Email = rcpt
	if _, err := store.Enqueue(ctx, e); err != nil {
		t.Errorf("default tenant: Enqueue to the address bounced in acme: %v", err)
	}
}
