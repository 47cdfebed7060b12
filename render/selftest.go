package render

import (
	"encoding/json"
	"fmt"
	htemplate "html/template"
	"strings"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// The self-test renders these sample envelopes through every template at
// New. Sample strings are plain ASCII so that their presence in the output
// can be checked whatever the escaping.

var sampleNow = time.Date(2026, 1, 5, 8, 0, 0, 0, time.UTC)

func sampleInt(v int64) *int64 { return &v }

// sampleItems are the items of the sample digest; the first is the sample
// nudge's lead.
var sampleItems = []envelope.Item{
	{
		Quote: "Sample quote one", EpisodeSlug: "sample-episode-one", EpisodeTitle: "Sample Episode One",
		TMs: sampleInt(754000), Source: "user", DeepLink: "https://example.invalid/e/sample-one?t=754",
		GraphRefs: []envelope.GraphRef{
			{ID: "person:sample-person", Kind: "person", Label: "Sample Person"},
			{ID: "topic:sample-topic", Kind: "topic", Label: "Sample Topic"},
		},
	},
	{
		Quote: "Sample quote two", EpisodeSlug: "sample-episode-two", EpisodeTitle: "Sample Episode Two",
		TMs: sampleInt(3723000), Source: "auto", DeepLink: "https://example.invalid/e/sample-two?t=3723",
		GraphRefs: []envelope.GraphRef{{ID: "person:second-person", Kind: "person", Label: "Second Person"}},
	},
	{
		EpisodeSlug: "sample-episode-three", EpisodeTitle: "Sample Episode Three",
		DeepLink:  "https://example.invalid/e/sample-three",
		GraphRefs: []envelope.GraphRef{{ID: "topic:third-topic", Kind: "topic", Label: "Third Topic"}},
	},
	{
		DeepLink:  "https://example.invalid/t/fourth-topic",
		GraphRefs: []envelope.GraphRef{{ID: "topic:fourth-topic", Kind: "topic", Label: "Fourth Topic"}},
	},
}

// sampleEnvelope returns a sample envelope of template t on channel ch.
func sampleEnvelope(t envelope.Template, ch envelope.Channel) *envelope.Envelope {
	var payload any
	switch t {
	case envelope.TemplateDigest:
		payload = envelope.DigestPayload{Sections: []envelope.Section{
			{Kind: envelope.SectionRevisit, Items: sampleItems[:2]},
			{Kind: envelope.SectionNewInFollows, Items: sampleItems[2:3]},
			{Kind: envelope.SectionTrending, Items: sampleItems[3:4]},
		}}
	case envelope.TemplateNudge:
		payload = envelope.NudgePayload{HighlightCount: 3, Lead: sampleItems[0]}
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		panic(err)
	}
	return &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion,
		ID:            "sample-" + string(t) + "-" + string(ch),
		UserID:        "sample-user",
		Channel:       ch,
		Template:      t,
		Recipient: envelope.Recipient{
			Email: "sample@example.invalid", EmailVerified: true,
			PushSubscription: &envelope.PushSubscription{
				Endpoint: "https://push.example.invalid/sample",
				Keys:     envelope.PushKeys{P256dh: "sample-p256dh", Auth: "sample-auth"},
			},
			ChatID:    "1",
			WeComUser: "sample-user",
		},
		ConsentSnapshot: envelope.ConsentSnapshot{DigestEnabled: true, Cadence: "weekly", UnsubscribeRef: "sample-ref"},
		Payload:         raw,
		ExpiresAt:       sampleNow.Add(48 * time.Hour),
		CreatedAt:       sampleNow,
	}
}

