// Package wecombot is the wecom_robot channel's provider: posts of WeCom
// group robots (消息推送, POST /cgi-bin/webhook/send?key=KEY).
//
// Robots are configured on the server by name (OUTBOX_WECOM_ROBOT_<NAME>_KEY
// in outbox serve); an envelope names the robot (recipient.robot), never
// its key. The key is in the request URL: no URL, key, text or errmsg
// reaches an error or a log record.
//
// Messages are text (at most 2048 bytes) or markdown (at most 4096 bytes);
// longer content is refused before any call (payload_too_large). WeCom
// allows 20 messages a minute per robot: outbox keeps that limit itself
// (Options.Clock) and answers rate_limited with the wait, without calling.
//
//	errcode 0                         sent
//	93000 (invalid key)               permanent (auth_failed) + an operator hint
//	45009 (frequency limit)           retryable (rate_limited), at least 60 s
//	-1, HTTP ≠ 200, not JSON          retryable (provider_unavailable)
//	network errors, timeouts          retryable (network_error, timeout)
//	any other errcode                 permanent (invalid_request)
//
// A robot has no idempotency key and cannot be asked whether a post went
// through: IdempotentRedelivery is false and Reconcile answers Unknown, so a
// post whose answer was lost becomes unresolved, never posted twice.
package wecombot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/envelope"
)

// Name is the provider's name in Capabilities, metrics and logs.
const Name = "wecom_robot"

// Limits.
const (
	MaxTextBytes     = 2048
	MaxMarkdownBytes = envelope.MaxWeComRobotMarkdownBytes
	PerMinute        = 20
	MinFreqRetry     = time.Minute
)

// EnvPrefix and EnvSuffix frame a robot's key variable:
// OUTBOX_WECOM_ROBOT_<NAME>_KEY (or _KEY_FILE), NAME upper-case.
const (
	EnvPrefix = "OUTBOX_WECOM_ROBOT_"
	EnvSuffix = "_KEY"
)

// Options configures a Provider.
type Options struct {
	// Robots maps a robot's name (lower case, as envelopes name it) to its
	// webhook key. At least one.
	Robots map[string]wxapi.Secret
	// BaseURL is WeCom's API server; "" means wxapi.DefaultBaseURL.
	BaseURL    string
	HTTPClient *http.Client
	Logger     *slog.Logger
	// Clock is the limiter's time source; nil means time.Now.
	Clock func() time.Time
}

// Provider posts robot messages. It is safe for concurrent use.
type Provider struct {
	robots map[string]wxapi.Secret
	base   string
	client *http.Client
	log    *slog.Logger
	limit  *wxapi.Limiter
}

