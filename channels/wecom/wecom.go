// Package wecom is the wecom channel's provider: WeCom (企业微信)
// application messages to one member, POST /cgi-bin/message/send, over
// plain net/http.
//
// # Tokens
//
// Each application (corp id, agentid, secret) has an access token from
// GET /cgi-bin/gettoken, cached and refreshed RefreshMargin before its
// expires_in ends: one gettoken per token lifetime in steady state, and one
// at a time per application (concurrent sends wait for it). A send answered
// 40014, 42001 or 40001 (the token is invalid or expired) drops the token,
// fetches a new one and sends once more; a second such answer is
// auth_failed.
//
// # Requests
//
// text or markdown (msgtype from the message) to touser, as agentid, with
// enable_duplicate_check 1 and duplicate_check_interval
// (Options.DuplicateCheckInterval, 30 minutes by default, at most 4 hours):
// WeCom drops a byte-identical request within the interval, which makes a
// redelivery of the same key idempotent within it. Reconcile replays the
// request only while the interval since the first attempt (remembered by
// this process) has not passed; otherwise it answers Unknown.
//
// # Limits
//
// WeCom silently drops messages past 30 a minute or 1000 an hour to one
// member of an application, and past the application's daily cap
// (account cap × 200 person-messages). outbox counts them itself
// (Options.Clock) and answers rate_limited or quota_exceeded with the wait
// until there is room, without calling WeCom.
//
// # Outcomes
//
//	errcode 0                       sent (receipt msgid)
//	errcode 0 with the member in
//	  invaliduser, 81013            recipient gone (invalid_recipient)
//	errcode 0 with the member in
//	  unlicenseduser                permanent (invalid_recipient)
//	40014/42001/40001 after a
//	  refresh, 40013, 40091, 301002 permanent (auth_failed)
//	60020 (IP not trusted), 48001   permanent (auth_failed) + an operator hint
//	45009, 45033                    retryable (rate_limited), at least 60 s
//	-1 (busy), HTTP ≠ 200, not JSON retryable (provider_unavailable)
//	network errors, timeouts        retryable (network_error, timeout)
//	any other errcode               permanent (invalid_request)
//
// # Secrets
//
// The secret and the access token are in request URLs; no URL, no errmsg,
// no member id and no text reach an error or a log record (status,
// errcode and class only).
package wecom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/envelope"
)

// Name is the provider's name in Capabilities, metrics and logs.
const Name = "wecom"

// Defaults and bounds.
const (
	DefaultDuplicateCheckInterval = 30 * time.Minute
	MaxDuplicateCheckInterval     = 4 * time.Hour
	// RefreshMargin is how long before expires_in ends a token is renewed.
	RefreshMargin = 5 * time.Minute
	// PerMemberMinute and PerMemberHour are WeCom's limits per member of
	// an application.
	PerMemberMinute = 30
	PerMemberHour   = 1000
	// DefaultDailyCap is the per-application daily cap when none is set
	// (the smallest account cap, 200 members, × 200).
	DefaultDailyCap = 40000
	// MinFreqRetry is the least wait after a 45009.
	MinFreqRetry = time.Minute
	maxMembers   = 100000
	maxAttempts  = 10000 // first-attempt times remembered for Reconcile
)

// App is one WeCom application outbox sends as.
type App struct {
	// AgentID is the application's agentid.
	AgentID int64
	// Secret is the application's secret.
	Secret wxapi.Secret
}

// Options configures a Provider.
type Options struct {
	// CorpID is the enterprise's corp id; required.
	CorpID string
	// Apps are the applications; the first is the default (an envelope
	// without recipient.wecom_agent). At least one.
	Apps []App
	// BaseURL is WeCom's API server; "" means wxapi.DefaultBaseURL.
	BaseURL string
	// HTTPClient sends the requests (a copy that never follows a
	// redirect); nil means a client with wxapi.DefaultRequestTimeout.
	HTTPClient *http.Client
	// Logger receives one record per request; nil means slog.Default().
	Logger *slog.Logger
	// Clock is the time source of tokens and limits; nil means time.Now.
	Clock func() time.Time
	// DuplicateCheckInterval is WeCom's deduplication interval; 0 means
	// DefaultDuplicateCheckInterval.
	DuplicateCheckInterval time.Duration
	// DailyCap is the person-messages per application and day (China
	// time); 0 means DefaultDailyCap.
	DailyCap int
}

