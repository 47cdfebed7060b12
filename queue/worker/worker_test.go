package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/memstore"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"
)

// threeSegmentText is a reply long enough for three Telegram segments.
func threeSegmentText() string {
	para := strings.Repeat("Segments are delivered in order, one after the other. ", 50) // ~2750 chars
	return para + "\n\n" + para + "\n\n" + para
}

func TestWorker_ConcurrentWorkersDeliverEachSegmentOnce(t *testing.T) {
	s := memstore.New(&queue.Options{Logger: discard}) // real clock: leases really race
	t.Cleanup(func() { s.Close() })
	fakes := map[envelope.Channel]channels.Provider{}
	pf := map[envelope.Channel]*fake.Provider{}
	for _, ch := range envelope.Channels {
		pf[ch] = fake.New(ch)
		fakes[ch] = pf[ch]
	}
	var envs []*envelope.Envelope
	for i := range 60 {
		user := fmt.Sprintf("u%d", i%7)
		envs = append(envs,
			queuetest.Digest(fmt.Sprintf("d%d", i), user),
			queuetest.Nudge(fmt.Sprintf("n%d", i), user),
			queuetest.Reply(fmt.Sprintf("r%d", i), user, "short reply"))
	}
	envs = append(envs, queuetest.Reply("long", "u1", threeSegmentText()))
	mustEnqueue(t, s, envs...)

	var rows int
	for _, e := range envs {
		rows += renderSegments(e)
	}
	if rows != 3*60+3 {
		t.Fatalf("test setup: %d rows, want %d (the reply must split into 3 segments)", rows, 3*60+3)
	}

	var workers []*running
	for i := range 4 {
		workers = append(workers, startWorker(t, Config{
			Store: s, Providers: fakes, Renderer: testRenderer{}, Logger: discard,
			Concurrency: 3, ClaimBatch: 1 + i%3, Owner: fmt.Sprintf("w%d", i),
		}))
	}
	waitFor(t, "every row sent", func() bool {
		c, err := s.Counts(context.Background(), "")
		return err == nil && c.Total(envelope.StateSent) == rows
	})
	for _, r := range workers {
		r.idle(t)
	}
	var claims float64
	for _, r := range workers {
		for _, ch := range envelope.Channels {
			claims += testutil.ToFloat64(r.w.metrics.claims.WithLabelValues(string(ch)))
		}
	}
	if claims != float64(rows) {
		t.Errorf("claims over all workers = %v, want %d", claims, rows)
	}
	for _, e := range envs {
		for seg := range renderSegments(e) {
			if n := pf[e.Channel].Delivered(keyOf(e, seg)); n != 1 {
				t.Errorf("%s delivered %d times, want 1", keyOf(e, seg), n)
			}
		}
		st, err := s.Get(context.Background(), e.Tenant(), e.ID)
		if err != nil || st.Status != queue.StatusDelivered {
			t.Errorf("%s: status %v, err %v; want delivered", e.ID, st, err)
		}
	}
}

// renderSegments is the number of rows an envelope materialises.
func renderSegments(e *envelope.Envelope) int {
	if e.Template != envelope.TemplateReply {
		return 1
	}
	p, _ := e.ReplyPayload()
	return len(envelope.SplitReply(p.Text))
}

