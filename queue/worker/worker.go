package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/time/rate"
)

// Internal timing.
const (
	// storeOpTimeout bounds a commit or release made after a provider call,
	// on a context that survives Run's cancellation.
	storeOpTimeout = 10 * time.Second
	// staleWaitMin and the rescan interval bound the wait when the store's
	// next due time has passed but nothing of this worker's was claimable
	// (rows of another tenant or of a channel without a provider).
	staleWaitMin = 100 * time.Millisecond
	// maxHints bounds the due times the worker remembers itself.
	maxHints = 256
	// errWaitMax caps the back-off after a failing store call.
	errWaitMax = 30 * time.Second
	// exhaustedWaitMax caps it when the call failed for a passing shortage
	// of the process's (open files, memory: queue.Exhausted): it is over
	// as soon as the burst that caused it is.
	exhaustedWaitMax = time.Second
)

// leaser is the part of the store the delivery path uses: a queue.Store,
// or a tenant-scoped *queue.Tenant that rejects another tenant's leases.
type leaser interface {
	Claim(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error)
	Recover(ctx context.Context, req queue.ClaimRequest) ([]*queue.Lease, error)
	Commit(ctx context.Context, l *queue.Lease, out queue.Outcome) error
	Release(ctx context.Context, l *queue.Lease) error
}

// Worker delivers a store's rows through providers (see the package doc).
// Its methods are safe for concurrent use.
type Worker struct {
	cfg          Config
	store        queue.Store
	leases       leaser
	providers    map[envelope.Channel]channels.Provider
	names        map[envelope.Channel]string // provider names, for labels
	channels     []envelope.Channel          // configured, in envelope.Channels order
	unconfigured []envelope.Channel
	limiters     map[envelope.Channel]*rate.Limiter
	paused       pauses // channels whose provider refused the credentials
	metrics      *metrics
	tracer       trace.Tracer
	log          *slog.Logger
	now          func() time.Time
	rescan       time.Duration
	idem         map[envelope.Channel]bool // per channel: its provider redelivers idempotently
	oneService   map[envelope.Channel]bool // per channel: its provider serves every row from one service (pauses)

	slots chan struct{} // one token per task in flight
	tasks chan struct{} // a task freed its slot or recorded a due time (coalesced)
	kick  chan struct{} // wake the loop (coalesced)
	wg    sync.WaitGroup

	flights flights // delivery tasks running, for the recovery of their leases
	// ahead holds leases claimed for slots not free yet (ahead.go): the
	// loop adds and prunes them, the loop and (while handOn) the tasks that
	// end start them. pace times claims and calls, to bound it.
	aheadMu     sync.Mutex
	ahead       []*queue.Lease
	handOn      bool
	lastRecover time.Time // loop only: when the loop last looked for expired leases
	pace        pace
	hintMu      sync.Mutex
	hints       []time.Time // sorted due times this worker knows of (its retries, its abandoned leases)

	mu      sync.Mutex
	closed  bool
	running bool
	cancel  context.CancelFunc
	done    chan struct{}

	// hooks are test signals; nil outside tests.
	hooks *hooks
}

// hooks lets tests observe the worker without sleeping. Set before Run.
type hooks struct {
	// taskStart and taskDone are called when a delivery or
	// reconciliation task starts and when it ends (its commit written).
	taskStart func(op string, key envelope.Key)
	taskDone  func(op string, key envelope.Key, r result)
	// turnStart and turnEnd are called at the start and the end of each
	// loop turn.
	turnStart, turnEnd func()
	// sleep is called with the wait the loop arms its timer for, just
	// before it sleeps.
	sleep func(wait time.Duration)
}

