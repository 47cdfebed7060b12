package render

import (
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"
	"unicode/utf8"

	"github.com/outboxhq/outbox/envelope"
)

// mustNew returns a renderer or fails the test.
func mustNew(t testing.TB, opts *Options) *Renderer {
	t.Helper()
	r, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r
}

// mustRender renders segment 0 of e at its render time.
func mustRender(t testing.TB, r *Renderer, e *envelope.Envelope) *envelope.Message {
	t.Helper()
	m, err := r.Render(e, 0, renderTime(e))
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	return m
}

// fixture loads a shared golden fixture by template name.
func fixture(t testing.TB, name string) *envelope.Envelope {
	t.Helper()
	return mustLoadEnvelope(t, "../testdata/delivery/"+name+".golden.json")
}

func TestNew_Options(t *testing.T) {
	tests := []struct {
		name    string
		opts    *Options
		wantErr string
	}{
		{name: "Nil", opts: nil},
		{name: "Zero", opts: &Options{}},
		{name: "HTTPSBase", opts: &Options{BaseURL: "https://app.example.org/base/"}},
		{name: "RelativeBase", opts: &Options{BaseURL: "/app"}, wantErr: "BaseURL"},
		{name: "JavascriptBase", opts: &Options{BaseURL: "javascript:alert(1)"}, wantErr: "BaseURL"},
		{name: "BaseWithQuery", opts: &Options{BaseURL: "https://a.example/?x=1"}, wantErr: "BaseURL"},
		{name: "OverridesUnknownFile", opts: &Options{Overrides: fstest.MapFS{"x": {}}}, wantErr: "not a template name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("New: %v", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("New error = %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestRender_Unsupported(t *testing.T) {
	r := mustNew(t, nil)
	digest := fixture(t, "your-week-digest.v1")
	nudge := fixture(t, "resurface-nudge.v1")
	reply := fixture(t, "reply-text.v1")
	with := func(e *envelope.Envelope, f func(*envelope.Envelope)) *envelope.Envelope {
		cp := *e
		f(&cp)
		return &cp
	}
	tests := []struct {
		name    string
		env     *envelope.Envelope
		segment int
		want    error
	}{
		{"DigestOnPush", with(digest, func(e *envelope.Envelope) { e.Channel = envelope.ChannelPush }), 0, ErrUnsupported},
		{"DigestOnTelegram", with(digest, func(e *envelope.Envelope) { e.Channel = envelope.ChannelTelegram }), 0, ErrUnsupported},
		{"NudgeOnTelegram", with(nudge, func(e *envelope.Envelope) { e.Channel = envelope.ChannelTelegram }), 0, ErrUnsupported},
		{"ReplyOnEmail", with(reply, func(e *envelope.Envelope) { e.Channel = envelope.ChannelEmail }), 0, ErrUnsupported},
		{"UnknownTemplate", with(digest, func(e *envelope.Envelope) { e.Template = "other.v9" }), 0, ErrUnsupported},
		{"DigestSegment1", digest, 1, ErrSegment},
		{"ReplySegmentPastEnd", reply, Segments(reply), ErrSegment},
		{"ReplyNegativeSegment", reply, -1, ErrSegment},
		{"EmailWithoutAddress", with(digest, func(e *envelope.Envelope) { e.Recipient.Email = "" }), 0, ErrPayload},
		{"EmailWithoutUnsubscribeRef", with(digest, func(e *envelope.Envelope) { e.ConsentSnapshot.UnsubscribeRef = "" }), 0, ErrPayload},
		{"PushWithoutSubscription", with(nudge, func(e *envelope.Envelope) { e.Recipient.PushSubscription = nil }), 0, ErrPayload},
		{"TelegramWithoutChat", with(reply, func(e *envelope.Envelope) { e.Recipient.ChatID = "" }), 0, ErrPayload},
		{"PayloadNotJSON", with(digest, func(e *envelope.Envelope) { e.Payload = json.RawMessage(`{"sections": [secret`) }), 0, ErrPayload},
		{"PayloadWrongType", with(nudge, func(e *envelope.Envelope) { e.Payload = json.RawMessage(`{"lead": "secret-text"}`) }), 0, ErrPayload},
		{"DigestWithoutItems", with(digest, func(e *envelope.Envelope) { e.Payload = json.RawMessage(`{"sections": []}`) }), 0, ErrPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := r.Render(tt.env, tt.segment, renderTime(tt.env))
			if !errors.Is(err, tt.want) {
				t.Fatalf("Render = %v, %v; want %v", m, err, tt.want)
			}
			for _, secret := range []string{"secret", "ada.lovelace", "734519028", "fcm.googleapis"} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error text %q leaks payload or recipient data", err)
				}
			}
		})
	}
}

