package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outboxhq/outbox/channels/resend"
	"github.com/outboxhq/outbox/channels/wecom"
	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/channels/wecomreply"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/httpapi"
	"github.com/outboxhq/outbox/render"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"
)

func init() {
	register(&command{Name: "serve", Short: "run the HTTP seam and the delivery worker", Run: runServe})
}

// SocketName is the operator socket of a running serve, in the data directory.
const SocketName = "outbox.sock"

func rateLimit(perSecond float64) rate.Limit { return rate.Limit(perSecond) }

// serveFlags are serve's settings; demo reuses the store and provider ones.
type serveFlags struct {
	data, addr, publicURL, templates, subscriber, emailFrom, replyTo, resendURL, telegramURL, logFormat *string
	wecomAPI, wecomCorp, wecomAgent, wecomReplyHosts                                                    *string
	wecomDailyCap                                                                                       *int
	wecomBotReplies                                                                                     *bool
	noSink, relaxed, sinkJournal                                                                        *bool
	concurrency, maxAttempts                                                                            *int
	lease, backoffBase, backoffCap, retention, rescan, shutdown, resendPoll, seamLease                  *time.Duration
	maxBody, maxInflight, logRewriteMin                                                                 *int
	resendRate                                                                                          *int
	brand                                                                                               *brandFlags
	db                                                                                                  *dbFlags
	noMigrate                                                                                           *bool
}

func addServeFlags(s *settings) *serveFlags {
	f := &serveFlags{}
	f.data = dataFlag(s)
	f.addr = s.str("addr", "OUTBOX_ADDR", "127.0.0.1:8080", "HTTP listen address (port 0 picks a free one)")
	f.publicURL = s.str("public-url", "OUTBOX_PUBLIC_URL", "", "public base URL for unsubscribe links (default: the listen address)")
	f.noSink = s.boolean("no-sink", "OUTBOX_NO_SINK", false, "leave channels without a provider pending instead of writing them to the sink")
	f.concurrency = s.integer("concurrency", "OUTBOX_CONCURRENCY", 4, "provider calls in flight")
	f.lease = s.duration("lease", "OUTBOX_LEASE", 30*time.Second, "lease of a claimed delivery")
	f.maxAttempts = s.integer("max-attempts", "OUTBOX_MAX_ATTEMPTS", queue.DefaultMaxAttempts, "attempts before dead_letter")
	f.backoffBase = s.duration("backoff-base", "OUTBOX_BACKOFF_BASE", queue.DefaultBackoffBase, "first retry delay")
	f.backoffCap = s.duration("backoff-cap", "OUTBOX_BACKOFF_CAP", queue.DefaultBackoffCap, "longest retry delay")
	f.retention = s.duration("retention", "OUTBOX_RETENTION", queue.DefaultRetention, "how long terminal rows are kept")
	f.logRewriteMin = logRewriteFlag(s)
	f.rescan = s.duration("rescan", "OUTBOX_RESCAN_INTERVAL", filestore.DefaultRescanInterval, "how often every log is rescanned for missed appends")
	f.relaxed = s.boolean("relaxed-durability", "OUTBOX_RELAXED_DURABILITY", false, "skip fsync (a machine crash can lose acknowledged envelopes)")
	f.templates = s.str("templates", "OUTBOX_TEMPLATES", "", "directory of template overrides")
	f.subscriber = s.str("vapid-subject", "OUTBOX_VAPID_SUBJECT", "", "VAPID contact: an e-mail address or https URL (push)")
	f.emailFrom = s.str("email-from", "OUTBOX_EMAIL_FROM", "", "sender address of e-mails (Resend)")
	f.replyTo = s.str("email-reply-to", "OUTBOX_EMAIL_REPLY_TO", "", "Reply-To of e-mails")
	f.resendRate = s.integer("resend-rate", "OUTBOX_RESEND_RATE", 2, "Resend requests per second (per team)")
	f.resendPoll = s.duration("resend-poll", "OUTBOX_RESEND_POLL_INTERVAL", 5*time.Minute, "how often bounces/complaints are polled from Resend (0 = off)")
	f.resendURL = s.str("resend-api", "OUTBOX_RESEND_API", resend.DefaultBaseURL, "Resend API base URL")
	f.telegramURL = s.str("telegram-api", "OUTBOX_TELEGRAM_API", "https://api.telegram.org", "Telegram Bot API base URL")
	f.wecomAPI = s.str("wecom-api", "OUTBOX_WECOM_API", wxapi.DefaultBaseURL, "WeCom API base URL (application messages and group robots)")
	f.wecomCorp = s.str("wecom-corp-id", "OUTBOX_WECOM_CORP_ID", "", "WeCom corp id (application messages; the secret is OUTBOX_WECOM_SECRET)")
	f.wecomAgent = s.str("wecom-agent-id", "OUTBOX_WECOM_AGENT_ID", "", "WeCom application agentid")
	f.wecomDailyCap = s.integer("wecom-daily-cap", "OUTBOX_WECOM_DAILY_CAP", wecom.DefaultDailyCap, "WeCom person-messages per application and day (your account cap × 200)")
	f.wecomBotReplies = s.boolean("wecom-bot-replies", "OUTBOX_WECOM_BOT_REPLIES", false, "deliver wecom_bot_reply envelopes to their response_url (else the sink)")
	f.wecomReplyHosts = s.str("wecom-bot-reply-hosts", "OUTBOX_WECOM_BOT_REPLY_HOSTS", wecomreply.DefaultHost, "hosts a response_url may point to, comma-separated")
	f.shutdown = s.duration("shutdown-timeout", "OUTBOX_SHUTDOWN_TIMEOUT", 10*time.Second, "bound on draining in-flight deliveries at shutdown")
	f.maxBody = s.integer("max-body", "OUTBOX_MAX_BODY", 1<<20, "largest request body in bytes")
	f.maxInflight = s.integer("max-inflight", "OUTBOX_MAX_INFLIGHT", httpapi.DefaultMaxInflight,
		"bytes of request bodies handled at once; a request past it gets 503 with Retry-After (-1 = no bound)")
	f.seamLease = s.duration("seam-lease", "OUTBOX_SEAM_LEASE", 5*time.Minute, "lease of envelopes handed out by /internal/outbox/pending")
	f.logFormat = s.str("log-format", "OUTBOX_LOG_FORMAT", "text", "log format: text or json")
	f.brand = addBrandFlags(s)
	f.sinkJournal = s.boolean("sink-journal", "OUTBOX_SINK_JOURNAL", false, "the sink also appends each delivered key's hash to DATA/sink/CHANNEL.journal (used by the kill drill)")
	f.db = addDBFlags(s)
	f.noMigrate = s.boolean("no-migrate", "OUTBOX_NO_MIGRATE", false, "PostgreSQL: refuse a schema that is not migrated (outbox migrate) instead of migrating it on start")
	return f
}

