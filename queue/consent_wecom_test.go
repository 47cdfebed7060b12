package queue_test

import (
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

func wecomTo(user, agent string, t envelope.Template) *envelope.Envelope {
	return &envelope.Envelope{TenantID: "t", UserID: "u-1", Channel: envelope.ChannelWeCom, Template: t,
		Recipient: envelope.Recipient{WeComUser: user, WeComAgent: agent}}
}

// A WeCom member that bounced is suppressed for that app only, not the
// whole channel (an empty target would suppress every wecom recipient of
// the user); digests and nudges on wecom need digest_enabled, replies none.
func TestAllows_WeCom(t *testing.T) {
	c := &queue.Consent{ConsentFlags: queue.ConsentFlags{DigestEnabled: true}}
	gone := wecomTo("zhangsan", "1000002", envelope.TemplateReply)
	c.Add(queue.SuppressionFor(gone, envelope.ClassInvalidRecipient, t0))
	if ok, _ := c.Allows(true, gone); ok {
		t.Errorf("the suppressed member is allowed")
	}
	for _, e := range []*envelope.Envelope{
		wecomTo("lisi", "1000002", envelope.TemplateReply),
		wecomTo("zhangsan", "1000003", envelope.TemplateReply),
	} {
		if ok, why := c.Allows(true, e); !ok {
			t.Errorf("%+v refused (%s) by another recipient's suppression", e.Recipient, why)
		}
	}
	if ok, _ := (&queue.Consent{}).Allows(false, wecomTo("lisi", "", envelope.TemplateDigest)); ok {
		t.Errorf("a wecom digest without consent is allowed")
	}
	if ok, _ := (&queue.Consent{}).Allows(false, wecomTo("lisi", "", envelope.TemplateReply)); !ok {
		t.Errorf("a wecom reply without a consent record is refused")
	}
	robot := &envelope.Envelope{Channel: envelope.ChannelWeComRobot, Recipient: envelope.Recipient{Robot: "ops"}}
	if queue.TargetOf(robot) == "" {
		t.Errorf("a robot has no suppression target")
	}
}
