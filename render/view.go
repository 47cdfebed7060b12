package render

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/outboxhq/outbox/envelope"
)

// The views are what templates see: plain strings and numbers, computed
// here so that templates stay simple and cannot make unsafe choices (links
// are already vetted, timestamps formatted, chips labelled).

// commonView is shared by every e-mail view.
type commonView struct {
	// Product is Brand.Name.
	Product string
	// Color is the brand colour (#rrggbb), ButtonText the text colour on
	// it, LinkColor the colour of links (the brand colour when readable
	// on white).
	Color, ButtonText, LinkColor string
	// LogoURL, Address and PreferencesURL are the Brand's ("" when unset).
	LogoURL, Address, PreferencesURL string
	// CTAURL and CTALabel are the message's primary call to action (the
	// digest's; "" when there is none).
	CTAURL, CTALabel string
	// BaseURL is Options.BaseURL without a trailing slash.
	BaseURL string
	// UnsubscribeURL is the one-click unsubscribe URL.
	UnsubscribeURL string
	// Cadence is the consent snapshot's cadence ("weekly" when unset).
	Cadence string
	// Subject is the rendered subject (set before the bodies render).
	Subject string
	// Preheader is the inbox preview text.
	Preheader string
}

// digestView is the data of your-week-digest.v1 templates.
type digestView struct {
	commonView
	Sections []sectionView
	// Total counts the items of every section.
	Total int
	// Summary is e.g. "2 to revisit, 1 new from shows you follow, 3 trending".
	Summary string
}

// sectionView is one non-empty digest section.
type sectionView struct {
	Kind    string
	Heading string
	Blurb   string
	Items   []itemView
}

// itemView is one digest item (or a nudge's lead).
type itemView struct {
	// Quote is the highlighted quote ("" when the item has none).
	Quote string
	// Episode is the episode title, else its slug, else "".
	Episode string
	// Title is what heads an item without a quote: Episode, else the
	// labels of its graph refs (a trending topic has nothing else).
	Title string
	// Timestamp is t_ms as h:mm:ss or m:ss ("" when absent).
	Timestamp string
	// Refs are the graph refs as chips, in payload order.
	Refs []refView
	// Link is the deep link when it is an absolute http(s) URL, else "".
	Link string
	// LinkLabel is the link's call to action ("Open at 12:34").
	LinkLabel string
	// Auto is true for automatic picks (source "auto").
	Auto bool
	// LinkColor is the brand's link colour (e-mail).
	LinkColor string
}

// refView is one graph-ref chip.
type refView struct {
	// Kind is "person", "topic" or another kind name.
	Kind string
	// KindLabel is Kind for people ("Person", "Topic", …).
	KindLabel string
	// Label is the ref's label, else the id without its kind prefix.
	Label string
}

// nudgeView is the data of resurface-nudge.v1 templates.
type nudgeView struct {
	commonView
	HighlightCount int
	// More is HighlightCount-1 when positive: highlights besides the lead.
	More int
	Lead itemView
}

// replyView is the data of reply-text.v1 templates.
type replyView struct {
	// Text is the raw (unescaped) text of this segment.
	Text string
	// Segment and Segments are this segment's 0-based index and the count.
	Segment, Segments int
}

// sectionMeta holds the heading and blurb of the known section kinds.
var sectionMeta = map[string]struct{ heading, blurb, summary string }{
	envelope.SectionRevisit:      {"Revisit", "Highlights worth another listen.", "%d to revisit"},
	envelope.SectionNewInFollows: {"New in shows you follow", "Fresh episodes from the shows you follow.", "%d new from shows you follow"},
	envelope.SectionTrending:     {"Trending in your corpus", "What is coming up across your library.", "%d trending"},
}

// newDigestView builds the view of a digest payload.
func newDigestView(c commonView, p *envelope.DigestPayload) digestView {
	v := digestView{commonView: c}
	var summary []string
	for _, s := range p.Sections {
		if len(s.Items) == 0 {
			continue
		}
		meta, known := sectionMeta[s.Kind]
		if !known { // a kind added after this renderer: show it by name
			meta.heading = humanize(clean(s.Kind))
		}
		sv := sectionView{Kind: s.Kind, Heading: meta.heading, Blurb: meta.blurb}
		for i := range s.Items {
			it := newItemView(&s.Items[i])
			it.LinkColor = c.LinkColor
			sv.Items = append(sv.Items, it)
		}
		v.Sections = append(v.Sections, sv)
		v.Total += len(sv.Items)
		if known {
			summary = append(summary, fmt.Sprintf(meta.summary, len(sv.Items)))
		} else {
			summary = append(summary, fmt.Sprintf("%d %s", len(sv.Items), strings.ToLower(meta.heading)))
		}
	}
	v.Summary = strings.Join(summary, ", ")
	return v
}

// newItemView builds the view of one item.
func newItemView(it *envelope.Item) itemView {
	v := itemView{
		Quote:   clean(it.Quote),
		Episode: clean(it.EpisodeTitle),
		Link:    safeLink(it.DeepLink),
		Auto:    it.Auto(),
	}
	if v.Episode == "" {
		v.Episode = clean(it.EpisodeSlug)
	}
	if it.TMs != nil {
		v.Timestamp = formatTimestamp(*it.TMs)
	}
	for _, g := range it.GraphRefs {
		v.Refs = append(v.Refs, newRefView(g))
	}
	v.Title = v.Episode
	if v.Title == "" {
		labels := make([]string, len(v.Refs))
		for i, ref := range v.Refs {
			labels[i] = ref.Label
		}
		v.Title = strings.Join(labels, " · ")
	}
	switch {
	case v.Timestamp != "":
		v.LinkLabel = "Open at " + v.Timestamp
	case v.Episode != "":
		v.LinkLabel = "Open episode"
	default:
		v.LinkLabel = "Explore"
	}
	return v
}

