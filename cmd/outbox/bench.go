package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/worker"
	"github.com/outboxhq/outbox/render"
)

func init() {
	register(&command{Name: "bench", Short: "measure durable enqueue, drain and end-to-end latency on this machine", Run: runBench})
}

const benchHelp = `Usage: outbox bench [flags]

Runs the phases of the project's benchmark harness on a fresh store each,
with 1 KiB envelopes, through the store contract and the real worker
(figures and how to compare them: docs/capacity.md, and for PostgreSQL
docs/capacity-postgres.md):

  send_p1   1 producer enqueues N envelopes (closed loop)
  drain_c1  1 worker slot drains them: claim → render → deliver to a no-op
            provider → fenced commit (the real worker path)
  send_p16  16 producers, fresh store
  drain_c4  4 worker slots drain them
  e2e_c1    a worker waits; 1 producer sends E2E envelopes at RATE/s; latency
            = provider call time − enqueue start time
  e2e_c4    the same with 4 worker slots

Durability: every acknowledged enqueue is fsynced to its append log (group
commit). Claims and commits are bbolt transactions without fsync: the no-op
provider declares that it redelivers idempotently (as Resend does under its
Idempotency-Key), so a claim lost to a machine crash is redelivered under the
same key; a worker with a provider that does not (Telegram, the WeCom robots and bot replies) fsyncs
each claim (see docs/reliability.md). --relaxed skips the enqueue's fsync
too (not durable against a machine crash).

--store postgres runs the same phases on PostgreSQL (--database-url, or
OUTBOX_DATABASE_URL / OUTBOX_DATABASE_URL_FILE), each in a schema of its own
(outbox_bench_…) that is dropped at the end; every commit is as durable as
the server's fsync and synchronous_commit make it. When the server runs on
this machine and its processes are readable, each phase also reports the
server's CPU per message (server_cpu_us_per_msg).

Flags:
`

type benchOpts struct {
	n, e2eN, rate, users, producers, consumers int
	relaxed                                    bool
	dir                                        string          // the file store's parent directory
	only                                       map[string]bool // phase groups to run; nil: all
}

// benchGroups are the phase groups --only selects.
var benchGroups = []string{"p1", "p16", "e2e"}

