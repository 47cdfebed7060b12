// Package pgstore is the PostgreSQL implementation of queue.Store: the same
// contract as the file store, on a database that several outbox processes
// share.
//
// Every row change is computed by the state machine in package queue: a
// method locks the envelope it changes (SELECT … FOR UPDATE, or FOR UPDATE
// SKIP LOCKED for claims and recoveries), reads its rows again in a new
// statement, so with a snapshot taken after the lock, calls the machine and
// writes back the rows the step changed, each UPDATE guarded by the state
// and fence it read (a row that changed anyway fails the transaction instead
// of being overwritten). Enqueue batches are one transaction; idempotency is
// the primary key (tenant, id); fences come from a sequence.
//
// The store keeps its tables in a schema of its own (Options.Schema, default
// "outbox"), created and upgraded by the embedded migrations (Migrate).
// Wake-ups across processes are a hint: a throttled NOTIFY after a change
// that makes a row claimable, a LISTEN connection that reconnects, and the
// worker's own polling; the claim itself is always authoritative.
package pgstore

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxhq/outbox/queue"
)

// Default option values.
const (
	DefaultNotifyInterval = 2 * time.Millisecond
	listenRetryMin        = 50 * time.Millisecond
	listenRetryMax        = 5 * time.Second
)

// Options configures the PostgreSQL store: the options every store takes
// (queue.Options) and its own. A nil *Options means all defaults.
type Options struct {
	queue.Options

	// Schema is the schema the store's tables live in (default "outbox"):
	// lower-case letters, digits and _.
	Schema string
	// NoMigrate makes Open refuse a schema that is not at this version
	// (ErrNotMigrated) instead of migrating it.
	NoMigrate bool
	// NotifyInterval is the shortest time between two NOTIFYs this store
	// sends (default 2ms); changes in between are announced once, after it.
	NotifyInterval time.Duration

	// MarkFile, when set, is where the store records the queue's identity
	// and the highest numbers it drew from its sequences (serve keeps it
	// in its data directory): Open refuses a database behind them, one
	// restored from a backup, with a *RestoredError. A running store
	// refuses one from the first number it draws there, with or without.
	MarkFile string

	hostNow  func() time.Time     // this host's clock for checkClock (a test's)
	onListen func(signalled bool) // the listener's test hook (Store.onListen)
}

// Store is a queue.Store on PostgreSQL. Open one with Open or OpenPool.
type Store struct {
	pool      *pgxpool.Pool
	ownPool   bool
	schema    string // the schema's name
	prefix    string // its quoted name and a dot, for table names
	channel   string // the LISTEN/NOTIFY channel
	self      string // this store's NOTIFY payload: its listener ignores its own
	now       func() time.Time
	skew      atomic.Int64     // the database server's clock minus this host's, ns (checkClock)
	hostNow   func() time.Time // this host's clock, against the database's
	markFile  string
	instance  string // the schema's instance id
	drawn     drawn
	restored  atomic.Pointer[RestoredError] // the database went back under the store
	suspect   atomic.Pointer[RestoredError] // a sequence went back: restored, or a new schema? (settle)
	backoff   queue.Backoff
	retention time.Duration
	source    queue.ConsentSource
	log       *slog.Logger
	interval  time.Duration
	metrics   *storeMetrics

	notify   chan struct{}        // Notify's channel
	onListen func(signalled bool) // a test's: each notification the listener gets
	hint     chan struct{}        // to the notifier: send a NOTIFY
	enq      *group[*enqCall]     // groups concurrent Enqueue calls
	commits  *group[*commitCall]  // groups concurrent Commit calls

	closed    atomic.Bool
	closeOnce sync.Once
	stop      context.CancelFunc
	wg        sync.WaitGroup
}

var _ queue.Store = (*Store)(nil)

// DefaultStatementTimeout bounds every statement of a store opened by Open
// or Connect, unless the DSN sets statement_timeout itself.
const DefaultStatementTimeout = "30s"

