package queue_test

import (
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// OptIn sets exactly the flag that Set takes as an opt-in: on every
// channel where it reports ok, Set then lifts the channel's unsubscribe;
// where it does not, Set leaves it.
func TestConsentFlags_OptIn(t *testing.T) {
	now := time.Date(2026, 5, 4, 7, 0, 0, 0, time.UTC)
	for _, ch := range envelope.Channels {
		t.Run(string(ch), func(t *testing.T) {
			var c queue.Consent
			c.Add(queue.Suppression{Channel: ch, Reason: envelope.ClassUnsubscribed, At: now})
			c.Add(queue.Suppression{Channel: ch, Target: "t1", Reason: envelope.ClassComplaint, At: now})
			f, ok := queue.ConsentFlags{EmailVerified: true, Cadence: "daily"}.OptIn(ch)
			if !f.EmailVerified || f.Cadence != "daily" {
				t.Fatalf("OptIn changed other flags: %+v", f)
			}
			f.By = "test"
			c.Set(f, now)
			lifted := len(c.Suppressions) == 1
			if lifted != ok {
				t.Fatalf("OptIn ok=%v but Set lifted the unsubscribe: %v (%+v)", ok, lifted, c.Suppressions)
			}
			if c.Suppressions[len(c.Suppressions)-1].Reason != envelope.ClassComplaint {
				t.Fatalf("the complaint went: %+v", c.Suppressions)
			}
		})
	}
	for ch, want := range map[envelope.Channel]bool{envelope.ChannelEmail: true, envelope.ChannelPush: true, envelope.ChannelWeCom: true, envelope.ChannelTelegram: false} {
		if _, ok := (queue.ConsentFlags{}).OptIn(ch); ok != want {
			t.Errorf("OptIn(%s) ok = %v, want %v", ch, ok, want)
		}
	}
}
