package envelope

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxSegmentUnits is the longest text of one chat segment: Telegram's limit
// of 4096 characters per message, counted as Telegram counts them (UTF-16
// code units, after entity parsing).
const MaxSegmentUnits = 4096

// SplitReply splits the raw text of a reply-text.v1 payload into the
// segments delivered as separate chat messages, each at most
// MaxSegmentUnits UTF-16 code units long.
//
// It works on the raw text, before any escaping: escaping afterwards for
// Telegram's HTML parse mode (only <, > and & become entities) keeps the
// length Telegram counts, because Telegram counts the text after parsing
// entities. The queue calls it at enqueue to fix a reply's segment count and
// the renderer calls it again to produce segment i's text, so it is
// deterministic: the same text always yields the same segments.
//
// Where the text must be split, SplitReply cuts at the last paragraph
// break (a whitespace run holding two or more line breaks) that leaves the
// segment at least half full; failing that at the last line break, then at
// the last word break (any whitespace) under the same condition; failing
// those at the last whitespace run of any kind; and only when the segment
// holds no whitespace at all it cuts a too-long word on a rune boundary
// (never between the halves of a UTF-16 surrogate pair, and, where it can,
// not before a combining mark, a variation selector or a zero-width joiner
// nor after a joiner).
//
// The invariant (pinned by FuzzSplitReply): let S be text with every invalid
// UTF-8 sequence replaced by U+FFFD (strings.ToValidUTF8). Then
//
//	S == w0 + seg[0] + w1 + seg[1] + … + seg[n-1] + wn
//
// where every w is a (possibly empty) run of whitespace (unicode.IsSpace),
// and every segment is valid UTF-8, non-empty, at most MaxSegmentUnits
// UTF-16 code units, and neither starts nor ends with whitespace. An
// interior w is empty only where a word was cut. Whitespace inside a
// segment is kept as it is. A text that is empty or only whitespace yields
// no segments (nil), which is why such a reply is not a valid envelope.
func SplitReply(text string) []string { return split(text, telegramLimit) }

// WeCom's limits on one message, in UTF-8 bytes.
const (
	// MaxWeComAppBytes is an application message's text (and markdown).
	MaxWeComAppBytes = 2048
	// MaxWeComRobotMarkdownBytes is a group robot's markdown message.
	MaxWeComRobotMarkdownBytes = 4096
	// MaxWeComBotReplyBytes is an AI bot reply's markdown through a
	// response_url. Such a reply is one segment: the URL is single use.
	MaxWeComBotReplyBytes = 20480
)

// SegmentLimit is how long one segment of a reply may be on a channel.
type SegmentLimit struct {
	// Max is the limit, in UTF-16 code units or, with Bytes, in UTF-8
	// bytes.
	Max   int
	Bytes bool
	// KeepLinks says that no cut falls inside a markdown link
	// "[text](url)" where another cut is possible.
	KeepLinks bool
}

var telegramLimit = SegmentLimit{Max: MaxSegmentUnits}

// SegmentLimitOf returns the segment limit of reply-text.v1 on ch (the
// Telegram one for a channel without replies).
func SegmentLimitOf(ch Channel) SegmentLimit {
	switch ch {
	case ChannelWeCom:
		return SegmentLimit{Max: MaxWeComAppBytes, Bytes: true, KeepLinks: true}
	case ChannelWeComRobot:
		return SegmentLimit{Max: MaxWeComRobotMarkdownBytes, Bytes: true, KeepLinks: true}
	case ChannelWeComBotReply:
		return SegmentLimit{Max: MaxWeComBotReplyBytes, Bytes: true, KeepLinks: true}
	}
	return telegramLimit
}

// SplitReplyFor splits text for channel ch: SplitReply's rules and
// invariant with ch's SegmentLimitOf (WeCom counts UTF-8 bytes and keeps
// markdown links whole where it can).
func SplitReplyFor(ch Channel, text string) []string { return split(text, SegmentLimitOf(ch)) }

func split(text string, l SegmentLimit) []string {
	s := strings.ToValidUTF8(text, string(utf8.RuneError))
	s = strings.TrimLeftFunc(s, unicode.IsSpace)
	var segs []string
	for s != "" {
		if last := strings.TrimRightFunc(s, unicode.IsSpace); l.fits(last) {
			segs = append(segs, last)
			break
		}
		end, next := cutPoint(s, l)
		segs = append(segs, s[:end])
		s = s[next:]
	}
	return segs
}

// fits reports whether s is within the limit.
func (l SegmentLimit) fits(s string) bool {
	if l.Bytes {
		return len(s) <= l.Max
	}
	return fitsUnits(s, l.Max)
}

// units is r's length under the limit.
func (l SegmentLimit) units(r rune) int {
	if l.Bytes {
		return utf8.RuneLen(r)
	}
	return runeUnits(r)
}