// DefaultIdleInTransactionTimeout ends a session of a store opened by Open
// or Connect that stays idle inside a transaction this long, unless the
// DSN sets idle_in_transaction_session_timeout itself. A process paused
// mid-transaction (SIGSTOP, a suspended VM, a network partition) holds its
// envelopes' row locks until then, and claims and recoveries skip locked
// envelopes: without a bound its leases would never be recovered while it
// stays paused. The store's own transactions are never idle for more than
// a round trip; one ended this way is rolled back whole.
const DefaultIdleInTransactionTimeout = "5s"

// Open connects to the database at dsn (a PostgreSQL URL or key=value
// string; pgxpool settings such as pool_max_conns apply), migrates the
// schema unless opts.NoMigrate, and returns the store, which owns the pool
// and closes it on Close. Errors never repeat the DSN.
func Open(ctx context.Context, dsn string, opts *Options) (*Store, error) {
	pool, err := Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	s, err := open(ctx, pool, true, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Connect opens a pool on the database at dsn and checks that it answers,
// without touching any schema (for the tools that look before they
// migrate). Its errors never repeat the DSN.
func Connect(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, safeErr("open", err)
	}
	// A statement that waits for ever (behind a lock a stuck session
	// holds, on a server in trouble) would hold a worker slot or an HTTP
	// request for ever; the DSN may set another bound (0: none).
	if _, set := cfg.ConnConfig.RuntimeParams["statement_timeout"]; !set {
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = DefaultStatementTimeout
	}
	if _, set := cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"]; !set {
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = DefaultIdleInTransactionTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, safeErr("open", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, safeErr("open", err)
	}
	return pool, nil
}

// OpenPool is Open on a pool the caller owns: Close leaves it open. The
// store also opens one connection of its own (from the pool's
// configuration) for LISTEN. The pool's settings are the caller's: set
// statement_timeout and idle_in_transaction_session_timeout in its
// configuration (see DefaultStatementTimeout and
// DefaultIdleInTransactionTimeout for why).
func OpenPool(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: nil pool")
	}
	return open(ctx, pool, false, opts)
}

func open(ctx context.Context, pool *pgxpool.Pool, own bool, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	q := o.Options.WithDefaults()
	schema, err := checkSchema(o.Schema)
	if err != nil {
		return nil, err
	}
	if o.NoMigrate {
		err = checkVersion(ctx, pool, schema)
	} else {
		_, err = Migrate(ctx, pool, schema)
	}
	if err != nil {
		return nil, err
	}
	if o.NotifyInterval <= 0 {
		o.NotifyInterval = DefaultNotifyInterval
	}
	s := &Store{
		pool:      pool,
		ownPool:   own,
		schema:    schema,
		prefix:    pgx.Identifier{schema}.Sanitize() + ".",
		channel:   "outbox_wake_" + schema,
		self:      uuid.NewString(),
		now:       q.Now, // a test's clock; else the server's (below)
		backoff:   q.Backoff,
		retention: q.Retention,
		source:    q.Consent,
		log:       q.Logger,
		interval:  o.NotifyInterval,
		metrics:   newStoreMetrics(q.Registerer),
		notify:    make(chan struct{}, 1),
		hint:      make(chan struct{}, 1),
		onListen:  o.onListen,
	}
	s.enq, s.commits = s.enqueuer(), s.committer()
	if s.hostNow = o.hostNow; s.hostNow == nil {
		s.hostNow = time.Now
	}
	if o.Options.Now == nil {
		s.now = func() time.Time { return s.hostNow().Add(time.Duration(s.skew.Load())) }
	}
	bg, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.markFile = o.MarkFile
	if err := s.checkMark(ctx); err != nil {
		stop()
		return nil, err
	}
	s.checkClock(ctx)
	s.wg.Add(4)
	go s.listen(bg)
	go s.notifier(bg)
	go s.watchClock(bg)
	go s.markLoop(bg)
	return s, nil
}