func runBench(ctx context.Context, e *env, args []string) int {
	s := newSettings("bench", e)
	s.usage(benchHelp)
	dir := s.fs.String("data", "", "directory for the temporary stores of --store file (default the system temp dir)")
	js := s.fs.Bool("json", false, "print one JSON object with the harness's metric names")
	var o benchOpts
	s.fs.IntVar(&o.n, "n", 5000, "envelopes per send/drain phase")
	s.fs.IntVar(&o.e2eN, "e2e-n", 500, "envelopes per end-to-end phase")
	s.fs.IntVar(&o.rate, "e2e-rate", 500, "end-to-end send rate per second")
	s.fs.IntVar(&o.users, "users", 1, "users the envelopes are spread over (one append log each)")
	s.fs.IntVar(&o.producers, "producers", 16, "producers of send_p16")
	s.fs.IntVar(&o.consumers, "consumers", 4, "worker slots of drain_c4 and e2e_c4")
	s.fs.BoolVar(&o.relaxed, "relaxed", false, "relaxed durability (no fsync; --store file only)")
	store := s.fs.String("store", "file", "the store to measure: file or postgres")
	dbURL := s.fs.String("database-url", "", "PostgreSQL URL of --store postgres (env "+EnvDatabaseURL+" or "+EnvDatabaseURL+"_FILE; the environment is safer: a flag shows in ps)")
	cpuProfile := s.fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	only := s.fs.String("only", "", "comma-separated phase groups to run: p1 (send_p1, drain_c1), p16 (send_p16, drain_c4), e2e (e2e_c1, e2e_c4); default all")
	if code, done := s.parse(args); done {
		return code
	}
	o.dir = *dir
	if *only != "" {
		o.only = map[string]bool{}
		for _, g := range strings.Split(*only, ",") {
			if !slices.Contains(benchGroups, g) {
				fmt.Fprintf(e.Stderr, "outbox bench: --only: unknown phase group %q (want %s)\n", g, strings.Join(benchGroups, ", "))
				return exitUsage
			}
			o.only[g] = true
		}
	}
	var back benchBackend
	switch *store {
	case "file":
		if *dbURL != "" {
			fmt.Fprintln(e.Stderr, "outbox bench: --database-url needs --store postgres")
			return exitUsage
		}
		back = &fileBench{o: o}
	case "postgres":
		if o.relaxed {
			fmt.Fprintln(e.Stderr, "outbox bench: --relaxed is for --store file (PostgreSQL commits as its synchronous_commit says)")
			return exitUsage
		}
		dsn, err := (&dbFlags{url: dbURL}).dsn(e)
		if err != nil {
			return fail(e, "%v", err)
		}
		if dsn == "" {
			fmt.Fprintf(e.Stderr, "outbox bench: --store postgres needs --database-url or %s\n", EnvDatabaseURL)
			return exitUsage
		}
		back = &pgBench{dsn: dsn}
	default:
		fmt.Fprintf(e.Stderr, "outbox bench: --store: unknown store %q (want file or postgres)\n", *store)
		return exitUsage
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fail(e, "%v", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(e, "%v", err)
		}
		defer pprof.StopCPUProfile()
	}
	m, err := benchAll(ctx, back, o, func(format string, a ...any) {
		if !*js {
			fmt.Fprintf(e.Stderr, format, a...)
		}
	})
	if err != nil {
		return fail(e, "%v", err)
	}
	if *js {
		params := map[string]any{"n": o.n, "e2e_n": o.e2eN, "e2e_rate": o.rate, "users": o.users,
			"producers": o.producers, "consumers": o.consumers, "size": 1024, "durability": back.durability()}
		for k, v := range back.params() {
			params[k] = v
		}
		out := map[string]any{
			"bench":   "outbox",
			"store":   back.name(),
			"params":  params,
			"metrics": m,
			"host":    map[string]any{"cpus": runtime.NumCPU(), "go": runtime.Version(), "os": runtime.GOOS, "arch": runtime.GOARCH},
		}
		return printJSON(e, out)
	}
	fmt.Fprintf(e.Stdout, "outbox bench: store %s, %d envelopes of 1 KiB, %d user(s), durability: %s, %d CPUs\n\n", back.name(), o.n, o.users, back.durability(), runtime.NumCPU())
	_, server := back.serverCPU()
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	head := "phase\tmsgs/s\tp50 µs\tp99 µs\tCPU µs/msg\t"
	if server {
		head += "server CPU µs/msg\t"
	}
	fmt.Fprintln(tw, head)
	for _, p := range []string{"send_p1", "drain_c1", "send_p16", "drain_c4", "e2e_c1", "e2e_c4"} {
		if _, ran := m[p+"_per_s"]; !ran {
			continue
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.1f\t", p, m[p+"_per_s"], m[p+"_p50_us"], m[p+"_p99_us"], m[p+"_cpu_us_per_msg"])
		if server {
			fmt.Fprintf(tw, "%.1f\t", m[p+"_server_cpu_us_per_msg"])
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	send := back.sendWhat()
	for _, p := range []string{"e2e_c1", "e2e_c4"} {
		if v, ok := m[p+"_send_p50_us"]; ok {
			fmt.Fprintf(e.Stdout, "\n%s: %s took p50 %.0f µs, p99 %.0f µs of it", p, send, v, m[p+"_send_p99_us"])
		}
	}
	fmt.Fprintf(e.Stdout, "\n\nduplicates_n = %.0f\n", m["duplicates_n"])
	if m["duplicates_n"] != 0 {
		return exitFailure
	}
	return exitOK
}

func durability(relaxed bool) string {
	if relaxed {
		return "relaxed (no fsync)"
	}
	return "durable (enqueues fsynced per group commit; claims unsynced: the provider redelivers idempotently)"
}

// benchProvider is a no-op provider that records when each key arrived.
type benchProvider struct {
	mu     sync.Mutex
	seen   map[envelope.Key]int
	dups   atomic.Int64
	count  atomic.Int64
	notify chan benchHit // e2e: the worker's deliveries, in order
}

type benchHit struct {
	key envelope.Key
	at  time.Time
}

func newBenchProvider() *benchProvider { return &benchProvider{seen: map[envelope.Key]int{}} }

func (p *benchProvider) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	p.mu.Lock()
	p.seen[key]++
	if p.seen[key] > 1 {
		p.dups.Add(1)
	}
	p.mu.Unlock()
	p.count.Add(1)
	if p.notify != nil {
		p.notify <- benchHit{key, time.Now()}
	}
	return channels.Receipt{ID: "bench"}, nil
}

func (p *benchProvider) Reconcile(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Reconciliation, error) {
	return channels.Reconciliation{Outcome: channels.Unknown}, nil
}

func (p *benchProvider) Capabilities() channels.Capabilities {
	return channels.Capabilities{Name: "bench", Channel: envelope.ChannelTelegram, IdempotentRedelivery: true}
}

// benchEnvelope is a 1 KiB reply envelope (telegram needs no consent record).
func benchEnvelope(id string, user int) *envelope.Envelope {
	payload, _ := json.Marshal(envelope.ReplyPayload{Text: benchText})
	return &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion, ID: id, UserID: "bench-user-" + strconv.Itoa(user),
		Channel: envelope.ChannelTelegram, Template: envelope.TemplateReply,
		Recipient: envelope.Recipient{ChatID: "1000" + strconv.Itoa(user)},
		Payload:   payload, CreatedAt: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
	}
}

var benchText = strings.Repeat("outbox bench filler text. ", 30)[:750]

type phaseStats map[string]float64

func latStats(m phaseStats, prefix string, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(f float64) float64 {
		i := int(math.Ceil(f*float64(len(lat)))) - 1
		if i < 0 {
			i = 0
		}
		return float64(lat[i].Nanoseconds()) / 1e3
	}
	m[prefix+"_p50_us"] = q(0.50)
	m[prefix+"_p99_us"] = q(0.99)
	m[prefix+"_max_us"] = float64(lat[len(lat)-1].Nanoseconds()) / 1e3
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter measures a phase's CPU: this process's and, when the backend
// can read it, the database server's.
type cpuMeter struct {
	b          benchBackend
	self, serv time.Duration
	servOK     bool
}

func startCPU(b benchBackend) cpuMeter {
	c := cpuMeter{b: b, self: cpuTime()}
	c.serv, c.servOK = b.serverCPU()
	return c
}

// stop records the CPU per message of the phase's n messages.
func (c cpuMeter) stop(m phaseStats, prefix string, n int, self bool) {
	if n == 0 {
		return
	}
	if self {
		m[prefix+"_cpu_us_per_msg"] = float64((cpuTime() - c.self).Microseconds()) / float64(n)
	}
	if s, ok := c.b.serverCPU(); ok && c.servOK {
		m[prefix+"_server_cpu_us_per_msg"] = float64((s - c.serv).Microseconds()) / float64(n)
	}
}

// benchStore is the fresh store of one phase group.
type benchStore struct {
	q     queue.Store
	close func() error // closes it and removes what it stored
}

// benchBackend opens the fresh stores of one run on one kind of store.
type benchBackend interface {
	name() string
	// open returns a fresh, empty store; end removes whatever the run
	// left (it runs last, also after a failure).
	open(ctx context.Context) (*benchStore, error)
	end() error
	durability() string
	sendWhat() string       // what an enqueue does, in a sentence's words
	params() map[string]any // the backend's settings, for the JSON
	// serverCPU returns the CPU the database server's processes have
	// used so far, when they run on this machine and can be read.
	serverCPU() (time.Duration, bool)
}

// fileBench runs on the file store, each store in a directory of its own.
type fileBench struct {
	o    benchOpts
	root string
}

func (f *fileBench) name() string { return "file" }

func (f *fileBench) durability() string { return durability(f.o.relaxed) }

func (f *fileBench) sendWhat() string {
	if f.o.relaxed {
		return "the enqueue (validate, append; no fsync)"
	}
	return "the durable enqueue (validate, append, fdatasync)"
}

func (f *fileBench) params() map[string]any { return nil }

func (f *fileBench) serverCPU() (time.Duration, bool) { return 0, false }

func (f *fileBench) end() error {
	if f.root == "" {
		return nil
	}
	return os.RemoveAll(f.root)
}

// benchRoot makes the directory a run's stores go in, each under a random
// name. It asks the filesystem (ext2/3/4) to place each store in a block
// group of its own choosing, as it does for the children of the root,
// rather than next to parent: ext4 without a journal skips every inode
// freed in the last minute or more when it allocates one, one by one, and
// in the block group of a temporary directory that earlier runs (or test
// suites) just emptied, creating a log cost 0.5–0.7 ms of CPU instead of
// ~30 µs. Back-to-back runs would measure their predecessors' deletions.
// It is a hint: other filesystems ignore it or refuse it, and the run goes
// on.
func benchRoot(parent string) (string, error) {
	root, err := os.MkdirTemp(parent, "outbox-bench-")
	if err != nil {
		return "", err
	}
	spreadStores(root)
	return root, nil
}

func (f *fileBench) open(context.Context) (*benchStore, error) {
	if f.root == "" {
		root, err := benchRoot(f.o.dir)
		if err != nil {
			return nil, err
		}
		f.root = root
	}
	dir, err := os.MkdirTemp(f.root, "store-")
	if err != nil {
		return nil, err
	}
	// The store as `outbox serve` runs it: the tailer watches the logs, and
	// claims skip their fsync for the no-op provider's channel, whose
	// provider redelivers idempotently (see idempotentChannels).
	q, err := filestore.Open(dir, &filestore.Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, NoSync: f.o.relaxed, UnsyncedClaims: []envelope.Channel{envelope.ChannelTelegram}})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &benchStore{q: q, close: func() error { q.Close(); return os.RemoveAll(dir) }}, nil
}

// send enqueues n envelopes from producers goroutines (closed loop).
func benchSend(ctx context.Context, b benchBackend, q queue.Store, o benchOpts, producers int, prefix string, m phaseStats) error {
	var next atomic.Int64
	lats := make([][]time.Duration, producers)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	cpu, t0 := startCPU(b), time.Now()
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= o.n {
					return
				}
				env := benchEnvelope("b-"+strconv.Itoa(i), i%o.users)
				s := time.Now()
				if _, err := q.Enqueue(ctx, env); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				lats[p] = append(lats[p], time.Since(s))
			}
		}()
	}
	wg.Wait()
	el := time.Since(t0)
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	cpu.stop(m, prefix, len(all), true)
	m[prefix+"_per_s"] = float64(len(all)) / el.Seconds()
	m[prefix+"_n"] = float64(len(all))
	latStats(m, prefix, all)
	return nil
}

