package queuetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// DiffStore is one store implementation that Differential runs.
type DiffStore struct {
	Name    string
	Harness Harness
}

// DiffConfig configures Differential.
type DiffConfig struct {
	// Stores are the implementations compared in every run; each gets a
	// fresh store and its own Clock per seed (advanced identically).
	Stores []DiffStore
	// Seeds is the number of seeds run (default 8), starting at FirstSeed
	// (default 1). OUTBOX_DIFF_SEEDS=n raises it; OUTBOX_DIFF_SEED=s starts
	// at s instead (and runs only s unless OUTBOX_DIFF_SEEDS is set too).
	Seeds     int
	FirstSeed uint64
	// Steps is the number of operations per seed (default 60);
	// OUTBOX_DIFF_STEPS=n raises it.
	Steps int
	// NoModel compares the stores with each other only (the first store is
	// the reference). The reference model still drives the generation.
	NoModel bool
	// Exclude lists operation kinds (DiffOpKinds) not to generate.
	Exclude []string
	// MaxReports is the number of distinct divergences (by operation,
	// field and stores involved) reported before the test stops
	// (default 3; OUTBOX_DIFF_REPORTS=n raises it).
	MaxReports int
	// ShrinkRuns and ShrinkTime bound the replays and the time spent
	// shrinking one divergence (defaults 300 and 10s; negative ShrinkRuns
	// disables shrinking).
	ShrinkRuns int
	ShrinkTime time.Duration
}

// DiffOpKinds lists the kinds of operation Differential generates, for
// DiffConfig.Exclude. "edge" is the calls the contract leaves open (an
// empty user id, an unknown suppression channel, a nil envelope or lease).
var DiffOpKinds = []string{
	"enqueue", "consent", "suppress", "suppress-email", "claim", "commit", "release", "advance",
	"recover", "requeue", "resolve", "erase", "prune", "reopen", "rebuild", "edge", "close", "work",
}

// The options every store of a differential run is opened with (plus its
// own Clock in Now).
const (
	diffMaxAttempts = 3
	diffRetention   = time.Hour
)

// Differential is the model-based differential test of queue.Store: for
// each seed it generates a random sequence of every Store operation
// (batches with duplicates, chat replies of several segments, not_before
// and expires_at, consent refusals; claims with filters, limits and
// ExpireToPending; commits of every outcome, stale and forged leases;
// releases, lease expiry, recovery, requeue, resolve, erase, prune,
// consent and suppression; Reopen, and a rebuild of the index on a copy
// whose consent facts must be the store's, for the stores that have
// them), applies
// each operation to every store and to a small reference model of the
// contract, and after each step compares what each returned and
// everything observable: Get of every envelope (state, attempts, class,
// receipt, next_at, lease end, update time, history), List (one full
// listing and a filtered, paged one), Counts, NextDue and Consent.
// Fences are compared by issue order (the n-th fence a store issued), not
// by value, since the contract fixes only that they grow.
//
// On a divergence it shrinks the sequence (drops operations while the
// same divergence remains) and reports the seed, a numbered minimal
// reproducer and the observations that differ. Every store starts at T0
// with Backoff{NoJitter, Base 1s, MaxAttempts 3} and a retention of an
// hour.
func Differential(t testing.TB, cfg DiffConfig) {
	t.Helper()
	cfg = cfg.withDefaults()
	if len(cfg.Stores) == 0 || (cfg.NoModel && len(cfg.Stores) < 2) {
		t.Fatal("queuetest.Differential: not enough stores to compare")
	}
	for _, s := range cfg.Stores {
		if s.Harness.Open == nil || s.Name == "" {
			t.Fatalf("queuetest.Differential: store %q has no name or no Harness.Open", s.Name)
		}
	}
	seen := map[string]bool{}
	diverged, reports := 0, 0
	for seed := cfg.FirstSeed; seed < cfg.FirstSeed+uint64(cfg.Seeds); seed++ {
		gen := newDiffGen(seed, cfg)
		d := runDiff(t, cfg, seed, gen.next, cfg.Steps)
		if d == nil {
			continue
		}
		diverged++
		if seen[d.sig] {
			continue
		}
		seen[d.sig] = true
		d = shrinkDiff(t, cfg, d)
		t.Error(d.report(cfg, t.Name()))
		if reports++; reports >= cfg.MaxReports {
			t.Logf("queuetest.Differential: stopped at seed %d after %d distinct divergences", seed, reports)
			return
		}
	}
	if diverged > 0 {
		t.Logf("queuetest.Differential: %d of %d seeds diverged (%d distinct)", diverged, cfg.Seeds, len(seen))
	}
}

func envInt(name string) (int, bool) {
	v, err := strconv.Atoi(os.Getenv(name))
	return v, err == nil && v > 0
}

func (c DiffConfig) withDefaults() DiffConfig {
	if c.Seeds <= 0 {
		c.Seeds = 8
	}
	if c.FirstSeed == 0 {
		c.FirstSeed = 1
	}
	if c.Steps <= 0 {
		c.Steps = 60
	}
	if c.MaxReports <= 0 {
		c.MaxReports = 3
	}
	if c.ShrinkRuns == 0 {
		c.ShrinkRuns = 300
	}
	if c.ShrinkTime <= 0 {
		c.ShrinkTime = 10 * time.Second
	}
	if s, ok := envInt("OUTBOX_DIFF_SEED"); ok {
		c.FirstSeed, c.Seeds = uint64(s), 1
	}
	if n, ok := envInt("OUTBOX_DIFF_SEEDS"); ok && (n > c.Seeds || os.Getenv("OUTBOX_DIFF_SEED") != "") {
		c.Seeds = n
	}
	if n, ok := envInt("OUTBOX_DIFF_STEPS"); ok && n > c.Steps {
		c.Steps = n
	}
	if n, ok := envInt("OUTBOX_DIFF_REPORTS"); ok && n > c.MaxReports {
		c.MaxReports = n
	}
	return c
}