// MaxClockSkew is how far this host's clock may be from the database
// server's before the store warns. The store judges leases, backoff and
// expiry by the server's clock (this host's, corrected by the skew last
// measured), so that processes on hosts whose clocks differ by more than
// a lease do not take over each other's live leases; the rest of the
// process (logs, metrics, the HTTP seam's checks) keeps the host's.
const MaxClockSkew = time.Second

// clockEvery is how often the skew is measured again: a step of this
// host's clock (NTP) misleads the store's clock until then.
const clockEvery = 30 * time.Second

// Now is the store's clock: the database server's, as this host
// estimates it (or the clock queue.Options.Now gave). A worker on this
// store takes it as its worker.Config.Now.
func (s *Store) Now() time.Time { return s.now() }

// checkClock measures the database server's clock against this host's,
// corrects the store's clock by it, sets the gauge and warns past
// MaxClockSkew.
func (s *Store) checkClock(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	t0 := s.hostNow()
	var db time.Time
	if err := s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&db); err != nil {
		return // a store call says what is wrong with the database
	}
	t1 := s.hostNow()
	skew := db.Sub(t0.Add(t1.Sub(t0) / 2))
	s.skew.Store(int64(skew))
	s.metrics.clockSkew.Set(skew.Seconds())
	if skew > MaxClockSkew || skew < -MaxClockSkew {
		s.log.LogAttrs(ctx, slog.LevelWarn, "this host's clock is not the database server's: the store corrects its own by the difference, measured every 30 s; keep every host's clock in sync (NTP), for the logs and for a step between two measurements",
			slog.String("operation", "clock"), slog.String("status", "skewed"), slog.Duration("database_ahead_by", skew.Round(time.Millisecond)))
	}
}

// watchClock runs checkClock every clockEvery.
func (s *Store) watchClock(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(clockEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.checkClock(ctx)
		}
	}
}

// Pool returns the store's connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Schema returns the schema the store's tables are in.
func (s *Store) Schema() string { return s.schema }

// sql returns query with every "{s}." replaced by the store's schema.
func (s *Store) sql(query string) string { return strings.ReplaceAll(query, "{s}.", s.prefix) }

// check reports ErrClosed and the context's error before any work.
func (s *Store) check(ctx context.Context) error {
	if s.closed.Load() {
		return queue.ErrClosed
	}
	if r := s.restored.Load(); r != nil {
		return r
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.settle(ctx)
}

// inTx runs fn in a transaction (READ COMMITTED) and names op in its error.
func (s *Store) inTx(ctx context.Context, op string, fn func(pgx.Tx) error) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return safeErr(op, pgx.BeginFunc(ctx, s.pool, fn))
}

// dbtx is what the statements of a transaction go through: a pgx.Tx or a
// pipe.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// pipe is a transaction (READ COMMITTED) on one connection whose BEGIN
// goes in the round trip of its first batch, and its COMMIT in that of
// its last (commitWith): two round trips fewer than pgx.BeginFunc.
//
// Its statements look rows up by key (or walk an index in order, the
// claim's candidates), a few at a time, and run often: each is planned
// once per connection (a generic plan), and only index-driven plans are
// allowed, since a generic plan made while a table was small would scan
// it whole for as long as the connection lives (planning a custom plan
// each time cost more server CPU than running them).
type pipe struct {
	conn     *pgxpool.Conn
	settings string // the statement after BEGIN: pipeSettings or claimSettings
	begun    bool
	done     bool     // committed or rolled back
	drawn    []func() // to run once the transaction committed (what it drew)
}

var _ dbtx = (*pipe)(nil)

// inPipe is inTx on a pipe. fn may end the transaction itself with
// commitWith; otherwise inPipe commits it.
func (s *Store) inPipe(ctx context.Context, op, settings string, fn func(*pipe) error) error {
	return safeErr(op, s.runPipe(ctx, settings, fn))
}

// readParts runs parts in a pipe of one round trip: BEGIN, the parts,
// COMMIT.
func (s *Store) readParts(ctx context.Context, parts ...batchPart) error {
	return s.runPipe(ctx, pipeSettings, func(p *pipe) error { return p.commitWith(ctx, parts...) })
}

