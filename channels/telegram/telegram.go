// Package telegram is the chat channel's provider: it sends rendered
// envelope.ChatMessage segments with the Telegram Bot API's sendMessage,
// over plain net/http.
//
// # Requests
//
// One POST {BaseURL}/bot{Token}/sendMessage per segment, with a JSON body:
// chat_id (a number when the chat id is numeric, else the string, e.g.
// "@channelname"), text, parse_mode (when the message has one) and, with
// Options.DisableWebPagePreview, link_preview_options {"is_disabled":true}
// (the Bot API 7.0 successor of disable_web_page_preview). The receipt is the
// message_id Telegram returns.
//
// # Pacing
//
// Telegram asks bots to send at most about one message per second to one
// chat and 30 per second overall. Deliver waits for a per-chat limiter and a
// global one (golang.org/x/time/rate) before each request; both are
// configurable, and the wait ends early with a retryable error when ctx is
// done. Per-chat limiters are kept in a bounded map (MaxChatLimiters, least
// recently used evicted: a limiter idle for longer than its refill time is
// full again, so evicting it loses nothing).
//
// # Outcomes
//
//	ok                                  sent, receipt = message_id
//	429                                 retryable (rate_limited), parameters.retry_after honoured
//	403 blocked/deactivated/kicked/
//	    can't initiate/not a member     recipient gone (blocked_by_user)
//	400 chat not found/user not found   recipient gone (invalid_recipient)
//	400 with migrate_to_chat_id         permanent (invalid_recipient); the app must use the new id
//	400 can't parse entities/too long   permanent (invalid_request)
//	other 403                           permanent (invalid_recipient)
//	401, 404 (a bad token)              permanent (auth_failed)
//	5xx, network errors, timeouts       retryable (provider_unavailable, network_error, timeout)
//	3xx (a redirect is never followed)  retryable (provider_unavailable)
//
// Telegram has no idempotency key: a request that timed out may or may not
// have been delivered, and a redelivery can duplicate it. So
// Capabilities().IdempotentRedelivery is false and Reconcile always answers
// Unknown (the row becomes unresolved for an operator).
//
// # Secrets
//
// The bot token is part of every request URL, and net/http's errors quote
// the URL. No error text from the HTTP client, and nothing of the answer's
// description, ever reaches a returned error or a log record: errors are
// envelope.DeliveryError values wrapping redacted causes, and logs carry the
// operation, HTTP status, Telegram error code and error class only.
package telegram

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"golang.org/x/time/rate"
)

// Name is the provider's name in Capabilities, metrics and logs.
const Name = "telegram"

// Defaults.
const (
	// DefaultBaseURL is the Bot API server.
	DefaultBaseURL = "https://api.telegram.org"
	// DefaultPerChat is the default pace per chat: one message a second.
	DefaultPerChat rate.Limit = 1
	// DefaultPerChatBurst is the default per-chat burst.
	DefaultPerChatBurst = 1
	// DefaultGlobal is the default pace over all chats: 30 messages a
	// second.
	DefaultGlobal rate.Limit = 30
	// DefaultGlobalBurst is the default global burst.
	DefaultGlobalBurst = 30
	// DefaultRequestTimeout bounds one request of the default HTTP client.
	DefaultRequestTimeout = 30 * time.Second
	// MaxChatLimiters bounds the number of per-chat limiters kept.
	MaxChatLimiters = 10000
	// maxResponseBytes bounds how much of an answer is read.
	maxResponseBytes = 1 << 20
)

// Options configures a Provider.
type Options struct {
	// Token is the bot token from @BotFather; required. It prints as
	// "[redacted]".
	Token Token
	// BaseURL is the Bot API server; "" means DefaultBaseURL. Tests point
	// it at a local server.
	BaseURL string
	// HTTPClient sends the requests; nil means a client with
	// DefaultRequestTimeout. Either is used through a copy whose
	// CheckRedirect refuses every redirect (a 3xx answer is a provider
	// error, never followed).
	HTTPClient *http.Client
	// Logger receives one record per request (status, error code and class
	// only); nil means slog.Default().
	Logger *slog.Logger
	// PerChat is the pace per chat; 0 means DefaultPerChat, rate.Inf no
	// limit. PerChatBurst is its burst; 0 means DefaultPerChatBurst.
	PerChat      rate.Limit
	PerChatBurst int
	// Global is the pace over all chats; 0 means DefaultGlobal, rate.Inf no
	// limit. GlobalBurst is its burst; 0 means DefaultGlobalBurst.
	Global      rate.Limit
	GlobalBurst int
	// DisableWebPagePreview turns off link previews in sent messages.
	DisableWebPagePreview bool
}

