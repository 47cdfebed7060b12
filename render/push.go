package render

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// Web Push limits and defaults.
const (
	// MaxPushPayloadBytes is the largest push payload Render produces. Web
	// Push services must accept 4096-byte bodies (3993 bytes of plaintext),
	// but webpush-go pads to its record size and some services refuse
	// large records (Firefox for Android: 3070 bytes), so payloads are kept
	// well under webpush-go's 2048-byte record (1945 bytes of plaintext).
	MaxPushPayloadBytes = 1800
	// MinPushTTL is the shortest TTL Render sets (never 0: "deliver now or
	// drop" would lose a nudge to a phone that is briefly offline).
	MinPushTTL = time.Minute
	// MaxPushTTL is the TTL of a nudge without expires_at, and the longest
	// TTL set (four weeks, the longest push services keep a message).
	MaxPushTTL = 28 * 24 * time.Hour
	// maxTitleRunes and maxBodyRunes bound the notification texts before
	// the byte budget applies.
	maxTitleRunes = 80
	maxBodyRunes  = 240
	maxQuoteRunes = 160
	// maxPushURLBytes bounds the click URL, which is never shortened.
	maxPushURLBytes = 1200
)

// pushPayload is the JSON a service worker receives.
type pushPayload struct {
	Title string    `json:"title"`
	Body  string    `json:"body"`
	URL   string    `json:"url"`
	Tag   string    `json:"tag"`
	Data  *pushData `json:"data,omitempty"`
}

// pushData is the notification's data: enough for the service worker to
// act on a click or to fetch more, nothing personal beyond the lead.
type pushData struct {
	Template       string        `json:"template"`
	Product        string        `json:"product,omitempty"`
	HighlightCount int           `json:"highlight_count"`
	EpisodeSlug    string        `json:"episode_slug,omitempty"`
	TMs            *int64        `json:"t_ms,omitempty"`
	Source         string        `json:"source,omitempty"`
	GraphRefs      []pushDataRef `json:"graph_refs,omitempty"`
}

// pushDataRef is a graph ref in the push data.
type pushDataRef struct {
	ID    string `json:"id"`
	Label string `json:"label,omitempty"`
}

// nudgePush renders a resurface-nudge.v1 Web Push notification.
func (r *Renderer) nudgePush(e *envelope.Envelope, now time.Time) (*envelope.Message, error) {
	if e.Recipient.PushSubscription == nil {
		return nil, fmt.Errorf("%w: push envelope has no recipient.push_subscription", ErrPayload)
	}
	p, err := e.NudgePayload()
	if err != nil {
		return nil, decodeError(e.Template, err)
	}
	v := nudgeView{
		commonView:     r.common(),
		HighlightCount: p.HighlightCount,
		Lead:           newItemView(&p.Lead),
	}
	if p.HighlightCount > 1 {
		v.More = p.HighlightCount - 1
	}
	// Shorten the long parts before templating, so that what the template
	// adds around them (a timestamp, a count) survives.
	v.Lead.Quote = shorten(v.Lead.Quote, maxQuoteRunes)
	v.Lead.Title = shorten(v.Lead.Title, maxTitleRunes-20)
	v.Lead.Episode = shorten(v.Lead.Episode, maxTitleRunes-20)
	title, err := r.t.execText(r.t.nudgeTitle, &v)
	if err != nil {
		return nil, err
	}
	body, err := r.t.execText(r.t.nudgeBody, &v)
	if err != nil {
		return nil, err
	}
	title = oneLineSpace(title)
	if title == "" {
		return nil, fmt.Errorf("render: template %s (%s) renders an empty title", fileNudgeTitle, r.t.origin(fileNudgeTitle))
	}
	link := v.Lead.Link
	if link == "" {
		link = r.baseURL + "/"
	}
	if len(link) > maxPushURLBytes {
		return nil, fmt.Errorf("%w: deep link too long for a push payload (%d bytes)", ErrPayload, len(link))
	}
	key := envelope.Key{Tenant: e.Tenant(), EnvelopeID: e.ID}
	hash := key.Hash()
	pl := pushPayload{
		Title: shorten(title, maxTitleRunes),
		Body:  shorten(oneLineSpace(body), maxBodyRunes),
		URL:   link,
		Tag:   "outbox-" + hash[:24],
		Data: &pushData{
			Template:       string(e.Template),
			Product:        r.brand.Name,
			HighlightCount: p.HighlightCount,
			EpisodeSlug:    p.Lead.EpisodeSlug,
			TMs:            p.Lead.TMs,
			Source:         p.Lead.Source,
		},
	}
	if pl.Data.TMs != nil && *pl.Data.TMs < 0 {
		pl.Data.TMs = nil
	}
	for _, g := range p.Lead.GraphRefs {
		pl.Data.GraphRefs = append(pl.Data.GraphRefs, pushDataRef{ID: g.ID, Label: g.Label})
	}
	payload, err := fitPushPayload(&pl)
	if err != nil {
		return nil, err
	}
	return &envelope.Message{
		Channel: envelope.ChannelPush,
		Push: &envelope.PushMessage{
			Subscription: *e.Recipient.PushSubscription,
			Payload:      payload,
			TTL:          pushTTL(e.ExpiresAt, now),
			Urgency:      envelope.UrgencyNormal,
			Topic:        hash[:32],
		},
	}, nil
}

// fitPushPayload encodes pl, giving things up until it fits in
// MaxPushPayloadBytes: first the graph refs of the data, then the whole
// data, then the body and the title are shortened (on rune boundaries, with
// an ellipsis) down to nothing. The URL is never shortened.
func fitPushPayload(pl *pushPayload) ([]byte, error) {
	enc := func() []byte {
		b, err := json.Marshal(pl)
		if err != nil { // strings and numbers only: cannot happen
			panic("render: encode push payload: " + err.Error())
		}
		return b
	}
	b := enc()
	if len(b) <= MaxPushPayloadBytes {
		return b, nil
	}
	if pl.Data != nil && len(pl.Data.GraphRefs) > 0 {
		pl.Data.GraphRefs = nil
		if b = enc(); len(b) <= MaxPushPayloadBytes {
			return b, nil
		}
	}
	if pl.Data != nil {
		pl.Data = nil
		if b = enc(); len(b) <= MaxPushPayloadBytes {
			return b, nil
		}
	}
	for _, field := range []*string{&pl.Body, &pl.Title} {
		for n := len([]rune(*field)); n > 0; {
			n = n * 3 / 4
			*field = shorten(*field, n)
			if b = enc(); len(b) <= MaxPushPayloadBytes {
				return b, nil
			}
		}
	}
	return nil, fmt.Errorf("%w: push payload cannot fit in %d bytes", ErrPayload, MaxPushPayloadBytes)
}

// pushTTL is the time left until expires (whole seconds, rounded down),
// at least MinPushTTL and at most MaxPushTTL; MaxPushTTL when expires is
// zero.
func pushTTL(expires, now time.Time) time.Duration {
	if expires.IsZero() {
		return MaxPushTTL
	}
	ttl := expires.Sub(now).Truncate(time.Second)
	return min(max(ttl, MinPushTTL), MaxPushTTL)
}
