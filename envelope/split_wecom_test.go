package envelope

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// WeCom counts UTF-8 bytes: a CJK text (3 bytes a rune) is cut at 2048
// bytes for an application message, where Telegram's 4096 units would
// have taken it whole.
func TestSplitReplyFor_WeComCountsBytes(t *testing.T) {
	text := strings.Repeat("睡眠是一切的上游。", 200) // 5400 bytes, 1800 units, no whitespace
	if n := len(SplitReply(text)); n != 1 {
		t.Fatalf("Telegram: %d segments, want 1", n)
	}
	for ch, want := range map[Channel]int{ChannelWeCom: 3, ChannelWeComRobot: 2, ChannelWeComBotReply: 1} {
		segs := SplitReplyFor(ch, text)
		if len(segs) != want {
			t.Errorf("%s: %d segments, want %d", ch, len(segs), want)
		}
		checkSplitLimit(t, text, segs, SegmentLimitOf(ch))
		for i, s := range segs {
			if !utf8.ValidString(s) {
				t.Errorf("%s: segment %d cut inside a character", ch, i)
			}
		}
	}
}

// A cut never falls inside a markdown link where a space outside links
// allows another one, also when the link's text has spaces.
func TestSplitReplyFor_KeepsMarkdownLinks(t *testing.T) {
	link := "[the exact moment you saved at 41:05 in the episode](https://app.example.org/e/deep-work?t=2465)"
	for _, pad := range []int{1900, 1950, 1990, 2000, 2010, 2030} {
		text := strings.Repeat("x", pad-10) + " tail word " + link + " after the link"
		segs := SplitReplyFor(ChannelWeCom, text)
		checkSplitLimit(t, text, segs, SegmentLimitOf(ChannelWeCom))
		whole := false
		for _, s := range segs {
			whole = whole || strings.Contains(s, link)
		}
		if !whole {
			t.Errorf("pad %d: the link was cut: %q", pad, segs)
		}
	}
	// Telegram's text is plain (escaped): no link rule, the last space wins.
	text := strings.Repeat("x", 4000) + " a " + "[b c d e f g h i j k l m n o p q r s t u v w x y z](https://e.example/x)"
	if segs := SplitReply(text); strings.Contains(segs[0], "[") == false {
		t.Errorf("Telegram split changed: first segment %q…", segs[0][len(segs[0])-10:])
	}
}

// Rows counts segments by the envelope's channel.
func TestRows_ByChannel(t *testing.T) {
	text := strings.Repeat("专注是一种预算。 ", 500) // 12500 bytes
	for ch, want := range map[Channel]int{ChannelTelegram: 2, ChannelWeCom: 7, ChannelWeComRobot: 4} {
		e := &Envelope{Channel: ch, Template: TemplateReply, Payload: []byte(`{"text":"` + text + `"}`)}
		if got := Rows(e); got != want {
			t.Errorf("%s: Rows = %d, want %d", ch, got, want)
		}
	}
}
