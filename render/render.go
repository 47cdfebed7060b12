// Package render turns an envelope into the message of its channel (SPEC §7):
// the e-mail of a your-week-digest.v1 or resurface-nudge.v1 envelope
// (subject, HTML body, plain-text alternative, RFC 8058 one-click
// unsubscribe headers), the Web Push notification of a nudge (JSON payload,
// TTL, urgency, topic), and the Telegram segments of a reply-text.v1 reply.
//
// Rendering is pure and deterministic: the same envelope, segment and time
// give the same message. Templates are Go html/template (e-mail HTML) and
// text/template (everything else) files embedded in the binary; an override
// file system may replace any of them (TemplateNames lists the names). New
// parses every template and renders built-in sample envelopes through them,
// so a broken or incomplete override fails at start-up, never at send time.
//
// Payload strings are data, never markup: the HTML is escaped by
// html/template, Telegram text has <, > and & escaped, and a deep link that
// is not an absolute http(s) URL is never made a link.
//
// The supported template × channel pairs are:
//
//	your-week-digest.v1  email, wecom
//	resurface-nudge.v1   push, email, wecom
//	reply-text.v1        telegram, wecom, wecom_robot, wecom_bot_reply
//
// and on wecom, your-week-digest.v1 and resurface-nudge.v1 as markdown.
package render

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// DefaultBaseURL is Options.BaseURL when it is empty.
const DefaultBaseURL = "http://127.0.0.1:8080"

// DefaultProductName is Brand.Name when it is empty.
const DefaultProductName = "outbox"

// Errors returned by Render.
var (
	// ErrUnsupported is returned when an envelope's template has no
	// rendering for its channel.
	ErrUnsupported = errors.New("render: template has no rendering for this channel")
	// ErrSegment is returned when the segment index is outside the
	// envelope's segments.
	ErrSegment = errors.New("render: segment out of range")
	// ErrPayload is returned (wrapped) when the payload or the recipient
	// does not have what the rendering needs. Its text never holds payload
	// content.
	ErrPayload = errors.New("render: unusable envelope")
)

// Options configure a Renderer. The zero value (or a nil *Options) is
// usable: the embedded templates, DefaultBaseURL and the default Brand.
type Options struct {
	// UnsubscribeURL builds the one-click unsubscribe URL of an envelope
	// (an absolute http(s) URL). nil → BaseURL + "/unsubscribe/" +
	// url.PathEscape(consent_snapshot.unsubscribe_ref).
	//
	// The List-Unsubscribe-Post header (RFC 8058 one-click) is added only
	// when the URL is https, as RFC 8058 requires; an http URL (a local
	// preview) still gets List-Unsubscribe.
	UnsubscribeURL func(e *envelope.Envelope) string

	// BaseURL is the public base URL of the app that serves the
	// unsubscribe endpoint (absolute http or https, no query). It is also
	// the click target of a push notification whose deep link is unusable.
	// Default DefaultBaseURL.
	BaseURL string

	// Overrides optionally replaces embedded templates: a file at its root
	// named like one of TemplateNames replaces that template. Any other
	// file (except dot files) is an error, so a misspelt name is caught by
	// New.
	Overrides fs.FS

	// Brand names the product, the sender, the colour, the logo, the
	// postal address and the preferences link every template shows. New
	// refuses a Brand that Brand.Normalize refuses.
	Brand Brand
}

// Renderer renders envelopes into channel messages. It is safe for
// concurrent use.
type Renderer struct {
	baseURL     string
	brand       Brand
	unsubscribe func(e *envelope.Envelope) string
	t           *templates
}