func (s *Store) runPipe(ctx context.Context, settings string, fn func(*pipe) error) error {
	err := s.runPipeOnce(ctx, settings, fn)
	if errors.Is(err, errSequenceBack) {
		// Rolled back; once settled (a schema made afresh), once more.
		if err := s.settle(ctx); err != nil {
			return err
		}
		err = s.runPipeOnce(ctx, settings, fn)
	}
	return err
}

func (s *Store) runPipeOnce(ctx context.Context, settings string, fn func(*pipe) error) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // a connection left in a transaction is closed, not reused
	p := &pipe{conn: conn, settings: settings}
	if err = fn(p); err == nil && !p.done {
		err = p.commitWith(ctx)
	}
	if err != nil {
		p.rollback()
		return err
	}
	for _, f := range p.drawn {
		f()
	}
	return nil
}

// pipeSettings are the planner settings of a pipe's transaction.
const pipeSettings = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
	set_config('enable_mergejoin', 'off', true)`

// claimSettings are those of a claim or recovery, whose due rows must
// come from the index in its order whatever the statistics say (with too
// low an estimate, on a table that grew since its last ANALYZE, it sorted
// every due row, per claim): no sort, no bitmap scan. Its other
// statements need no order.
const claimSettings = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
	set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
	set_config('enable_mergejoin', 'off', true), set_config('enable_sort', 'off', true),
	set_config('enable_bitmapscan', 'off', true)`

// begin starts the transaction on its own, for a statement that is not a
// batch.
func (p *pipe) begin(ctx context.Context) error {
	if p.begun {
		return nil
	}
	return p.SendBatch(ctx, &pgx.Batch{}).Close()
}

func (p *pipe) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := p.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return p.conn.Exec(ctx, sql, args...)
}

func (p *pipe) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := p.begin(ctx); err != nil {
		return nil, err
	}
	return p.conn.Query(ctx, sql, args...)
}

func (p *pipe) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := p.begin(ctx); err != nil {
		return errRow{err}
	}
	return p.conn.QueryRow(ctx, sql, args...)
}

// SendBatch sends b, after BEGIN in the same round trip when it is the
// transaction's first.
func (p *pipe) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if p.begun {
		return p.conn.SendBatch(ctx, b)
	}
	p.begun = true
	first := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: "begin"}, {SQL: p.settings}}, b.QueuedQueries...)}
	br := p.conn.SendBatch(ctx, first)
	for range 2 {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return pgx.FailedBatchResults(b, err)
		}
	}
	return br
}

// commitWith sends parts and COMMIT in one round trip and reads the
// parts' results. A part that fails leaves the transaction failed: the
// COMMIT then rolls it back, and commitWith returns the part's error.
func (p *pipe) commitWith(ctx context.Context, parts ...batchPart) error {
	if p.done {
		return errors.New("pgstore: transaction already ended")
	}
	p.done = true
	if !p.begun && len(parts) == 0 {
		return nil // no statement ran
	}
	var b pgx.Batch
	for _, pt := range parts {
		pt.queue(&b)
	}
	b.Queue("commit")
	br := p.SendBatch(ctx, &b)
	for _, pt := range parts {
		if err := pt.read(br); err != nil {
			br.Close()
			return err
		}
	}
	tag, err := br.Exec()
	if err == nil {
		err = br.Close()
	} else {
		br.Close()
	}
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	return err
}