func TestWorker_BackoffThenDeadLetter(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{Base: time.Second, MaxAttempts: 3, NoJitter: true})
	env := queuetest.Nudge("n1", "u1")
	key := keyOf(env, 0)
	te.fakes[envelope.ChannelPush].Script(key, fake.FailRetryable, fake.FailRetryable, fake.FailRetryable, fake.FailRetryable)
	te.enqueue(t, env)
	r := startWorker(t, te.config())

	r.waitEvent(t, "attempt 1", is("deliver", key, "retryable"))
	seg := segment(t, te.store, key)
	if seg.State != envelope.StateRetryable || seg.Attempts != 1 || seg.Class != envelope.ClassProviderUnavailable {
		t.Fatalf("after attempt 1: %+v", seg)
	}
	if want := t0.Add(time.Second); !seg.NextAt.Equal(want) {
		t.Fatalf("next attempt at %v, want %v", seg.NextAt, want)
	}

	// Not before the backoff is due.
	r.advance(t, te.clock, 500*time.Millisecond)
	if n := len(calls(te.fakes[envelope.ChannelPush], fake.OpDeliver, key)); n != 1 {
		t.Fatalf("%d calls before the backoff was due, want 1", n)
	}
	r.advance(t, te.clock, 500*time.Millisecond)
	waitFor(t, "attempt 2", func() bool { return r.count(is("deliver", key, "retryable")) == 2 })
	if seg := segment(t, te.store, key); seg.Attempts != 2 || !seg.NextAt.Equal(te.clock.Now().Add(2*time.Second)) {
		t.Fatalf("after attempt 2: %+v", seg)
	}
	r.advance(t, te.clock, 2*time.Second)
	r.waitEvent(t, "attempt 3", is("deliver", key, "dead_letter"))

	seg = segment(t, te.store, key)
	if seg.State != envelope.StateDeadLetter || seg.Attempts != 3 {
		t.Fatalf("after attempt 3: %+v", seg)
	}
	r.advance(t, te.clock, time.Hour)
	if n := len(calls(te.fakes[envelope.ChannelPush], fake.OpDeliver, key)); n != 3 {
		t.Errorf("%d calls, want 3", n)
	}
	m := r.w.metrics
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"retries", testutil.ToFloat64(m.retries.WithLabelValues("push", "provider_unavailable")), 2},
		{"dead letters", testutil.ToFloat64(m.deadLetters.WithLabelValues("push", "provider_unavailable")), 1},
		{"deliveries retryable", testutil.ToFloat64(m.deliveries.WithLabelValues("push", "retryable")), 2},
		{"deliveries dead_letter", testutil.ToFloat64(m.deliveries.WithLabelValues("push", "dead_letter")), 1},
		{"claims", testutil.ToFloat64(m.claims.WithLabelValues("push")), 3},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestWorker_RetryAfterIsHonoured(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{Base: time.Second, NoJitter: true})
	te.fakes[envelope.ChannelEmail].SetRetryAfter(time.Hour)
	env := queuetest.Digest("d1", "u1")
	key := keyOf(env, 0)
	te.fakes[envelope.ChannelEmail].Script(key, fake.FailRetryable)
	te.enqueue(t, env)
	r := startWorker(t, te.config())

	r.waitEvent(t, "the rate-limited attempt", is("deliver", key, "retryable"))
	seg := segment(t, te.store, key)
	if seg.Class != envelope.ClassRateLimited || seg.NextAt.Before(t0.Add(time.Hour)) {
		t.Fatalf("got class %s next %v, want rate_limited no sooner than %v", seg.Class, seg.NextAt, t0.Add(time.Hour))
	}
	r.advance(t, te.clock, 59*time.Minute)
	if n := len(calls(te.fakes[envelope.ChannelEmail], fake.OpDeliver, key)); n != 1 {
		t.Fatalf("retried before Retry-After: %d calls", n)
	}
	r.advance(t, te.clock, time.Minute)
	r.waitEvent(t, "the retry", is("deliver", key, "sent"))
}

func TestWorker_PermanentGoesToDeadLetterAtOnce(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	env := queuetest.Digest("d1", "u1")
	key := keyOf(env, 0)
	te.fakes[envelope.ChannelEmail].Script(key, fake.FailPermanent)
	te.enqueue(t, env)
	r := startWorker(t, te.config())

	r.waitEvent(t, "the permanent failure", is("deliver", key, "dead_letter"))
	seg := segment(t, te.store, key)
	if seg.State != envelope.StateDeadLetter || seg.Attempts != 1 || seg.Class != envelope.ClassInvalidRequest {
		t.Fatalf("got %+v, want dead_letter after 1 attempt with invalid_request", seg)
	}
	r.advance(t, te.clock, 24*time.Hour)
	if n := len(te.fakes[envelope.ChannelEmail].Calls()); n != 1 {
		t.Errorf("%d calls, want 1", n)
	}
	if got := testutil.ToFloat64(r.w.metrics.deadLetters.WithLabelValues("email", "invalid_request")); got != 1 {
		t.Errorf("dead letters = %v, want 1", got)
	}
}

func TestWorker_RecipientGone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   *envelope.Envelope
		state envelope.State
		class envelope.ErrorClass
	}{
		{"EmailBounces", queuetest.Digest("d1", "u1"), envelope.StateBounced, envelope.ClassBounced},
		{"PushSubscriptionGone", queuetest.Nudge("n1", "u1"), envelope.StateBounced, envelope.ClassSubscriptionGone},
		{"TelegramBlocked", queuetest.Reply("r1", "u1", "hello"), envelope.StateSuppressed, envelope.ClassBlockedByUser},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := newTestEnv(t, queue.Backoff{})
			key := keyOf(tc.env, 0)
			te.fakes[tc.env.Channel].Script(key, fake.Gone)
			te.enqueue(t, tc.env)
			r := startWorker(t, te.config())

			r.waitEvent(t, "the gone recipient", is("deliver", key, string(tc.state)))
			seg := segment(t, te.store, key)
			if seg.State != tc.state || seg.Class != tc.class {
				t.Fatalf("got %s/%s, want %s/%s", seg.State, seg.Class, tc.state, tc.class)
			}
			c, err := te.store.Consent(context.Background(), key.Tenant, tc.env.UserID)
			if err != nil {
				t.Fatal(err)
			}
			want := queue.TargetOf(tc.env)
			found := false
			for _, s := range c.Suppressions {
				found = found || (s.Channel == tc.env.Channel && s.Target == want)
			}
			if !found {
				t.Errorf("no suppression of the recipient written: %+v", c.Suppressions)
			}
		})
	}
}

