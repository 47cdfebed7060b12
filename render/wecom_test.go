package render

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
)

// A reply on each wecom channel: the segments of SplitReplyFor, as text
// for an application message and markdown for a robot or a bot reply,
// addressed to the envelope's recipient, the bot reply with its deadline.
func TestRender_WeComReply(t *testing.T) {
	r := mustNew(t, nil)
	for _, tc := range []struct {
		name    string
		msgType string
		segs    int
	}{
		{"reply-text.v1.wecom", envelope.WeComText, 3},
		{"reply-text.v1.wecom_robot", envelope.WeComMarkdown, 2},
		{"reply-text.v1.wecom_bot_reply", envelope.WeComMarkdown, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := fixture(t, tc.name)
			if n := Segments(e); n != tc.segs || n != envelope.Rows(e) {
				t.Fatalf("Segments = %d, Rows = %d, want %d", n, envelope.Rows(e), tc.segs)
			}
			p, _ := e.ReplyPayload()
			want := envelope.SplitReplyFor(e.Channel, p.Text)
			for i := range tc.segs {
				m, err := r.Render(e, i, renderTime(e))
				if err != nil {
					t.Fatal(err)
				}
				w := m.WeCom
				if m.Channel != e.Channel || w == nil || w.MsgType != tc.msgType || w.Content != want[i] || w.Segment != i || w.Segments != tc.segs {
					t.Fatalf("segment %d: %+v", i, m)
				}
				if w.User != e.Recipient.WeComUser || w.Agent != e.Recipient.WeComAgent || w.Robot != e.Recipient.Robot ||
					w.ResponseURL != e.Recipient.ResponseURL {
					t.Errorf("segment %d: recipient %+v from %+v", i, w, e.Recipient)
				}
				if e.Channel == envelope.ChannelWeComBotReply && !w.NotAfter.Equal(e.ExpiresAt) {
					t.Errorf("NotAfter = %v, want expires_at %v", w.NotAfter, e.ExpiresAt)
				}
			}
			if _, err := r.Render(e, tc.segs, renderTime(e)); err == nil {
				t.Errorf("segment %d rendered", tc.segs)
			}
		})
	}
}

// The digest and the nudge as WeCom markdown: every item's deep link and
// graph refs, payload markdown shown as text (a quote cannot make a link
// or a heading), at most 2048 bytes; a digest too long for that leaves
// out its last items and says how many.
func TestRender_WeComDigestAndNudge(t *testing.T) {
	r := mustNew(t, nil)
	nudge := mustRender(t, r, fixture(t, "resurface-nudge.v1.wecom"))
	if nudge.WeCom.MsgType != envelope.WeComMarkdown || !strings.Contains(nudge.WeCom.Content, "](https://") {
		t.Errorf("nudge: %+v", nudge.WeCom)
	}

	e := fixture(t, "your-week-digest.v1.wecom")
	p, _ := e.DigestPayload()
	p.Sections[0].Items[0].Quote = "[click](https://evil.example) **bold** <font color=\"warning\">x</font>\n# heading"
	raw, _ := json.Marshal(p)
	e.Payload = raw
	m := mustRender(t, r, e)
	c := m.WeCom.Content
	for _, bad := range []string{"[click]", "**bold**", "<font", "\n# heading"} {
		if strings.Contains(c, bad) {
			t.Errorf("payload markdown %q is markup in the message:\n%s", bad, c)
		}
	}
	for _, s := range p.Sections {
		for _, it := range s.Items {
			if !strings.Contains(c, "("+it.DeepLink+")") {
				t.Errorf("deep link %s missing", it.DeepLink)
			}
		}
	}

	// 30 long items: cut to fit, the kept ones complete.
	var items []envelope.Item
	for i := range 30 {
		it := p.Sections[0].Items[0]
		it.Quote = strings.Repeat("很长的一句引用。", 10)
		it.DeepLink = fmt.Sprintf("https://app.example.org/e/%d", i)
		items = append(items, it)
	}
	p.Sections = []envelope.Section{{Kind: envelope.SectionRevisit, Items: items}}
	raw, _ = json.Marshal(p)
	e.Payload = raw
	m = mustRender(t, r, e)
	c = m.WeCom.Content
	if len(c) > MaxWeComMarkdownBytes {
		t.Fatalf("%d bytes, more than %d", len(c), MaxWeComMarkdownBytes)
	}
	kept := strings.Count(c, "](https://app.example.org/e/")
	if kept == 0 || kept == 30 || !strings.Contains(c, fmt.Sprintf("… and %d more in", 30-kept)) {
		t.Errorf("kept %d items of 30:\n%s", kept, c)
	}
}
