package main

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// outbox doctor --rebuild keeps every consent fact (issue K item 6):
// consent set over HTTP, a push subscription saved over HTTP, an address
// suppression added with outbox suppressions, an unsubscribe; after a
// rebuild and a new serve, the consent reads back the same, the
// unsubscribed user and the suppressed address are refused, the
// subscription is there, and doctor finds nothing wrong.
func TestFault_RebuildKeepsConsent(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	const bounced = "bounced.reader@example.org"
	d := startServe(t, bin, data, faultToken)
	for _, u := range []string{"u-1", "u-2"} {
		body := `{"digest_enabled":true,"push_enabled":true,"email_verified":true,"cadence":"weekly"}`
		if code, b := request(t, "PUT", d.base+"/v1/consent/"+u, faultToken, []byte(body)); code != 200 {
			t.Fatalf("PUT consent %s = %d %s", u, code, b)
		}
	}
	sub := queuetest.Nudge("n-1", "u-1").Recipient.PushSubscription
	body, _ := json.Marshal(sub)
	if code, b := request(t, "POST", d.base+"/api/app/push/subscribe?user=u-1", faultToken, body); code != 201 {
		t.Fatalf("subscribe = %d %s", code, b)
	}
	if out, code := outbox(t, bin, "suppressions", "--data", data, "add", bounced); code != 0 {
		t.Fatalf("suppressions add = %d:\n%s", code, out)
	}
	d.stop(t)
	// u-2 unsubscribes (the store's own call, as the unsubscribe page makes).
	q := openDirect(t, data)
	if err := q.Suppress(context.Background(), "", "u-2", queue.Suppression{Channel: envelope.ChannelEmail, Reason: envelope.ClassUnsubscribed}); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	d = startServe(t, bin, data, faultToken)
	consent := func(u string) string {
		code, b := request(t, "GET", d.base+"/v1/consent/"+u, faultToken, nil)
		if code != 200 {
			t.Fatalf("GET consent %s = %d %s", u, code, b)
		}
		return string(b)
	}
	before := []string{consent("u-1"), consent("u-2")}
	if !strings.Contains(before[1], "unsubscribed") {
		t.Fatalf("setup: u-2's consent %s", before[1])
	}
	d.stop(t)

	if out, code := outbox(t, bin, "doctor", "--rebuild", "--data", data); code != 0 {
		t.Fatalf("doctor --rebuild = %d:\n%s", code, out)
	}
	d = startServe(t, bin, data, faultToken)
	if after := []string{consent("u-1"), consent("u-2")}; !reflect.DeepEqual(after, before) {
		t.Fatalf("consent after the rebuild:\n%s\nwant\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	refused := func(e *envelope.Envelope, class string) {
		t.Helper()
		b, _ := json.Marshal(e)
		code, resp := request(t, "POST", d.base+"/v1/envelopes", faultToken, b)
		if code != 409 || !strings.Contains(string(resp), "consent_denied") || !strings.Contains(string(resp), class) {
			t.Errorf("POST %s after the rebuild = %d %s, want 409 consent_denied (%s)", e.ID, code, resp, class)
		}
	}
	refused(queuetest.Digest("d-u2", "u-2"), "unsubscribed")
	toBounced := queuetest.Digest("d-u1", "u-1")
	toBounced.Recipient.Email = bounced
	refused(toBounced, "bounced")
	ok, _ := json.Marshal(queuetest.Digest("d-ok", "u-1"))
	if code, resp := request(t, "POST", d.base+"/v1/envelopes", faultToken, ok); code != 201 {
		t.Errorf("POST a digest u-1 may have = %d %s", code, resp)
	}
	d.stop(t)

	q = openDirect(t, data)
	subs, err := q.Subscriptions(context.Background(), "", "u-1")
	if cerr := q.Close(); err == nil {
		err = cerr
	}
	if err != nil || len(subs) != 1 || subs[0].Sub.Endpoint != sub.Endpoint {
		t.Fatalf("subscriptions after the rebuild = %+v, %v", subs, err)
	}
	if out, code := outbox(t, bin, "doctor", "--data", data); code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("doctor after the rebuild = %d:\n%s", code, out)
	}
	if b, err := os.ReadFile(filestore.JournalPath(data)); err != nil || strings.Contains(string(b), bounced) {
		t.Fatalf("the journal holds the suppressed address in clear (or is unreadable: %v)", err)
	}
}
