package envelope

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// checkSplit fails t unless segs is a valid split of text (the invariant
// documented on SplitReply).
func checkSplit(t testing.TB, text string, segs []string) {
	t.Helper()
	checkSplitLimit(t, text, segs, telegramLimit)
}

// checkSplitLimit is checkSplit under limit l.
func checkSplitLimit(t testing.TB, text string, segs []string, l SegmentLimit) {
	t.Helper()
	size := UTF16Len
	if l.Bytes {
		size = func(s string) int { return len(s) }
	}
	s := strings.ToValidUTF8(text, string(utf8.RuneError))
	pos := 0
	for i, seg := range segs {
		if seg == "" {
			t.Fatalf("segment %d is empty", i)
		}
		if !utf8.ValidString(seg) {
			t.Fatalf("segment %d is not valid UTF-8", i)
		}
		if n := size(seg); n > l.Max {
			t.Fatalf("segment %d is %d units, more than %d", i, n, l.Max)
		}
		first, _ := utf8.DecodeRuneInString(seg)
		last, _ := utf8.DecodeLastRuneInString(seg)
		if unicode.IsSpace(first) || unicode.IsSpace(last) {
			t.Fatalf("segment %d starts or ends with whitespace: %q…%q", i, first, last)
		}
		gap := strings.TrimLeftFunc(s[pos:], unicode.IsSpace)
		if i > 0 && len(gap) == len(s[pos:]) {
			// No whitespace between two segments: only allowed where a
			// word was cut, i.e. the previous segment held no whitespace
			// at all and was (nearly) full.
			prev := segs[i-1]
			if strings.IndexFunc(prev, unicode.IsSpace) >= 0 {
				t.Fatalf("segments %d and %d are split without whitespace, but segment %d had a word break", i-1, i, i-1)
			}
			if size(prev)+maxHardCutBackoff*2*utf8.UTFMax < l.Max {
				t.Fatalf("hard cut after only %d units", size(prev))
			}
		}
		if !strings.HasPrefix(gap, seg) {
			t.Fatalf("segment %d is not the next non-space text of the input (at byte %d)", i, pos)
		}
		pos = len(s) - len(gap) + len(seg)
	}
	if rest := s[pos:]; strings.TrimLeftFunc(rest, unicode.IsSpace) != "" {
		t.Fatalf("text after the last segment is lost (%d bytes)", len(rest))
	}
	if trimmed := strings.TrimSpace(s); trimmed != "" && size(trimmed) <= l.Max {
		if len(segs) != 1 || segs[0] != trimmed {
			t.Fatalf("text that fits in one message gave %d segments", len(segs))
		}
	}
}

// words returns n space-separated copies of w.
func words(w string, n int) string {
	return strings.TrimSpace(strings.Repeat(w+" ", n))
}

func TestSplitReply(t *testing.T) {
	para := func(units int) string { // one paragraph of about units units, words of 9
		return words("abcdefghi", units/10)
	}
	tests := []struct {
		name string
		text string
		want []string // nil: check only the invariant and wantN
		// wantN is the expected segment count when want is nil.
		wantN int
	}{
		{name: "Empty", text: "", want: nil},
		{name: "OnlyWhitespace", text: " \n\t\u3000 ", want: nil},
		{name: "Short", text: "hello <b>&amp;</b>", want: []string{"hello <b>&amp;</b>"}},
		{name: "TrimmedEdges", text: "\n\n  hi there \n", want: []string{"hi there"}},
		{name: "ExactlyMax", text: strings.Repeat("x", MaxSegmentUnits), want: []string{strings.Repeat("x", MaxSegmentUnits)}},
		{
			name: "OneOverMaxIsHardCut",
			text: strings.Repeat("x", MaxSegmentUnits+1),
			want: []string{strings.Repeat("x", MaxSegmentUnits), "x"},
		},
		{
			name: "AstralRunesNeverSplitPairs",
			// 2049 emoji of 2 units each: 4098 units; 2048 fit.
			text: strings.Repeat("😀", 2049),
			want: []string{strings.Repeat("😀", 2048), "😀"},
		},
		{
			name: "AstralAtOddBoundary",
			// 4095 units of x then an emoji (2 units) cannot share a segment.
			text: strings.Repeat("x", 4095) + "😀",
			want: []string{strings.Repeat("x", 4095), "😀"},
		},
		{
			name: "ParagraphPreferred",
			text: para(3000) + "\n\n" + para(1500),
			want: []string{para(3000), para(1500)},
		},
		{
			name: "ParagraphWithSpacesBetweenBreaks",
			text: para(3000) + "\n \t\n" + para(1500),
			want: []string{para(3000), para(1500)},
		},
		{
			name: "LineBreakBeatsWordWhenNoParagraph",
			text: para(2500) + "\n" + para(2500),
			want: []string{para(2500), para(2500)},
		},
		{
			name: "CRLFLineBreak",
			text: para(2500) + "\r\n" + para(2500),
			want: []string{para(2500), para(2500)},
		},
		{
			name: "EarlyParagraphLosesToLateLine",
			// A paragraph break in the first half is skipped in favour of a
			// line break in the second half.
			text: "intro\n\n" + para(3000) + "\n" + para(2000),
			want: []string{"intro\n\n" + para(3000), para(2000)},
		},
		{
			name:  "WordBreak",
			text:  para(6000),
			wantN: 2,
		},
		{
			name: "EarlyWordBreakBeatsHardCut",
			// The only whitespace is early: cut there rather than inside the long word.
			text: "hi " + strings.Repeat("y", 4095),
			want: []string{"hi", strings.Repeat("y", 4095)},
		},
		{
			name: "LongWordAfterShortOnesIsHardCut",
			text: "hi " + strings.Repeat("y", 9000),
			want: []string{"hi", strings.Repeat("y", 4096), strings.Repeat("y", 4096), strings.Repeat("y", 808)},
		},
		{
			name: "HardCutKeepsCombiningMark",
			// "e" + U+0301 straddling the limit: the cut moves before the "e".
			text: strings.Repeat("x", 4095) + "e\u0301" + "tail",
			want: []string{strings.Repeat("x", 4095), "e\u0301tail"},
		},
		{
			name: "HardCutKeepsZWJSequence",
			// man ZWJ laptop: never cut right after the joiner.
			text: strings.Repeat("x", 4093) + "👨\u200d💻" + "tail",
			want: []string{strings.Repeat("x", 4093), "👨\u200d💻tail"},
		},
		{
			name: "InvalidUTF8Replaced",
			text: "a\xffb",
			want: []string{"a\uFFFDb"},
		},
		{
			name:  "ThreeSegmentsMixed",
			text:  strings.Repeat("Grüße, 世界! 😀 "+"line of text\n", 400),
			wantN: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SplitReply(tt.text)
			checkSplit(t, tt.text, got)
			if tt.want != nil || tt.wantN == 0 {
				if !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("got %d segments %s, want %d %s", len(got), summarize(got), len(tt.want), summarize(tt.want))
				}
				return
			}
			if len(got) != tt.wantN {
				t.Fatalf("got %d segments %s, want %d", len(got), summarize(got), tt.wantN)
			}
		})
	}
}