// party is one participant of a run: the model or a store.
type party struct {
	name  string
	h     Harness
	store queue.Store
	clock *Clock
	opts  *queue.Options

	leases map[envelope.Key][]*queue.Lease // every lease returned, per row, in order
	fences map[uint64]int                  // fence → its issue number
	issued int
	last   uint64
}

// line is one observation: a key naming what was looked at and its value.
type line struct{ key, val string }

// diffRun is one run of a sequence against fresh stores.
type diffRun struct {
	t       testing.TB
	ctx     context.Context
	parties []*party // parties[0] is the model
	model   *model
	ref     int // the party the others are compared with
	ids     map[pair]bool
	users   map[pair]bool
	steps   int // the length of the run
}

func diffOptions(clock *Clock) *queue.Options {
	return &queue.Options{
		Now:       clock.Now,
		Logger:    slog.New(slog.DiscardHandler),
		Backoff:   queue.Backoff{NoJitter: true, Base: time.Second, MaxAttempts: diffMaxAttempts},
		Retention: diffRetention,
	}
}

func newParty(name string, h Harness) *party {
	clock := NewClock(T0)
	return &party{name: name, h: h, clock: clock, opts: diffOptions(clock),
		leases: map[envelope.Key][]*queue.Lease{}, fences: map[uint64]int{}}
}

// divergence is what a run found: the first step after which the parties
// disagree.
type divergence struct {
	seed   uint64
	ops    []diffOp // up to and including the step that diverged
	sig    string   // operation kind, field and parties, to recognise it while shrinking
	lines  []string
	odd    []string // the parties that differ from the reference on the first line
	agree  []string // the reference and those that agree with it
	before int      // the length of the sequence before shrinking
	runs   int      // replays spent shrinking
}

// runDiff runs up to steps operations from next against fresh stores and
// returns the first divergence, or nil.
func runDiff(t testing.TB, cfg DiffConfig, seed uint64, next func(r *diffRun, step int) diffOp, steps int) *divergence {
	t.Helper()
	r := &diffRun{t: t, ctx: context.Background(), ids: map[pair]bool{}, users: map[pair]bool{}, steps: steps}
	mp := newParty("model", Harness{})
	r.model = newModel(mp.opts)
	mp.store = r.model
	r.parties = append(r.parties, mp)
	for _, s := range cfg.Stores {
		p := newParty(s.Name, s.Harness)
		p.store = s.Harness.Open(t, p.opts)
		if p.store == nil {
			t.Fatalf("queuetest.Differential: %s: Harness.Open returned nil", s.Name)
		}
		r.parties = append(r.parties, p)
	}
	if cfg.NoModel {
		r.ref = 1
	}
	defer func() {
		for _, p := range r.parties {
			_ = p.store.Close()
		}
	}()
	var ops []diffOp
	for step := range steps {
		op := next(r, step)
		if op == nil {
			break
		}
		ops = append(ops, op)
		op.note(r)
		results := make([][]line, len(r.parties))
		for i, p := range r.parties {
			results[i] = guard("op", func() []line { return op.apply(r, p) })
			results[i] = append(results[i], guard("observe", func() []line { return r.observe(p, step) })...)
		}
		if lines, first, odd, agree := r.compare(results, cfg.NoModel); lines != nil {
			sig := op.kind() + ":" + fieldOf(first) + ":" + strings.Join(odd, ",")
			return &divergence{seed: seed, ops: ops, sig: sig, lines: lines, odd: odd, agree: agree, before: len(ops)}
		}
	}
	return nil
}

// guard runs fn, turning a panic into an observation.
func guard(what string, fn func() []line) (out []line) {
	defer func() {
		if v := recover(); v != nil {
			out = append(out, line{what + ".panic", fmt.Sprint(v)})
		}
	}()
	return fn()
}

// compare returns the lines on which the parties disagree, and the key of
// the first of them with the parties that differ there from the reference
// and those that agree with it. Without the model, the model's lines are
// left out.
func (r *diffRun) compare(results [][]line, noModel bool) (out []string, first string, odd, agree []string) {
	from := 0
	if noModel {
		from = 1
	}
	vals := make([]map[string]string, len(results))
	var keys []string
	seen := map[string]bool{}
	for i, res := range results {
		vals[i] = make(map[string]string, len(res))
		for _, l := range res {
			vals[i][l.key] = l.val
			if !seen[l.key] {
				seen[l.key] = true
				keys = append(keys, l.key)
			}
		}
	}
	for _, k := range keys {
		same := true
		ref, ok := vals[r.ref][k]
		if !ok {
			ref = "<none>"
		}
		var who []string
		for i := from; i < len(vals); i++ {
			v, ok := vals[i][k]
			if !ok {
				v = "<none>"
			}
			if v != ref {
				same = false
				who = append(who, r.parties[i].name)
			}
		}
		if same {
			continue
		}
		if odd == nil {
			first, odd = k, who
			for i := from; i < len(vals); i++ {
				if !slices.Contains(who, r.parties[i].name) {
					agree = append(agree, r.parties[i].name)
				}
			}
		}
		var b strings.Builder
		b.WriteString(k + ":")
		for i := from; i < len(vals); i++ {
			v, ok := vals[i][k]
			if !ok {
				v = "<none>"
			}
			fmt.Fprintf(&b, "\n        %-10s %s", r.parties[i].name, v)
		}
		out = append(out, b.String())
	}
	return out, first, odd, agree
}