// markdownLink matches a markdown link or image "[text](url)".
var markdownLink = regexp.MustCompile(`!?\[[^\[\]\n]*\]\([^()\s]*\)`)

// UTF16Len returns the length of s in UTF-16 code units, the unit Telegram
// counts message length in. An invalid UTF-8 byte counts as one unit (it
// would be sent as U+FFFD).
func UTF16Len(s string) int {
	n := 0
	for _, r := range s {
		n += runeUnits(r)
	}
	return n
}

// runeUnits is r's length in UTF-16 code units.
func runeUnits(r rune) int {
	if r >= 0x10000 {
		return 2
	}
	return 1
}

// fitsUnits reports whether s is at most max UTF-16 code units, without
// scanning further than needed.
func fitsUnits(s string, max int) bool {
	if len(s) <= max {
		return true // every unit takes at least one byte
	}
	n := 0
	for _, r := range s {
		n += runeUnits(r)
		if n > max {
			return false
		}
	}
	return true
}

// Boundary tiers, best last.
const (
	tierWord = iota
	tierLine
	tierParagraph
	numTiers
)

// boundary is a maximal whitespace run s[start:end]; units is the length of
// s[:start] in UTF-16 code units.
type boundary struct {
	start, end, units int
	ok                bool
}

// cutPoint returns where the first segment of s ends (end) and where the
// rest begins (next). s starts with a non-space rune and is longer than the
// limit once trailing whitespace is trimmed.
func cutPoint(s string, l SegmentLimit) (end, next int) {
	max := l.Max
	var links [][]int
	if l.KeepLinks {
		links = markdownLink.FindAllStringIndex(s, -1)
	}
	var best [numTiers]boundary
	var latest boundary
	record := func(b boundary, breaks int) {
		for _, ln := range links {
			if ln[0] < b.start && b.start < ln[1] {
				return // inside a link: not a place to cut
			}
		}
		t := tierWord
		switch {
		case breaks >= 2:
			t = tierParagraph
		case breaks == 1:
			t = tierLine
		}
		b.ok = true
		best[t] = b
		latest = b
	}

	units := 0
	hard := -1
	inRun := false
	var run boundary
	breaks := 0
	prevCR := false
	for i, r := range s {
		w := l.units(r)
		if unicode.IsSpace(r) {
			if !inRun {
				if units > max {
					break
				}
				inRun = true
				run = boundary{start: i, units: units}
				breaks = 0
				prevCR = false
			}
			switch r {
			case '\n':
				if !prevCR { // "\r\n" is one line break
					breaks++
				}
			case '\r', '\v', '\f', '\u0085', '\u2028':
				breaks++
			case '\u2029': // paragraph separator
				breaks += 2
			}
			prevCR = r == '\r'
		} else {
			if inRun {
				inRun = false
				run.end = i
				record(run, breaks)
			}
			if units+w > max {
				if hard < 0 {
					hard = i
				}
				break
			}
		}
		if hard < 0 && units+w > max {
			hard = i
		}
		units += w
	}
	if inRun { // not reached for valid input: the run would be trailing whitespace
		run.end = len(s)
		record(run, breaks)
	}

	half := max / 2
	for t := numTiers - 1; t >= 0; t-- {
		if b := best[t]; b.ok && b.units >= half {
			return b.start, b.end
		}
	}
	if latest.ok {
		return latest.start, latest.end
	}
	cut := softenHardCut(s, hard)
	return cut, cut
}

// maxHardCutBackoff bounds how many runes a hard cut moves back to avoid
// separating a rune from the marks or joiners that belong to it.
const maxHardCutBackoff = 16

// softenHardCut moves a hard cut at byte index cut back (by at most
// maxHardCutBackoff runes) so that it does not fall before a combining mark,
// a variation selector, an emoji modifier or tag, or a zero-width joiner,
// nor right after a joiner. If no such place exists it returns cut.
func softenHardCut(s string, cut int) int {
	c := cut
	for range maxHardCutBackoff {
		next, _ := utf8.DecodeRuneInString(s[c:])
		prev, size := utf8.DecodeLastRuneInString(s[:c])
		if !clings(next) && prev != '\u200d' {
			return c
		}
		if c-size <= 0 {
			break
		}
		c -= size
	}
	return cut
}

// clings reports whether r attaches to the rune before it.
func clings(r rune) bool {
	switch {
	case unicode.In(r, unicode.Mn, unicode.Me, unicode.Mc):
		return true
	case r == '\u200d' || r == '\u200c':
		return true
	case r >= 0xFE00 && r <= 0xFE0F, r >= 0xE0100 && r <= 0xE01EF: // variation selectors
		return true
	case r >= 0x1F3FB && r <= 0x1F3FF: // emoji skin-tone modifiers
		return true
	case r >= 0xE0020 && r <= 0xE007F: // emoji tag characters
		return true
	}
	return false
}