// selfTest renders the sample envelopes and checks that every message
// carries what it must. Its errors name the template files involved.
func (r *Renderer) selfTest() error {
	// Digest and nudge e-mails.
	emails := []struct {
		tpl                    envelope.Template
		items                  []envelope.Item
		subject, html, text    string
		htmlPartial, textPartl string
	}{
		{envelope.TemplateDigest, sampleItems, fileDigestSubject, fileDigestHTML, fileDigestText, fileHTMLPartials, fileTextPartials},
		{envelope.TemplateNudge, sampleItems[:1], fileNudgeSubject, fileNudgeHTML, fileNudgeText, fileHTMLPartials, fileTextPartials},
	}
	// The e-mails must show the postal address: with a sample one when
	// none is configured, so that an override without it fails now, not
	// when an address is set later.
	withAddress := r
	if r.brand.Address == "" {
		cp := *r
		cp.brand.Address = sampleAddress
		withAddress = &cp
	}
	for _, c := range emails {
		e := sampleEnvelope(c.tpl, envelope.ChannelEmail)
		m, err := withAddress.Render(e, 0, sampleNow)
		if err != nil {
			return fmt.Errorf("render: self-test of %s e-mail: %w", c.tpl, err)
		}
		unsub, err := r.unsubscribeURL(e)
		if err != nil {
			return fmt.Errorf("render: self-test of %s e-mail: %w", c.tpl, err)
		}
		htmlWant, textWant := emailMust(c.items, unsub, withAddress.brand.Address)
		for _, w := range htmlWant {
			if !strings.Contains(m.Email.HTML, w.s) && !strings.Contains(m.Email.HTML, htemplate.HTMLEscapeString(w.s)) {
				return r.incomplete(fmt.Sprintf("the HTML body of the sample %s lacks %s", c.tpl, w.what), c.html, c.htmlPartial)
			}
		}
		for _, w := range textWant {
			if !strings.Contains(m.Email.Text, w.s) {
				return r.incomplete(fmt.Sprintf("the plain-text body of the sample %s lacks %s", c.tpl, w.what), c.text, c.textPartl)
			}
		}
	}

	// Nudge push.
	m, err := r.Render(sampleEnvelope(envelope.TemplateNudge, envelope.ChannelPush), 0, sampleNow)
	if err != nil {
		return fmt.Errorf("render: self-test of %s push: %w", envelope.TemplateNudge, err)
	}
	var pl pushPayload
	if err := json.Unmarshal(m.Push.Payload, &pl); err != nil || pl.URL != sampleItems[0].DeepLink {
		return fmt.Errorf("render: self-test of %s push: the payload lacks the deep link", envelope.TemplateNudge)
	}
	if strings.TrimSpace(pl.Body) == "" {
		return r.incomplete("the sample push notification has an empty body", fileNudgeBody)
	}

	// WeCom markdown: every item's deep link and graph refs (the moat
	// rule), within WeCom's limit.
	for _, c := range []struct {
		tpl   envelope.Template
		items []envelope.Item
		file  string
	}{{envelope.TemplateDigest, sampleItems, fileDigestWeCom}, {envelope.TemplateNudge, sampleItems[:1], fileNudgeWeCom}} {
		m, err := r.Render(sampleEnvelope(c.tpl, envelope.ChannelWeCom), 0, sampleNow)
		if err != nil {
			return fmt.Errorf("render: self-test of %s on wecom: %w", c.tpl, err)
		}
		for i := range c.items {
			v := newItemView(&c.items[i])
			if !strings.Contains(m.WeCom.Content, "("+mdURL(v.Link)+")") {
				return r.incomplete(fmt.Sprintf("the sample %s on wecom lacks item %d's deep link as a markdown link", c.tpl, i+1), c.file)
			}
			for _, ref := range v.Refs {
				if !strings.Contains(m.WeCom.Content, mdText(ref.Label)) {
					return r.incomplete(fmt.Sprintf("the sample %s on wecom lacks item %d's graph ref %s", c.tpl, i+1, ref.Label), c.file)
				}
			}
		}
	}

	// Reply segments: markup in the text must come out as text, and a
	// full-length segment must stay within Telegram's limit.
	for _, seg := range []string{
		`<b>not bold</b> & <a href="https://example.invalid">not a link</a> &amp; <script>`,
		strings.Repeat("x", envelope.MaxSegmentUnits),
	} {
		out, err := r.chatText(replyView{Text: seg, Segments: 1})
		if err != nil {
			return err
		}
		visible, _ := TelegramVisibleText(out) // checked by chatText
		if visible != seg {
			return r.incomplete("the sample reply does not show exactly the segment's text (escape it with {{tg .Text}} and add no visible text)", fileReply)
		}
	}
	return nil
}

// want is one string a rendered message must contain.
type want struct{ what, s string }

// sampleAddress is the postal address of the self-test's e-mails when
// the brand has none.
const sampleAddress = "Sample Postal Address 1"

// emailMust lists what the HTML and text bodies of an e-mail showing items
// must contain: every deep link, quote, episode and graph-ref label, the
// unsubscribe link and the postal address.
func emailMust(items []envelope.Item, unsub, address string) (html, text []want) {
	for i := range items {
		v := newItemView(&items[i])
		n := fmt.Sprintf("item %d's ", i+1)
		ws := []want{{n + "deep link", v.Link}}
		if v.Episode != "" {
			ws = append(ws, want{n + "episode", v.Episode})
		}
		if v.Quote != "" {
			ws = append(ws, want{n + "quote", v.Quote})
		}
		if v.Timestamp != "" {
			ws = append(ws, want{n + "timestamp", v.Timestamp})
		}
		for _, ref := range v.Refs {
			ws = append(ws, want{n + "graph ref " + ref.Label, ref.Label})
		}
		html = append(html, ws...)
		text = append(text, ws...)
	}
	html = append(html, want{"the unsubscribe link", unsub}, want{"the postal address (Brand.Address)", address})
	text = append(text, want{"the unsubscribe link", unsub}, want{"the postal address (Brand.Address)", address})
	return html, text
}

// incomplete reports a template set whose output lacks something, naming
// its files and where they came from.
func (r *Renderer) incomplete(problem string, files ...string) error {
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f + " (" + r.t.origin(f) + ")"
	}
	return fmt.Errorf("render: templates %s: %s", strings.Join(names, ", "), problem)
}