func TestWorker_ComplaintClassGoesToComplaint(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	env := queuetest.Digest("d1", "u1")
	key := keyOf(env, 0)
	p := &scriptedProvider{Provider: te.fakes[envelope.ChannelEmail], deliver: map[envelope.Key][]func() (channels.Receipt, error){
		key: {func() (channels.Receipt, error) {
			return channels.Receipt{}, envelope.RecipientGone(envelope.ClassComplaint, errors.New("marked as spam"))
		}},
	}}
	te.enqueue(t, env)
	cfg := te.config()
	cfg.Providers = map[envelope.Channel]channels.Provider{envelope.ChannelEmail: p}
	r := startWorker(t, cfg)
	r.waitEvent(t, "the complaint", is("deliver", key, "complaint"))
	if seg := segment(t, te.store, key); seg.State != envelope.StateComplaint {
		t.Fatalf("state %s, want complaint", seg.State)
	}
}

func TestWorker_LostReceiptReconciledAccepted(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	p := te.fakes[envelope.ChannelEmail]
	p.SetIdempotent(true)
	env := queuetest.Digest("d1", "u1")
	key := keyOf(env, 0)
	p.Script(key, fake.LoseReceipt)
	te.enqueue(t, env)
	r := startWorker(t, te.config())

	r.waitEvent(t, "the lost receipt", is("deliver", key, callLost))
	if seg := segment(t, te.store, key); seg.State != envelope.StateSending {
		t.Fatalf("after a lost receipt the row is %s, want it left sending", seg.State)
	}
	// Before the lease expires nothing happens.
	r.advance(t, te.clock, 10*time.Second)
	if n := len(p.Calls()); n != 1 {
		t.Fatalf("%d calls before the lease expired, want 1", n)
	}
	r.advance(t, te.clock, DefaultLease)
	r.waitEvent(t, "the reconciliation", is("reconcile", key, "sent"))

	seg := segment(t, te.store, key)
	if seg.State != envelope.StateSent || seg.Receipt == "" {
		t.Fatalf("got %+v, want sent with the receipt", seg)
	}
	if n := p.Delivered(key); n != 1 {
		t.Errorf("delivered %d times, want 1", n)
	}
	if d, rc := len(calls(p, fake.OpDeliver, key)), len(calls(p, fake.OpReconcile, key)); d != 1 || rc != 1 {
		t.Errorf("%d deliver and %d reconcile calls, want 1 and 1", d, rc)
	}
	if got := testutil.ToFloat64(r.w.metrics.recoveries.WithLabelValues("accepted")); got != 1 {
		t.Errorf("lease recoveries accepted = %v, want 1", got)
	}
	if got := testutil.ToFloat64(r.w.metrics.deliveries.WithLabelValues("email", "retryable")); got != 0 {
		t.Errorf("a lost receipt was committed retryable %v times", got)
	}
}

func TestWorker_LostReceiptUnknownBecomesUnresolved(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	p := te.fakes[envelope.ChannelPush]
	env := queuetest.Nudge("n1", "u1")
	key := keyOf(env, 0)
	p.Script(key, fake.LoseReceipt)
	p.ScriptReconcile(key, channels.Unknown)
	te.enqueue(t, env)
	r := startWorker(t, te.config())

	r.waitEvent(t, "the lost receipt", is("deliver", key, callLost))
	r.advance(t, te.clock, DefaultLease+time.Second)
	r.waitEvent(t, "the reconciliation", is("reconcile", key, "unresolved"))
	seg := segment(t, te.store, key)
	if seg.State != envelope.StateUnresolved || seg.Class != envelope.ClassReconcileUnknown {
		t.Fatalf("got %s/%s, want unresolved/reconcile_unknown", seg.State, seg.Class)
	}
	// Never redelivered automatically.
	r.advance(t, te.clock, 48*time.Hour)
	if d, rc := len(calls(p, fake.OpDeliver, key)), len(calls(p, fake.OpReconcile, key)); d != 1 || rc != 1 {
		t.Errorf("%d deliver and %d reconcile calls, want 1 and 1", d, rc)
	}
	if got := testutil.ToFloat64(r.w.metrics.recoveries.WithLabelValues("unknown")); got != 1 {
		t.Errorf("lease recoveries unknown = %v, want 1", got)
	}
}

func TestWorker_ReplySegmentsInOrder(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{Base: time.Second, NoJitter: true})
	env := queuetest.Reply("r1", "u1", threeSegmentText())
	if n := renderSegments(env); n != 3 {
		t.Fatalf("test setup: %d segments, want 3", n)
	}
	p := te.fakes[envelope.ChannelTelegram]
	p.Script(keyOf(env, 1), fake.FailRetryable, fake.FailRetryable)
	te.enqueue(t, env)
	r := startWorker(t, te.config())

	for i := 0; ; i++ {
		st, err := te.store.Get(context.Background(), env.Tenant(), env.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == queue.StatusDelivered {
			break
		}
		if i == 20 {
			t.Fatalf("not delivered after %d clock steps: %+v", i, st)
		}
		r.idle(t)
		r.advance(t, te.clock, 10*time.Second)
	}

	var order []string
	for _, c := range p.Calls() {
		order = append(order, fmt.Sprintf("%d:%s", c.Key.Segment, c.Step))
	}
	want := []string{"0:succeed", "1:fail_retryable", "1:fail_retryable", "1:succeed", "2:succeed"}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Errorf("calls %v, want %v", order, want)
	}
	for seg, attempts := range []int{1, 3, 1} {
		k := keyOf(env, seg)
		if n := p.Delivered(k); n != 1 {
			t.Errorf("segment %d delivered %d times, want 1", seg, n)
		}
		if s := segment(t, te.store, k); s.State != envelope.StateSent || s.Attempts != attempts {
			t.Errorf("segment %d: %s after %d attempts, want sent after %d", seg, s.State, s.Attempts, attempts)
		}
	}
	for i, c := range calls(p, fake.OpDeliver, keyOf(env, 1)) {
		if c.Message == nil || c.Message.Chat == nil || c.Message.Chat.Segment != 1 || c.Message.Chat.Segments != 3 {
			t.Errorf("call %d of segment 1 rendered %+v", i, c.Message)
		}
	}
}