// New validates cfg and returns a worker. Errors name the Config field at
// fault. It registers the worker's metrics on cfg.Registerer.
func New(cfg Config) (*Worker, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	w := &Worker{
		cfg:        c,
		store:      c.Store,
		leases:     c.Store,
		providers:  c.Providers,
		names:      make(map[envelope.Channel]string, len(c.Providers)),
		idem:       make(map[envelope.Channel]bool, len(c.Providers)),
		oneService: make(map[envelope.Channel]bool, len(c.Providers)),
		limiters:   make(map[envelope.Channel]*rate.Limiter),
		log:        c.Logger,
		now:        c.Now,
		rescan:     DefaultRescanInterval,
		slots:      make(chan struct{}, c.Concurrency),
		tasks:      make(chan struct{}, 1),
		kick:       make(chan struct{}, 1),
	}
	if c.Tenant != "" {
		w.leases = queue.Scope(c.Store, c.Tenant)
	}
	for _, ch := range envelope.Channels {
		p, ok := c.Providers[ch]
		if !ok {
			w.unconfigured = append(w.unconfigured, ch)
			continue
		}
		w.channels = append(w.channels, ch)
		w.idem[ch] = p.Capabilities().IdempotentRedelivery
		w.oneService[ch] = p.Capabilities().OneService
		name := p.Capabilities().Name
		if name == "" {
			name = "unnamed"
		}
		w.names[ch] = name
		if l, ok := c.RateLimits[ch]; ok && l != rate.Inf {
			b := c.RateBursts[ch]
			if b == 0 {
				b = 1
			}
			w.limiters[ch] = rate.NewLimiter(l, b)
		}
	}
	tp := c.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	w.tracer = tp.Tracer(tracerName)
	w.metrics, err = newMetrics(c.Registerer, func(ctx context.Context) (queue.Counts, error) {
		return c.Store.Counts(ctx, c.Tenant)
	})
	if err != nil {
		return nil, fmt.Errorf("worker: register metrics: %w", err)
	}
	for _, ch := range envelope.Channels {
		v := 0.0
		if !slices.Contains(w.channels, ch) {
			v = 1
		}
		w.metrics.unconfigured.WithLabelValues(string(ch)).Set(v)
		if v == 0 {
			w.metrics.paused.WithLabelValues(string(ch)).Set(0)
		}
	}
	return w, nil
}

// Run claims and delivers until ctx is cancelled or Close is called, then
// stops claiming, cancels in-flight provider calls, waits up to
// Config.ShutdownTimeout for them and returns: nil on a clean stop,
// ErrShutdownTimeout when calls were still running, or an error wrapping
// queue.ErrClosed when the store was closed under it. It returns ErrRunning
// when the worker is already running and ErrClosed after Close. A worker may
// be run again after Run returned.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	switch {
	case w.closed:
		w.mu.Unlock()
		return ErrClosed
	case w.running:
		w.mu.Unlock()
		return ErrRunning
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	w.running, w.cancel, w.done = true, cancel, done
	w.mu.Unlock()

	defer func() {
		cancel()
		w.mu.Lock()
		w.running, w.cancel, w.done = false, nil, nil
		w.mu.Unlock()
		close(done)
	}()

	w.log.LogAttrs(runCtx, slog.LevelInfo, "worker started",
		slog.String(keyOperation, "run"), slog.String(keyStatus, "started"))
	for _, ch := range w.unconfigured {
		w.log.LogAttrs(runCtx, slog.LevelWarn, "channel has no provider: its deliveries stay pending",
			slog.String(keyOperation, "run"), slog.String(keyChannel, string(ch)),
			slog.String(keyStatus, "unconfigured"))
	}

	err := w.loop(runCtx)
	cancel()
	w.pruneAhead(runCtx, nil) // stopping: every lease waiting here is given back
	if werr := w.waitTasks(); werr != nil && err == nil {
		err = werr
	}
	status := "stopped"
	if err != nil {
		status = "failed"
	}
	w.log.LogAttrs(context.WithoutCancel(runCtx), slog.LevelInfo, "worker stopped",
		slog.String(keyOperation, "run"), slog.String(keyStatus, status))
	return err
}

// Close stops Run if it is running and waits for it to return. It is
// idempotent; Run after Close returns ErrClosed.
func (w *Worker) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	cancel, done := w.cancel, w.done
	w.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return nil
}