func TestRender_DigestEmail(t *testing.T) {
	e := fixture(t, "your-week-digest.v1")
	p, err := e.DigestPayload()
	if err != nil {
		t.Fatal(err)
	}
	m := mustRender(t, mustNew(t, &Options{BaseURL: "https://app.example.org"}), e)
	if m.Channel != envelope.ChannelEmail || m.Email == nil || m.Push != nil || m.Chat != nil {
		t.Fatalf("message = %+v, want an e-mail only", m)
	}
	em := m.Email
	if em.To != e.Recipient.Email {
		t.Errorf("To = %q, want the recipient", em.To)
	}
	if !strings.HasPrefix(em.Subject, "Your week") || strings.ContainsAny(em.Subject, "\r\n") {
		t.Errorf("Subject = %q", em.Subject)
	}
	unsub := "https://app.example.org/unsubscribe/" + e.ConsentSnapshot.UnsubscribeRef
	wantHeaders := []envelope.Header{
		{Name: "List-Unsubscribe", Value: "<" + unsub + ">"},
		{Name: "List-Unsubscribe-Post", Value: "List-Unsubscribe=One-Click"},
	}
	if !reflect.DeepEqual(em.Headers, wantHeaders) {
		t.Errorf("Headers = %v, want %v", em.Headers, wantHeaders)
	}
	for _, body := range []struct{ name, s string }{{"html", em.HTML}, {"text", em.Text}} {
		for _, w := range []string{"Revisit", "New in shows you follow", "Trending in your corpus", "30:34", "10:12"} {
			if !strings.Contains(strings.ToLower(body.s), strings.ToLower(w)) {
				t.Errorf("%s body lacks %q", body.name, w)
			}
		}
		autos := 0
		for _, s := range p.Sections {
			for _, it := range s.Items {
				if it.Auto() {
					autos++
				}
				link := it.DeepLink
				if body.name == "html" {
					link = strings.ReplaceAll(link, "&", "&amp;")
				}
				if !strings.Contains(body.s, link) {
					t.Errorf("%s body lacks the deep link of %s", body.name, it.EpisodeSlug)
				}
				for _, g := range it.GraphRefs {
					if !strings.Contains(body.s, g.Label) {
						t.Errorf("%s body lacks the graph ref %q", body.name, g.Label)
					}
				}
			}
		}
		if got := strings.Count(strings.ToLower(body.s), "auto pick"); got != autos {
			t.Errorf("%s body marks %d auto picks, want %d", body.name, got, autos)
		}
		if !strings.Contains(body.s, unsub) {
			t.Errorf("%s body lacks the unsubscribe link", body.name)
		}
	}
	// E-mail client safety: dark-mode metadata, inline styles, nothing
	// loaded from elsewhere.
	for _, w := range []string{`<meta name="color-scheme" content="light dark">`, `role="presentation"`, `style="`} {
		if !strings.Contains(em.HTML, w) {
			t.Errorf("HTML lacks %s", w)
		}
	}
	for _, bad := range []string{"<img", "<link", "@import", "url(", "<script", "@font-face"} {
		if strings.Contains(em.HTML, bad) {
			t.Errorf("HTML contains %s", bad)
		}
	}
}

