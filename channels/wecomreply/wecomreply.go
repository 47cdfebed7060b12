// Package wecomreply is the wecom_bot_reply channel's provider: a WeCom AI
// bot (智能机器人) reply posted to the response_url of the callback it
// answers (active reply, markdown of at most 20480 bytes).
//
// A response_url is usable once, for one hour, and is a secret (it carries
// the response code). So:
//
//   - it is posted to only when its host is one of Options.Hosts
//     (qyapi.weixin.qq.com by default) and over https;
//   - it is never used after the message's NotAfter (the envelope's
//     expires_at, at most an hour after created_at): the row ends expired;
//   - it is never used twice: before the request, its digest is written to
//     the Ledger (a file, fsynced, in outbox serve); a second Deliver of it
//     (a requeue, a retry, another envelope with the same URL) is refused
//     without a call, dead_letter idempotency_conflict;
//   - an ambiguous failure (a timeout, a network error, an answer that is not
//     WeCom's JSON) is retryable for the worker, which, since the provider
//     has no idempotent redelivery, leaves the row to reconciliation, and
//     Reconcile answers Unknown: the row becomes unresolved, never resent;
//   - a WeCom errcode is permanent (the URL is spent): 45009 rate_limited,
//     -1 provider_unavailable, any other invalid_request, all dead_letter.
//
// No URL, text or errmsg reaches an error or a log record.
//
// The long-connection mode (a WebSocket to wss://openws.work.weixin.qq.com
// with a heartbeat) is not implemented: its frame protocol is documented
// for WeCom's Node and Python SDKs, not as a wire specification.
package wecomreply

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/envelope"
)

// Name is the provider's name in Capabilities, metrics and logs.
const Name = "wecom_bot_reply"

// DefaultHost is the host of WeCom's response_urls.
const DefaultHost = "qyapi.weixin.qq.com"

// MaxMarkdownBytes is the longest reply.
const MaxMarkdownBytes = envelope.MaxWeComBotReplyBytes

// Options configures a Provider.
type Options struct {
	// Ledger records spent response_urls; required (OpenLedger for a file).
	Ledger Ledger
	// Hosts are the hosts (host[:port]) a response_url may point to; nil
	// means DefaultHost.
	Hosts      []string
	HTTPClient *http.Client
	Logger     *slog.Logger
	// Clock is the time source of the one-hour window; nil means time.Now.
	Clock func() time.Time
}

// Provider posts AI bot replies. It is safe for concurrent use.
type Provider struct {
	ledger Ledger
	hosts  map[string]bool
	client *http.Client
	log    *slog.Logger
	now    func() time.Time
}

var _ channels.Provider = (*Provider)(nil)

// New validates opts and returns a Provider.
func New(opts Options) (*Provider, error) {
	if opts.Ledger == nil {
		return nil, errors.New("wecomreply: Options.Ledger is required (response_urls are single use)")
	}
	hosts := map[string]bool{}
	for _, h := range opts.Hosts {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" || strings.ContainsAny(h, "/?#@ ") {
			return nil, errors.New("wecomreply: Options.Hosts holds something that is not a host[:port]")
		}
		hosts[h] = true
	}
	if len(hosts) == 0 {
		hosts[DefaultHost] = true
	}
	now := opts.Clock
	if now == nil {
		now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Provider{ledger: opts.Ledger, hosts: hosts, client: wxapi.Client(opts.HTTPClient), now: now,
		log: log.With(slog.String("component", "channels/wecomreply"), slog.String("provider", Name))}, nil
}

// Capabilities: no idempotent redelivery (the URL is single use).
func (p *Provider) Capabilities() channels.Capabilities {
	return channels.Capabilities{Name: Name, Channel: envelope.ChannelWeComBotReply}
}

// Reconcile answers Unknown: a response_url cannot be asked.
func (p *Provider) Reconcile(context.Context, envelope.Key, *envelope.Message) (channels.Reconciliation, error) {
	return channels.Reconciliation{Outcome: channels.Unknown}, nil
}