func (f *serveFlags) appConfig(log *slog.Logger, reg *prometheus.Registry, publicURL string, brand render.Brand) appConfig {
	return appConfig{
		Data: *f.data, PublicURL: publicURL, NoSink: *f.noSink, Concurrency: *f.concurrency, Lease: *f.lease,
		Backoff:   queue.Backoff{Base: *f.backoffBase, Cap: *f.backoffCap, MaxAttempts: *f.maxAttempts},
		Retention: *f.retention, LogRewriteMin: int64(*f.logRewriteMin), Rescan: *f.rescan, Relaxed: *f.relaxed, TemplatesDir: *f.templates,
		Subscriber: *f.subscriber, EmailFrom: *f.emailFrom, EmailReplyTo: *f.replyTo,
		ResendRate: float64(*f.resendRate), ResendPoll: *f.resendPoll, ResendURL: *f.resendURL, TelegramURL: *f.telegramURL,
		WeCom: weComConfig{API: *f.wecomAPI, CorpID: *f.wecomCorp, AgentID: *f.wecomAgent, DailyCap: *f.wecomDailyCap,
			BotReplies: *f.wecomBotReplies, ReplyHosts: *f.wecomReplyHosts},
		Shutdown: *f.shutdown, SinkJournal: *f.sinkJournal, Logger: log, Registry: reg, Brand: brand,
		DatabaseSchema: *f.db.schema, NoMigrate: *f.noMigrate,
	}
}

// serveRegistry is the registry /metrics serves, before the app adds the
// store's and the worker's metrics.
func serveRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