func benchWorker(q queue.Store, p *benchProvider, slots int) (*worker.Worker, error) {
	r, err := render.New(nil)
	if err != nil {
		return nil, err
	}
	return worker.New(worker.Config{
		Store: q, Renderer: r, Concurrency: slots, Lease: time.Minute,
		Providers: map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: p},
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
}

// benchDrain runs the worker until every envelope was delivered.
func benchDrain(ctx context.Context, b benchBackend, q queue.Store, o benchOpts, slots int, prefix string, m phaseStats, dups *float64) error {
	p := newBenchProvider()
	w, err := benchWorker(q, p, slots)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	cpu, t0 := startCPU(b), time.Now()
	go func() { done <- w.Run(runCtx) }()
	for p.count.Load() < int64(o.n) {
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			stop()
			<-done
			return ctx.Err()
		}
		if time.Since(t0) > 5*time.Minute {
			stop()
			<-done
			return fmt.Errorf("%s: only %d of %d delivered after 5 minutes", prefix, p.count.Load(), o.n)
		}
	}
	el := time.Since(t0)
	// Wait until the last commits landed: every row sent.
	for {
		c, err := q.Counts(ctx, "")
		if err != nil {
			stop()
			<-done
			return err
		}
		if c.Total(envelope.StateSent) >= o.n {
			break
		}
		time.Sleep(time.Millisecond)
	}
	el2 := time.Since(t0)
	stop()
	<-done
	w.Close()
	cpu.stop(m, prefix, o.n, true)
	m[prefix+"_per_s"] = float64(o.n) / el2.Seconds()
	m[prefix+"_deliver_per_s"] = float64(o.n) / el.Seconds()
	*dups += float64(p.dups.Load())
	return nil
}

