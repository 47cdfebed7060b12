package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/resend"
	"github.com/outboxhq/outbox/channels/sink"
	"github.com/outboxhq/outbox/channels/telegram"
	"github.com/outboxhq/outbox/channels/webpush"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/httpapi"
	"github.com/outboxhq/outbox/queue/worker"
	"github.com/outboxhq/outbox/render"
	"github.com/prometheus/client_golang/prometheus"
)

// appConfig is what serve and demo share: how to open the store and which
// providers to build.
type appConfig struct {
	Data        string
	PublicURL   string
	NoSink      bool
	Concurrency int
	Lease       time.Duration
	Backoff     queue.Backoff
	Retention   time.Duration
	// LogRewriteMin is filestore.Options.LogRewriteMin.
	LogRewriteMin int64
	Rescan        time.Duration
	Relaxed       bool
	TemplatesDir  string
	Subscriber    string // VAPID subject
	EmailFrom     string
	EmailReplyTo  string
	ResendRate    float64
	ResendPoll    time.Duration
	ResendURL     string
	TelegramURL   string
	WeCom         weComConfig
	Shutdown      time.Duration
	SinkJournal   bool
	Brand         render.Brand // checked by render.Brand.Normalize
	// DatabaseURL, when set, puts the store in PostgreSQL (pgstore) instead
	// of the files in Data; Data still holds the unsubscribe key and the sink.
	DatabaseURL    string
	DatabaseSchema string
	NoMigrate      bool
	Logger         *slog.Logger
	Registry       *prometheus.Registry
}

// app is the wired delivery stack. The store is the contract: what only the
// file store has (the operator socket's checks, the seam's return of
// expired leases) is reached by type assertion or an optional interface.
type app struct {
	q         queue.Store
	r         *render.Renderer
	unsub     *httpapi.Unsubscriber
	providers map[envelope.Channel]channels.Provider
	sinks     map[envelope.Channel]*sink.Provider
	w         *worker.Worker
	poller    *resend.Poller
	webhook   http.Handler
	vapidPub  string
	ledger    *deferredLedger // the AI bot replies' spent URLs, when configured
	described []string        // "channel: provider" lines for the start-up log
}

// buildApp builds the renderer, the providers whose configuration is
// present (secrets from the environment only) and the sink for every other
// channel (unless NoSink), then opens the store and builds the worker.
// usedBefore reports whether an earlier serve used data directory dir: a
// file store was opened in it, or a PostgreSQL store marked it.
func usedBefore(dir string) bool {
	_, mark := pgMarked(dir)
	return !neverOpened(dir) || mark != ""
}