func TestWorker_RestartReconcilesInterruptedCall(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	p := te.fakes[envelope.ChannelPush]
	env := queuetest.Nudge("n1", "u1")
	key := keyOf(env, 0)
	p.Script(key, fake.Hang)
	started := make(chan struct{}, 1)
	p.OnDeliver(func(envelope.Key) {
		select {
		case started <- struct{}{}:
		default:
		}
	})
	te.enqueue(t, env)

	first := startWorker(t, te.config())
	select {
	case <-started:
	case <-time.After(waitTimeout):
		t.Fatal("the hanging call never started")
	}
	if err := first.stop(t); err != nil {
		t.Fatalf("first Run: %v", err)
	}
	if n := first.count(is("deliver", key, callInterrupted)); n != 1 {
		t.Fatalf("%d interrupted deliveries, want 1", n)
	}
	seg := segment(t, te.store, key)
	if seg.State != envelope.StateSending || seg.Attempts != 1 {
		t.Fatalf("after the stop: %+v, want left sending", seg)
	}
	if got := testutil.ToFloat64(first.w.metrics.deliveries.WithLabelValues("push", "retryable")); got != 0 {
		t.Errorf("an interrupted call was committed retryable")
	}

	te.clock.Advance(DefaultLease + time.Second)
	second := startWorker(t, te.config())
	second.waitEvent(t, "the reconciliation", is("reconcile", key, "retryable"))
	second.waitEvent(t, "the redelivery", is("deliver", key, "sent"))
	if n := p.Delivered(key); n != 1 {
		t.Errorf("delivered %d times, want 1", n)
	}
	var ops []string
	for _, c := range p.Calls() {
		ops = append(ops, c.Op+":"+c.Outcome.String())
	}
	if want := "deliver:unknown reconcile:rejected deliver:unknown"; strings.Join(ops, " ") != want {
		t.Errorf("calls %v, want %s", ops, want)
	}
	if got := testutil.ToFloat64(second.w.metrics.recoveries.WithLabelValues("rejected")); got != 1 {
		t.Errorf("lease recoveries rejected = %v, want 1", got)
	}
}

func TestWorker_TenantIsolation(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	var aEnvs, bEnvs []*envelope.Envelope
	for i := range 5 {
		a := queuetest.Nudge(fmt.Sprintf("n%d", i), "u1")
		a.TenantID = "a"
		b := queuetest.Nudge(fmt.Sprintf("n%d", i), "u1") // same ids in another tenant
		b.TenantID = "b"
		aEnvs, bEnvs = append(aEnvs, a), append(bEnvs, b)
	}
	te.enqueue(t, append(aEnvs, bEnvs...)...)
	cfg := te.config()
	cfg.Tenant = "a"
	r := startWorker(t, cfg)

	waitFor(t, "tenant a delivered", func() bool {
		c, err := te.store.Counts(context.Background(), "a")
		return err == nil && c.Total(envelope.StateSent) == len(aEnvs)
	})
	r.advance(t, te.clock, time.Minute)
	for _, c := range te.fakes[envelope.ChannelPush].Calls() {
		if c.Key.Tenant != "a" {
			t.Errorf("worker of tenant a called the provider for tenant %q", c.Key.Tenant)
		}
	}
	for _, b := range bEnvs {
		if seg := segment(t, te.store, keyOf(b, 0)); seg.State != envelope.StatePending || seg.Attempts != 0 {
			t.Errorf("tenant b row touched: %+v", seg)
		}
	}
}