// summarize describes segments by their lengths (the texts are too long to print).
func summarize(segs []string) string {
	parts := make([]string, len(segs))
	for i, s := range segs {
		parts[i] = fmt.Sprint(UTF16Len(s))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func TestSplitReply_Deterministic(t *testing.T) {
	text := strings.Repeat("Ein Absatz mit Umlauten äöü und 🎧 Emoji.\n", 400)
	a, b := SplitReply(text), SplitReply(text)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two calls on the same text disagree")
	}
	checkSplit(t, text, a)
}

func TestSplitReply_EscapingKeepsTelegramLength(t *testing.T) {
	// Every character escapable: the raw length is what Telegram counts
	// after parsing &lt; &gt; &amp; back.
	text := strings.Repeat("<&> ", 3000)
	for i, seg := range SplitReply(text) {
		esc := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(seg)
		back := strings.NewReplacer("&amp;", "&", "&lt;", "<", "&gt;", ">").Replace(esc)
		if back != seg || UTF16Len(back) > MaxSegmentUnits {
			t.Fatalf("segment %d: escaped text does not parse back within the limit", i)
		}
	}
}

func TestUTF16Len(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"abc", 3},
		{"é", 1},
		{"世界", 2},
		{"😀", 2},
		{"a😀b", 4},
		{"\xff", 1},
	}
	for _, tt := range tests {
		if got := UTF16Len(tt.in); got != tt.want {
			t.Errorf("UTF16Len(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func FuzzSplitReply(f *testing.F) {
	// Seeds stay small (the fuzzer minimises new inputs byte by byte); the
	// target repeats short inputs until they need several segments.
	f.Add("")
	f.Add("hello")
	f.Add("word ")
	f.Add("😀")
	f.Add("x")
	f.Add("para graph\n\n")
	f.Add("line\r\nline ")
	f.Add("a\u0301")
	f.Add("bad \xff\xfe utf8 ")
	f.Add("👨\u200d💻")
	f.Add("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n\n\u3000y z\t")
	f.Fuzz(func(t *testing.T, text string) {
		// Short fuzz inputs rarely reach the limit: also split a repetition
		// long enough to need several segments.
		long := text
		if text != "" && len(text) < 3*MaxSegmentUnits {
			long = strings.Repeat(text, 3*MaxSegmentUnits/len(text)+1)
		}
		for _, in := range []string{text, long} {
			segs := SplitReply(in)
			checkSplit(t, in, segs)
			if again := SplitReply(in); !reflect.DeepEqual(segs, again) {
				t.Fatal("not deterministic")
			}
			for _, ch := range []Channel{ChannelWeCom, ChannelWeComRobot} {
				checkSplitLimit(t, in, SplitReplyFor(ch, in), SegmentLimitOf(ch))
			}
		}
	})
}