// Provider sends WeCom application messages. It is safe for concurrent
// use.
type Provider struct {
	corp     string
	apps     map[string]*app // by agentid
	def      *app
	base     string
	client   *http.Client
	log      *slog.Logger
	now      func() time.Time
	interval time.Duration
	members  *wxapi.Limiter
	daily    *wxapi.DailyCap

	mu       sync.Mutex
	attempts map[envelope.Key]time.Time // first attempt of a key, for Reconcile
}

// app is one application with its cached token.
type app struct {
	id     int64
	secret wxapi.Secret

	fetch sync.Mutex // one gettoken at a time
	mu    sync.Mutex
	token wxapi.Secret
	until time.Time // renew from then on
}

var _ channels.Provider = (*Provider)(nil)

// New validates opts and returns a Provider. Errors name the option at
// fault, never its value.
func New(opts Options) (*Provider, error) {
	corp := strings.TrimSpace(opts.CorpID)
	if corp == "" || strings.ContainsFunc(corp, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return nil, errors.New("wecom: Options.CorpID is empty or not printable ASCII")
	}
	if len(opts.Apps) == 0 {
		return nil, errors.New("wecom: Options.Apps is empty (an agentid and its secret)")
	}
	base, err := wxapi.CheckBaseURL(opts.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("wecom: Options.BaseURL %w", err)
	}
	interval := opts.DuplicateCheckInterval
	if interval == 0 {
		interval = DefaultDuplicateCheckInterval
	}
	if interval < time.Second || interval > MaxDuplicateCheckInterval {
		return nil, fmt.Errorf("wecom: Options.DuplicateCheckInterval must be between 1s and %s", MaxDuplicateCheckInterval)
	}
	daily := opts.DailyCap
	if daily == 0 {
		daily = DefaultDailyCap
	}
	if daily < 0 {
		return nil, errors.New("wecom: Options.DailyCap must be positive (0 = default)")
	}
	now := opts.Clock
	if now == nil {
		now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	p := &Provider{
		corp: corp, apps: map[string]*app{}, base: base, client: wxapi.Client(opts.HTTPClient),
		log:      log.With(slog.String("component", "channels/wecom"), slog.String("provider", Name)),
		now:      now,
		interval: interval,
		members: wxapi.NewLimiter(now, maxMembers,
			wxapi.Limit{N: PerMemberMinute, Per: time.Minute}, wxapi.Limit{N: PerMemberHour, Per: time.Hour}),
		daily:    wxapi.NewDailyCap(daily, wxapi.ChinaTime, now),
		attempts: map[envelope.Key]time.Time{},
	}
	for i, a := range opts.Apps {
		if a.AgentID <= 0 {
			return nil, fmt.Errorf("wecom: Options.Apps[%d].AgentID must be positive", i)
		}
		if strings.TrimSpace(string(a.Secret)) == "" {
			return nil, fmt.Errorf("wecom: Options.Apps[%d].Secret is empty", i)
		}
		id := strconv.FormatInt(a.AgentID, 10)
		if p.apps[id] != nil {
			return nil, fmt.Errorf("wecom: Options.Apps[%d]: agentid configured twice", i)
		}
		p.apps[id] = &app{id: a.AgentID, secret: wxapi.Secret(strings.TrimSpace(string(a.Secret)))}
		if i == 0 {
			p.def = p.apps[id]
		}
	}
	return p, nil
}

// Capabilities: redelivery of a key is idempotent within the duplicate
// check interval (WeCom drops the byte-identical request).
func (p *Provider) Capabilities() channels.Capabilities {
	return channels.Capabilities{Name: Name, Channel: envelope.ChannelWeCom, IdempotentRedelivery: true, OneService: true}
}

// sendRequest is message/send's body. Its encoding is deterministic, so a
// redelivery is byte-identical (what the duplicate check compares).
type sendRequest struct {
	ToUser                 string   `json:"touser"`
	MsgType                string   `json:"msgtype"`
	AgentID                int64    `json:"agentid"`
	Text                   *content `json:"text,omitempty"`
	Markdown               *content `json:"markdown,omitempty"`
	EnableDuplicateCheck   int      `json:"enable_duplicate_check"`
	DuplicateCheckInterval int      `json:"duplicate_check_interval"`
}

type content struct {
	Content string `json:"content"`
}

type sendAnswer struct {
	InvalidUser    string `json:"invaliduser"`
	UnlicensedUser string `json:"unlicenseduser"`
	MsgID          string `json:"msgid"`
}

// Deliver sends msg.WeCom to its member. See the package documentation.
func (p *Provider) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	p.noteAttempt(key)
	rc, code, status, err := p.deliver(ctx, msg, true)
	p.logResult(ctx, "deliver", status, code, err)
	return rc, err
}

