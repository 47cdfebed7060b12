package wecom

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/envelope"
)

// TestE2E_Deliver sends one real text and one markdown message. It runs
// only with OUTBOX_E2E_WECOM_CORP_ID, OUTBOX_E2E_WECOM_AGENT_ID,
// OUTBOX_E2E_WECOM_SECRET and OUTBOX_E2E_WECOM_USER (a member in the
// application's visible range; this host's IP in its trusted IPs):
//
//	OUTBOX_E2E_WECOM_CORP_ID=… … go test -run E2E -v ./channels/wecom
func TestE2E_Deliver(t *testing.T) {
	corp, agent := os.Getenv("OUTBOX_E2E_WECOM_CORP_ID"), os.Getenv("OUTBOX_E2E_WECOM_AGENT_ID")
	secret, user := os.Getenv("OUTBOX_E2E_WECOM_SECRET"), os.Getenv("OUTBOX_E2E_WECOM_USER")
	if corp == "" || agent == "" || secret == "" || user == "" {
		t.Skip("set OUTBOX_E2E_WECOM_CORP_ID, OUTBOX_E2E_WECOM_AGENT_ID, OUTBOX_E2E_WECOM_SECRET and OUTBOX_E2E_WECOM_USER to run")
	}
	id, err := strconv.ParseInt(agent, 10, 64)
	if err != nil {
		t.Fatal("OUTBOX_E2E_WECOM_AGENT_ID is not a number")
	}
	p, err := New(Options{CorpID: corp, Apps: []App{{AgentID: id, Secret: wxapi.Secret(secret)}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stamp := time.Now().UTC().Format(time.RFC3339)
	for i, m := range []*envelope.WeComMessage{
		{User: user, MsgType: envelope.WeComText, Content: "outbox e2e " + stamp + ": a test message from outbox's opt-in tests."},
		{User: user, MsgType: envelope.WeComMarkdown, Content: "**outbox e2e** " + stamp + "\n> markdown, [a link](https://github.com/outboxhq/outbox)"},
	} {
		rc, err := p.Deliver(ctx, envelope.Key{Tenant: "e2e", EnvelopeID: "e2e", Segment: i}, &envelope.Message{Channel: envelope.ChannelWeCom, WeCom: m})
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		t.Logf("message %d sent (msgid %s)", i, rc.ID)
	}
}