func TestWorker_ShutdownReleasesUnstartedAndLeaksNothing(t *testing.T) {
	defer goleak.VerifyNone(t)
	te := newTestEnv(t, queue.Backoff{})
	p := te.fakes[envelope.ChannelPush]
	p.Default(fake.Hang)
	var envs []*envelope.Envelope
	for i := range 4 {
		envs = append(envs, queuetest.Nudge(fmt.Sprintf("n%d", i), "u1"))
	}
	te.enqueue(t, envs...)
	cfg := te.config()
	cfg.Concurrency = 4
	// One call at once, the next token 20 s later (within the lease), the
	// ones after that beyond it: one call hangs, one row waits for a token,
	// two are released at once.
	cfg.RateLimits = map[envelope.Channel]rate.Limit{envelope.ChannelPush: rate.Every(20 * time.Second)}
	r := startWorker(t, cfg)

	released := func(e event) bool { return e.r.status == outcomeReleased }
	waitFor(t, "one call in flight and two rows released", func() bool {
		return len(p.Calls()) == 1 && r.count(released) == 2
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := r.count(released); n != 3 {
		t.Errorf("%d rows released, want 3", n)
	}
	if n := r.count(func(e event) bool { return e.r.status == callInterrupted }); n != 1 {
		t.Errorf("%d calls interrupted, want 1", n)
	}
	if n := len(p.Calls()); n != 1 {
		t.Errorf("%d provider calls, want 1", n)
	}
	var sending, pending int
	for _, e := range envs {
		switch seg := segment(t, te.store, keyOf(e, 0)); {
		case seg.State == envelope.StateSending && seg.Attempts == 1:
			sending++
		case seg.State == envelope.StatePending && seg.Attempts == 0:
			pending++
		default:
			t.Errorf("unexpected row after shutdown: %+v", seg)
		}
	}
	if sending != 1 || pending != 3 {
		t.Errorf("%d sending and %d pending, want 1 and 3", sending, pending)
	}
	if got := testutil.ToFloat64(r.w.metrics.deliveries.WithLabelValues("push", outcomeReleased)); got != 3 {
		t.Errorf("released deliveries = %v, want 3", got)
	}
}

func TestWorker_ShutdownTimeout(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	unblock := make(chan struct{})
	returned := make(chan struct{})
	p := &scriptedProvider{Provider: te.fakes[envelope.ChannelPush], deliverCtx: func(ctx context.Context) (channels.Receipt, error) {
		defer close(returned)
		<-unblock // ignores ctx: a badly behaved provider
		return channels.Receipt{}, errors.New("too late")
	}}
	started := make(chan struct{})
	te.fakes[envelope.ChannelPush].OnDeliver(func(envelope.Key) { close(started) })
	env := queuetest.Nudge("n1", "u1")
	te.enqueue(t, env)
	cfg := te.config()
	cfg.Providers = map[envelope.Channel]channels.Provider{envelope.ChannelPush: p}
	cfg.ShutdownTimeout = 50 * time.Millisecond
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-started
	cancel()
	select {
	case err = <-done:
	case <-time.After(waitTimeout):
		t.Fatal("Run ignored its shutdown timeout")
	}
	close(unblock)
	<-returned
	if !errors.Is(err, ErrShutdownTimeout) {
		t.Fatalf("Run = %v, want ErrShutdownTimeout", err)
	}
	// Let the stray task finish before goleak looks.
	w.wg.Wait()
	if seg := segment(t, te.store, keyOf(env, 0)); seg.State != envelope.StateSending {
		t.Errorf("a call that failed during shutdown was committed: %s", seg.State)
	}
}

func TestWorker_ChannelWithoutProviderStaysPending(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	var logs bytes.Buffer
	email, push := queuetest.Digest("d1", "u1"), queuetest.Nudge("n1", "u1")
	te.enqueue(t, email, push)
	cfg := te.config()
	cfg.Providers = te.providers(envelope.ChannelPush)
	cfg.Logger = jsonLogger(&logs)
	r := startWorker(t, cfg)

	r.waitEvent(t, "the push delivery", is("deliver", keyOf(push, 0), "sent"))
	r.idle(t)
	// Idle means idle: the email row stays due, but the worker must not spin
	// on it (the store's next due time is in the past for ever).
	before := r.ends.Load()
	time.Sleep(300 * time.Millisecond)
	if n := r.ends.Load() - before; n > 6 {
		t.Errorf("%d loop turns in 300ms while idle", n)
	}
	r.advance(t, te.clock, time.Hour)
	if seg := segment(t, te.store, keyOf(email, 0)); seg.State != envelope.StatePending || seg.Attempts != 0 {
		t.Errorf("email row without provider: %+v, want pending", seg)
	}
	if n := len(te.fakes[envelope.ChannelEmail].Calls()); n != 0 {
		t.Errorf("unconfigured provider called %d times", n)
	}
	for ch, want := range map[string]float64{"email": 1, "telegram": 1, "push": 0} {
		if got := testutil.ToFloat64(r.w.metrics.unconfigured.WithLabelValues(ch)); got != want {
			t.Errorf("outbox_channel_unconfigured{channel=%q} = %v, want %v", ch, got, want)
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	var lines int
	for _, rec := range decodeLogs(t, &logs) {
		if rec["status"] == "unconfigured" && rec["channel"] == "email" {
			lines++
		}
	}
	if lines != 1 {
		t.Errorf("%d log lines say email is unconfigured, want 1:\n%s", lines, logs.String())
	}
}

func TestWorker_PanicIsContained(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{Base: time.Second, NoJitter: true})
	env := queuetest.Nudge("n1", "u1")
	key := keyOf(env, 0)
	te.fakes[envelope.ChannelPush].Script(key, fake.Panic)
	te.enqueue(t, env)
	r := startWorker(t, te.config())

	r.waitEvent(t, "the panic", is("deliver", key, callPanic))
	seg := segment(t, te.store, key)
	if seg.State != envelope.StateRetryable || seg.Class != envelope.ClassProviderPanic {
		t.Fatalf("after the panic: %s/%s, want retryable/provider_panic", seg.State, seg.Class)
	}
	if got := testutil.ToFloat64(r.w.metrics.panics.WithLabelValues("push")); got != 1 {
		t.Errorf("panics = %v, want 1", got)
	}
	r.advance(t, te.clock, time.Minute)
	r.waitEvent(t, "the retry", is("deliver", key, "sent"))
}

func TestWorker_RenderFailureIsDeadLetter(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	env := queuetest.Digest("render-fail-1", "u1")
	key := keyOf(env, 0)
	te.enqueue(t, env)
	r := startWorker(t, te.config())
	r.waitEvent(t, "the render failure", is("deliver", key, "dead_letter"))
	if seg := segment(t, te.store, key); seg.State != envelope.StateDeadLetter || seg.Class != envelope.ClassRenderFailed {
		t.Fatalf("got %s/%s, want dead_letter/render_failed", seg.State, seg.Class)
	}
	if n := len(te.fakes[envelope.ChannelEmail].Calls()); n != 0 {
		t.Errorf("provider called %d times for an unrenderable row", n)
	}
}

func TestWorker_Lifecycle(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	w, err := New(te.config())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	turned := make(chan struct{}, 1)
	w.hooks = &hooks{turnEnd: func() {
		select {
		case turned <- struct{}{}:
		default:
		}
	}}
	go func() { done <- w.Run(ctx) }()
	<-turned
	if err := w.Run(ctx); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	w.mu.Lock()
	stillRunning := w.running
	w.mu.Unlock()
	if stillRunning {
		t.Fatal("Close returned before Run stopped")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run stopped by Close = %v, want nil", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return after Close")
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if err := w.Run(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close = %v, want ErrClosed", err)
	}
}

func TestWorker_RunAgainAfterStop(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	w, err := New(te.config())
	if err != nil {
		t.Fatal(err)
	}
	first := runWorker(t, w)
	first.sync(t)
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}
	env := queuetest.Nudge("n1", "u1")
	te.enqueue(t, env)
	second := runWorker(t, w)
	second.waitEvent(t, "delivery by the restarted worker", is("deliver", keyOf(env, 0), "sent"))
}

func TestWorker_StoreClosedEndsRun(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	w, err := New(te.config())
	if err != nil {
		t.Fatal(err)
	}
	r := &running{w: w}
	w.hooks = &hooks{turnEnd: func() { r.ends.Add(1) }}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	waitFor(t, "a turn", func() bool { return r.ends.Load() > 0 })
	te.store.Close()
	w.wake()
	select {
	case err = <-done:
	case <-time.After(waitTimeout):
		t.Fatal("Run kept running on a closed store")
	}
	if !errors.Is(err, queue.ErrClosed) {
		t.Fatalf("Run = %v, want queue.ErrClosed", err)
	}
}

func TestNew_ConfigErrors(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	base := te.config()
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"NoStore", func(c *Config) { c.Store = nil }, "Store"},
		{"NoRenderer", func(c *Config) { c.Renderer = nil }, "Renderer"},
		{"NoProviders", func(c *Config) { c.Providers = nil }, "Providers"},
		{"NilProvider", func(c *Config) { c.Providers = map[envelope.Channel]channels.Provider{envelope.ChannelEmail: nil} }, "Providers"},
		{"WrongChannel", func(c *Config) {
			c.Providers = map[envelope.Channel]channels.Provider{envelope.ChannelEmail: te.fakes[envelope.ChannelPush]}
		}, "Providers"},
		{"UnknownChannel", func(c *Config) {
			c.Providers = map[envelope.Channel]channels.Provider{"fax": te.fakes[envelope.ChannelPush]}
		}, "Providers"},
		{"NegativeConcurrency", func(c *Config) { c.Concurrency = -1 }, "Concurrency"},
		{"NegativeLease", func(c *Config) { c.Lease = -time.Second }, "Lease"},
		{"NegativeClaimBatch", func(c *Config) { c.ClaimBatch = -1 }, "ClaimBatch"},
		{"NegativeShutdownTimeout", func(c *Config) { c.ShutdownTimeout = -1 }, "ShutdownTimeout"},
		{"ZeroRate", func(c *Config) { c.RateLimits = map[envelope.Channel]rate.Limit{envelope.ChannelEmail: 0} }, "RateLimits"},
		{"NegativeBurst", func(c *Config) { c.RateBursts = map[envelope.Channel]int{envelope.ChannelEmail: -1} }, "RateBursts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.edit(&cfg)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), "Config."+tc.field) {
				t.Fatalf("New = %v, want an error naming Config.%s", err, tc.field)
			}
		})
	}
	t.Run("Defaults", func(t *testing.T) {
		w, err := New(base)
		if err != nil {
			t.Fatal(err)
		}
		c := w.cfg
		if c.Concurrency != DefaultConcurrency || c.Lease != DefaultLease || c.ClaimBatch != DefaultConcurrency ||
			c.ShutdownTimeout != DefaultShutdownTimeout || !strings.HasPrefix(c.Owner, "worker-") {
			t.Errorf("defaults not applied: %+v", c)
		}
	})
}