// waitTasks waits up to ShutdownTimeout for the tasks in flight.
func (w *Worker) waitTasks() error {
	finished := make(chan struct{})
	go func() {
		w.wg.Wait()
		close(finished)
	}()
	t := time.NewTimer(w.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-finished:
		return nil
	case <-t.C:
		w.log.LogAttrs(context.Background(), slog.LevelError, "provider calls still running after the shutdown timeout",
			slog.String(keyOperation, "run"), slog.String(keyStatus, "shutdown_timeout"))
		return ErrShutdownTimeout
	}
}

// wake makes the loop take a turn now.
func (w *Worker) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// loop runs turns until ctx is done.
func (w *Worker) loop(ctx context.Context) error {
	notify := w.store.Notify()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	stale := time.Duration(0)   // back-off when the store's due time is not ours
	errWait := time.Duration(0) // back-off after store errors
	for {
		if ctx.Err() != nil {
			return nil
		}
		if w.hooks != nil && w.hooks.turnStart != nil {
			w.hooks.turnStart()
		}
		start := w.now()
		progress, saturated, err := w.turn(ctx)
		var wait time.Duration
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, queue.ErrClosed):
			return fmt.Errorf("worker: %w", queue.ErrClosed)
		case err != nil:
			limit := errWaitMax
			if queue.Exhausted(err) {
				limit = exhaustedWaitMax
			}
			errWait = min(max(2*errWait, staleWaitMin), limit)
			wait = errWait
		default:
			errWait = 0
			if progress {
				stale = 0
			}
			wait = w.nextWait(ctx, start, progress, saturated, &stale)
		}
		if w.hooks != nil && w.hooks.turnEnd != nil {
			w.hooks.turnEnd()
		}
		if wait <= 0 {
			continue
		}
		if w.hooks != nil && w.hooks.sleep != nil {
			w.hooks.sleep(wait)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-notify:
			if !ok {
				return fmt.Errorf("worker: %w", queue.ErrClosed)
			}
			stale = 0
		case <-w.kick:
			stale = 0
		case <-w.tasks:
		case <-timer.C:
		}
		timer.Stop() // Go ≥ 1.23 timers: no stale tick survives Stop or Reset
	}
}

// free returns the number of task slots free.
func (w *Worker) free() int { return cap(w.slots) - len(w.slots) }

// turn recovers expired leases and claims rows into the free slots (and,
// for some channels, ahead of them: ahead.go). It reports whether it
// leased or started anything and whether every slot is busy.
func (w *Worker) turn(ctx context.Context) (progress, saturated bool, err error) {
	var recovered []*queue.Lease
	if n := w.free(); n > 0 {
		w.lastRecover = w.now()
		recovered, err = w.leases.Recover(ctx, w.request(w.channels, n))
		if err != nil {
			if ctx.Err() == nil {
				w.logStoreError(ctx, "recover", err)
			}
			return progress, false, err
		}
		for _, l := range recovered {
			progress = true
			w.dispatch(ctx, "reconcile", l)
		}
	}
	w.pruneAhead(ctx, recovered)
	// A paused channel whose pause is over is tried with one row.
	_, probe := w.paused.split(w.readyChannels(time.Now()), w.now())
	w.updateHandOn(probe)
	for _, ch := range probe {
		if w.free() == 0 {
			break
		}
		n, err := w.claim(ctx, []envelope.Channel{ch}, 1, 0, func(l *queue.Lease) { w.paused.startProbe(ch, l.Key) })
		if err != nil {
			return progress, false, err
		}
		progress = progress || n > 0
	}
	if w.aheadLen() > 0 && w.free() > 0 {
		// Rows of the other channels go before those waiting here, which
		// were claimed earlier: otherwise a steady flow on one channel
		// would keep a slot from them for good.
		if others := slices.DeleteFunc(w.ready(), w.aheadable); len(others) > 0 {
			n, err := w.claim(ctx, others, min(w.free(), w.cfg.ClaimBatch), 0, nil)
			if err != nil {
				return progress, false, err
			}
			progress = progress || n > 0
		}
	}
	for {
		progress = w.startAhead(ctx) || progress // slots freed during the turn
		n, room := w.free(), w.aheadRoom()
		chans := w.ready()
		if len(chans) == 0 {
			return progress, n == 0, nil
		}
		limit := min(n, w.cfg.ClaimBatch)
		switch {
		case !slices.ContainsFunc(chans, func(ch envelope.Channel) bool { return !w.aheadable(ch) }):
			// Every channel may be claimed ahead: one claim fills both.
		case n > 0:
			room = 0
		default:
			chans = slices.DeleteFunc(chans, func(ch envelope.Channel) bool { return !w.aheadable(ch) })
		}
		if limit+room == 0 || len(chans) == 0 {
			return progress, n == 0, nil
		}
		got, err := w.claim(ctx, chans, limit, room, nil)
		if err != nil {
			return progress, false, err
		}
		progress = progress || got > 0
		if got < limit+room {
			return progress, w.free() == 0, nil
		}
	}
}