// Provider sends chat segments. It is safe for concurrent use.
type Provider struct {
	token     Token
	endpoint  string // {BaseURL}/bot{Token}/sendMessage: never log it
	client    *http.Client
	log       *slog.Logger
	global    *rate.Limiter
	chats     *chatLimiters
	noPreview bool
}

var _ channels.Provider = (*Provider)(nil)

// New validates opts and returns a Provider. Its errors name the setting at
// fault, never its value.
func New(opts Options) (*Provider, error) {
	token := Token(strings.TrimSpace(string(opts.Token)))
	if token == "" {
		return nil, errors.New("telegram: Options.Token is empty (the bot token from @BotFather)")
	}
	if !validToken(string(token)) {
		return nil, errors.New("telegram: Options.Token has characters a bot token cannot have (want digits, ':', letters, '_' and '-')")
	}
	base := strings.TrimSpace(opts.BaseURL)
	if base == "" {
		base = DefaultBaseURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, errors.New("telegram: Options.BaseURL must be an http(s) URL without query, fragment or user info")
	}
	perChat, perChatBurst, err := limits("PerChat", opts.PerChat, opts.PerChatBurst, DefaultPerChat, DefaultPerChatBurst)
	if err != nil {
		return nil, err
	}
	global, globalBurst, err := limits("Global", opts.Global, opts.GlobalBurst, DefaultGlobal, DefaultGlobalBurst)
	if err != nil {
		return nil, err
	}
	// A copy of the caller's client (or the default one) that never
	// follows a redirect: the token is in the request's path, and a
	// redirect must not take the request anywhere else.
	var client *http.Client
	if opts.HTTPClient != nil {
		c := *opts.HTTPClient
		client = &c
	} else {
		client = &http.Client{Timeout: DefaultRequestTimeout}
	}
	client.CheckRedirect = noRedirect
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Provider{
		token:     token,
		endpoint:  strings.TrimRight(base, "/") + "/bot" + string(token) + "/sendMessage",
		client:    client,
		log:       log.With(slog.String("component", "channels/telegram"), slog.String("provider", Name)),
		global:    rate.NewLimiter(global, globalBurst),
		chats:     newChatLimiters(perChat, perChatBurst, MaxChatLimiters),
		noPreview: opts.DisableWebPagePreview,
	}, nil
}

// noRedirect makes the client return a redirect answer instead of
// following it.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// limits applies the defaults to one limit and burst and checks them.
func limits(name string, l rate.Limit, burst int, defLimit rate.Limit, defBurst int) (rate.Limit, int, error) {
	if l == 0 {
		l = defLimit
	}
	if burst == 0 {
		burst = defBurst
	}
	if l < 0 {
		return 0, 0, fmt.Errorf("telegram: Options.%s must be positive (0 = default, rate.Inf = no limit)", name)
	}
	if burst < 1 {
		return 0, 0, fmt.Errorf("telegram: Options.%sBurst must be at least 1 (0 = default)", name)
	}
	return l, burst, nil
}

// validToken reports whether t only has characters a bot token has (it goes
// into the URL path unescaped).
func validToken(t string) bool {
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == ':' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Capabilities reports Name "telegram", channel telegram and no idempotent
// redelivery (the Bot API has no idempotency key).
func (p *Provider) Capabilities() channels.Capabilities {
	return channels.Capabilities{Name: Name, Channel: envelope.ChannelTelegram, IdempotentRedelivery: false, OneService: true}
}

// Reconcile answers Unknown: the Bot API cannot say whether an earlier
// sendMessage went through, and re-sending could duplicate it.
func (p *Provider) Reconcile(context.Context, envelope.Key, *envelope.Message) (channels.Reconciliation, error) {
	return channels.Reconciliation{Outcome: channels.Unknown}, nil
}

// sendMessageRequest is sendMessage's JSON body.
type sendMessageRequest struct {
	ChatID             any                 `json:"chat_id"`
	Text               string              `json:"text"`
	ParseMode          string              `json:"parse_mode,omitempty"`
	LinkPreviewOptions *linkPreviewOptions `json:"link_preview_options,omitempty"`
}

type linkPreviewOptions struct {
	IsDisabled bool `json:"is_disabled"`
}

// apiResponse is the Bot API's answer envelope.
type apiResponse struct {
	OK     bool `json:"ok"`
	Result *struct {
		MessageID int64 `json:"message_id"`
	} `json:"result"`
	ErrorCode   int    `json:"error_code"`
	Description string `json:"description"`
	Parameters  *struct {
		RetryAfter      int   `json:"retry_after"`
		MigrateToChatID int64 `json:"migrate_to_chat_id"`
	} `json:"parameters"`
}

// chatIDValue is the chat id as sendMessage takes it: an integer for a
// numeric id, the string otherwise ("@channelusername").
func chatIDValue(id string) any {
	if n, err := strconv.ParseInt(id, 10, 64); err == nil {
		return n
	}
	return id
}

// Deliver sends msg.Chat with sendMessage after waiting for the pacing
// limiters. It blocks until Telegram answers or ctx is done. See the
// package documentation for the outcome mapping.
func (p *Provider) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	rc, status, code, err := p.send(ctx, msg)
	p.logResult(ctx, status, code, err)
	return rc, err
}