// fieldOf is the field part of an observation key ("Get(t/x)#1.state" →
// "state", "List(…).page[2]" → "List"), used in signatures.
func fieldOf(k string) string {
	if i := strings.LastIndexByte(k, '.'); i >= 0 && !strings.ContainsAny(k[i:], "()[]") {
		return k[i+1:]
	}
	if i := strings.IndexAny(k, "(["); i > 0 {
		return k[:i]
	}
	return k
}

// shrinkDiff drops operations from d's sequence while the same divergence
// remains (chunks first, then single steps).
func shrinkDiff(t testing.TB, cfg DiffConfig, d *divergence) *divergence {
	if cfg.ShrinkRuns < 0 {
		return d
	}
	best := d
	deadline := time.Now().Add(cfg.ShrinkTime)
	budget := func() bool { return best.runs < cfg.ShrinkRuns && time.Now().Before(deadline) }
	try := func(ops []diffOp) bool {
		if !budget() {
			return false
		}
		best.runs++
		got := runDiff(t, cfg, d.seed, func(_ *diffRun, i int) diffOp {
			if i < len(ops) {
				return ops[i]
			}
			return nil
		}, len(ops))
		if got == nil || got.sig != d.sig {
			return false
		}
		got.before, got.runs = best.before, best.runs
		best = got
		return true
	}
	// Drop chunks of operations, halving the chunk down to single steps;
	// then simplify single operations (a batch without one of its
	// envelopes, a claim without one of its filters); again while that
	// changed something.
	drop := func() {
		for chunk := max(len(best.ops)/2, 1); budget(); {
			removed := false
			for i := 0; i < len(best.ops) && budget(); {
				ops := best.ops
				cand := append(slices.Clone(ops[:i]), ops[min(i+chunk, len(ops)):]...)
				if len(cand) > 0 && try(cand) {
					removed = true
					continue
				}
				i += chunk
			}
			if !removed {
				if chunk == 1 {
					return
				}
				chunk /= 2
			}
		}
	}
	simplify := func() bool {
		// Two advances of the clock in a row are one.
		for i := 0; i+1 < len(best.ops); i++ {
			a, ok1 := best.ops[i].(*opAdvance)
			b, ok2 := best.ops[i+1].(*opAdvance)
			if ok1 && ok2 {
				ops := append(slices.Clone(best.ops[:i]), &opAdvance{d: a.d + b.d})
				if try(append(ops, best.ops[i+2:]...)) {
					return true
				}
			}
		}
		for i := 0; i < len(best.ops); i++ {
			s, ok := best.ops[i].(interface{ simpler() []diffOp })
			if !ok {
				continue
			}
			for _, alt := range s.simpler() {
				ops := slices.Clone(best.ops)
				ops[i] = alt
				if try(ops) {
					return true
				}
			}
		}
		return false
	}
	for drop(); budget() && simplify(); {
		drop()
	}
	return best
}

func (d *divergence) report(cfg DiffConfig, test string) string {
	var b strings.Builder
	verb := "differs"
	if len(d.odd) > 1 {
		verb = "differ"
	}
	fmt.Fprintf(&b, "differential: seed %d: %s %s from %s after step %d", d.seed, strings.Join(d.odd, " and "), verb, strings.Join(d.agree, " and "), len(d.ops))
	if d.runs > 0 {
		fmt.Fprintf(&b, " (shrunk from %d steps in %d replays)", d.before, d.runs)
	}
	b.WriteString(":\n")
	now := T0
	for i, op := range d.ops {
		if a, ok := op.(*opAdvance); ok {
			now = now.Add(a.d)
		}
		fmt.Fprintf(&b, "  %2d. [%s] %s\n", i+1, at(now), op)
	}
	b.WriteString("  differing observations after the last step:\n")
	for i, l := range d.lines {
		if i == 12 {
			fmt.Fprintf(&b, "    … and %d more\n", len(d.lines)-i)
			break
		}
		b.WriteString("    " + l + "\n")
	}
	fmt.Fprintf(&b, "  replay the whole seed: OUTBOX_DIFF_SEED=%d OUTBOX_DIFF_STEPS=%d go test -run '^%s$' <its package>", d.seed, cfg.Steps, test)
	return b.String()
}

// at formats a time relative to T0 ("T0+1h30s"); "zero" for the zero time.
func at(t time.Time) string {
	if t.IsZero() {
		return "zero"
	}
	d := t.Sub(T0)
	if d < 0 {
		return "T0-" + (-d).String()
	}
	return "T0+" + d.String()
}

var diffErrors = []struct {
	name string
	err  error
}{
	{"ErrClosed", queue.ErrClosed},
	{"ErrStaleFence", queue.ErrStaleFence},
	{"ErrLeaseLost", queue.ErrLeaseLost},
	{"ErrCrossTenant", queue.ErrCrossTenant},
	{"ErrConsentDenied", queue.ErrConsentDenied},
	{"ErrExpired", queue.ErrExpired},
	{"ErrBadCursor", queue.ErrBadCursor},
	{"ErrInvalidTransition", queue.ErrInvalidTransition},
	{"ErrNotFound", queue.ErrNotFound},
	{"ErrInvalid", envelope.ErrInvalid},
}