// Causes: none holds the URL or the text.
var (
	errNotReply  = errors.New("wecomreply: message is not an AI bot reply")
	errURL       = errors.New("wecomreply: the response_url is not an https URL of an allowed host")
	errNoWindow  = errors.New("wecomreply: the message has no deadline")
	errExpired   = errors.New("wecomreply: the response_url's hour is over")
	errSpent     = errors.New("wecomreply: the response_url was used already")
	errEmpty     = errors.New("wecomreply: reply is empty")
	errTooLong   = errors.New("wecomreply: reply exceeds 20480 bytes")
	errEncode    = errors.New("wecomreply: cannot build the request")
	errLedger    = errors.New("wecomreply: cannot record the response_url as spent")
	errNotMarkdn = errors.New("wecomreply: a reply is markdown")
)

type postRequest struct {
	MsgType  string `json:"msgtype"`
	Markdown struct {
		Content string `json:"content"`
	} `json:"markdown"`
}

// Deliver posts msg.WeCom to its response_url (see the package doc).
func (p *Provider) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	code, status, err := p.post(ctx, msg)
	p.logResult(ctx, status, code, err)
	if err != nil {
		return channels.Receipt{}, err
	}
	return channels.Receipt{ID: "reply-" + key.Hash()[:24]}, nil
}

func (p *Provider) post(ctx context.Context, msg *envelope.Message) (code, status int, err error) {
	if msg == nil || msg.WeCom == nil || (msg.Channel != "" && msg.Channel != envelope.ChannelWeComBotReply) {
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errNotReply)
	}
	m := msg.WeCom
	u, perr := url.Parse(m.ResponseURL)
	if perr != nil || u.Scheme != "https" || u.User != nil || !p.hosts[strings.ToLower(u.Host)] {
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRecipient, errURL)
	}
	switch {
	case m.MsgType != envelope.WeComMarkdown:
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errNotMarkdn)
	case strings.TrimSpace(m.Content) == "":
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errEmpty)
	case len(m.Content) > MaxMarkdownBytes:
		return 0, 0, envelope.Permanent(envelope.ClassPayloadTooLarge, errTooLong)
	case m.NotAfter.IsZero():
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errNoWindow)
	}
	now := p.now()
	if !now.Before(m.NotAfter) {
		return 0, 0, envelope.Permanent(envelope.ClassExpired, errExpired)
	}
	var req postRequest
	req.MsgType, req.Markdown.Content = envelope.WeComMarkdown, m.Content
	body, jerr := json.Marshal(req)
	if jerr != nil {
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errEncode)
	}
	already, lerr := p.ledger.Spend(m.ResponseURL, now)
	switch {
	case lerr != nil:
		// Nothing was sent; but the URL may be recorded: never try it again
		// blindly (the worker leaves a non-idempotent retryable failure to
		// reconciliation, which answers unknown).
		return 0, 0, envelope.Retryable(envelope.ClassProviderUnavailable, errLedger)
	case already:
		return 0, 0, envelope.Permanent(envelope.ClassIdempotencyConflict, errSpent)
	}
	r, err := wxapi.Call(ctx, p.client, http.MethodPost, m.ResponseURL, body)
	switch {
	case err != nil:
		return 0, r.Status, err
	case !r.OK:
		return 0, r.Status, wxapi.NotAnswer(&r)
	case r.ErrCode == 0:
		return 0, r.Status, nil
	case r.ErrCode == wxapi.CodeFreqLimit:
		return r.ErrCode, r.Status, envelope.Permanent(envelope.ClassRateLimited, r.Cause())
	case r.ErrCode == wxapi.CodeBusy:
		return r.ErrCode, r.Status, envelope.Permanent(envelope.ClassProviderUnavailable, r.Cause())
	}
	return r.ErrCode, r.Status, envelope.Permanent(envelope.ClassInvalidRequest, r.Cause())
}

// logResult writes one record: status, errcode and class, never the
// response_url, the text or errmsg.
func (p *Provider) logResult(ctx context.Context, status, code int, err error) {
	channels.LogRequest(ctx, p.log, "wecom bot reply", channels.Request{Operation: "deliver", Status: status, CodeName: "errcode", Code: code}, err,
		func(err error, _ *envelope.DeliveryError) (slog.Level, string) {
			switch {
			case errors.Is(err, errSpent):
				return slog.LevelWarn, "this response_url was used already and is single use: the reply was not sent again"
			case errors.Is(err, errURL):
				return slog.LevelWarn, "the response_url is not https on an allowed host (OUTBOX_WECOM_BOT_REPLY_HOSTS)"
			case errors.Is(err, errLedger):
				return slog.LevelError, "the spent-URL ledger in the data directory cannot be written (disk full or read-only?)"
			}
			return slog.LevelInfo, ""
		})
}