// New parses the templates (embedded, replaced by opts.Overrides where
// given) and renders sample envelopes through every one of them; it returns
// an error naming the template file and the problem when a template does
// not parse, fails to execute, or leaves out what its message must carry
// (deep links, graph refs, the unsubscribe link, escaped chat text).
func New(opts *Options) (*Renderer, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.BaseURL == "" {
		o.BaseURL = DefaultBaseURL
	}
	base, err := url.Parse(o.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" || base.RawQuery != "" || base.Fragment != "" {
		return nil, fmt.Errorf("render: Options.BaseURL %q must be an absolute http or https URL without query or fragment", o.BaseURL)
	}
	brand, err := o.Brand.Normalize()
	if err != nil {
		return nil, err
	}
	t, err := loadTemplates(o.Overrides)
	if err != nil {
		return nil, err
	}
	r := &Renderer{
		baseURL:     strings.TrimRight(o.BaseURL, "/"),
		brand:       brand,
		unsubscribe: o.UnsubscribeURL,
		t:           t,
	}
	if err := r.selfTest(); err != nil {
		return nil, err
	}
	return r, nil
}

// Render returns the message of segment segment of e on e's channel. now is
// used only for the push TTL (the time left until e.ExpiresAt). Every
// template has one segment except reply-text.v1 (see Segments).
func (r *Renderer) Render(e *envelope.Envelope, segment int, now time.Time) (*envelope.Message, error) {
	if e == nil {
		return nil, fmt.Errorf("%w: nil envelope", ErrPayload)
	}
	if e.Template != envelope.TemplateReply && segment != 0 {
		return nil, fmt.Errorf("%w: %s has one segment, not %d", ErrSegment, e.Template, segment+1)
	}
	switch {
	case e.Template == envelope.TemplateDigest && e.Channel == envelope.ChannelEmail:
		return r.digestEmail(e)
	case e.Template == envelope.TemplateNudge && e.Channel == envelope.ChannelEmail:
		return r.nudgeEmail(e)
	case e.Template == envelope.TemplateNudge && e.Channel == envelope.ChannelPush:
		return r.nudgePush(e, now)
	case e.Template == envelope.TemplateReply && e.Channel == envelope.ChannelTelegram:
		return r.replyChat(e, segment)
	case e.Template == envelope.TemplateReply && isWeCom(e.Channel):
		return r.replyWeCom(e, segment)
	case e.Template == envelope.TemplateDigest && e.Channel == envelope.ChannelWeCom:
		return r.digestWeCom(e)
	case e.Template == envelope.TemplateNudge && e.Channel == envelope.ChannelWeCom:
		return r.nudgeWeCom(e)
	}
	return nil, fmt.Errorf("%w: %q on %q", ErrUnsupported, e.Template, e.Channel)
}

// Segments returns how many deliveries e makes: len(envelope.SplitReply(text))
// for reply-text.v1 (0 when the text is blank or the payload does not
// decode, i.e. the envelope is invalid), 1 for every other template.
func Segments(e *envelope.Envelope) int {
	if e.Template != envelope.TemplateReply {
		return 1
	}
	p, err := e.ReplyPayload()
	if err != nil {
		return 0
	}
	return len(envelope.SplitReplyFor(e.Channel, p.Text))
}

// isWeCom reports whether ch is one of the wecom channels.
func isWeCom(ch envelope.Channel) bool {
	return ch == envelope.ChannelWeCom || ch == envelope.ChannelWeComRobot || ch == envelope.ChannelWeComBotReply
}

// unsubscribeURL returns e's one-click unsubscribe URL.
func (r *Renderer) unsubscribeURL(e *envelope.Envelope) (string, error) {
	var u string
	if r.unsubscribe != nil {
		u = r.unsubscribe(e)
	} else {
		ref := e.ConsentSnapshot.UnsubscribeRef
		if ref == "" {
			return "", fmt.Errorf("%w: e-mail needs consent_snapshot.unsubscribe_ref for its unsubscribe link", ErrPayload)
		}
		u = r.baseURL + "/unsubscribe/" + url.PathEscape(ref)
	}
	if safeLink(u) == "" {
		return "", fmt.Errorf("%w: the unsubscribe URL is not an absolute http(s) URL", ErrPayload)
	}
	return u, nil
}

// decodeError describes a payload decoding error without quoting the
// payload.
func decodeError(t envelope.Template, err error) error {
	return fmt.Errorf("%w: %s payload does not decode (%s)", ErrPayload, t, jsonErrorKind(err))
}