// ready returns the channels claimed as usual now: configured, with a
// rate token, not paused.
func (w *Worker) ready() []envelope.Channel {
	chans, _ := w.paused.split(w.readyChannels(time.Now()), w.now())
	return slices.Clone(chans)
}

// claim leases up to limit rows of chans for the free slots and up to
// ahead more to wait for one, and dispatches the first; each, when given,
// runs on every lease before its task starts. It returns how many it
// leased.
func (w *Worker) claim(ctx context.Context, chans []envelope.Channel, limit, ahead int, each func(*queue.Lease)) (int, error) {
	start := w.now()
	leases, err := w.leases.Claim(ctx, w.request(chans, limit+ahead))
	w.pace.addClaim(w.now().Sub(start))
	if err != nil {
		if ctx.Err() == nil {
			w.logStoreError(ctx, "claim", err)
		}
		return 0, err
	}
	now := w.now()
	for _, l := range leases {
		if each != nil {
			each(l)
		}
		w.metrics.claims.WithLabelValues(string(l.Channel)).Inc()
		// A slot freed during the claim goes to the rows of this channel
		// that were waiting already: they were due first. A lease of a
		// channel paused during the claim waits too, and is given back.
		if w.free() == 0 || w.waiting(l.Channel) || (each == nil && !w.startable(l, now)) {
			w.addAhead(l)
			continue
		}
		w.dispatch(ctx, "deliver", l)
	}
	w.startAhead(ctx)
	return len(leases), nil
}

func (w *Worker) request(chans []envelope.Channel, limit int) queue.ClaimRequest {
	return queue.ClaimRequest{
		Tenant:   w.cfg.Tenant,
		Channels: chans,
		Owner:    w.cfg.Owner,
		Lease:    w.cfg.Lease,
		Limit:    limit,
	}
}

// readyChannels returns the configured channels whose rate limiter has a
// token at t.
func (w *Worker) readyChannels(t time.Time) []envelope.Channel {
	if len(w.limiters) == 0 {
		return w.channels
	}
	out := make([]envelope.Channel, 0, len(w.channels))
	for _, ch := range w.channels {
		if lim := w.limiters[ch]; lim != nil && lim.TokensAt(t) < 1 {
			continue
		}
		out = append(out, ch)
	}
	return out
}

// tokenWait returns how long until every rate-limited channel has a token
// again (the shortest such wait), or 0 when none is waiting.
func (w *Worker) tokenWait(t time.Time) time.Duration {
	var wait time.Duration
	for _, lim := range w.limiters {
		tok := lim.TokensAt(t)
		if tok >= 1 {
			continue
		}
		d := time.Duration(math.Ceil((1 - tok) / float64(lim.Limit()) * float64(time.Second)))
		if d < time.Millisecond {
			d = time.Millisecond
		}
		if wait == 0 || d < wait {
			wait = d
		}
	}
	return wait
}