func TestNew_SharedRegistry(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	reg := prometheus.NewRegistry()
	cfg := te.config()
	cfg.Registerer = reg
	w1, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := New(cfg)
	if err != nil {
		t.Fatalf("second worker on one registry: %v", err)
	}
	w1.metrics.claims.WithLabelValues("email").Inc()
	w2.metrics.claims.WithLabelValues("email").Inc()
	if got := testutil.ToFloat64(w1.metrics.claims.WithLabelValues("email")); got != 2 {
		t.Errorf("shared claims counter = %v, want 2", got)
	}
	te.enqueue(t, queuetest.Digest("d1", "u1"), queuetest.Nudge("n1", "u1"))
	n, err := testutil.GatherAndCount(reg, "outbox_queue_depth")
	if err != nil {
		t.Fatal(err)
	}
	if n != len(envelope.States) {
		t.Errorf("%d queue_depth series, want one per state (%d)", n, len(envelope.States))
	}
	want := "# HELP outbox_queue_depth Rows in the queue by state (refreshed at most every few seconds).\n# TYPE outbox_queue_depth gauge\n"
	for _, s := range envelope.States {
		v := 0
		if s == envelope.StatePending {
			v = 2
		}
		want += fmt.Sprintf("outbox_queue_depth{state=%q} %d\n", s, v)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "outbox_queue_depth"); err != nil {
		t.Error(err)
	}
}

