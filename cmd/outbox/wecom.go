package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outboxhq/outbox/channels/wecom"
	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/channels/wecombot"
	"github.com/outboxhq/outbox/channels/wecomreply"
	"github.com/outboxhq/outbox/envelope"
)

// Environment variables of the WeCom providers (secrets: env or _FILE).
const (
	envWeComSecret = "OUTBOX_WECOM_SECRET"
	// ledgerName is the spent response_url ledger in the data directory.
	ledgerName = "wecom-replies.spent"
)

// weComConfig is serve's WeCom configuration.
type weComConfig struct {
	API        string // base URL of qyapi
	CorpID     string
	AgentID    string
	DailyCap   int
	BotReplies bool
	ReplyHosts string // comma-separated
}

// buildWeCom adds the WeCom providers whose configuration is present:
// the application (OUTBOX_WECOM_SECRET with --wecom-corp-id and
// --wecom-agent-id), the group robots (OUTBOX_WECOM_ROBOT_<NAME>_KEY) and,
// with --wecom-bot-replies, the AI bot replies (their ledger opens with
// the store, after the data directory's lock: see openLedger).
func buildWeCom(e *env, c appConfig, a *app) error {
	w := c.WeCom
	secret, err := wxapi.FromEnv(e.Getenv, envWeComSecret)
	switch {
	case errors.Is(err, wxapi.ErrNotSet):
		if w.CorpID != "" || w.AgentID != "" {
			return fmt.Errorf("wecom: --wecom-corp-id/--wecom-agent-id are set but %s (or %s_FILE) is not", envWeComSecret, envWeComSecret)
		}
	case err != nil:
		return fmt.Errorf("wecom: %w", err)
	default:
		if w.CorpID == "" || w.AgentID == "" {
			return fmt.Errorf("wecom: %s is set but --wecom-corp-id (OUTBOX_WECOM_CORP_ID) or --wecom-agent-id (OUTBOX_WECOM_AGENT_ID) is not", envWeComSecret)
		}
		id, err := strconv.ParseInt(w.AgentID, 10, 64)
		if err != nil || id <= 0 {
			return errors.New("wecom: --wecom-agent-id (OUTBOX_WECOM_AGENT_ID) must be the application's agentid (a positive number)")
		}
		p, err := wecom.New(wecom.Options{CorpID: w.CorpID, Apps: []wecom.App{{AgentID: id, Secret: secret}},
			BaseURL: w.API, DailyCap: w.DailyCap, Logger: c.Logger})
		if err != nil {
			return err
		}
		a.providers[envelope.ChannelWeCom] = p
	}

	var environ []string
	if e.Environ != nil {
		environ = e.Environ()
	}
	robots, err := wecombot.RobotsFromEnv(environ, e.Getenv)
	if err != nil {
		return err
	}
	if len(robots) > 0 {
		p, err := wecombot.New(wecombot.Options{Robots: robots, BaseURL: w.API, Logger: c.Logger})
		if err != nil {
			return err
		}
		a.providers[envelope.ChannelWeComRobot] = p
	}

	if w.BotReplies {
		var hosts []string
		for _, h := range strings.Split(w.ReplyHosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				hosts = append(hosts, h)
			}
		}
		a.ledger = &deferredLedger{}
		p, err := wecomreply.New(wecomreply.Options{Ledger: a.ledger, Hosts: hosts, Logger: c.Logger})
		if err != nil {
			return err
		}
		a.providers[envelope.ChannelWeComBotReply] = p
	}
	return nil
}

// deferredLedger is the reply ledger, opened once the store holds the
// data directory's lock (a second serve must not rewrite the file the
// first one appends to).
type deferredLedger struct {
	l *wecomreply.FileLedger
}

func (d *deferredLedger) open(dataDir string) error {
	l, err := wecomreply.OpenLedger(filepath.Join(dataDir, ledgerName), time.Now())
	if err != nil {
		return err
	}
	d.l = l
	return nil
}

func (d *deferredLedger) Spend(u string, at time.Time) (bool, error) {
	if d.l == nil {
		return false, errors.New("wecomreply: ledger not open")
	}
	return d.l.Spend(u, at)
}

func (d *deferredLedger) close() {
	if d != nil && d.l != nil {
		_ = d.l.Close()
	}
}
