package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// An operator adds, lists and lifts a tenant's address suppression; while
// it holds, the store refuses every user's e-mail to the address.
func TestSuppressionsCommand(t *testing.T) {
	data := t.TempDir()
	q, err := filestore.Open(data, &filestore.Options{DisableWatcher: true})
	if err != nil {
		t.Fatal(err)
	}
	queuetest.GrantAll(t, q, "acme", "u-1")
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	const addr = "family.inbox@example.net"
	target := queue.TargetOfValue("email:" + addr)

	if out, errs, code := runCmd(t, "suppressions", "--data", data, "--tenant", "acme", "--reason", "complaint", "add", addr); code != 0 || !strings.Contains(out, target) {
		t.Fatalf("add: code %d out %q err %q", code, out, errs)
	}
	out, errs, code := runCmd(t, "suppressions", "--data", data, "--tenant", "acme", "--json", "list")
	var list []queue.Suppression
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Target != target || list[0].Reason != envelope.ClassComplaint {
		t.Fatalf("list: code %d out %q err %q", code, out, errs)
	}
	if strings.Contains(out, addr) {
		t.Errorf("list shows the address in clear: %s", out)
	}
	if out, _, code := runCmd(t, "suppressions", "--data", data, "list"); code != 0 || strings.Contains(out, target) {
		t.Errorf("the default tenant's list: code %d out %q, want no suppression", code, out)
	}

	q, err = filestore.Open(data, &filestore.Options{DisableWatcher: true})
	if err != nil {
		t.Fatal(err)
	}
	e := queuetest.Digest("d-1", "u-1")
	e.TenantID, e.Recipient.Email = "acme", addr
	if _, err := q.Enqueue(context.Background(), e); !errors.Is(err, queue.ErrConsentDenied) {
		t.Errorf("Enqueue to the suppressed address: %v, want ErrConsentDenied", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	if out, errs, code := runCmd(t, "suppressions", "--data", data, "--tenant", "acme", "lift", addr); code != 0 {
		t.Fatalf("lift: code %d out %q err %q", code, out, errs)
	}
	if _, errs, code := runCmd(t, "suppressions", "--data", data, "--tenant", "acme", "lift", target); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("lift again: code %d err %q, want not found", code, errs)
	}
	if _, _, code := runCmd(t, "suppressions", "--data", data, "--reason", "nope", "add", addr); code != exitUsage {
		t.Errorf("add --reason nope: code %d, want a usage error", code)
	}
	if _, _, code := runCmd(t, "suppressions", "--data", data, "forget"); code != exitUsage {
		t.Errorf("an unknown verb: code %d, want a usage error", code)
	}
}

// The same calls through the operator socket's handler and client.
func TestSuppressions_OperatorSocket(t *testing.T) {
	q, err := filestore.Open(t.TempDir(), &filestore.Options{DisableWatcher: true})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	srv := httptest.NewServer(operatorHandler(&directBackend{q: q}))
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	}}}
	b := &socketBackend{c: c}
	ctx := context.Background()
	const addr = "a@example.net"
	if err := b.SuppressEmail(ctx, "acme", addr, envelope.ClassBounced); err != nil {
		t.Fatal(err)
	}
	list, err := b.AddressSuppressions(ctx, "acme")
	if err != nil || len(list) != 1 || list[0].Target != addressTarget(addr) || list[0].Reason != envelope.ClassBounced {
		t.Fatalf("AddressSuppressions = %+v, %v", list, err)
	}
	if err := b.LiftAddressSuppression(ctx, "acme", addressTarget(addr)); err != nil {
		t.Fatal(err)
	}
	if err := b.LiftAddressSuppression(ctx, "acme", addressTarget(addr)); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("lift again: %v, want ErrNotFound", err)
	}
}
