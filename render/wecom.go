package render

import (
	"fmt"
	"strings"

	"github.com/outboxhq/outbox/envelope"
)

// MaxWeComMarkdownBytes is the longest digest or nudge markdown rendered
// for a WeCom application message.
const MaxWeComMarkdownBytes = envelope.MaxWeComAppBytes

// replyWeCom renders segment segment of a reply-text.v1 reply on a wecom
// channel: the segment's text as it is (WeCom text and markdown need no
// escaping), as text for an application message and as markdown for a
// robot and an AI bot reply (which take only markdown).
func (r *Renderer) replyWeCom(e *envelope.Envelope, segment int) (*envelope.Message, error) {
	m := &envelope.WeComMessage{MsgType: envelope.WeComMarkdown}
	switch e.Channel {
	case envelope.ChannelWeCom:
		m.User, m.Agent, m.MsgType = e.Recipient.WeComUser, e.Recipient.WeComAgent, envelope.WeComText
	case envelope.ChannelWeComRobot:
		m.Robot = e.Recipient.Robot
	case envelope.ChannelWeComBotReply:
		m.ResponseURL, m.NotAfter = e.Recipient.ResponseURL, e.ExpiresAt
	}
	if strings.TrimSpace(m.User+m.Robot+m.ResponseURL) == "" {
		return nil, fmt.Errorf("%w: %s envelope has no recipient", ErrPayload, e.Channel)
	}
	p, err := e.ReplyPayload()
	if err != nil {
		return nil, decodeError(e.Template, err)
	}
	segs := envelope.SplitReplyFor(e.Channel, p.Text)
	if segment < 0 || segment >= len(segs) {
		return nil, fmt.Errorf("%w: segment %d of %d", ErrSegment, segment, len(segs))
	}
	m.Content, m.Segment, m.Segments = segs[segment], segment, len(segs)
	return &envelope.Message{Channel: e.Channel, WeCom: m}, nil
}

// weComMember checks an application message's recipient.
func weComMember(e *envelope.Envelope) (*envelope.WeComMessage, error) {
	if strings.TrimSpace(e.Recipient.WeComUser) == "" {
		return nil, fmt.Errorf("%w: wecom envelope has no recipient.wecom_user", ErrPayload)
	}
	return &envelope.WeComMessage{User: e.Recipient.WeComUser, Agent: e.Recipient.WeComAgent,
		MsgType: envelope.WeComMarkdown, Segments: 1}, nil
}

// weComDigestView is a digest view with the count of items left out.
type weComDigestView struct {
	digestView
	More int
}

// digestWeCom renders a your-week-digest.v1 as WeCom markdown, leaving out
// the last items while it is longer than MaxWeComMarkdownBytes.
func (r *Renderer) digestWeCom(e *envelope.Envelope) (*envelope.Message, error) {
	m, err := weComMember(e)
	if err != nil {
		return nil, err
	}
	p, err := e.DigestPayload()
	if err != nil {
		return nil, decodeError(e.Template, err)
	}
	v := weComDigestView{digestView: newDigestView(r.common(), p)}
	if v.Total == 0 {
		return nil, fmt.Errorf("%w: digest has no items", ErrPayload)
	}
	for {
		out, err := r.t.execText(r.t.digestWeCom, &v)
		if err != nil {
			return nil, err
		}
		out = strings.TrimSpace(out)
		if len(out) <= MaxWeComMarkdownBytes {
			m.Content = out
			return &envelope.Message{Channel: e.Channel, WeCom: m}, nil
		}
		if !dropLastItem(&v) {
			return nil, fmt.Errorf("render: template %s (%s) renders %d bytes with one item, more than WeCom's %d",
				fileDigestWeCom, r.t.origin(fileDigestWeCom), len(out), MaxWeComMarkdownBytes)
		}
	}
}

// dropLastItem removes the digest's last item (and its section when it
// empties), unless only one is left.
func dropLastItem(v *weComDigestView) bool {
	if v.Total-v.More <= 1 {
		return false
	}
	last := &v.Sections[len(v.Sections)-1]
	last.Items = last.Items[:len(last.Items)-1]
	if len(last.Items) == 0 {
		v.Sections = v.Sections[:len(v.Sections)-1]
	}
	v.More++
	return true
}

// nudgeWeCom renders a resurface-nudge.v1 as WeCom markdown.
func (r *Renderer) nudgeWeCom(e *envelope.Envelope) (*envelope.Message, error) {
	m, err := weComMember(e)
	if err != nil {
		return nil, err
	}
	p, err := e.NudgePayload()
	if err != nil {
		return nil, decodeError(e.Template, err)
	}
	v := nudgeView{commonView: r.common(),
		HighlightCount: p.HighlightCount, Lead: newItemView(&p.Lead)}
	if p.HighlightCount > 1 {
		v.More = p.HighlightCount - 1
	}
	for _, limit := range []int{maxQuoteRunes * 4, maxQuoteRunes, 40} {
		v.Lead.Quote = shorten(v.Lead.Quote, limit)
		out, err := r.t.execText(r.t.nudgeWeCom, &v)
		if err != nil {
			return nil, err
		}
		if out = strings.TrimSpace(out); len(out) <= MaxWeComMarkdownBytes {
			m.Content = out
			return &envelope.Message{Channel: e.Channel, WeCom: m}, nil
		}
	}
	return nil, fmt.Errorf("render: template %s (%s) renders more than WeCom's %d bytes",
		fileNudgeWeCom, r.t.origin(fileNudgeWeCom), MaxWeComMarkdownBytes)
}

// mdEscaper turns the characters WeCom markdown gives a meaning to into
// look-alikes: payload text is shown, never interpreted.
var mdEscaper = strings.NewReplacer(
	"[", "［", "]", "］", "*", "∗", "`", "ˋ", "<", "‹", ">", "›", "#", "＃", "_", "＿",
	"\r", " ", "\n", " ",
)

// mdText escapes payload text for a WeCom markdown template (one line).
func mdText(s string) string { return mdEscaper.Replace(s) }

// mdURL makes a vetted link safe inside a markdown link's parentheses.
func mdURL(s string) string {
	return strings.NewReplacer("(", "%28", ")", "%29", " ", "%20", "<", "%3C", ">", "%3E").Replace(s)
}