var _ channels.Provider = (*Provider)(nil)

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_]{0,31}$`)

// New validates opts and returns a Provider.
func New(opts Options) (*Provider, error) {
	if len(opts.Robots) == 0 {
		return nil, errors.New("wecombot: Options.Robots is empty")
	}
	robots := map[string]wxapi.Secret{}
	for name, key := range opts.Robots {
		if !namePattern.MatchString(name) {
			return nil, errors.New("wecombot: a robot name must be 1-32 lower-case letters, digits or _")
		}
		k := strings.TrimSpace(string(key))
		if k == "" {
			return nil, fmt.Errorf("wecombot: robot %s has an empty key", name)
		}
		robots[name] = wxapi.Secret(k)
	}
	base, err := wxapi.CheckBaseURL(opts.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("wecombot: Options.BaseURL %w", err)
	}
	now := opts.Clock
	if now == nil {
		now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Provider{robots: robots, base: base, client: wxapi.Client(opts.HTTPClient),
		log:   log.With(slog.String("component", "channels/wecombot"), slog.String("provider", Name)),
		limit: wxapi.NewLimiter(now, len(robots)+1, wxapi.Limit{N: PerMinute, Per: time.Minute})}, nil
}

// RobotsFromEnv finds every OUTBOX_WECOM_ROBOT_<NAME>_KEY (or _KEY_FILE)
// in environ (os.Environ()) and reads it through getenv. Names are
// returned in lower case. Errors name the variable, never the key.
func RobotsFromEnv(environ []string, getenv func(string) string) (map[string]wxapi.Secret, error) {
	robots := map[string]wxapi.Secret{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) {
			continue
		}
		robot := strings.TrimPrefix(name, EnvPrefix)
		switch {
		case strings.HasSuffix(robot, EnvSuffix+"_FILE"):
			robot = strings.TrimSuffix(robot, EnvSuffix+"_FILE")
		case strings.HasSuffix(robot, EnvSuffix):
			robot = strings.TrimSuffix(robot, EnvSuffix)
		default:
			return nil, fmt.Errorf("wecombot: %s: want %s<NAME>%s or %s<NAME>%s_FILE", name, EnvPrefix, EnvSuffix, EnvPrefix, EnvSuffix)
		}
		lower := strings.ToLower(robot)
		if robot != strings.ToUpper(robot) || !namePattern.MatchString(lower) {
			return nil, fmt.Errorf("wecombot: %s: the robot name must be 1-32 upper-case letters, digits or _", name)
		}
		if _, done := robots[lower]; done {
			continue
		}
		key, err := wxapi.FromEnv(getenv, EnvPrefix+robot+EnvSuffix)
		if err != nil {
			return nil, fmt.Errorf("wecombot: %w", err)
		}
		robots[lower] = key
	}
	return robots, nil
}

// Names returns the configured robots' names.
func (p *Provider) Names() []string {
	var out []string
	for n := range p.robots {
		out = append(out, n)
	}
	return out
}

// Capabilities: no idempotent redelivery (a robot has no idempotency key).
func (p *Provider) Capabilities() channels.Capabilities {
	return channels.Capabilities{Name: Name, Channel: envelope.ChannelWeComRobot}
}

// Reconcile answers Unknown: a robot cannot be asked.
func (p *Provider) Reconcile(context.Context, envelope.Key, *envelope.Message) (channels.Reconciliation, error) {
	return channels.Reconciliation{Outcome: channels.Unknown}, nil
}

type content struct {
	Content string `json:"content"`
}

type postRequest struct {
	MsgType  string   `json:"msgtype"`
	Text     *content `json:"text,omitempty"`
	Markdown *content `json:"markdown,omitempty"`
}

// Causes: none names a robot, a key or a text.
var (
	errNotRobot     = errors.New("wecombot: message is not a robot message")
	errUnknownRobot = errors.New("wecombot: the message's robot is not configured")
	errMsgType      = errors.New("wecombot: unknown msgtype")
	errEmpty        = errors.New("wecombot: message content is empty")
	errTooLong      = errors.New("wecombot: content exceeds the robot's limit")
	errEncode       = errors.New("wecombot: cannot build the request")
	errRobotLimit   = errors.New("wecombot: the robot's 20 messages a minute are used (kept by outbox)")
)

// Deliver posts msg.WeCom through its robot.
func (p *Provider) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	code, status, err := p.post(ctx, msg)
	p.logResult(ctx, status, code, err)
	if err != nil {
		return channels.Receipt{}, err
	}
	// A robot returns no message id: the receipt is an opaque digest of
	// the key.
	return channels.Receipt{ID: "robot-" + key.Hash()[:24]}, nil
}

func (p *Provider) post(ctx context.Context, msg *envelope.Message) (code, status int, err error) {
	if msg == nil || msg.WeCom == nil || (msg.Channel != "" && msg.Channel != envelope.ChannelWeComRobot) {
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errNotRobot)
	}
	m := msg.WeCom
	robot := m.Robot
	key, ok := p.robots[robot]
	if !ok {
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRecipient, errUnknownRobot)
	}
	req := postRequest{MsgType: m.MsgType}
	limit := 0
	switch m.MsgType {
	case envelope.WeComText:
		req.Text, limit = &content{m.Content}, MaxTextBytes
	case envelope.WeComMarkdown:
		req.Markdown, limit = &content{m.Content}, MaxMarkdownBytes
	default:
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errMsgType)
	}
	switch {
	case strings.TrimSpace(m.Content) == "":
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errEmpty)
	case len(m.Content) > limit:
		return 0, 0, envelope.Permanent(envelope.ClassPayloadTooLarge, errTooLong)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return 0, 0, envelope.Permanent(envelope.ClassInvalidRequest, errEncode)
	}
	if wait := p.limit.Take(robot); wait > 0 {
		return 0, 0, envelope.RetryAfter(envelope.ClassRateLimited, wait, errRobotLimit)
	}
	r, err := wxapi.Call(ctx, p.client, http.MethodPost, p.base+"/cgi-bin/webhook/send?key="+url.QueryEscape(string(key)), body)
	switch {
	case err != nil:
		return 0, r.Status, err
	case !r.OK:
		return 0, r.Status, wxapi.NotAnswer(&r)
	case r.ErrCode == 0:
		return 0, r.Status, nil
	}
	return r.ErrCode, r.Status, classify(&r)
}

func classify(r *wxapi.Result) error {
	switch r.ErrCode {
	case wxapi.CodeRobotKey:
		return envelope.Permanent(envelope.ClassAuthFailed, r.Cause())
	case wxapi.CodeFreqLimit:
		return envelope.RetryAfter(envelope.ClassRateLimited, MinFreqRetry, r.Cause())
	case wxapi.CodeBusy:
		return envelope.Retryable(envelope.ClassProviderUnavailable, r.Cause())
	}
	return envelope.Permanent(envelope.ClassInvalidRequest, r.Cause())
}

// logResult writes one record: status, errcode and class, never the key,
// the text or errmsg.
func (p *Provider) logResult(ctx context.Context, status, code int, err error) {
	channels.LogRequest(ctx, p.log, "wecom robot message", channels.Request{Operation: "deliver", Status: status, CodeName: "errcode", Code: code}, err,
		func(err error, _ *envelope.DeliveryError) (slog.Level, string) {
			switch {
			case code == wxapi.CodeRobotKey:
				return slog.LevelWarn, "WeCom refused the robot's key (93000): check its OUTBOX_WECOM_ROBOT_<NAME>_KEY (the robot may have been removed from the group)"
			case errors.Is(err, errUnknownRobot):
				return slog.LevelWarn, "the envelope names a robot that is not configured: set OUTBOX_WECOM_ROBOT_<NAME>_KEY for it"
			}
			return slog.LevelInfo, ""
		})
}