func buildApp(e *env, c appConfig) (*app, error) {
	var reg prometheus.Registerer
	if c.Registry != nil {
		reg = c.Registry
	}
	a := &app{providers: map[envelope.Channel]channels.Provider{}, sinks: map[envelope.Channel]*sink.Provider{}}
	fail := func(err error) (*app, error) {
		a.ledger.close()
		if a.q != nil {
			a.q.Close()
		}
		return nil, err
	}

	if err := dataIsDir(c.Data); err != nil {
		return fail(err)
	}
	if err := checkOwner(c.Data); err != nil {
		return fail(err)
	}
	_, kerr := os.Lstat(filepath.Join(c.Data, httpapi.KeyFile))
	key, err := httpapi.LoadOrCreateKey(c.Data)
	if err != nil {
		return fail(err)
	}
	if errors.Is(kerr, os.ErrNotExist) && usedBefore(c.Data) {
		c.Logger.Warn("the unsubscribe key "+filepath.Join(c.Data, httpapi.KeyFile)+" was missing from a data directory an earlier serve used: a new key was made, and the unsubscribe links of e-mails and pushes sent before it no longer work; put the old key back (from a backup of the data directory) and restart",
			"operation", "serve", "status", "new_unsubscribe_key")
	}
	a.unsub = httpapi.NewUnsubscriber(key, c.PublicURL)
	ro := &render.Options{UnsubscribeURL: a.unsub.URL, BaseURL: c.PublicURL, Brand: c.Brand}
	if c.TemplatesDir != "" {
		if _, err := os.Stat(c.TemplatesDir); err != nil {
			return fail(fmt.Errorf("templates: %w", err))
		}
		ro.Overrides = os.DirFS(c.TemplatesDir)
	}
	if a.r, err = render.New(ro); err != nil {
		return fail(err)
	}

	// Web Push: VAPID keys + subject.
	keys, err := webpush.KeysFromEnv(e.Getenv)
	switch {
	case errors.Is(err, webpush.ErrNoKeys):
	case err != nil:
		return fail(err)
	case c.Subscriber == "":
		return fail(errors.New("push: VAPID keys are set but --vapid-subject (OUTBOX_VAPID_SUBJECT) is not"))
	default:
		p, err := webpush.New(webpush.Options{VAPIDPublicKey: keys.Public, VAPIDPrivateKey: keys.Private, Subscriber: c.Subscriber, Logger: c.Logger})
		if err != nil {
			return fail(err)
		}
		a.providers[envelope.ChannelPush] = p
		a.vapidPub = keys.Public
	}

	// Email: RESEND_API_KEY + from. The webhook needs only its secret
	// and the store: it is served with or without the API key (an
	// external worker on the seam may send through Resend itself, and
	// its bounces and complaints still suppress the addresses here).
	var email *resend.Provider
	whSecret, err := secret(e, "RESEND_WEBHOOK_SECRET")
	if err != nil {
		return fail(err)
	}
	from, err := senderAddress(c)
	if err != nil {
		return fail(err)
	}
	if apiKey, err := resend.APIKeyFromEnv(e.Getenv); err == nil {
		if c.EmailFrom == "" {
			return fail(errors.New("email: RESEND_API_KEY is set but --email-from (OUTBOX_EMAIL_FROM) is not"))
		}
		if c.Brand.Address == "" {
			// Not refused: outbox cannot tell commercial mail from
			// relationship mail, which needs no address (docs/branding.md).
			c.Logger.Warn("--brand-address (OUTBOX_BRAND_ADDRESS) is not set: commercial e-mail must show the sender's postal address (CAN-SPAM); set it unless these e-mails are transactional", "operation", "serve", "status", "degraded")
		}
		opts := resend.Options{APIKey: resend.APIKey(apiKey), From: from, ReplyTo: c.EmailReplyTo, BaseURL: c.ResendURL,
			FirstAttempt: a.firstAttempt, Logger: c.Logger}
		if c.ResendRate > 0 {
			opts.Rate = rateLimit(c.ResendRate)
		}
		if email, err = resend.New(opts); err != nil {
			return fail(err)
		}
		a.providers[envelope.ChannelEmail] = email
	} else if e.Getenv(resend.EnvAPIKey) != "" || e.Getenv(resend.EnvAPIKeyFile) != "" {
		return fail(err)
	}

	// Telegram: bot token.
	tok, err := telegram.TokenFromEnv(e.Getenv)
	switch {
	case errors.Is(err, telegram.ErrNoToken):
	case err != nil:
		return fail(err)
	default:
		p, err := telegram.New(telegram.Options{Token: tok, BaseURL: c.TelegramURL, Logger: c.Logger})
		if err != nil {
			return fail(err)
		}
		a.providers[envelope.ChannelTelegram] = p
	}
	if err := buildWeCom(e, c, a); err != nil {
		return fail(err)
	}

	for _, ch := range envelope.Channels {
		if p, ok := a.providers[ch]; ok {
			a.described = append(a.described, string(ch)+": "+p.Capabilities().Name)
			continue
		}
		if c.NoSink {
			a.described = append(a.described, string(ch)+": none (rows stay pending)")
			continue
		}
		s, err := sink.New(c.Data, ch, &sink.Options{Journal: c.SinkJournal, From: from})
		if err == nil {
			err = s.CheckDir() // a linked sink directory: refused at start, by name
		}
		if err != nil {
			return fail(err)
		}
		a.providers[ch] = s
		a.sinks[ch] = s
		a.described = append(a.described, string(ch)+": sink ("+filepath.Join(c.Data, "sink", string(ch))+")")
	}

	qo := queue.Options{Logger: c.Logger.With("component", "queue"), Registerer: reg, Backoff: c.Backoff, Retention: c.Retention}
	storeNow := time.Now // the worker's clock: the store's
	if c.DatabaseURL != "" {
		if err := sameSchema(c.Data, c.DatabaseSchema); err != nil {
			return fail(err)
		}
		pg, err := openPG(context.Background(), c.DatabaseURL, c.DatabaseSchema, c.NoMigrate, pgMark(c.Data, c.DatabaseSchema), qo)
		if err != nil {
			return fail(err)
		}
		a.q, storeNow = pg, pg.Now
	} else {
		if err := fileStoreDir(c.Data); err != nil {
			return fail(err)
		}
		// Claims of channels whose provider redelivers idempotently skip
		// their fsync (see queue.Options.UnsyncedClaims).
		fq, err := filestore.Open(c.Data, &filestore.Options{Options: qo, RescanInterval: c.Rescan, NoSync: c.Relaxed, LogRewriteMin: c.LogRewriteMin, UnsyncedClaims: idempotentChannels(a.providers)})
		if err != nil {
			return fail(err)
		}
		a.q = fq
	}
	if a.ledger != nil {
		if err := a.ledger.open(c.Data); err != nil {
			return fail(err)
		}
	}
	if email != nil && c.ResendPoll > 0 {
		cursor := resend.FileCursor(filepath.Join(c.Data, "resend.cursor"))
		if _, err := cursor.LoadCursor(context.Background()); err != nil {
			return fail(err) // a linked cursor file: refused at start, by name
		}
		a.poller, err = resend.NewPoller(email, a.q, resend.PollerOptions{Interval: c.ResendPoll, Cursor: cursor, Logger: c.Logger})
		if err != nil {
			return fail(err)
		}
	}
	if whSecret != "" {
		if a.webhook, err = resend.NewWebhookHandler(whSecret, a.q, resend.WebhookOptions{Logger: c.Logger}); err != nil {
			return fail(fmt.Errorf("RESEND_WEBHOOK_SECRET: %w", err))
		}
	}
	if len(a.providers) == 0 {
		// Nothing to deliver with: rows wait for an external worker on the
		// /internal/outbox seam.
		return a, nil
	}
	a.w, err = worker.New(worker.Config{
		Store: a.q, Providers: a.providers, Renderer: a.r, Concurrency: c.Concurrency,
		Lease: c.Lease, ShutdownTimeout: c.Shutdown, Logger: c.Logger, Registerer: reg, Now: storeNow,
	})
	if err != nil {
		return fail(err)
	}
	return a, nil
}

