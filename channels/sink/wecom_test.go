package sink_test

import (
	"os"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
)

// A WeCom message is written with its recipient and content; an AI bot
// reply's response_url (a credential) is not.
func TestSink_WeCom(t *testing.T) {
	dir := t.TempDir()
	p := newSink(t, dir, envelope.ChannelWeComBotReply)
	k := envelope.Key{Tenant: "t", EnvelopeID: "r"}
	deliver(t, p, k, &envelope.Message{Channel: envelope.ChannelWeComBotReply, WeCom: &envelope.WeComMessage{
		ResponseURL: canaryEndpoint, MsgType: envelope.WeComMarkdown, Content: canaryBody, Segments: 1}})
	b, err := os.ReadFile(p.Path(k))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), canaryEndpoint) || !strings.Contains(string(b), canaryBody) || !strings.Contains(string(b), `"msgtype": "markdown"`) {
		t.Fatalf("sink file: %s", b)
	}
}