func TestDecide(t *testing.T) {
	raw := errors.New("raw")
	for _, tc := range []struct {
		name                      string
		err                       error
		panicked, interr, timeout bool
		commit                    bool
		state                     envelope.State
		class                     envelope.ErrorClass
		call                      string
	}{
		{"Success", nil, false, false, false, true, envelope.StateSent, "", callSent},
		{"Panic", nil, true, false, false, true, envelope.StateRetryable, envelope.ClassProviderPanic, callPanic},
		{"Retryable", envelope.Retryable(envelope.ClassProviderUnavailable, raw), false, false, false, true, envelope.StateRetryable, envelope.ClassProviderUnavailable, callRetryable},
		{"PlainError", raw, false, false, false, true, envelope.StateRetryable, envelope.ClassUnknown, callRetryable},
		{"RetryableNoClass", &envelope.DeliveryError{Kind: envelope.KindRetryable}, false, false, false, true, envelope.StateRetryable, envelope.ClassUnknown, callRetryable},
		{"Permanent", envelope.Permanent(envelope.ClassPayloadTooLarge, raw), false, false, false, true, envelope.StateDeadLetter, envelope.ClassPayloadTooLarge, callPermanent},
		{"GoneBounced", envelope.RecipientGone(envelope.ClassSubscriptionGone, raw), false, false, false, true, envelope.StateBounced, envelope.ClassSubscriptionGone, callRecipientGone},
		{"GoneNoClass", &envelope.DeliveryError{Kind: envelope.KindRecipientGone}, false, false, false, true, envelope.StateBounced, envelope.ClassBounced, callRecipientGone},
		{"Complaint", envelope.RecipientGone(envelope.ClassComplaint, raw), false, false, false, true, envelope.StateComplaint, envelope.ClassComplaint, callRecipientGone},
		{"Blocked", envelope.RecipientGone(envelope.ClassBlockedByUser, raw), false, false, false, true, envelope.StateSuppressed, envelope.ClassBlockedByUser, callRecipientGone},
		{"Unsubscribed", envelope.RecipientGone(envelope.ClassUnsubscribed, raw), false, false, false, true, envelope.StateSuppressed, envelope.ClassUnsubscribed, callRecipientGone},
		{"TimeoutIsLost", envelope.Retryable(envelope.ClassTimeout, raw), false, false, false, false, envelope.StateSending, envelope.ClassTimeout, callLost},
		{"DeadlineIsLost", context.DeadlineExceeded, false, false, false, false, envelope.StateSending, envelope.ClassTimeout, callLost},
		{"LeaseDeadlinePassed", envelope.Retryable(envelope.ClassNetwork, raw), false, false, true, false, envelope.StateSending, envelope.ClassTimeout, callLost},
		{"Interrupted", envelope.Retryable(envelope.ClassTimeout, context.Canceled), false, true, false, false, envelope.StateSending, envelope.ClassInterrupted, callInterrupted},
		{"InterruptedPlain", context.Canceled, false, true, false, false, envelope.StateSending, envelope.ClassInterrupted, callInterrupted},
		{"PermanentDuringShutdown", envelope.Permanent(envelope.ClassAuthFailed, raw), false, true, false, true, envelope.StateDeadLetter, envelope.ClassAuthFailed, callPermanent},
		{"SuccessDuringShutdown", nil, false, true, false, true, envelope.StateSent, "", callSent},
		{"UnreachableAtTheLeaseDeadline", envelope.Retryable(envelope.ClassUnreachable, raw), false, false, true, true, envelope.StateRetryable, envelope.ClassUnreachable, callRetryable},
		{"UnreachableDuringShutdown", envelope.Retryable(envelope.ClassUnreachable, raw), false, true, false, true, envelope.StateRetryable, envelope.ClassUnreachable, callRetryable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decide(tc.err, tc.panicked, tc.interr, tc.timeout)
			if d.commit != tc.commit || d.out.State != tc.state || d.out.Class != tc.class || d.call != tc.call {
				t.Errorf("decide = commit %v %s/%s call %s; want commit %v %s/%s call %s",
					d.commit, d.out.State, d.out.Class, d.call, tc.commit, tc.state, tc.class, tc.call)
			}
		})
	}
	t.Run("NotIdempotent", func(t *testing.T) {
		// Telegram-like providers: an ambiguous failure is reconciled, not resent.
		for _, tc := range []struct {
			err    error
			commit bool
		}{
			{envelope.Retryable(envelope.ClassProviderUnavailable, raw), false},
			{envelope.Retryable(envelope.ClassNetwork, raw), false},
			{raw, false},
			{envelope.RetryAfter(envelope.ClassRateLimited, time.Second, raw), true},
			{envelope.Retryable(envelope.ClassQuotaExceeded, raw), true},
			{envelope.Retryable(envelope.ClassUnreachable, raw), true}, // no connection: nothing sent
			{envelope.Permanent(envelope.ClassInvalidRequest, raw), true},
			{nil, true},
		} {
			d := forProvider(decide(tc.err, false, false, false), false)
			if d.commit != tc.commit {
				t.Errorf("%v: commit = %v, want %v", tc.err, d.commit, tc.commit)
			}
			if !tc.commit && (d.out.State != envelope.StateSending || d.call != callLost) {
				t.Errorf("%v: = %+v, want left sending for reconciliation", tc.err, d)
			}
			if d2 := forProvider(decide(tc.err, false, false, false), true); d2 != decide(tc.err, false, false, false) {
				t.Errorf("%v: idempotent provider decision changed", tc.err)
			}
		}
	})
	t.Run("RetryAfter", func(t *testing.T) {
		d := decide(envelope.RetryAfter(envelope.ClassRateLimited, time.Minute, raw), false, false, false)
		if d.out.RetryAfter != time.Minute {
			t.Errorf("RetryAfter = %v, want 1m", d.out.RetryAfter)
		}
	})
}