// rollback ends a failed transaction; a connection it cannot clean is
// closed when released.
func (p *pipe) rollback() {
	if !p.begun || p.conn.Conn().PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = p.conn.Exec(ctx, "rollback")
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// Notify returns a channel (buffer 1, coalesced) that receives a value
// whenever rows may have become claimable: a change by this store, a
// NOTIFY from another process on the same schema, or a reconnect of the
// LISTEN connection (whatever was announced while it was down).
func (s *Store) Notify() <-chan struct{} { return s.notify }

// wake signals Notify and asks the notifier to tell the other processes.
func (s *Store) wake() {
	s.local()
	select {
	case s.hint <- struct{}{}:
	default:
	}
}

func (s *Store) local() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// notifier sends a NOTIFY for the hints it gets, at most one per interval:
// a hint during the wait is announced after it, never dropped, and one
// still held at Close is sent then (a process that enqueues and exits at
// once would otherwise leave the others to find the rows by polling).
func (s *Store) notifier(ctx context.Context) {
	defer s.wg.Done()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			s.flushHint(false)
			return
		case <-s.hint:
		}
		if d := s.interval - time.Since(last); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				s.flushHint(true)
				return
			case <-t.C:
			}
		}
		select { // hints of the wait go with this NOTIFY
		case <-s.hint:
		default:
		}
		last = time.Now()
		s.sendNotify()
	}
}

// notifyTimeout bounds one NOTIFY; Close does not cancel one under way
// (that dropped the last enqueue's wake-up of a process that exits).
const notifyTimeout = 2 * time.Second

func (s *Store) sendNotify() {
	ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
	defer cancel()
	if _, err := s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, s.channel, s.self); err != nil {
		s.log.LogAttrs(ctx, slog.LevelDebug, "notify failed", slog.String("operation", "notify"), slog.String("error", safeErr("notify", err).Error()))
	}
}

// flushHint sends the NOTIFY of a hint still held at Close (held: one was
// taken from the channel already).
func (s *Store) flushHint(held bool) {
	select {
	case <-s.hint:
	default:
		if !held {
			return
		}
	}
	s.sendNotify()
}

// listen keeps a connection that LISTENs on the store's channel and turns
// each notification into a Notify signal; on a lost connection it signals
// once (the worker looks) and reconnects with a growing pause.
func (s *Store) listen(ctx context.Context) {
	defer s.wg.Done()
	pause := listenRetryMin
	for ctx.Err() == nil {
		connected := false
		err := s.listenOnce(ctx, func() { pause, connected = listenRetryMin, true })
		if ctx.Err() != nil {
			return
		}
		msg := "listen connection lost, reconnecting"
		if !connected {
			// Never made: a wrong setting or a server out of connections,
			// not a blip. Other processes' wake-ups wait for the rescan.
			msg = "listen connection could not be made, retrying (wake-ups from other processes wait for the worker's rescan meanwhile)"
		}
		s.log.LogAttrs(ctx, slog.LevelWarn, msg, slog.String("operation", "listen"),
			slog.String("error", safeErr("listen", err).Error()), slog.Duration("retry_in", pause))
		s.metrics.listenReconnects.Inc()
		s.local()
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, listenRetryMax)
	}
}

func (s *Store) listenOnce(ctx context.Context, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(c)
	}()
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return err
	}
	connected()
	s.local() // whatever was announced before
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		// This store signalled Notify when it asked for its own NOTIFY:
		// another signal would cost the worker a turn that finds nothing.
		// Processes before this payload sent an empty one.
		own := n.Payload == s.self
		if !own {
			s.local()
		}
		if s.onListen != nil {
			s.onListen(!own)
		}
	}
}

// Close stops the store's goroutines and, when Open made the pool, closes
// it; every later call returns queue.ErrClosed. Closing again returns nil.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.stop()
		s.wg.Wait()
		if s.ownPool {
			s.pool.Close()
		}
	})
	return nil
}

// Ping reports whether the store can serve calls (a readiness check): the
// database answers, the store's schema is there and it accepts writes.
// It returns nil, or the error, as every other call's, without the DSN.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	// The schema too: one dropped under the store fails every call. And
	// writes: a standby (the URL still naming a primary that failed over)
	// answers every read and refuses every write.
	var (
		v        *int
		readOnly string
	)
	err := s.pool.QueryRow(ctx, s.sql(`SELECT max(version), current_setting('transaction_read_only') FROM {s}.migrations`)).Scan(&v, &readOnly)
	if err == nil && readOnly == "on" {
		err = &pgconn.PgError{Code: "25006"}
	}
	return safeErr("ping", err)
}
