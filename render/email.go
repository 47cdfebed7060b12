package render

import (
	"fmt"
	htemplate "html/template"
	"strings"
	ttemplate "text/template"

	"github.com/outboxhq/outbox/envelope"
)

// maxSubjectRunes bounds a rendered subject; longer ones are shortened with
// an ellipsis.
const maxSubjectRunes = 150

// Header names and values of RFC 8058 one-click unsubscribe.
const (
	HeaderListUnsubscribe     = "List-Unsubscribe"
	HeaderListUnsubscribePost = "List-Unsubscribe-Post"
	ListUnsubscribeOneClick   = "List-Unsubscribe=One-Click"
)

// commonEmail builds the shared part of an e-mail view and checks the
// recipient.
func (r *Renderer) commonEmail(e *envelope.Envelope) (commonView, error) {
	if strings.TrimSpace(e.Recipient.Email) == "" {
		return commonView{}, fmt.Errorf("%w: e-mail envelope has no recipient.email", ErrPayload)
	}
	unsub, err := r.unsubscribeURL(e)
	if err != nil {
		return commonView{}, err
	}
	cadence := e.ConsentSnapshot.Cadence
	if cadence == "" {
		cadence = "weekly"
	}
	c := r.common()
	c.UnsubscribeURL, c.Cadence = unsub, cadence
	return c, nil
}

// common returns the view of the brand and the base URL, shared by every
// rendering.
func (r *Renderer) common() commonView {
	b := r.brand
	return commonView{
		Product:        b.Name,
		BaseURL:        r.baseURL,
		Color:          b.Color,
		ButtonText:     b.ButtonText(),
		LinkColor:      b.LinkColor(),
		LogoURL:        b.LogoURL,
		Address:        b.Address,
		PreferencesURL: b.PreferencesURL,
	}
}

// digestEmail renders a your-week-digest.v1 e-mail.
func (r *Renderer) digestEmail(e *envelope.Envelope) (*envelope.Message, error) {
	c, err := r.commonEmail(e)
	if err != nil {
		return nil, err
	}
	p, err := e.DigestPayload()
	if err != nil {
		return nil, decodeError(e.Template, err)
	}
	v := newDigestView(c, p)
	if v.Total == 0 {
		return nil, fmt.Errorf("%w: digest has no items", ErrPayload)
	}
	v.Preheader = v.Summary
	// The digest payload has no URL of its own to act on; managing the
	// digest is what a reader of it may want.
	if v.PreferencesURL != "" {
		v.CTAURL, v.CTALabel = v.PreferencesURL, "Manage your digest"
	}
	return r.email(e, &v, &v.commonView, r.t.digestSubject, r.t.digestHTML, r.t.digestText)
}

// nudgeEmail renders a resurface-nudge.v1 e-mail.
func (r *Renderer) nudgeEmail(e *envelope.Envelope) (*envelope.Message, error) {
	c, err := r.commonEmail(e)
	if err != nil {
		return nil, err
	}
	v, err := newNudgeView(c, e)
	if err != nil {
		return nil, err
	}
	v.Preheader = v.Lead.Quote
	if v.Preheader == "" {
		v.Preheader = v.Lead.Episode
	}
	return r.email(e, &v, &v.commonView, r.t.nudgeSubject, r.t.nudgeHTML, r.t.nudgeText)
}

// newNudgeView decodes a nudge payload into its view.
func newNudgeView(c commonView, e *envelope.Envelope) (nudgeView, error) {
	p, err := e.NudgePayload()
	if err != nil {
		return nudgeView{}, decodeError(e.Template, err)
	}
	v := nudgeView{commonView: c, HighlightCount: p.HighlightCount, Lead: newItemView(&p.Lead)}
	v.Lead.LinkColor = c.LinkColor
	if p.HighlightCount > 1 {
		v.More = p.HighlightCount - 1
	}
	return v, nil
}

// email executes the subject, HTML and text templates on view (whose
// common part is c) and assembles the message with its headers.
func (r *Renderer) email(e *envelope.Envelope, view any, c *commonView, subject *ttemplate.Template, html *htemplate.Template, text *ttemplate.Template) (*envelope.Message, error) {
	s, err := r.t.execText(subject, view)
	if err != nil {
		return nil, err
	}
	c.Subject = shorten(oneLineSpace(s), maxSubjectRunes)
	if c.Subject == "" {
		return nil, fmt.Errorf("render: template %s (%s) renders an empty subject", subject.Name(), r.t.origin(subject.Name()))
	}
	h, err := r.t.execHTML(html, view)
	if err != nil {
		return nil, err
	}
	txt, err := r.t.execText(text, view)
	if err != nil {
		return nil, err
	}
	headers := []envelope.Header{{Name: HeaderListUnsubscribe, Value: "<" + c.UnsubscribeURL + ">"}}
	if strings.HasPrefix(strings.ToLower(c.UnsubscribeURL), "https://") {
		headers = append(headers, envelope.Header{Name: HeaderListUnsubscribePost, Value: ListUnsubscribeOneClick})
	}
	return &envelope.Message{
		Channel: envelope.ChannelEmail,
		Email: &envelope.EmailMessage{
			To:      strings.TrimSpace(e.Recipient.Email),
			Subject: c.Subject,
			HTML:    h,
			Text:    tidyText(txt),
			Headers: headers,
			Tags:    map[string]string{"template": tagValue(string(e.Template))},
		},
	}, nil
}

// tagValue makes s a provider tag value: ASCII letters, digits, _ and -
// (other characters become -).
func tagValue(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			return r
		}
		return '-'
	}, s)
}