func newLogger(e *env, format string) *slog.Logger {
	var h slog.Handler
	if format == "json" {
		h = slog.NewJSONHandler(e.Stderr, nil)
	} else {
		h = slog.NewTextHandler(e.Stderr, nil)
	}
	return slog.New(h)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

const serveHelp = `Usage: outbox serve [flags]

Runs the HTTP seam (POST /v1/envelopes, the /internal/outbox seam, consent,
unsubscribe, push subscriptions, /metrics, /healthz, /readyz) and the
delivery worker on the store in --data, or with --database-url on the
PostgreSQL store (several serves may share one database; --data then
holds only the unsubscribe key and the sink). Providers start when their
configuration is present; channels without one go to the sink (files under
DATA/sink) unless --no-sink.

Secrets come only from the environment (or NAME_FILE paths), never flags:
  INTERNAL_OUTBOX_TOKEN      bearer token for /v1 and /internal (required off loopback)
  OUTBOX_VAPID_PUBLIC_KEY, OUTBOX_VAPID_PRIVATE_KEY   Web Push (with --vapid-subject)
  RESEND_API_KEY             email (with --email-from)
  RESEND_WEBHOOK_SECRET      serves POST /webhooks/resend (with or without RESEND_API_KEY)
  OUTBOX_TELEGRAM_TOKEN      telegram
  OUTBOX_DATABASE_URL        PostgreSQL (or --database-url, which shows in ps)

Flags:
`

func runServe(ctx context.Context, e *env, args []string) int {
	s := newSettings("serve", e)
	s.usage(serveHelp)
	f := addServeFlags(s)
	if code, done := s.parse(args); done {
		return code
	}
	log := newLogger(e, *f.logFormat)
	brand, err := f.brand.brand()
	if err != nil {
		fmt.Fprintf(e.Stderr, "Error: %v\n", err)
		return exitUsage
	}
	dsn, err := f.db.dsn(e)
	if err != nil {
		return fail(e, "%v", err)
	}
	if dsn != "" && *f.relaxed {
		return fileOnly(e, "--relaxed-durability")
	}
	tokens, tokFile, err := serveTokens(e)
	if err != nil {
		return fail(e, "%v", err)
	}
	host, _, err := net.SplitHostPort(*f.addr)
	if err != nil {
		fmt.Fprintf(e.Stderr, "Error: --addr %q is not host:port\n", *f.addr)
		return exitUsage
	}
	var tokenSet *httpapi.Tokens
	if len(tokens) > 0 {
		if tokenSet, err = httpapi.NewTokens(tokens...); err != nil {
			return fail(e, "%v", err)
		}
	} else {
		if !isLoopback(host) {
			return fail(e, "refusing to listen on %s without INTERNAL_OUTBOX_TOKEN: set it (or INTERNAL_OUTBOX_TOKEN_FILE), or listen on 127.0.0.1", *f.addr)
		}
		log.Warn("INTERNAL_OUTBOX_TOKEN is not set: /v1 and /internal are not served", "operation", "serve", "status", "degraded")
	}
	ln, err := net.Listen("tcp", *f.addr)
	if err != nil {
		return fail(e, "listen: %v", err)
	}
	defer ln.Close()
	public := strings.TrimRight(*f.publicURL, "/")
	if public == "" {
		public = "http://" + ln.Addr().String()
	}

	reg := serveRegistry()
	cfg := f.appConfig(log, reg, public, brand)
	cfg.DatabaseURL = dsn
	fresh := dsn == "" && neverOpened(cfg.Data)
	a, err := buildApp(e, cfg)
	if err != nil {
		var inUse *filestore.StoreInUseError
		if errors.As(err, &inUse) {
			return fail(e, "%v", err)
		}
		return fail(e, "%v", err)
	}
	defer a.close()
	if dsn != "" {
		log.Info("store: PostgreSQL, schema "+cfg.DatabaseSchema, "operation", "serve")
		if !neverOpened(cfg.Data) {
			log.Warn("the data directory "+cfg.Data+" holds a file store too: a serve on PostgreSQL does not deliver its envelopes; drain it with a serve without --database-url, then move it away", "operation", "serve", "status", "file_store_beside")
		}
	} else {
		logFileStore(ctx, log, a.q, cfg.Data, fresh)
	}
	for _, d := range a.described {
		log.Info("channel "+d, "operation", "serve")
	}
	if a.webhook != nil {
		if _, viaResend := a.providers[envelope.ChannelEmail].(*resend.Provider); viaResend {
			log.Info("resend webhook: POST /webhooks/resend (bounces and complaints suppress addresses)", "operation", "serve")
		} else {
			log.Info("resend webhook: POST /webhooks/resend (bounces and complaints suppress addresses); RESEND_API_KEY is not set, so this daemon sends no e-mail through Resend and polls no bounces", "operation", "serve")
		}
	}

	api, err := httpapi.New(httpapi.Config{
		Store: a.q, Tokens: tokenSet, MaxBody: int64(*f.maxBody), MaxInflight: int64(*f.maxInflight), Logger: log, Unsub: a.unsub, Brand: brand,
		VAPIDPublicKey: a.vapidPub, SeamLease: *f.seamLease,
		Ready: func() bool { return ready(a.q) },
	})
	if err != nil {
		return fail(e, "%v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if a.webhook != nil {
		mux.Handle("POST /webhooks/resend", a.webhook)
	}
	mux.Handle("/", api)
	srv := newHTTPServer(mux, log)

	// The operator socket: the operator commands, trusted by file
	// permissions. On PostgreSQL they reach the database themselves.
	var sock net.Listener
	var opSrv *http.Server
	if fq := a.files(); fq != nil {
		if sock, err = listenOperator(*f.data); err != nil {
			return fail(e, "%v", err)
		}
		defer os.Remove(filepath.Join(*f.data, SocketName))
		opSrv = newHTTPServer(operatorHandler(&directBackend{q: fq}), log)
	}

	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	var bg sync.WaitGroup // the goroutines that use the store: ended before it is closed
	workerDone := make(chan error, 1)
	if a.w != nil {
		bg.Go(func() { workerDone <- a.w.Run(runCtx) })
	} else {
		log.Info("no provider for any channel: the built-in worker is off; rows wait for /internal/outbox/pending", "operation", "serve")
		workerDone <- nil
		bg.Go(func() {
			t := time.NewTicker(max(*f.seamLease/10, time.Second))
			defer t.Stop()
			for {
				select {
				case <-runCtx.Done():
					return
				case <-t.C:
					if r, ok := a.q.(seamReturner); ok {
						_, _ = r.ReturnExpiredSeam(runCtx)
					}
				}
			}
		})
	}
	if a.poller != nil {
		bg.Go(func() { _ = a.poller.Run(runCtx) })
	}
	bg.Go(func() { runPruner(runCtx, a.q, time.Hour, log) })
	if tokFile.path != "" && tokenSet != nil {
		bg.Go(func() { watchTokens(runCtx, tokFile, tokenSet, log) })
	}
	srvErr := make(chan error, 2)
	go func() { srvErr <- srv.Serve(ln) }()
	if opSrv != nil {
		go func() { srvErr <- opSrv.Serve(sock) }()
		bg.Go(func() { keepSocket(runCtx, *f.data, opSrv, log) })
	}
	fmt.Fprintf(e.Stderr, "listening on http://%s\n", ln.Addr())

	var damaged <-chan struct{} // the file store's index damaged under it; never on PostgreSQL
	if fq := a.files(); fq != nil {
		damaged = fq.Damaged()
	}
	code := exitOK
	select {
	case <-ctx.Done():
	case <-damaged:
		log.Error("stopping: "+a.files().DamageError().Error(), "operation", "serve", "status", "damaged")
		code = exitFailure
	case err := <-srvErr:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server failed", "operation", "serve", "status", "error")
			code = exitFailure
		}
	}
	// A second signal exits at once.
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(again)
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-again:
			fmt.Fprintln(e.Stderr, "second signal: exiting now")
			os.Exit(exitFailure)
		case <-stopped:
		}
	}()
	log.Info("shutting down", "operation", "serve", "status", "stopping")
	shCtx, cancel := context.WithTimeout(context.Background(), *f.shutdown)
	defer cancel()
	_ = srv.Shutdown(shCtx)
	if opSrv != nil {
		_ = opSrv.Shutdown(shCtx)
	}
	stopRun()
	if err := <-workerDone; err != nil && !errors.Is(err, context.Canceled) {
		log.Warn("worker stopped with in-flight deliveries left for reconciliation", "operation", "serve", "status", "timeout")
	}
	bg.Wait()
	if err := a.close(); err != nil {
		log.Error("close store failed", "operation", "serve", "status", "error")
		code = exitFailure
	}
	log.Info("stopped", "operation", "serve", "status", "ok")
	return code
}