// Reconcile replays the request while the duplicate check interval since
// the key's first attempt in this process has not passed (WeCom then drops
// a copy that went through): errcode 0 is Accepted. Otherwise Unknown.
func (p *Provider) Reconcile(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Reconciliation, error) {
	p.mu.Lock()
	first, ok := p.attempts[key]
	p.mu.Unlock()
	// A margin for the replay's own time on the wire.
	if !ok || p.now().Sub(first) > p.interval-time.Minute {
		return channels.Reconciliation{Outcome: channels.Unknown}, nil
	}
	rc, code, status, err := p.deliver(ctx, msg, false)
	p.logResult(ctx, "reconcile", status, code, err)
	if err != nil {
		return channels.Reconciliation{Outcome: channels.Unknown}, err
	}
	return channels.Reconciliation{Outcome: channels.Accepted, Receipt: rc}, nil
}

func (p *Provider) noteAttempt(key envelope.Key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.attempts[key]; ok {
		return
	}
	if len(p.attempts) >= maxAttempts {
		cut := p.now().Add(-p.interval)
		for k, at := range p.attempts {
			if at.Before(cut) {
				delete(p.attempts, k)
			}
		}
		if len(p.attempts) >= maxAttempts {
			return // forgetting it only makes Reconcile answer Unknown
		}
	}
	p.attempts[key] = p.now()
}

// deliver sends msg; count says whether the local limits count it (a
// reconciling replay is the same message, already counted).
func (p *Provider) deliver(ctx context.Context, msg *envelope.Message, count bool) (rc channels.Receipt, code, status int, err error) {
	if msg == nil || msg.WeCom == nil || (msg.Channel != "" && msg.Channel != envelope.ChannelWeCom) {
		return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errNotWeCom)
	}
	m := msg.WeCom
	user := strings.TrimSpace(m.User)
	if user == "" || strings.ContainsAny(user, "|") {
		return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRecipient, errNoUser)
	}
	a := p.def
	if m.Agent != "" {
		if a = p.apps[m.Agent]; a == nil {
			return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRecipient, errUnknownAgent)
		}
	}
	req := sendRequest{ToUser: user, MsgType: m.MsgType, AgentID: a.id, EnableDuplicateCheck: 1,
		DuplicateCheckInterval: int(p.interval / time.Second)}
	switch m.MsgType {
	case envelope.WeComText:
		req.Text = &content{m.Content}
	case envelope.WeComMarkdown:
		req.Markdown = &content{m.Content}
	default:
		return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errMsgType)
	}
	if strings.TrimSpace(m.Content) == "" {
		return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errEmpty)
	}
	if len(m.Content) > envelope.MaxWeComAppBytes {
		return rc, 0, 0, envelope.Permanent(envelope.ClassPayloadTooLarge, errTooLong)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errEncode)
	}
	if count {
		if err := p.take(a, user); err != nil {
			return rc, 0, 0, err
		}
	}
	for attempt := 0; ; attempt++ {
		token, err := p.token(ctx, a)
		if err != nil {
			return rc, 0, 0, err
		}
		u := p.base + "/cgi-bin/message/send?access_token=" + url.QueryEscape(string(token))
		r, err := wxapi.Call(ctx, p.client, http.MethodPost, u, body)
		if err != nil {
			return rc, 0, r.Status, err
		}
		if !r.OK {
			return rc, 0, r.Status, wxapi.NotAnswer(&r)
		}
		if isTokenError(r.ErrCode) && attempt == 0 {
			a.drop(token)
			continue
		}
		if r.ErrCode != 0 {
			return rc, r.ErrCode, r.Status, classify(&r)
		}
		var ans sendAnswer
		_ = json.Unmarshal(r.Body, &ans)
		switch {
		case listed(ans.InvalidUser, user):
			return rc, 0, r.Status, envelope.RecipientGone(envelope.ClassInvalidRecipient, errInvalidUser)
		case listed(ans.UnlicensedUser, user):
			return rc, 0, r.Status, envelope.Permanent(envelope.ClassInvalidRecipient, errUnlicensed)
		}
		id := ans.MsgID
		if id == "" {
			id = "wecom"
		}
		return channels.Receipt{ID: id}, 0, r.Status, nil
	}
}