// senderAddress is the From of e-mails, sent or written to the sink:
// --email-from (outbox@localhost without it) with the brand's sender name.
func senderAddress(c appConfig) (string, error) {
	addr := c.EmailFrom
	if addr == "" {
		addr = sinkFromAddress
	}
	brand, err := c.Brand.Normalize()
	if err != nil {
		return "", err
	}
	if addr, err = brand.SenderAddress(addr); err != nil {
		return "", errors.New("email: --email-from (OUTBOX_EMAIL_FROM) is not an e-mail address like news@example.org or \"Name <news@example.org>\"")
	}
	return addr, nil
}

// sinkFromAddress is the address of the sink's .eml files without
// --email-from.
const sinkFromAddress = "outbox@localhost"

// idempotentChannels returns the channels whose provider redelivers
// idempotently (delivering a key twice has the effect of once).
func idempotentChannels(providers map[envelope.Channel]channels.Provider) []envelope.Channel {
	var out []envelope.Channel
	for _, ch := range envelope.Channels {
		// WeCom's duplicate check holds only within its interval, and a
		// claim lost in a machine crash may be redelivered later than that.
		if p, ok := providers[ch]; ok && p.Capabilities().IdempotentRedelivery && ch != envelope.ChannelWeCom {
			out = append(out, ch)
		}
	}
	return out
}

// close stops the worker (if not stopped) and closes the store.
// firstAttempt tells the Resend provider, for a row it did not send itself
// (sent before a restart, by a killed serve), the earliest its first send
// can have been: its envelope's enqueue. Within Resend's idempotency window
// from there, a replay under the same key cannot send the e-mail twice, so
// such a row is settled by the replay instead of left unresolved.
func (a *app) firstAttempt(key envelope.Key) (time.Time, bool) {
	if a.q == nil {
		return time.Time{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := a.q.Get(ctx, key.Tenant, key.EnvelopeID)
	if err != nil || st.EnqueuedAt.IsZero() {
		return time.Time{}, false
	}
	return st.EnqueuedAt, true
}

func (a *app) close() error {
	if a.w != nil {
		a.w.Close()
	}
	err := a.q.Close()
	a.ledger.close()
	return err
}

// files returns the file store, nil when the store is in PostgreSQL.
func (a *app) files() *filestore.Queue {
	fq, _ := a.q.(*filestore.Queue)
	return fq
}

// seamReturner is a store that returns the seam's expired leases to
// pending by itself (the work a built-in worker's recoveries do).
type seamReturner interface {
	ReturnExpiredSeam(ctx context.Context) (int, error)
}

// runPruner prunes terminal rows past retention every interval until ctx ends.
func runPruner(ctx context.Context, q queue.Store, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n, err := q.Prune(ctx); err != nil {
				log.Error("prune failed", "operation", "prune", "status", "error")
			} else if n > 0 {
				log.Info("pruned", "operation", "prune", "status", "ok", "count", n)
			}
		}
	}
}