// errText names an error by the exported errors it matches (errors.Is),
// with an *EnqueueError's index, key and reason; "ok" for nil, "error" for
// one that matches none (its text is not compared).
func errText(err error) string {
	if err == nil {
		return "ok"
	}
	var names []string
	for _, e := range diffErrors {
		if errors.Is(err, e.err) {
			names = append(names, e.name)
		}
	}
	if len(names) == 0 {
		names = []string{"error"}
	}
	s := strings.Join(names, "+")
	var ee *queue.EnqueueError
	if errors.As(err, &ee) {
		s += fmt.Sprintf(" (EnqueueError index %d %s/%s reason %q)", ee.Index, ee.Tenant, ee.ID, ee.Reason)
	}
	return s
}

// envHashes caches envHash by the envelope's fields (encoding a long
// reply for every observation would be most of a run's time).
var envHashes sync.Map

// envHash fingerprints an envelope's JSON encoding (which does not depend
// on how a store keeps times or raw payload bytes).
func envHash(e *envelope.Envelope) string {
	if e == nil {
		return "nil"
	}
	var k strings.Builder
	for _, s := range []string{e.SchemaVersion, e.ID, e.UserID, e.TenantID, string(e.Channel), string(e.Template),
		e.Recipient.Email, strconv.FormatBool(e.Recipient.EmailVerified), e.Recipient.ChatID,
		strconv.FormatBool(e.ConsentSnapshot.DigestEnabled), e.ConsentSnapshot.Cadence, e.ConsentSnapshot.UnsubscribeRef,
		e.NotBefore.String(), e.ExpiresAt.String(), e.CreatedAt.String(), string(e.Payload)} {
		k.WriteString(s)
		k.WriteByte(0)
	}
	if p := e.Recipient.PushSubscription; p != nil {
		fmt.Fprintf(&k, "%s\x00%s\x00%s\x00%v", p.Endpoint, p.Keys.P256dh, p.Keys.Auth, p.ExpirationTime != nil)
		if p.ExpirationTime != nil {
			fmt.Fprintf(&k, "%v", *p.ExpirationTime)
		}
	}
	if h, ok := envHashes.Load(k.String()); ok {
		return h.(string)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return "unencodable"
	}
	sum := sha256.Sum256(b)
	h := hex.EncodeToString(sum[:5])
	envHashes.Store(k.String(), h)
	return h
}

// fence names a fence by its issue number in p.
func (p *party) fence(f uint64) string {
	if f == 0 {
		return "0"
	}
	if n, ok := p.fences[f]; ok {
		return "#" + strconv.Itoa(n)
	}
	return "unissued"
}

// took records the leases a Claim or Recover returned and renders them.
func (p *party) took(ls []*queue.Lease, err error) []line {
	out := []line{{"op.err", errText(err)}, {"op.leases", strconv.Itoa(len(ls))}}
	for i, l := range ls {
		if l == nil {
			out = append(out, line{fmt.Sprintf("op.lease[%d]", i), "nil"})
			continue
		}
		order := "ok"
		if l.Fence <= p.last {
			order = fmt.Sprintf("fence not above the last one issued (%d after %d)", l.Fence, p.last)
		}
		p.last = max(p.last, l.Fence)
		p.issued++
		if _, dup := p.fences[l.Fence]; !dup {
			p.fences[l.Fence] = p.issued
		}
		p.leases[l.Key] = append(p.leases[l.Key], l)
		out = append(out, line{fmt.Sprintf("op.lease[%d]", i), fmt.Sprintf(
			"%s attempt=%d owner=%s fence=%s expires=%s segments=%d enqueued=%s user=%s channel=%s envelope=%s",
			l.Key, l.Attempt, l.Owner, p.fence(l.Fence), at(l.ExpiresAt), l.Segments, at(l.EnqueuedAt),
			l.UserID, l.Channel, envHash(l.Envelope))},
			line{fmt.Sprintf("op.lease[%d].fence-order", i), order})
	}
	return out
}

// The filtered listings, one per step in turn.
// dueFilters are the NextDue filters every observation compares: none, a
// tenant, channels, and both.
var dueFilters = []queue.DueFilter{
	{},
	{Tenant: "acme"},
	{Channels: []envelope.Channel{envelope.ChannelPush}},
	{Tenant: envelope.DefaultTenant, Channels: []envelope.Channel{envelope.ChannelTelegram, envelope.ChannelEmail}},
}

var diffListFilters = []queue.ListFilter{
	{Limit: 2},
	{Tenant: envelope.DefaultTenant, Limit: 3},
	{State: envelope.StatePending, Limit: 2},
	{Channel: envelope.ChannelTelegram, Limit: 1},
	{Tenant: "acme", State: envelope.StateSent},
	{State: envelope.StateRetryable},
	{Channel: envelope.ChannelEmail, State: envelope.StateSuppressed, Limit: 1},
	{State: envelope.StateDeadLetter, Limit: 2},
	{State: envelope.StateSending},
	{State: envelope.StateExpired, Limit: 1},
	{State: envelope.StateUnresolved},
	{Tenant: "acme", Channel: envelope.ChannelPush, Limit: 1},
}

func sortedPairs(m map[pair]bool) []pair {
	out := make([]pair, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].a != out[j].a {
			return out[i].a < out[j].a
		}
		return out[i].b < out[j].b
	})
	return out
}