// newRefView labels one graph ref.
func newRefView(g envelope.GraphRef) refView {
	prefix, rest, found := strings.Cut(g.ID, ":")
	kind := strings.ToLower(strings.TrimSpace(g.Kind))
	if kind == "" && found {
		kind = prefix
	}
	label := clean(g.Label)
	if label == "" {
		if found {
			label = humanize(rest)
		} else {
			label = g.ID
		}
	}
	if kind == "" {
		kind = "ref"
	}
	return refView{Kind: kind, KindLabel: humanize(kind), Label: label}
}

// clean prepares a payload string for display: control characters
// become spaces (so a quote cannot break a plain-text layout), the bidi
// embedding, override and isolate controls that can make text read
// differently from what it is (U+202A–U+202E, U+2066–U+2069) are removed,
// and the ends are trimmed. Escaping is left to the templates.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 0x202A && r <= 0x202E, r >= 0x2066 && r <= 0x2069:
			return -1
		case r == '\u2028' || r == '\u2029' || unicode.IsControl(r):
			return ' '
		}
		return r
	}, s)
	return strings.TrimSpace(s)
}

// humanize turns "new_in_follows" or "jane-doe" into "New in follows" /
// "Jane doe".
func humanize(s string) string {
	s = strings.TrimSpace(strings.Map(func(r rune) rune {
		if r == '_' || r == '-' {
			return ' '
		}
		return r
	}, s))
	if s == "" {
		return s
	}
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + s[n:]
}

// formatTimestamp formats milliseconds as h:mm:ss (an hour or more) or
// m:ss. A negative value is treated as absent.
func formatTimestamp(ms int64) string {
	if ms < 0 {
		return ""
	}
	s := ms / 1000
	h, m, sec := s/3600, s/60%60, s%60
	if h > 0 {
		return fmt.Sprintf("%d:%02d:%02d", h, m, sec)
	}
	return fmt.Sprintf("%d:%02d", m, sec)
}

// safeLink returns link when it is an absolute http or https URL with a
// host and no line breaks or spaces, and "" otherwise. Only such links are
// ever rendered as links.
func safeLink(link string) string {
	link = strings.TrimSpace(link)
	if link == "" || strings.ContainsFunc(link, func(r rune) bool { return r <= ' ' || r == 0x7f || unicode.IsSpace(r) }) {
		return ""
	}
	u, err := url.Parse(link)
	if err != nil || u.Host == "" || u.Opaque != "" {
		return ""
	}
	if s := strings.ToLower(u.Scheme); s != "http" && s != "https" {
		return ""
	}
	return link
}

// jsonErrorKind describes a JSON decoding error without quoting any of the
// input.
func jsonErrorKind(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("syntax error at byte %d", syn.Offset)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return fmt.Sprintf("field %s has the wrong type", typ.Field)
		}
		return "wrong type"
	}
	return "invalid JSON"
}

// shorten returns s cut to at most max runes, ending in an ellipsis when it
// was cut. It cuts on a rune boundary, not before a combining mark or
// joiner where it can avoid it, and drops whitespace before the ellipsis.
func shorten(s string, max int) string {
	if max < 1 {
		return ""
	}
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	// Keep max-1 runes and add the ellipsis: cut is where rune max-1
	// (0-based) starts.
	cut, n := 0, 0
	for i := range s {
		if n == max-1 {
			cut = i
			break
		}
		n++
	}
	for back := 0; back < 8 && cut > 0; back++ {
		r, _ := utf8.DecodeRuneInString(s[cut:])
		p, size := utf8.DecodeLastRuneInString(s[:cut])
		if !attaches(r) && p != '\u200d' {
			break
		}
		cut -= size
	}
	return strings.TrimRightFunc(s[:cut], unicode.IsSpace) + "…"
}

// attaches reports whether r belongs to the rune before it (a combining
// mark, a joiner, a variation selector or an emoji modifier).
func attaches(r rune) bool {
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Mc) ||
		r == '\u200d' || r == '\u200c' ||
		(r >= 0xFE00 && r <= 0xFE0F) || (r >= 0x1F3FB && r <= 0x1F3FF) ||
		(r >= 0xE0020 && r <= 0xE007F)
}

// oneLineSpace collapses every run of whitespace (line breaks included) to
// one space and trims the ends: for subjects and notification titles.
func oneLineSpace(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}), " ")
}

// tidyText normalises a rendered plain-text body: LF line breaks, no
// trailing spaces, at most one blank line in a row, one final newline.
func tidyText(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	lines := strings.Split(s, "\n")
	out := make([]string, 0, len(lines))
	blank := true // drop leading blank lines
	for _, l := range lines {
		l = strings.TrimRightFunc(l, unicode.IsSpace)
		if l == "" {
			if blank {
				continue
			}
			blank = true
		} else {
			blank = false
		}
		out = append(out, l)
	}
	return strings.TrimRight(strings.Join(out, "\n"), "\n") + "\n"
}