// nextWait decides how long the loop sleeps after a turn that began at
// start, unless woken. What was due at start the turn has claimed, as far as
// this worker can; what became due since, it may not have seen.
func (w *Worker) nextWait(ctx context.Context, start time.Time, progress, saturated bool, stale *time.Duration) time.Duration {
	wait := w.rescan
	if aw := w.aheadWait(); aw > 0 {
		wait = min(wait, aw)
	}
	if saturated {
		return wait // a finishing task wakes the loop
	}
	now := w.now()
	due, err := w.store.NextDue(ctx, queue.DueFilter{Tenant: w.cfg.Tenant, Channels: w.channels})
	switch {
	case err != nil:
		if ctx.Err() == nil {
			w.logStoreError(ctx, "next_due", err)
		}
	case due.IsZero():
	case due.After(now):
		wait = min(wait, due.Sub(now))
	case progress || due.After(start):
		return 0 // more may be due, or it became due during the turn: look again at once
	default:
		// Due before the turn began, and the turn claimed nothing: the
		// earliest due row is not claimable by this worker (another
		// tenant's, a channel without provider, a rate-limited channel),
		// and it hides the store's later due times. Fall back to what this
		// worker knows, and look again with a growing back-off.
		*stale = min(max(2**stale, staleWaitMin), w.rescan)
		wait = min(wait, *stale)
	}
	if h, ok := w.nextHint(start); ok {
		wait = min(wait, h.Sub(now)) // ≤ 0 when it became due during the turn
	}
	if tw := w.tokenWait(time.Now()); tw > 0 {
		wait = min(wait, tw)
	}
	if pw := w.paused.wait(now); pw > 0 {
		wait = min(wait, pw)
	}
	return wait
}

// addHint remembers a due time of this worker's own rows (a retry just
// committed, a lease left to expire) and makes the loop take a turn: the
// due time may be earlier than the one its timer is armed for, which it
// computed before the task's commit reached the store.
func (w *Worker) addHint(t time.Time) {
	w.hintMu.Lock()
	i, _ := slices.BinarySearchFunc(w.hints, t, func(a, b time.Time) int { return a.Compare(b) })
	if i < maxHints {
		w.hints = slices.Insert(w.hints, i, t)
		if len(w.hints) > maxHints {
			w.hints = w.hints[:maxHints]
		}
	}
	w.hintMu.Unlock()
	w.taskSignal()
}

// taskSignal makes the loop take a turn for a task (without resetting the
// stale back-off, unlike wake).
func (w *Worker) taskSignal() {
	select {
	case w.tasks <- struct{}{}:
	default:
	}
}

// nextHint drops the hints not after start (a turn that began at start has
// claimed their rows) and returns the earliest one left.
func (w *Worker) nextHint(start time.Time) (time.Time, bool) {
	w.hintMu.Lock()
	defer w.hintMu.Unlock()
	i := 0
	for i < len(w.hints) && !w.hints[i].After(start) {
		i++
	}
	w.hints = w.hints[i:]
	if len(w.hints) == 0 {
		return time.Time{}, false
	}
	return w.hints[0], true
}

// dispatch runs one task in its own goroutine, holding a slot. The loop
// only claims as many rows as there are free slots, so this never blocks.
func (w *Worker) dispatch(ctx context.Context, op string, l *queue.Lease) {
	w.slots <- struct{}{}
	w.run(ctx, op, l)
}

// run runs one task in its own goroutine, in a slot already held. A task
// frees its slot when its provider call returns, or passes it on to a
// lease waiting ahead (handOver).
func (w *Worker) run(ctx context.Context, op string, l *queue.Lease) {
	w.wg.Add(1)
	if op != "reconcile" {
		w.flights.start(l) // before the loop's next turn may recover l
	}
	if w.hooks != nil && w.hooks.taskStart != nil {
		w.hooks.taskStart(op, l.Key)
	}
	go func() {
		var once sync.Once
		free := func() {
			once.Do(func() {
				if next := w.handOver(ctx); next != nil {
					w.run(ctx, "deliver", next)
				} else {
					<-w.slots
				}
				w.taskSignal()
			})
		}
		defer func() {
			free()
			w.wg.Done()
		}()
		var r result
		if op == "reconcile" {
			r = w.reconcile(ctx, l)
		} else {
			r = w.deliver(ctx, l, free)
			w.flights.end(l)
		}
		if w.hooks != nil && w.hooks.taskDone != nil {
			w.hooks.taskDone(op, l.Key, r)
		}
	}()
}