// benchE2E measures enqueue → provider call with an idle worker waiting.
func benchE2E(ctx context.Context, b benchBackend, q queue.Store, o benchOpts, slots int, prefix string, base int, m phaseStats, dups *float64) error {
	p := newBenchProvider()
	p.notify = make(chan benchHit, o.e2eN+16)
	w, err := benchWorker(q, p, slots)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() { stop(); <-done; w.Close() }()
	time.Sleep(50 * time.Millisecond) // let the worker go idle

	sent := make([]time.Time, o.e2eN)
	var mu sync.Mutex
	var lats []time.Duration
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for i := 0; i < o.e2eN; i++ {
			select {
			case h := <-p.notify:
				n, _ := strconv.Atoi(strings.TrimPrefix(h.key.EnvelopeID, fmt.Sprintf("e%d-", base)))
				mu.Lock()
				lats = append(lats, h.at.Sub(sent[n]))
				mu.Unlock()
			case <-time.After(30 * time.Second):
				return
			}
		}
	}()
	cpu, start := startCPU(b), time.Now()
	interval := time.Second / time.Duration(o.rate)
	enq := make([]time.Duration, 0, o.e2eN)
	for i := 0; i < o.e2eN; i++ {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		env := benchEnvelope(fmt.Sprintf("e%d-%d", base, i), i%o.users)
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
		t := time.Now()
		if _, err := q.Enqueue(ctx, env); err != nil {
			return err
		}
		enq = append(enq, time.Since(t))
	}
	<-recvDone
	el := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	if len(lats) < o.e2eN {
		return fmt.Errorf("%s: %d of %d delivered", prefix, len(lats), o.e2eN)
	}
	cpu.stop(m, prefix, len(lats), false) // an open loop: its own CPU is mostly waiting, as the harness leaves it out
	m[prefix+"_per_s"] = float64(len(lats)) / el.Seconds()
	latStats(m, prefix, lats)
	latStats(m, prefix+"_send", enq) // the durable enqueue's share of it
	*dups += float64(p.dups.Load())
	return nil
}