func history(h []queue.Attempt) string {
	parts := make([]string, len(h))
	for i, a := range h {
		parts[i] = fmt.Sprintf("%d@%s:%s/%s", a.Attempt, at(a.At), a.State, a.Class)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func countsText(c queue.Counts, err error) string {
	if err != nil {
		return errText(err)
	}
	var parts []string
	for _, st := range envelope.States {
		for _, ch := range envelope.Channels {
			if n := c[st][ch]; n != 0 {
				parts = append(parts, fmt.Sprintf("%s/%s=%d", st, ch, n))
			}
		}
	}
	for st, m := range c {
		for ch, n := range m {
			if n != 0 && (!st.Valid() || !ch.Valid()) {
				parts = append(parts, fmt.Sprintf("%s/%s=%d", st, ch, n))
			}
		}
	}
	return strings.Join(parts, " ")
}

// observe renders everything observable of p's store.
func (r *diffRun) observe(p *party, step int) []line {
	ctx, s := r.ctx, p.store
	var out []line
	add := func(k, v string) { out = append(out, line{k, v}) }
	for _, k := range sortedPairs(r.ids) {
		name := "Get(" + k.a + "/" + k.b + ")"
		st, err := s.Get(ctx, k.a, k.b)
		if err != nil {
			add(name, errText(err))
			continue
		}
		add(name, fmt.Sprintf("tenant=%s id=%s user=%s channel=%s template=%s enqueued=%s segments=%d envelope=%s",
			st.Tenant, st.ID, st.UserID, st.Channel, st.Template, at(st.EnqueuedAt), len(st.Segments), envHash(st.Envelope)))
		add(name+".status", st.Status)
		for i, sg := range st.Segments {
			pre := fmt.Sprintf("%s#%d.", name, i)
			add(pre+"index", strconv.Itoa(sg.Index))
			add(pre+"state", string(sg.State))
			add(pre+"attempts", strconv.Itoa(sg.Attempts))
			add(pre+"class", string(sg.Class))
			add(pre+"receipt", sg.Receipt)
			add(pre+"fence", p.fence(sg.Fence))
			add(pre+"next_at", at(sg.NextAt))
			add(pre+"lease_end", at(sg.LeaseEnd))
			add(pre+"updated_at", at(sg.UpdatedAt))
			add(pre+"history", history(sg.History))
		}
	}
	// Every row in one page, then a filtered listing page by page.
	page, err := s.List(ctx, queue.ListFilter{Limit: 1000})
	if err != nil {
		add("List(all)", errText(err))
	} else {
		add("List(all)", fmt.Sprintf("%d rows, more=%t", len(page.Rows), page.Next != ""))
		for i, row := range page.Rows {
			add(fmt.Sprintf("List(all)[%d]", i), fmt.Sprintf("%s user=%s channel=%s state=%s attempts=%d class=%s updated=%s",
				row.Key, row.UserID, row.Channel, row.State, row.Attempts, row.Class, at(row.UpdatedAt)))
		}
	}
	f := diffListFilters[step%len(diffListFilters)]
	name := fmt.Sprintf("List(%+v)", f)
	for n := 0; ; n++ {
		page, err := s.List(ctx, f)
		if err != nil {
			add(fmt.Sprintf("%s.page[%d]", name, n), errText(err))
			break
		}
		keys := make([]string, len(page.Rows))
		for i, row := range page.Rows {
			keys[i] = row.Key.String() + ":" + string(row.State)
		}
		add(fmt.Sprintf("%s.page[%d]", name, n), fmt.Sprintf("%v more=%t", keys, page.Next != ""))
		if page.Next == "" || n > 200 {
			break
		}
		f.Cursor = page.Next
	}
	for _, tenant := range []string{"", envelope.DefaultTenant, "acme"} {
		c, err := s.Counts(ctx, tenant)
		add("Counts("+tenant+")", countsText(c, err))
	}
	for _, f := range dueFilters {
		name := fmt.Sprintf("NextDue(%s,%v)", f.Tenant, f.Channels)
		if due, err := s.NextDue(ctx, f); err != nil {
			add(name, errText(err))
		} else {
			add(name, at(due))
		}
	}
	return append(out, r.observeFacts(s, "")...)
}

// observeFacts renders the consent facts of s: every user's consent and
// the tenants' address suppressions, under keys that start with prefix.
func (r *diffRun) observeFacts(s queue.Store, prefix string) []line {
	ctx := r.ctx
	var out []line
	add := func(k, v string) { out = append(out, line{prefix + k, v}) }
	for _, k := range sortedPairs(r.users) {
		name := "Consent(" + k.a + "/" + k.b + ")"
		c, err := s.Consent(ctx, k.a, k.b)
		if err != nil {
			add(name, errText(err))
			continue
		}
		sup := make([]string, len(c.Suppressions))
		for i, x := range c.Suppressions {
			sup[i] = fmt.Sprintf("%s:%s:%s@%s", x.Channel, short(x.Target), x.Reason, at(x.At))
		}
		add(name+".flags", fmt.Sprintf("%+v", c.ConsentFlags))
		add(name+".suppressions", "["+strings.Join(sup, " ")+"]")
		add(name+".updated_at", at(c.UpdatedAt))
	}
	for _, tenant := range []string{envelope.DefaultTenant, "acme"} {
		name := "AddressSuppressions(" + tenant + ")"
		list, err := s.AddressSuppressions(ctx, tenant)
		if err != nil {
			add(name, errText(err))
			continue
		}
		sup := make([]string, len(list))
		for i, x := range list {
			sup[i] = fmt.Sprintf("%s:%s:%s@%s", x.Channel, short(x.Target), x.Reason, at(x.At))
		}
		add(name, "["+strings.Join(sup, " ")+"]")
	}
	return out
}

func short(target string) string {
	if len(target) > 8 {
		return target[:8]
	}
	return target
}

// diffOp is one generated operation. It holds everything it needs, so
// that a sequence replays (and shrinks) without its generator.
type diffOp interface {
	kind() string
	String() string
	// note adds the ids and users the operation names to the run's
	// universe of observed keys.
	note(r *diffRun)
	// apply runs the operation on p's store and renders what it returned.
	apply(r *diffRun, p *party) []line
}

type opEnqueue struct {
	envs  []*envelope.Envelope
	descs []string
}

func (o *opEnqueue) kind() string   { return "enqueue" }
func (o *opEnqueue) String() string { return "Enqueue(" + strings.Join(o.descs, ", ") + ")" }
func (o *opEnqueue) note(r *diffRun) {
	for _, e := range o.envs {
		r.ids[pair{e.Tenant(), e.ID}] = true
		r.users[pair{e.Tenant(), e.UserID}] = true
	}
}

func (o *opEnqueue) apply(r *diffRun, p *party) []line {
	envs := make([]*envelope.Envelope, len(o.envs))
	for i, e := range o.envs {
		envs[i] = copyEnvelope(e)
	}
	res, err := p.store.Enqueue(r.ctx, envs...)
	out := []line{{"op.err", errText(err)}, {"op.results", strconv.Itoa(len(res))}}
	for i, x := range res {
		out = append(out, line{fmt.Sprintf("op.result[%d]", i), fmt.Sprintf("%+v", x)})
	}
	return out
}

func (o *opEnqueue) simpler() []diffOp {
	if len(o.envs) < 2 {
		return nil
	}
	var out []diffOp
	for i := range o.envs {
		out = append(out, &opEnqueue{
			envs:  append(slices.Clone(o.envs[:i]), o.envs[i+1:]...),
			descs: append(slices.Clone(o.descs[:i]), o.descs[i+1:]...),
		})
	}
	return out
}

type opClaim struct {
	req     queue.ClaimRequest
	recover bool
}

func (o *opClaim) kind() string {
	if o.recover {
		return "recover"
	}
	return "claim"
}

func (o *opClaim) String() string {
	name := "Claim"
	if o.recover {
		name = "Recover"
	}
	s := fmt.Sprintf("%s(owner=%q lease=%s limit=%d", name, o.req.Owner, o.req.Lease, o.req.Limit)
	if o.req.Tenant != "" {
		s += " tenant=" + o.req.Tenant
	}
	if len(o.req.Channels) > 0 {
		s += fmt.Sprintf(" channels=%v", o.req.Channels)
	}
	if o.req.ExpireToPending {
		s += " ExpireToPending"
	}
	return s + ")"
}

func (o *opClaim) note(*diffRun) {}

func (o *opClaim) simpler() []diffOp {
	var out []diffOp
	with := func(f func(*queue.ClaimRequest)) {
		c := *o
		c.req.Channels = slices.Clone(o.req.Channels)
		f(&c.req)
		out = append(out, &c)
	}
	if o.req.Tenant != "" {
		with(func(r *queue.ClaimRequest) { r.Tenant = "" })
	}
	if len(o.req.Channels) > 0 {
		with(func(r *queue.ClaimRequest) { r.Channels = nil })
	}
	if o.req.ExpireToPending {
		with(func(r *queue.ClaimRequest) { r.ExpireToPending = false })
	}
	return out
}

func (o *opClaim) apply(r *diffRun, p *party) []line {
	req := o.req
	req.Channels = slices.Clone(o.req.Channels)
	if o.recover {
		return p.took(p.store.Recover(r.ctx, req))
	}
	return p.took(p.store.Claim(r.ctx, req))
}

// opWork is one turn of a worker: optionally a Recover whose leases are
// committed as their reconciliation found (routs, in order), then a claim
// whose leases are committed with the outcomes drawn for them (outs).
type opWork struct {
	recover bool
	rreq    queue.ClaimRequest
	routs   []queue.Outcome
	req     queue.ClaimRequest
	outs    []queue.Outcome
}

func (o *opWork) kind() string { return "work" }
func (o *opWork) String() string {
	texts := func(outs []queue.Outcome) string {
		s := make([]string, len(outs))
		for i, out := range outs {
			s[i] = outcomeText(out)
		}
		return strings.Join(s, "; ")
	}
	s := "Work("
	if o.recover {
		s += (&opClaim{req: o.rreq, recover: true}).String() + " committing " + texts(o.routs) + ", then "
	}
	return s + (&opClaim{req: o.req}).String() + " committing " + texts(o.outs) + ")"
}
func (o *opWork) note(*diffRun) {}

func (o *opWork) simpler() []diffOp {
	var out []diffOp
	if o.recover {
		c := *o
		c.recover, c.routs = false, nil
		out = append(out, &c)
		if len(o.routs) > 1 {
			c := *o
			c.rreq.Limit, c.routs = 1, o.routs[:1]
			out = append(out, &c)
		}
	}
	if len(o.outs) > 1 {
		for i := range o.outs {
			c := *o
			c.req.Limit, c.outs = 1, o.outs[i:i+1]
			out = append(out, &c)
		}
	}
	if len(o.req.Channels) > 0 || o.req.Tenant != "" {
		c := *o
		c.req.Channels, c.req.Tenant = nil, ""
		out = append(out, &c)
	}
	return out
}
func (o *opWork) apply(r *diffRun, p *party) []line {
	var out []line
	commit := func(name string, ls []*queue.Lease, outs []queue.Outcome) {
		for i, l := range ls {
			if i < len(outs) && l != nil {
				out = append(out, line{fmt.Sprintf("op.%s.commit[%d]", name, i), errText(p.store.Commit(r.ctx, l, outs[i]))})
			}
		}
	}
	if o.recover {
		ls, err := p.store.Recover(r.ctx, o.rreq)
		for _, l := range p.took(ls, err) {
			out = append(out, line{"op.recover." + strings.TrimPrefix(l.key, "op."), l.val})
		}
		commit("recover", ls, o.routs)
	}
	req := o.req
	req.Channels = slices.Clone(o.req.Channels)
	ls, err := p.store.Claim(r.ctx, req)
	out = append(out, p.took(ls, err)...)
	commit("claim", ls, o.outs)
	return out
}

// leaseRef names a lease by its row and its place among the leases
// returned for that row (0 = the first).
type leaseRef struct {
	key    envelope.Key
	nth    int
	forged bool // presented with another owner
}

func (l leaseRef) String() string {
	s := fmt.Sprintf("%s lease #%d", l.key, l.nth+1)
	if l.forged {
		s += " with owner \"intruder\""
	}
	return s
}

func (l leaseRef) resolve(p *party) *queue.Lease {
	ls := p.leases[l.key]
	if l.nth >= len(ls) {
		return nil
	}
	c := *ls[l.nth]
	if l.forged {
		c.Owner = "intruder"
	}
	return &c
}

type opCommit struct {
	ref leaseRef
	out queue.Outcome
}

func (o *opCommit) kind() string   { return "commit" }
func (o *opCommit) String() string { return fmt.Sprintf("Commit(%s, %s)", o.ref, outcomeText(o.out)) }

func outcomeText(o queue.Outcome) string {
	s := string(o.State)
	if o.Class != "" {
		s += " class=" + string(o.Class)
	}
	if o.RetryAfter > 0 {
		s += " RetryAfter=" + o.RetryAfter.String()
	}
	if o.NoAttempt {
		s += " NoAttempt"
	}
	if o.Receipt != "" {
		s += " receipt=" + o.Receipt
	}
	return s
}
func (o *opCommit) note(*diffRun) {}
func (o *opCommit) apply(r *diffRun, p *party) []line {
	l := o.ref.resolve(p)
	if l == nil {
		return []line{{"op.err", "no such lease"}}
	}
	return []line{{"op.err", errText(p.store.Commit(r.ctx, l, o.out))}}
}

type opRelease struct{ ref leaseRef }

func (o *opRelease) kind() string   { return "release" }
func (o *opRelease) String() string { return "Release(" + o.ref.String() + ")" }
func (o *opRelease) note(*diffRun)  {}
func (o *opRelease) apply(r *diffRun, p *party) []line {
	l := o.ref.resolve(p)
	if l == nil {
		return []line{{"op.err", "no such lease"}}
	}
	return []line{{"op.err", errText(p.store.Release(r.ctx, l))}}
}

type opAdvance struct{ d time.Duration }

func (o *opAdvance) kind() string                      { return "advance" }
func (o *opAdvance) String() string                    { return "Advance(" + o.d.String() + ")" }
func (o *opAdvance) note(*diffRun)                     {}
func (o *opAdvance) apply(_ *diffRun, p *party) []line { p.clock.Advance(o.d); return nil }

// opAdmin is an operation on one envelope or user.
type opAdmin struct {
	what   string // requeue, resolve, erase, consent, suppress, suppress-email, lift-address, prune
	tenant string
	id     string // envelope id, or user id, or (suppress-email) address, or (lift-address) target
	as     envelope.State
	flags  queue.ConsentFlags
	sup    queue.Suppression
	edge   bool
}

func (o *opAdmin) kind() string {
	if o.edge {
		return "edge"
	}
	return o.what
}

func (o *opAdmin) String() string {
	switch o.what {
	case "requeue":
		return fmt.Sprintf("Requeue(%s/%s)", o.tenant, o.id)
	case "resolve":
		return fmt.Sprintf("Resolve(%s/%s, as %q)", o.tenant, o.id, o.as)
	case "erase":
		return fmt.Sprintf("Erase(%s/%q)", o.tenant, o.id)
	case "consent":
		return fmt.Sprintf("SetConsent(%s/%q, %+v)", o.tenant, o.id, o.flags)
	case "suppress":
		return fmt.Sprintf("Suppress(%s/%q, %s target=%q reason=%s at=%s)", o.tenant, o.id, o.sup.Channel, short(o.sup.Target), o.sup.Reason, at(o.sup.At))
	case "suppress-email":
		return fmt.Sprintf("SuppressEmail(%s, %s, %s)", o.tenant, o.id, o.sup.Reason)
	case "lift-address":
		return fmt.Sprintf("LiftAddressSuppression(%s, %s)", o.tenant, short(o.id))
	case "nil":
		return "Enqueue(a reply, nil); Commit(nil lease, sent); Release(nil lease)"
	}
	return "Prune()"
}

func (o *opAdmin) note(r *diffRun) {
	switch o.what {
	case "requeue", "resolve":
		r.ids[pair{tenantOf(o.tenant), o.id}] = true
	case "erase", "consent", "suppress":
		r.users[pair{tenantOf(o.tenant), o.id}] = true
	}
}

func (o *opAdmin) apply(r *diffRun, p *party) []line {
	ctx, s := r.ctx, p.store
	var err error
	switch o.what {
	case "requeue":
		err = s.Requeue(ctx, o.tenant, o.id)
	case "resolve":
		err = s.Resolve(ctx, o.tenant, o.id, o.as)
	case "erase":
		err = s.Erase(ctx, o.tenant, o.id)
	case "consent":
		err = s.SetConsent(ctx, o.tenant, o.id, o.flags)
	case "suppress":
		err = s.Suppress(ctx, o.tenant, o.id, o.sup)
	case "suppress-email":
		err = s.SuppressEmail(ctx, o.tenant, o.id, o.sup.Reason)
	case "lift-address":
		err = s.LiftAddressSuppression(ctx, o.tenant, o.id)
	case "prune":
		n, err := s.Prune(ctx)
		return []line{{"op.err", errText(err)}, {"op.pruned", strconv.Itoa(n)}}
	case "nil":
		_, err := s.Enqueue(ctx, Reply("r-1", "u-1", "hello"), nil)
		return []line{{"op.Enqueue", errText(err)},
			{"op.Commit", errText(s.Commit(ctx, nil, queue.Outcome{State: envelope.StateSent}))},
			{"op.Release", errText(s.Release(ctx, nil))}}
	}
	return []line{{"op.err", errText(err)}}
}

// opClose closes the store and then calls every method: each must
// return ErrClosed (Close itself nil). It ends a run.
type opClose struct{}

func (opClose) kind() string   { return "close" }
func (opClose) String() string { return "Close(), then every method" }
func (opClose) note(*diffRun)  {}
func (opClose) apply(r *diffRun, p *party) []line {
	ctx, s := r.ctx, p.store
	var l *queue.Lease
	for _, k := range slices.SortedFunc(func(yield func(envelope.Key) bool) {
		for k := range p.leases {
			if !yield(k) {
				return
			}
		}
	}, func(a, b envelope.Key) int { return strings.Compare(a.String(), b.String()) }) {
		l = p.leases[k][len(p.leases[k])-1]
		break
	}
	if l == nil {
		l = &queue.Lease{Key: envelope.Key{Tenant: envelope.DefaultTenant, EnvelopeID: "r-1"}, Owner: "w-1", Fence: 1}
	}
	req := queue.ClaimRequest{Owner: "w-1", Lease: time.Minute, Limit: 1}
	calls := []struct {
		name string
		call func() error
	}{
		{"Close", s.Close},
		{"Enqueue", func() error { _, err := s.Enqueue(ctx, Reply("r-1", "u-1", "hello")); return err }},
		{"Claim", func() error { _, err := s.Claim(ctx, req); return err }},
		{"Commit", func() error { return s.Commit(ctx, l, queue.Outcome{State: envelope.StateSent}) }},
		{"Release", func() error { return s.Release(ctx, l) }},
		{"Recover", func() error { _, err := s.Recover(ctx, req); return err }},
		{"NextDue", func() error { _, err := s.NextDue(ctx, queue.DueFilter{}); return err }},
		{"Get", func() error { _, err := s.Get(ctx, "", "r-1"); return err }},
		{"List", func() error { _, err := s.List(ctx, queue.ListFilter{}); return err }},
		{"Counts", func() error { _, err := s.Counts(ctx, ""); return err }},
		{"Requeue", func() error { return s.Requeue(ctx, "", "r-1") }},
		{"Resolve", func() error { return s.Resolve(ctx, "", "r-1", envelope.StateSent) }},
		{"Consent", func() error { _, err := s.Consent(ctx, "", "u-1"); return err }},
		{"SetConsent", func() error { return s.SetConsent(ctx, "", "u-1", queue.ConsentFlags{}) }},
		{"Suppress", func() error {
			return s.Suppress(ctx, "", "u-1", queue.Suppression{Channel: envelope.ChannelEmail, Reason: envelope.ClassUnsubscribed})
		}},
		{"Erase", func() error { return s.Erase(ctx, "", "u-1") }},
		{"Prune", func() error { _, err := s.Prune(ctx); return err }},
		{"SuppressEmail", func() error { return s.SuppressEmail(ctx, "", diffSharedEmail, envelope.ClassBounced) }},
		{"AddressSuppressions", func() error { _, err := s.AddressSuppressions(ctx, ""); return err }},
		{"LiftAddressSuppression", func() error {
			return s.LiftAddressSuppression(ctx, "", queue.TargetOfValue("email:"+diffSharedEmail))
		}},
		{"Close again", s.Close},
	}
	var out []line
	for _, c := range calls {
		out = append(out, line{"op." + c.name, errText(c.call())})
	}
	return out
}

// opRebuild compares the consent facts that a rebuild of each store's
// index recovers (on a copy) with the model's; a store without Rebuilt
// (and the model) answers with its own facts, which nothing loses.
type opRebuild struct{}

func (opRebuild) kind() string   { return "rebuild" }
func (opRebuild) String() string { return "Rebuilt() (the facts a rebuild of the index keeps)" }
func (opRebuild) note(*diffRun)  {}
func (opRebuild) apply(r *diffRun, p *party) []line {
	if p.h.Rebuilt == nil {
		return r.observeFacts(p.store, "rebuilt.")
	}
	s := p.h.Rebuilt(r.t, p.store, p.opts)
	defer s.Close()
	return r.observeFacts(s, "rebuilt.")
}

type opReopen struct{}

func (opReopen) kind() string   { return "reopen" }
func (opReopen) String() string { return "Reopen() (the stores that can)" }
func (opReopen) note(*diffRun)  {}
func (opReopen) apply(r *diffRun, p *party) []line {
	if p.h.Reopen != nil {
		p.store = p.h.Reopen(r.t, p.store, p.opts)
	}
	return nil
}