// take applies the member limits and the daily cap.
func (p *Provider) take(a *app, user string) error {
	// Member ids are case-insensitive in WeCom.
	if wait := p.members.Take(strconv.FormatInt(a.id, 10) + "|" + strings.ToLower(user)); wait > 0 {
		return envelope.RetryAfter(envelope.ClassRateLimited, wait, errMemberLimit)
	}
	if wait := p.daily.Take(strconv.FormatInt(a.id, 10)); wait > 0 {
		return envelope.RetryAfter(envelope.ClassQuotaExceeded, wait, errDailyCap)
	}
	return nil
}

// listed reports whether user is in WeCom's "|"-separated list.
func listed(list, user string) bool {
	for _, u := range strings.Split(list, "|") {
		if u != "" && strings.EqualFold(u, user) {
			return true
		}
	}
	return false
}

func isTokenError(code int) bool {
	return code == wxapi.CodeInvalidToken || code == wxapi.CodeExpired || code == wxapi.CodeCredential
}

// token returns a's cached token, fetching one when there is none or it is
// due for renewal.
func (p *Provider) token(ctx context.Context, a *app) (wxapi.Secret, error) {
	if t, ok := a.cached(p.now()); ok {
		return t, nil
	}
	a.fetch.Lock()
	defer a.fetch.Unlock()
	if t, ok := a.cached(p.now()); ok {
		return t, nil // fetched while this call waited
	}
	u := p.base + "/cgi-bin/gettoken?corpid=" + url.QueryEscape(p.corp) + "&corpsecret=" + url.QueryEscape(string(a.secret))
	r, err := wxapi.Call(ctx, p.client, http.MethodGet, u, nil)
	if err != nil {
		p.logResult(ctx, "gettoken", r.Status, 0, err)
		return "", err
	}
	var ans struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int64  `json:"expires_in"`
	}
	if r.OK && r.ErrCode == 0 {
		_ = json.Unmarshal(r.Body, &ans)
	}
	switch {
	case !r.OK:
		err = wxapi.NotAnswer(&r)
	case r.ErrCode != 0:
		err = classifyToken(&r)
	case ans.AccessToken == "" || ans.ExpiresIn <= 0:
		err = envelope.Retryable(envelope.ClassProviderUnavailable, errNoToken)
	}
	if err != nil {
		p.logResult(ctx, "gettoken", r.Status, r.ErrCode, err)
		return "", err
	}
	life := time.Duration(ans.ExpiresIn) * time.Second
	margin := min(RefreshMargin, life/4)
	a.mu.Lock()
	a.token, a.until = wxapi.Secret(ans.AccessToken), p.now().Add(life-margin)
	a.mu.Unlock()
	p.log.LogAttrs(ctx, slog.LevelDebug, "wecom access token fetched", slog.String("operation", "gettoken"), slog.Duration("expires_in", life))
	return wxapi.Secret(ans.AccessToken), nil
}

func (a *app) cached(now time.Time) (wxapi.Secret, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.token, a.token != "" && now.Before(a.until)
}

// drop forgets token if it is still the cached one.
func (a *app) drop(token wxapi.Secret) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.token == token {
		a.token = ""
	}
}

// logResult writes one record: operation, status, errcode and class,
// never a URL, a member, a text or errmsg.
func (p *Provider) logResult(ctx context.Context, op string, status, code int, err error) {
	channels.LogRequest(ctx, p.log, "wecom "+op, channels.Request{Operation: op, Status: status, CodeName: "errcode", Code: code}, err,
		func(_ error, de *envelope.DeliveryError) (slog.Level, string) {
			if h := hint(code, de); h != "" {
				return slog.LevelWarn, h
			}
			return slog.LevelInfo, ""
		})
}

// hint is the operator's next step for a configuration error.
func hint(code int, de *envelope.DeliveryError) string {
	switch {
	case code == wxapi.CodeIPNotTrusted:
		return "WeCom refused the caller's IP (60020): add this host's public IP to the application's trusted IPs (企业可信IP) in the admin console"
	case code == wxapi.CodeNoPrivilege:
		return "WeCom says the application may not call this API (48001): check the application's permissions and visible range"
	case code == wxapi.CodeAppMismatch:
		return "the access token belongs to another application (301002): check the agentid and secret pairs"
	case de.Class == envelope.ClassAuthFailed:
		return "WeCom refused the credentials: check OUTBOX_WECOM_CORP_ID and the application's secret"
	case de.Class == envelope.ClassQuotaExceeded:
		return "the application's daily cap is used up: messages wait for the next day (China time)"
	}
	return ""
}