func benchAll(ctx context.Context, b benchBackend, o benchOpts, progress func(string, ...any)) (m phaseStats, err error) {
	defer func() {
		if e := b.end(); e != nil && err == nil {
			err = e
		}
	}()
	if o.users < 1 {
		o.users = 1
	}
	if o.rate < 1 {
		o.rate = 1
	}
	m = phaseStats{}
	var dups float64
	run := func(name string, fn func() error) error {
		progress("%-9s ...", name)
		t := time.Now()
		if err := fn(); err != nil {
			progress(" failed\n")
			return fmt.Errorf("%s: %w", name, err)
		}
		progress(" %.1fs\n", time.Since(t).Seconds())
		return nil
	}
	// group runs fn on a fresh store and removes it.
	group := func(fn func(q queue.Store) error) (err error) {
		st, err := b.open(ctx)
		if err != nil {
			return err
		}
		defer func() {
			if e := st.close(); e != nil && err == nil {
				err = e
			}
		}()
		return fn(st.q)
	}
	pair := func(producers, slots int, send, drain string) error {
		return group(func(q queue.Store) error {
			if err := run(send, func() error { return benchSend(ctx, b, q, o, producers, send, m) }); err != nil {
				return err
			}
			return run(drain, func() error { return benchDrain(ctx, b, q, o, slots, drain, m, &dups) })
		})
	}
	want := func(group string) bool { return o.only == nil || o.only[group] }
	if want("p1") {
		if err := pair(1, 1, "send_p1", "drain_c1"); err != nil {
			return nil, err
		}
	}
	if want("p16") {
		if err := pair(o.producers, o.consumers, "send_p16", "drain_c4"); err != nil {
			return nil, err
		}
	}
	if want("e2e") {
		err := group(func(q queue.Store) error {
			if err := run("e2e_c1", func() error { return benchE2E(ctx, b, q, o, 1, "e2e_c1", 1, m, &dups) }); err != nil {
				return err
			}
			return run("e2e_c4", func() error { return benchE2E(ctx, b, q, o, o.consumers, "e2e_c4", 4, m, &dups) })
		})
		if err != nil {
			return nil, err
		}
	}
	m["duplicates_n"] = dups
	return m, nil
}