func TestRender_UnsubscribeHeaders(t *testing.T) {
	e := fixture(t, "your-week-digest.v1")
	tests := []struct {
		name     string
		opts     *Options
		ref      string
		wantURL  string
		wantPost bool
		wantErr  bool
	}{
		{name: "DefaultBaseIsHTTP", opts: nil, ref: "r1", wantURL: "http://127.0.0.1:8080/unsubscribe/r1"},
		{name: "HTTPSBaseWithPath", opts: &Options{BaseURL: "https://a.example/app/"}, ref: "r1", wantURL: "https://a.example/app/unsubscribe/r1", wantPost: true},
		{name: "RefIsPathEscaped", opts: &Options{BaseURL: "https://a.example"}, ref: "a/../b?c#d e", wantURL: "https://a.example/unsubscribe/a%2F..%2Fb%3Fc%23d%20e", wantPost: true},
		{name: "CustomFunc", opts: &Options{UnsubscribeURL: func(e *envelope.Envelope) string {
			return "https://u.example/one-click/" + e.ConsentSnapshot.UnsubscribeRef + "?sig=abc"
		}}, ref: "r2", wantURL: "https://u.example/one-click/r2?sig=abc", wantPost: true},
		{name: "CustomFuncNotHTTP", opts: &Options{UnsubscribeURL: func(*envelope.Envelope) string { return "javascript:alert(1)" }}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.opts)
			if tt.wantErr {
				// The self-test renders a sample e-mail: a bad custom URL
				// fails at start-up.
				if err == nil || !errors.Is(err, ErrPayload) {
					t.Fatalf("New = %v, want an unsubscribe URL error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			cp := *e
			cp.ConsentSnapshot.UnsubscribeRef = tt.ref
			m := mustRender(t, r, &cp)
			want := []envelope.Header{{Name: HeaderListUnsubscribe, Value: "<" + tt.wantURL + ">"}}
			if tt.wantPost {
				want = append(want, envelope.Header{Name: HeaderListUnsubscribePost, Value: ListUnsubscribeOneClick})
			}
			if !reflect.DeepEqual(m.Email.Headers, want) {
				t.Fatalf("Headers = %v, want %v", m.Email.Headers, want)
			}
			if !strings.Contains(m.Email.Text, tt.wantURL) {
				t.Fatalf("text body lacks %s", tt.wantURL)
			}
		})
	}
}

var (
	attrRE = regexp.MustCompile(`(?i)\s(href|src|action|background|style)\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)`)
	tagRE  = regexp.MustCompile(`<[^>]*>`)
	onRE   = regexp.MustCompile(`(?i)\son[a-z]+\s*=`)
)

func TestRender_HostileEmail(t *testing.T) {
	r := mustNew(t, &goldenOptions)
	e := mustLoadEnvelope(t, "testdata/envelopes/hostile-digest.json")
	m := mustRender(t, r, e)
	h := m.Email.HTML

	// No payload string became markup: the only tags are the template's.
	templateTags := map[string]bool{
		"!doctype": true, "html": true, "head": true, "meta": true, "title": true, "style": true,
		"body": true, "div": true, "table": true, "tr": true, "td": true, "p": true, "span": true,
		"a": true, "h1": true, "h2": true,
	}
	for _, tag := range tagRE.FindAllString(h, -1) {
		name := strings.ToLower(strings.Fields(strings.Trim(tag, "</>"))[0])
		if !templateTags[name] {
			t.Errorf("injected tag %s", tag)
		}
		if onRE.MatchString(tag) {
			t.Errorf("event handler attribute in %s", tag)
		}
	}
	if n := strings.Count(h, "<h1"); n != 1 {
		t.Errorf("%d <h1> tags, want the template's one", n)
	}
	if strings.Contains(h, "<h1>Injected") || strings.Contains(h, "</table><h1>") {
		t.Error("an episode title closed the layout")
	}
	// Every link is http(s); the javascript:, data: and protocol-relative
	// deep links are not links at all.
	links := 0
	var attrs [][]string
	for _, tag := range tagRE.FindAllString(h, -1) {
		attrs = append(attrs, attrRE.FindAllStringSubmatch(tag, -1)...)
	}
	for _, a := range attrs {
		v := strings.Trim(a[2], `"'`)
		switch strings.ToLower(a[1]) {
		case "href":
			links++
			if !strings.HasPrefix(v, "https://") && !strings.HasPrefix(strings.ToLower(v), "https://") && !strings.HasPrefix(v, "http://") {
				t.Errorf("link %q is not http(s)", v)
			}
			if strings.Contains(v, "evil.example") {
				t.Errorf("protocol-relative link %q became a link", v)
			}
		case "style":
			if strings.Contains(strings.ToLower(v), "javascript") || strings.Contains(v, "url(") {
				t.Errorf("payload reached a style attribute: %q", v)
			}
		case "src", "action", "background":
			t.Errorf("unexpected %s attribute %q", a[1], v)
		}
	}
	// 3 safe links (the s2 item, the uppercase HTTPS trending item, the
	// unsubscribe link); 3 unsafe deep links render "Link unavailable".
	if links != 3 {
		t.Errorf("HTML has %d links, want 3", links)
	}
	if got := strings.Count(h, "Link unavailable"); got != 3 {
		t.Errorf("HTML marks %d links unavailable, want 3", got)
	}
	// The link with quotes and angle brackets stays inside its attribute.
	if !strings.Contains(h, `href="https://app.example.org/e/s2?a=1&amp;b=%222%22&amp;c=%3c3%3e"`) {
		t.Errorf("the deep link with special characters is not escaped as expected")
	}
	// Template syntax in a payload is data.
	if !strings.Contains(h, "{{.UnsubscribeURL}}") || !strings.Contains(m.Email.Text, "{{.UnsubscribeURL}}") {
		t.Error("template syntax in a quote was not shown literally")
	}
	// Bidi overrides are removed.
	if strings.ContainsRune(h, '\u202e') || strings.ContainsRune(m.Email.Text, '\u202e') {
		t.Error("a bidi override survived")
	}
	// In the plain text, every link line offers an http(s) URL, and the
	// three unsafe deep links are marked unavailable.
	linkLines := 0
	for _, line := range strings.Split(m.Email.Text, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "Open") || strings.HasPrefix(line, "Explore") || strings.HasPrefix(line, "Unsubscribe") {
			linkLines++
			_, u, _ := strings.Cut(line, ": ")
			if safeLink(u) == "" {
				t.Errorf("plain text offers the link %q", u)
			}
		}
	}
	if linkLines != 3 || strings.Count(m.Email.Text, "(link unavailable)") != 3 {
		t.Errorf("plain text has %d link lines and %d unavailable links, want 3 and 3", linkLines, strings.Count(m.Email.Text, "(link unavailable)"))
	}
}