// scriptedProvider wraps a fake: per-key functions answer Deliver (and
// may panic) before the fake's own script; deliverCtx, when set, answers
// every Deliver after the fake recorded it; reconcileErr answers Reconcile
// with an error.
type scriptedProvider struct {
	*fake.Provider
	deliverCtx   func(ctx context.Context) (channels.Receipt, error)
	reconcileErr map[envelope.Key]error

	mu      sync.Mutex
	deliver map[envelope.Key][]func() (channels.Receipt, error)
}

func (p *scriptedProvider) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	if p.deliverCtx != nil {
		_, _ = p.Provider.Deliver(ctx, key, msg) // records the call, fires OnDeliver
		return p.deliverCtx(ctx)
	}
	if fn := p.next(key); fn != nil {
		return fn()
	}
	return p.Provider.Deliver(ctx, key, msg)
}

func (p *scriptedProvider) next(key envelope.Key) func() (channels.Receipt, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fns := p.deliver[key]
	if len(fns) == 0 {
		return nil
	}
	p.deliver[key] = fns[1:]
	return fns[0]
}

func (p *scriptedProvider) Reconcile(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Reconciliation, error) {
	if err := p.reconcileErr[key]; err != nil {
		return channels.Reconciliation{}, err
	}
	return p.Provider.Reconcile(ctx, key, msg)
}

// jsonLogger logs everything, as JSON, into buf.
func jsonLogger(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func decodeLogs(t testing.TB, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("decode log line: %v", err)
		}
		out = append(out, m)
	}
	return out
}

// A successful delivery is logged at info (channel and status only), so an
// operator running at the default level sees that delivery works.
func TestWorker_SentLoggedAtInfo(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	var logs bytes.Buffer
	push := queuetest.Nudge("n1", "u1")
	te.enqueue(t, push)
	cfg := te.config()
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r := startWorker(t, cfg)
	r.waitEvent(t, "the push delivery", is("deliver", keyOf(push, 0), "sent"))
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	for _, rec := range decodeLogs(t, &logs) {
		if rec["status"] == "sent" && rec["channel"] == "push" && rec["level"] == "INFO" {
			if _, ok := rec["error_class"]; ok {
				t.Fatalf("a sent line with an error class: %v", rec)
			}
			return
		}
	}
	t.Fatalf("no info line for the sent push:\n%s", logs.String())
}