func (p *Provider) send(ctx context.Context, msg *envelope.Message) (rc channels.Receipt, status, code int, err error) {
	if msg == nil || msg.Chat == nil || (msg.Channel != "" && msg.Channel != envelope.ChannelTelegram) {
		return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errNotChat)
	}
	cm := msg.Chat
	chatID := strings.TrimSpace(cm.ChatID)
	if chatID == "" {
		return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRecipient, errNoChatID)
	}
	if cm.Text == "" {
		return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errEmptyText)
	}
	body := sendMessageRequest{ChatID: chatIDValue(chatID), Text: cm.Text, ParseMode: cm.ParseMode}
	if p.noPreview {
		body.LinkPreviewOptions = &linkPreviewOptions{IsDisabled: true}
	}
	buf, err := json.Marshal(body)
	if err != nil {
		return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errEncode)
	}
	if err := p.wait(ctx, chatID); err != nil {
		return rc, 0, 0, err
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.endpoint, bytes.NewReader(buf))
	if err != nil {
		// The URL was checked in New; only a nil ctx gets here.
		return rc, 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errEncode)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return rc, 0, 0, channels.ClassifyTransport(err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	var ar apiResponse
	data, readErr := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	decodeErr := json.Unmarshal(data, &ar)
	if readErr == nil && decodeErr == nil && resp.StatusCode == http.StatusOK && ar.OK && ar.Result != nil && ar.Result.MessageID != 0 {
		return channels.Receipt{ID: strconv.FormatInt(ar.Result.MessageID, 10)}, resp.StatusCode, 0, nil
	}
	if readErr != nil && resp.StatusCode == http.StatusOK {
		return rc, resp.StatusCode, 0, channels.ClassifyTransport(readErr)
	}
	if decodeErr != nil {
		ar = apiResponse{} // not the Bot API talking (a proxy's page): go by the status
	}
	return rc, resp.StatusCode, ar.ErrorCode, classify(resp, &ar)
}

// wait takes a token from the chat's limiter, then from the global one.
func (p *Provider) wait(ctx context.Context, chatID string) error {
	for _, lim := range []*rate.Limiter{p.chats.get(chatID), p.global} {
		if err := lim.Wait(ctx); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return envelope.Retryable(envelope.ClassTimeout, ctxErr)
			}
			// The wait would outlast ctx's deadline: come back later.
			return envelope.Retryable(envelope.ClassRateLimited, errPacing)
		}
	}
	return nil
}

// logResult writes one record per request: status, Telegram's error code
// and the error class, never the chat, the text or the description.
func (p *Provider) logResult(ctx context.Context, status, code int, err error) {
	channels.LogRequest(ctx, p.log, "telegram message", channels.Request{Operation: "deliver", Status: status, CodeName: "error_code", Code: code}, err,
		func(err error, de *envelope.DeliveryError) (slog.Level, string) {
			switch {
			case de.Class == envelope.ClassAuthFailed:
				return slog.LevelWarn, "the Bot API refused the bot token: check the configured token (a revoked or mistyped token answers 401, a malformed one 404)"
			case errors.Is(err, errMigrated):
				return slog.LevelWarn, "the group became a supergroup: the app must send to the new chat id"
			}
			return slog.LevelInfo, ""
		})
}

// chatLimiters keeps one limiter per chat, at most max of them, evicting
// the least recently used.
type chatLimiters struct {
	limit rate.Limit
	burst int
	max   int

	mu  sync.Mutex
	m   map[string]*list.Element // chat id → element of lru holding *chatLimiter
	lru *list.List               // front = most recently used
}

type chatLimiter struct {
	chat string
	lim  *rate.Limiter
}

func newChatLimiters(limit rate.Limit, burst, max int) *chatLimiters {
	return &chatLimiters{limit: limit, burst: burst, max: max, m: make(map[string]*list.Element), lru: list.New()}
}

// get returns chat's limiter, creating it (and evicting the least recently
// used one when full).
func (c *chatLimiters) get(chat string) *rate.Limiter {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[chat]; ok {
		c.lru.MoveToFront(e)
		return e.Value.(*chatLimiter).lim
	}
	for c.lru.Len() >= c.max {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.m, old.Value.(*chatLimiter).chat)
	}
	cl := &chatLimiter{chat: chat, lim: rate.NewLimiter(c.limit, c.burst)}
	c.m[chat] = c.lru.PushFront(cl)
	return cl.lim
}

// len returns the number of limiters kept.
func (c *chatLimiters) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