func TestRender_NudgePush(t *testing.T) {
	r := mustNew(t, &goldenOptions)
	e := fixture(t, "resurface-nudge.v1")
	p, _ := e.NudgePayload()
	now := e.NotBefore
	m, err := r.Render(e, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	pm := m.Push
	if m.Channel != envelope.ChannelPush || pm == nil {
		t.Fatalf("message = %+v", m)
	}
	if !reflect.DeepEqual(pm.Subscription, *e.Recipient.PushSubscription) {
		t.Error("subscription not copied")
	}
	if pm.Urgency != envelope.UrgencyNormal {
		t.Errorf("Urgency = %q", pm.Urgency)
	}
	if want := e.ExpiresAt.Sub(now); pm.TTL != want {
		t.Errorf("TTL = %s, want %s", pm.TTL, want)
	}
	if !regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`).MatchString(pm.Topic) {
		t.Errorf("Topic %q is not ≤ 32 URL-safe base64 characters", pm.Topic)
	}
	if len(pm.Payload) > MaxPushPayloadBytes {
		t.Errorf("payload is %d bytes", len(pm.Payload))
	}
	var pl pushPayload
	if err := json.Unmarshal(pm.Payload, &pl); err != nil {
		t.Fatal(err)
	}
	if pl.URL != p.Lead.DeepLink {
		t.Errorf("url = %q, want the deep link", pl.URL)
	}
	if pl.Title == "" || pl.Body == "" || !strings.Contains(pl.Body, "30:34") {
		t.Errorf("title %q, body %q", pl.Title, pl.Body)
	}
	if pl.Data == nil || pl.Data.HighlightCount != 3 || len(pl.Data.GraphRefs) != 2 {
		t.Errorf("data = %+v", pl.Data)
	}

	// Tag and topic are stable per envelope (a redelivery replaces) and
	// differ between envelopes and tenants.
	m2, _ := r.Render(e, 0, now.Add(time.Hour))
	var pl2 pushPayload
	json.Unmarshal(m2.Push.Payload, &pl2)
	if pl2.Tag != pl.Tag || m2.Push.Topic != pm.Topic {
		t.Error("tag or topic changed between renders of one envelope")
	}
	for _, other := range []func(*envelope.Envelope){
		func(e *envelope.Envelope) { e.ID += "-2" },
		func(e *envelope.Envelope) { e.TenantID = "other" },
	} {
		cp := *e
		other(&cp)
		m3 := mustRender(t, r, &cp)
		var pl3 pushPayload
		json.Unmarshal(m3.Push.Payload, &pl3)
		if pl3.Tag == pl.Tag || m3.Push.Topic == pm.Topic {
			t.Error("two envelopes share a tag or topic")
		}
	}
}

func TestRender_HostilePush(t *testing.T) {
	r := mustNew(t, &goldenOptions)
	e := mustLoadEnvelope(t, "testdata/envelopes/hostile-nudge.json")
	m := mustRender(t, r, e)
	if n := len(m.Push.Payload); n > MaxPushPayloadBytes {
		t.Fatalf("payload is %d bytes", n)
	}
	var pl pushPayload
	if err := json.Unmarshal(m.Push.Payload, &pl); err != nil {
		t.Fatal(err)
	}
	if pl.URL != "https://app.example.org/" {
		t.Errorf("url = %q: a javascript: deep link must fall back to the base URL", pl.URL)
	}
	for _, s := range []string{pl.Title, pl.Body} {
		if !utf8.ValidString(s) || !strings.Contains(s, "…") {
			t.Errorf("%q was not shortened on a rune boundary with an ellipsis", s)
		}
	}
	if utf8.RuneCountInString(pl.Title) > maxTitleRunes || utf8.RuneCountInString(pl.Body) > maxBodyRunes {
		t.Errorf("title or body too long: %d, %d runes", utf8.RuneCountInString(pl.Title), utf8.RuneCountInString(pl.Body))
	}
	if m.Push.TTL != MaxPushTTL {
		t.Errorf("TTL without expires_at = %s, want %s", m.Push.TTL, MaxPushTTL)
	}
}

func TestRender_PushBudget(t *testing.T) {
	r := mustNew(t, &goldenOptions)
	base := fixture(t, "resurface-nudge.v1")
	mk := func(link, quote, title string, refs int) *envelope.Envelope {
		p, _ := base.NudgePayload()
		p.Lead.DeepLink = link
		p.Lead.Quote = quote
		p.Lead.EpisodeTitle = title
		for i := range refs {
			p.Lead.GraphRefs = append(p.Lead.GraphRefs, envelope.GraphRef{ID: "topic:t" + strings.Repeat("x", i), Label: strings.Repeat("<&>", 20)})
		}
		cp := *base
		cp.Payload, _ = json.Marshal(p)
		return &cp
	}
	longLink := "https://app.example.org/e/x?q=" + strings.Repeat("a", 1100)
	tests := []struct {
		name    string
		env     *envelope.Envelope
		wantErr bool
	}{
		{"LongLinkKeptWhole", mk(longLink, strings.Repeat("<>&\"", 500), strings.Repeat("😀", 300), 40), false},
		{"ManyRefsDropped", mk(base.Recipient.PushSubscription.Endpoint, "q", "t", 200), false},
		{"CJKText", mk("https://a.example/", strings.Repeat("中文", 1000), strings.Repeat("標題", 200), 0), false},
		{"LinkTooLong", mk("https://app.example.org/"+strings.Repeat("a", maxPushURLBytes), "q", "t", 0), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := r.Render(tt.env, 0, renderTime(tt.env))
			if tt.wantErr {
				if !errors.Is(err, ErrPayload) {
					t.Fatalf("err = %v, want ErrPayload", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n := len(m.Push.Payload); n > MaxPushPayloadBytes {
				t.Fatalf("payload %d bytes", n)
			}
			var pl pushPayload
			if err := json.Unmarshal(m.Push.Payload, &pl); err != nil {
				t.Fatal(err)
			}
			p, _ := tt.env.NudgePayload()
			if pl.URL != p.Lead.DeepLink {
				t.Fatal("the URL was changed")
			}
			if pl.Title == "" {
				t.Fatal("title lost")
			}
		})
	}
}

func TestPushTTL(t *testing.T) {
	now := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		expires time.Time
		want    time.Duration
	}{
		{"NoExpiry", time.Time{}, 28 * 24 * time.Hour},
		{"Hours", now.Add(90 * time.Minute), 90 * time.Minute},
		{"FractionRoundedDown", now.Add(90*time.Second + 900*time.Millisecond), 90 * time.Second},
		{"SoonIsOneMinute", now.Add(10 * time.Second), time.Minute},
		{"PastIsOneMinute", now.Add(-time.Hour), time.Minute},
		{"FarIsCapped", now.Add(365 * 24 * time.Hour), 28 * 24 * time.Hour},
	}
	for _, tt := range tests {
		if got := pushTTL(tt.expires, now); got != tt.want {
			t.Errorf("%s: pushTTL = %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestRender_Reply(t *testing.T) {
	r := mustNew(t, nil)
	e := fixture(t, "reply-text.v1")
	p, _ := e.ReplyPayload()
	segs := envelope.SplitReply(p.Text)
	if len(segs) != 3 || Segments(e) != 3 {
		t.Fatalf("fixture splits into %d segments (Segments = %d), want 3", len(segs), Segments(e))
	}
	for i, seg := range segs {
		m, err := r.Render(e, i, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		c := m.Chat
		if m.Channel != envelope.ChannelTelegram || c.ChatID != e.Recipient.ChatID || c.ParseMode != envelope.ParseModeHTML || c.Segment != i || c.Segments != 3 {
			t.Fatalf("segment %d: %+v", i, c)
		}
		if c.Text != telegramEscape(seg) {
			t.Fatalf("segment %d text is not the escaped segment", i)
		}
	}

	hostile := *e
	hostile.Payload, _ = json.Marshal(envelope.ReplyPayload{Text: `<b>x</b> & <a href="javascript:alert(1)">y</a> &amp;`})
	m := mustRender(t, r, &hostile)
	if want := `&lt;b&gt;x&lt;/b&gt; &amp; &lt;a href="javascript:alert(1)"&gt;y&lt;/a&gt; &amp;amp;`; m.Chat.Text != want {
		t.Fatalf("text = %q, want %q", m.Chat.Text, want)
	}
	if Segments(&hostile) != 1 {
		t.Fatal("Segments of a short reply != 1")
	}
	blank := *e
	blank.Payload = json.RawMessage(`{"text": " \n "}`)
	if Segments(&blank) != 0 {
		t.Fatal("Segments of a blank reply != 0")
	}
	if Segments(fixture(t, "your-week-digest.v1")) != 1 {
		t.Fatal("Segments of a digest != 1")
	}
}

func TestRender_Concurrent(t *testing.T) {
	r := mustNew(t, nil)
	envs := []*envelope.Envelope{fixture(t, "your-week-digest.v1"), fixture(t, "resurface-nudge.v1"), fixture(t, "reply-text.v1")}
	want := make([]*envelope.Message, len(envs))
	for i, e := range envs {
		want[i] = mustRender(t, r, e)
	}
	var wg sync.WaitGroup
	for range 8 {
		for i, e := range envs {
			wg.Go(func() {
				m, err := r.Render(e, 0, renderTime(e))
				if err != nil || !reflect.DeepEqual(m, want[i]) {
					t.Errorf("concurrent render of %s differs (%v)", e.Template, err)
				}
			})
		}
	}
	wg.Wait()
}

func TestTemplateNames(t *testing.T) {
	entries, err := embedded.ReadDir("templates")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, ent := range entries {
		files = append(files, ent.Name())
	}
	if got := TemplateNames(); !reflect.DeepEqual(got, files) {
		t.Fatalf("TemplateNames = %v, embedded files = %v", got, files)
	}
	// Overriding every template with its own text changes nothing.
	same := fstest.MapFS{}
	for _, name := range TemplateNames() {
		b, err := EmbeddedTemplate(name)
		if err != nil {
			t.Fatal(err)
		}
		same[name] = &fstest.MapFile{Data: b}
	}
	a, b := mustNew(t, nil), mustNew(t, &Options{Overrides: same})
	for _, e := range []*envelope.Envelope{fixture(t, "your-week-digest.v1"), fixture(t, "resurface-nudge.v1"), fixture(t, "reply-text.v1")} {
		if !reflect.DeepEqual(mustRender(t, a, e), mustRender(t, b, e)) {
			t.Errorf("%s renders differently with identical overrides", e.Template)
		}
	}
	if _, err := EmbeddedTemplate("nope.tmpl"); err == nil {
		t.Error("EmbeddedTemplate of an unknown name succeeded")
	}
}

func TestNew_Overrides(t *testing.T) {
	embeddedText := func(name string) string {
		b, err := EmbeddedTemplate(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	tests := []struct {
		name    string
		files   map[string]string
		wantErr []string // substrings of the error; nil = success
		check   func(t *testing.T, r *Renderer)
	}{
		{
			name:  "SubjectReplaced",
			files: map[string]string{fileDigestSubject: "Digest for you: {{.Summary}}"},
			check: func(t *testing.T, r *Renderer) {
				m := mustRender(t, r, fixture(t, "your-week-digest.v1"))
				if !strings.HasPrefix(m.Email.Subject, "Digest for you: 2 to revisit") {
					t.Fatalf("subject %q", m.Email.Subject)
				}
			},
		},
		{
			name:  "TelegramWrappedInTags",
			files: map[string]string{fileReply: "<i>{{tg .Text}}</i>"},
			check: func(t *testing.T, r *Renderer) {
				m := mustRender(t, r, fixture(t, "reply-text.v1"))
				if !strings.HasPrefix(m.Chat.Text, "<i>") {
					t.Fatalf("text %q", m.Chat.Text[:20])
				}
			},
		},
		{name: "DotFilesIgnored", files: map[string]string{".DS_Store": "junk"}},
		{name: "UnknownName", files: map[string]string{"your-week-digest.v1.email.htm": "x"}, wantErr: []string{`"your-week-digest.v1.email.htm"`, "not a template name"}},
		{name: "ParseError", files: map[string]string{fileDigestHTML: "{{.Subject"}, wantErr: []string{fileDigestHTML, "override"}},
		{name: "PartialsParseError", files: map[string]string{fileHTMLPartials: "{{define \"item\"}}"}, wantErr: []string{fileHTMLPartials, "override"}},
		{name: "MissingField", files: map[string]string{fileNudgeTitle: "{{.NoSuchField}}"}, wantErr: []string{fileNudgeTitle, "NoSuchField"}},
		{name: "MissingPartial", files: map[string]string{fileTextPartials: "{{define \"foot\"}}{{.UnsubscribeURL}}{{end}}"}, wantErr: []string{"item"}},
		{name: "EmptySubject", files: map[string]string{fileNudgeSubject: "  \n"}, wantErr: []string{fileNudgeSubject, "empty subject"}},
		{name: "EmptyPushTitle", files: map[string]string{fileNudgeTitle: ""}, wantErr: []string{fileNudgeTitle, "empty title"}},
		{name: "EmptyPushBody", files: map[string]string{fileNudgeBody: ""}, wantErr: []string{fileNudgeBody, "empty body"}},
		{
			name:    "HTMLWithoutUnsubscribe",
			files:   map[string]string{fileDigestHTML: strings.Replace(embeddedText(fileDigestHTML), `{{template "foot" .}}`, "</table></td></tr></table></body></html>", 1)},
			wantErr: []string{fileDigestHTML + " (override)", fileHTMLPartials + " (embedded)", "unsubscribe link"},
		},
		{
			name:    "HTMLWithoutChips",
			files:   map[string]string{fileHTMLPartials: strings.Replace(embeddedText(fileHTMLPartials), `{{template "chips" .Refs}}`, "", 1)},
			wantErr: []string{"HTML body", "graph ref"},
		},
		{
			name:    "TextWithoutLinks",
			files:   map[string]string{fileTextPartials: strings.Replace(embeddedText(fileTextPartials), "{{.LinkLabel}}: {{.Link}}", "{{.LinkLabel}}", 1)},
			wantErr: []string{"plain-text body", "deep link"},
		},
		{name: "TelegramUnescaped", files: map[string]string{fileReply: "{{.Text}}"}, wantErr: []string{fileReply, "Telegram HTML"}},
		{name: "TelegramUnknownTag", files: map[string]string{fileReply: "<div>{{tg .Text}}</div>"}, wantErr: []string{fileReply, "Telegram HTML"}},
		{name: "TelegramPrefix", files: map[string]string{fileReply: "({{.Segment}}) {{tg .Text}}"}, wantErr: []string{fileReply, "exactly the segment's text"}},
		{name: "TelegramTooLong", files: map[string]string{fileReply: "{{tg .Text}}{{if gt (len .Text) 100}}!{{end}}"}, wantErr: []string{fileReply, "4097 characters"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for name, text := range tt.files {
				fsys[name] = &fstest.MapFile{Data: []byte(text)}
			}
			r, err := New(&Options{Overrides: fsys})
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if tt.check != nil {
					tt.check(t, r)
				}
				return
			}
			if err == nil {
				t.Fatal("New succeeded, want an error")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestTelegramVisibleText(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "plain", want: "plain"},
		{in: "a &lt;b&gt; &amp; &quot;c&quot;", want: `a <b> & "c"`},
		{in: "&#128512; &#x1F600;", want: "😀 😀"},
		{in: "<b>bold <i>both</i></b> <a href=\"https://x\">l</a>", want: "bold both l"},
		{in: `<span class="tg-spoiler">s</span><tg-spoiler>t</tg-spoiler>`, want: "st"},
		{in: "a < b", wantErr: true},
		{in: "a & b", wantErr: true},
		{in: "&nbsp;", wantErr: true},
		{in: "&#0;", wantErr: true},
		{in: "&#xD800;", wantErr: true},
		{in: "<div>x</div>", wantErr: true},
		{in: "<b>x", wantErr: true},
		{in: "<b>x</i>", wantErr: true},
		{in: "x</b>", wantErr: true},
	}
	for _, tt := range tests {
		got, err := TelegramVisibleText(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("TelegramVisibleText(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestFormatTimestamp(t *testing.T) {
	tests := []struct {
		ms   int64
		want string
	}{
		{0, "0:00"}, {999, "0:00"}, {59999, "0:59"}, {60000, "1:00"}, {612000, "10:12"},
		{1834200, "30:34"}, {3599999, "59:59"}, {3600000, "1:00:00"}, {3723000, "1:02:03"},
		{36000000, "10:00:00"}, {-1, ""},
	}
	for _, tt := range tests {
		if got := formatTimestamp(tt.ms); got != tt.want {
			t.Errorf("formatTimestamp(%d) = %q, want %q", tt.ms, got, tt.want)
		}
	}
}

func TestSafeLink(t *testing.T) {
	tests := []struct {
		in   string
		safe bool
	}{
		{"https://app.example.org/e/x?t=1&h=2", true},
		{"http://localhost:8080/x", true},
		{"HTTPS://APP.EXAMPLE.ORG/x", true},
		{"javascript:alert(1)", false},
		{"JavaScript:alert(1)", false},
		{" javascript:alert(1)", false},
		{"data:text/html,<script>", false},
		{"vbscript:x", false},
		{"//evil.example/x", false},
		{"/relative/path", false},
		{"https:///nohost", false},
		{"https:opaque", false},
		{"https://a.example/x y", false},
		{"https://a.example/x\ny", false},
		{"mailto:a@b.example", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := safeLink(tt.in) != ""; got != tt.safe {
			t.Errorf("safeLink(%q) safe = %v, want %v", tt.in, got, tt.safe)
		}
	}
}

func TestShorten(t *testing.T) {
	tests := []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"hello world foo", 10, "hello wor…"},
		{"hello     world", 8, "hello…"},
		{"😀😀😀😀", 3, "😀😀…"},
		{"ab\u0301cd", 3, "a…"}, // never separates b from its accent
		{"a👨\u200d💻b", 3, "a…"}, // nor a ZWJ sequence
		{"abc", 0, ""},
	}
	for _, tt := range tests {
		got := shorten(tt.in, tt.max)
		if got != tt.want {
			t.Errorf("shorten(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("shorten(%q, %d) is not valid UTF-8", tt.in, tt.max)
		}
	}
}

func TestClean(t *testing.T) {
	if got := clean(" a\u202eb\u2066c\nd\x00e "); got != "abc d e" {
		t.Fatalf("clean = %q", got)
	}
}

func FuzzTelegramVisibleText(f *testing.F) {
	f.Add("<b>x</b> &amp; y")
	f.Add("&#x1F600;")
	f.Fuzz(func(t *testing.T, s string) {
		// Escaping any text gives Telegram HTML showing exactly that text.
		got, err := TelegramVisibleText(telegramEscape(s))
		if err != nil {
			t.Fatalf("escaped text does not parse: %v", err)
		}
		if got != strings.ToValidUTF8(s, "\uFFFD") && utf8.ValidString(s) {
			t.Fatalf("visible text %q != %q", got, s)
		}
	})
}

func TestNewDigestView_UnknownSection(t *testing.T) {
	p := &envelope.DigestPayload{Sections: []envelope.Section{
		{Kind: "revisit"},
		{Kind: "from_friends_%d", Items: sampleItems[:1]},
		{Kind: envelope.SectionTrending, Items: sampleItems[2:4]},
	}}
	v := newDigestView(commonView{}, p)
	if len(v.Sections) != 2 || v.Sections[0].Heading != "From friends %d" || v.Total != 3 {
		t.Fatalf("view = %+v", v)
	}
	if v.Summary != "1 from friends %d, 2 trending" {
		t.Fatalf("Summary = %q", v.Summary)
	}
}
