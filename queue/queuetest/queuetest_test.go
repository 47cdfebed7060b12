package queuetest_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/queuetest"
)

func TestBuilders_Valid(t *testing.T) {
	tests := []struct {
		name    string
		env     *envelope.Envelope
		channel envelope.Channel
	}{
		{"Digest", queuetest.Digest("d-1", "u_42"), envelope.ChannelEmail},
		{"Nudge", queuetest.Nudge("n-1", "u_42"), envelope.ChannelPush},
		{"Reply", queuetest.Reply("r-1", "u_42", "Hello there."), envelope.ChannelTelegram},
		{"LongReply", queuetest.Reply("r-2", "u_42", queuetest.ReplyText(3)), envelope.ChannelTelegram},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := envelope.Validate(tc.env); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if tc.env.Channel != tc.channel || tc.env.TenantID != "" || tc.env.CreatedAt.IsZero() {
				t.Fatalf("envelope = %+v", tc.env)
			}
			if tc.channel == envelope.ChannelEmail && tc.env.ConsentSnapshot.UnsubscribeRef == "" {
				t.Fatal("email envelope without unsubscribe_ref")
			}
		})
	}
}

func TestBuilders_Stable(t *testing.T) {
	// The same user gets the same address, endpoint and chat; another user
	// gets different ones.
	for _, fn := range []func(string) string{queuetest.EmailOf, queuetest.EndpointOf, queuetest.ChatIDOf, queuetest.TargetOfNudge} {
		if a, b := fn("u-1"), fn("u-1"); a != b || a == fn("u-2") {
			t.Fatal("derived recipient data is not stable per user")
		}
	}
	if got := queuetest.Nudge("a", "u-1").Recipient.PushSubscription.Endpoint; got != queuetest.EndpointOf("u-1") {
		t.Fatalf("endpoint = %q", got)
	}
	if queuetest.TargetOfNudge("u-1") != queue.TargetOf(queuetest.Nudge("b", "u-1")) {
		t.Fatal("TargetOfNudge disagrees with queue.TargetOf")
	}
	// Builders return independent values.
	a, b := queuetest.Nudge("a", "u-1"), queuetest.Nudge("a", "u-1")
	a.Recipient.PushSubscription.Endpoint = "https://elsewhere.example/x"
	a.Payload[0] = ' '
	if b.Recipient.PushSubscription.Endpoint != queuetest.EndpointOf("u-1") || b.Payload[0] != '{' {
		t.Fatal("builders share state between calls")
	}
}

func TestReplyText(t *testing.T) {
	for n := 1; n <= 5; n++ {
		text := queuetest.ReplyText(n)
		segs := envelope.SplitReply(text)
		if len(segs) != n {
			t.Fatalf("ReplyText(%d) splits into %d segments", n, len(segs))
		}
		if !strings.Contains(text, "🚀") || !strings.Contains(text, "\n\n") {
			t.Fatalf("ReplyText(%d) lacks emoji or paragraphs", n)
		}
		if envelope.UTF16Len(text) <= (n-1)*envelope.MaxSegmentUnits {
			t.Fatalf("ReplyText(%d) is too short to need %d segments", n, n)
		}
	}
}

func TestClock(t *testing.T) {
	c := queuetest.NewClock(queuetest.T0)
	if !c.Now().Equal(queuetest.T0) {
		t.Fatalf("Now = %v", c.Now())
	}
	if got := c.Advance(90 * time.Second); !got.Equal(queuetest.T0.Add(90*time.Second)) || !c.Now().Equal(got) {
		t.Fatalf("Advance = %v, Now = %v", got, c.Now())
	}
	c.Set(queuetest.T0)
	if !c.Now().Equal(queuetest.T0) {
		t.Fatalf("after Set: %v", c.Now())
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got := c.Now().Sub(queuetest.T0); got != 800*time.Millisecond {
		t.Fatalf("concurrent Advance moved the clock by %v, want 800ms", got)
	}
}