func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		// net/http's own messages (accept errors: too many open files)
		// in the service's log format, not as bare lines beside it.
		ErrorLog:          slog.NewLogLogger(log.With("operation", "http").Handler(), slog.LevelWarn),
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		// Longer than the API's bound on a request's store calls
		// (httpapi.DefaultStoreTimeout), so that its 503 reaches the client.
		WriteTimeout:   httpapi.DefaultStoreTimeout + 20*time.Second,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
	}
}

// listenOperator listens on DATA/outbox.sock with mode 0600: only the data
// directory's owner can connect, which is the socket's authentication. A
// stale socket is removed; a symbolic link or any other file under that
// name is refused, never followed or replaced. The mode comes from the
// umask at bind(2) and is checked with lstat (a chmod by name would follow
// a link put in the socket's place).
func listenOperator(dir string) (net.Listener, error) {
	path := filepath.Join(dir, SocketName)
	switch fi, err := os.Lstat(path); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("operator socket: %w", err)
	case fi.Mode()&os.ModeSymlink != 0:
		return nil, fmt.Errorf("operator socket: %w", errSocketLink(path))
	case fi.Mode()&os.ModeSocket == 0:
		return nil, fmt.Errorf("operator socket: %s exists and is not a socket: remove it", path)
	default:
		_ = os.Remove(path) // a stale socket of an earlier serve
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("operator socket: %w", err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm()&0o077 != 0 {
		ln.Close()
		return nil, fmt.Errorf("operator socket: %s is not the socket just created with mode 0600", path)
	}
	return ln, nil
}

// socketCheckInterval is how often serve checks that its operator socket
// is still there.
const socketCheckInterval = 2 * time.Second

// keepSocket makes the operator socket again when it was removed under
// the running serve (a clean-up of the data directory): the operator
// commands would otherwise find the store in use and no serve to ask. The
// old listener is left open (closing it would unlink the new socket); the
// server's shutdown closes both.
func keepSocket(ctx context.Context, dir string, srv *http.Server, log *slog.Logger) {
	t := time.NewTicker(socketCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := os.Lstat(filepath.Join(dir, SocketName)); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		ln, err := listenOperator(dir)
		if err != nil {
			log.Warn("the operator socket was removed under the running serve, and cannot be made again", "operation", "serve", "status", "error")
			continue
		}
		log.Warn("the operator socket was removed under the running serve: made again", "operation", "serve", "status", "socket_restored")
		go func() { _ = srv.Serve(ln) }()
	}
}

// errSocketLink is the refusal of an operator socket path that is a
// symbolic link.
func errSocketLink(path string) error {
	return fmt.Errorf("%s is a symbolic link: outbox never follows links inside its data directory (remove it)", path)
}

// operatorSocket returns the path of dir's operator socket for a client
// to dial, or an error when that path is a symbolic link: a link could
// lead the operator commands to another store's daemon, or anywhere.
func operatorSocket(dir string) (string, error) {
	path := filepath.Join(dir, SocketName)
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return "", errSocketLink(path)
	}
	return path, nil
}

// ready is /readyz's answer: whether the store can serve calls now (the
// database answers; the file store is open and its index not damaged).
func ready(q queue.Store) bool {
	p, ok := q.(interface{ Ping(context.Context) error })
	if !ok {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return p.Ping(ctx) == nil
}

// logFileStore says at start which store serve opened and what waits in
// it, so that a --data mistyped (a new, empty store beside the real one)
// shows in the first lines of the log.
func logFileStore(ctx context.Context, log *slog.Logger, q queue.Store, dir string, fresh bool) {
	c, err := q.Counts(ctx, "")
	if err != nil {
		return
	}
	var n int
	for _, byChannel := range c {
		for _, k := range byChannel {
			n += k
		}
	}
	if fresh && n == 0 {
		log.Info("store: files in "+dir+": a new, empty store (if one was expected there, check --data)", "operation", "serve")
		return
	}
	log.Info(fmt.Sprintf("store: files in %s: %d pending, %d retryable, %d unresolved, %d dead_letter",
		dir, c.Total(envelope.StatePending), c.Total(envelope.StateRetryable), c.Total(envelope.StateUnresolved), c.Total(envelope.StateDeadLetter)),
		"operation", "serve")
}
