package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// pauseMin and pauseMax are auth_failed's.
var (
	pauseMin = pauseRules[envelope.ClassAuthFailed].min
	pauseMax = pauseRules[envelope.ClassAuthFailed].max
)

// A provider that refuses the credentials (a revoked Telegram token) does
// not dead-letter the channel's whole backlog: the row that met it goes to
// dead_letter, the channel pauses (1 min, then 2 min after a probe that
// is refused again), its other rows stay pending, one row is tried when a
// pause ends, and a delivery that goes through resumes the channel.
func TestWorker_RefusedCredentialsPauseTheChannel(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	var refuse atomic.Bool
	refuse.Store(true)
	var logs syncBuf
	p, _, r := startPaused(t, te, envelope.ChannelTelegram, true, slog.New(slog.NewTextHandler(&logs, nil)), 6, func(i int) *envelope.Envelope {
		return queuetest.Reply(fmt.Sprintf("r-%d", i), fmt.Sprintf("u-%d", i), "hi")
	}, func() (channels.Receipt, error) {
		if refuse.Load() {
			return channels.Receipt{}, envelope.Permanent(envelope.ClassAuthFailed, errors.New("401 Unauthorized"))
		}
		return channels.Receipt{ID: "m"}, nil
	})
	paused := func() float64 { return testutil.ToFloat64(r.w.metrics.paused.WithLabelValues("telegram")) }
	check := func(step string, calls, dead, sent int, gauge float64) {
		t.Helper()
		var c queue.Counts
		// A slot is free once its call returned, before its commit lands.
		waitFor(t, step, func() bool {
			var err error
			if c, err = te.store.Counts(context.Background(), ""); err != nil {
				t.Fatal(err)
			}
			return c.Total(envelope.StateDeadLetter)+c.Total(envelope.StateSent) >= dead+sent
		})
		if n := len(p.Calls()); n != calls {
			t.Errorf("%s: %d provider calls, want %d", step, n, calls)
		}
		if got := c.Total(envelope.StateDeadLetter); got != dead {
			t.Errorf("%s: %d dead_letter, want %d", step, got, dead)
		}
		if got := c.Total(envelope.StateSent); got != sent {
			t.Errorf("%s: %d sent, want %d", step, got, sent)
		}
		if got := c.Total(envelope.StatePending); got != 6-dead-sent {
			t.Errorf("%s: %d pending, want %d", step, got, 6-dead-sent)
		}
		if got := paused(); got != gauge {
			t.Errorf("%s: outbox_channel_paused = %v, want %v", step, got, gauge)
		}
	}

	r.idle(t)
	check("refused", 1, 1, 0, 1)
	r.advance(t, te.clock, pauseMin-time.Second)
	check("within the pause", 1, 1, 0, 1)
	r.advance(t, te.clock, time.Second)
	check("the probe, refused", 2, 2, 0, 1)
	committed(t, te.store)
	r.advance(t, te.clock, pauseMin)
	check("within the doubled pause", 2, 2, 0, 1)
	refuse.Store(false) // the operator fixed the token
	r.advance(t, te.clock, pauseMin)
	r.idle(t)
	check("the probe, accepted, then the rest", 6, 2, 4, 0)

	out := logs.String()
	for _, want := range []string{"channel telegram paused for 1m0s", "channel telegram paused for 2m0s", "channel telegram resumed: its provider answered"} {
		if strings.Count(out, want) != 1 {
			t.Errorf("log lines %q: %d, want 1:\n%s", want, strings.Count(out, want), out)
		}
	}
}

// A provider that cannot be reached (this host's network down, the
// service's name not resolving) pauses the channel too, and no row uses
// up its attempts while it lasts: with 3 attempts allowed, 6 rows go
// through 8 refused connections and are all delivered once the service
// answers again, none dead-lettered.
func TestWorker_UnreachableProviderPausesWithoutUsingAttempts(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{Base: time.Second, MaxAttempts: 3})
	var down atomic.Bool
	down.Store(true)
	p, envs, r := startPaused(t, te, envelope.ChannelTelegram, true, nil, 6, func(i int) *envelope.Envelope {
		return queuetest.Reply(fmt.Sprintf("r-%d", i), fmt.Sprintf("u-%d", i), "hi")
	}, func() (channels.Receipt, error) {
		if down.Load() {
			return channels.Receipt{}, envelope.Retryable(envelope.ClassUnreachable, errors.New("dial tcp: connection refused"))
		}
		return channels.Receipt{ID: "m"}, nil
	})
	r.idle(t)
	committed(t, te.store)
	lengths := pauseRules[envelope.ClassUnreachable]
	d := lengths.min
	for range 7 {
		r.advance(t, te.clock, d)
		committed(t, te.store)
		d = min(2*d, lengths.max)
	}
	if n := len(p.Calls()); n != 8 {
		t.Errorf("%d calls while unreachable, want 8 (the first, then one per pause)", n)
	}
	if got := testutil.ToFloat64(r.w.metrics.paused.WithLabelValues("telegram")); got != 1 {
		t.Errorf("outbox_channel_paused = %v while unreachable", got)
	}
	down.Store(false)
	r.advance(t, te.clock, d)
	r.idle(t)
	for _, e := range envs {
		seg := segment(t, te.store, keyOf(e, 0))
		if seg.State != envelope.StateSent || seg.Attempts != 1 {
			t.Errorf("%s: %s after %d attempts, want sent after 1 (the refused connections are given back)", e.ID, seg.State, seg.Attempts)
		}
	}
	if got := testutil.ToFloat64(r.w.metrics.paused.WithLabelValues("telegram")); got != 0 {
		t.Errorf("outbox_channel_paused = %v after the service answered", got)
	}
}

// A service that is out (three 5xx in a row) pauses its channel too, so
// that an outage does not burn every row's attempts: while it lasts one
// row is tried per pause, and when it answers again the backlog goes out.
func TestWorker_OutagePausesAfterThreeFailures(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{Base: time.Second, MaxAttempts: 3})
	var down atomic.Bool
	down.Store(true)
	p, _, r := startPaused(t, te, envelope.ChannelEmail, true, nil, 8, func(i int) *envelope.Envelope {
		return queuetest.Digest(fmt.Sprintf("d-%d", i), fmt.Sprintf("u-%d", i))
	}, func() (channels.Receipt, error) {
		if down.Load() {
			return channels.Receipt{}, envelope.Retryable(envelope.ClassProviderUnavailable, errors.New("503"))
		}
		return channels.Receipt{ID: "m"}, nil
	})
	waitFor(t, "three calls", func() bool { return len(p.Calls()) >= 3 })
	r.idle(t)
	committed(t, te.store)
	if n := len(p.Calls()); n != 3 {
		t.Fatalf("%d calls before the pause, want 3", n)
	}
	rule := pauseRules[envelope.ClassProviderUnavailable]
	r.advance(t, te.clock, rule.min)
	committed(t, te.store)
	if n := len(p.Calls()); n != 4 {
		t.Errorf("%d calls after the first pause, want 4 (one probe)", n)
	}
	down.Store(false)
	r.advance(t, te.clock, 2*rule.min)
	r.idle(t)
	committed(t, te.store)
	c, err := te.store.Counts(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.Total(envelope.StateSent) != 8 || c.Total(envelope.StateDeadLetter) != 0 {
		t.Errorf("after the outage: %v, want 8 sent", c)
	}
}

// A used-up sending quota (Resend's daily limit, reset in two hours)
// pauses the channel until the reset: the backlog is not claimed into the
// same answer row by row, and no row uses up an attempt on it.
func TestWorker_QuotaPausesUntilTheReset(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{Base: time.Second, MaxAttempts: 2})
	var used atomic.Bool
	used.Store(true)
	p, envs, r := startPaused(t, te, envelope.ChannelEmail, true, nil, 5, func(i int) *envelope.Envelope {
		return queuetest.Digest(fmt.Sprintf("q-%d", i), fmt.Sprintf("u-%d", i))
	}, func() (channels.Receipt, error) {
		if used.Load() {
			return channels.Receipt{}, envelope.RetryAfter(envelope.ClassQuotaExceeded, 2*time.Hour, errors.New("daily_quota_exceeded"))
		}
		return channels.Receipt{ID: "m"}, nil
	})
	waitFor(t, "the first call", func() bool { return len(p.Calls()) >= 1 })
	r.idle(t)
	committed(t, te.store)
	r.advance(t, te.clock, time.Hour)
	committed(t, te.store)
	if n := len(p.Calls()); n != 1 {
		t.Errorf("%d calls within the quota's pause, want 1", n)
	}
	if seg := segment(t, te.store, keyOf(envs[0], 0)); seg.State != envelope.StateRetryable || seg.Attempts != 0 {
		t.Errorf("the row that met the quota: %s after %d attempts, want retryable with its attempt given back", seg.State, seg.Attempts)
	}
	used.Store(false) // the reset
	r.advance(t, te.clock, time.Hour)
	waitFor(t, "every row sent", func() bool {
		c, err := te.store.Counts(context.Background(), "")
		return err == nil && c.Total(envelope.StateSent) == 5
	})
	if n := len(p.Calls()); n != 6 {
		t.Errorf("%d calls in all, want 6 (the refused one, then each row once)", n)
	}
}

// A probe held back by the provider's own pacing (rate_limited before any
// call: a Telegram chat's 1/s) learns nothing of the service: the pause
// is not lifted, and another row is tried.
func TestWorker_PacedProbeDoesNotResume(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{Base: time.Second})
	var calls atomic.Int64
	_, _, r := startPaused(t, te, envelope.ChannelTelegram, true, nil, 4, func(i int) *envelope.Envelope {
		return queuetest.Reply(fmt.Sprintf("p-%d", i), fmt.Sprintf("u-%d", i), "hi")
	}, func() (channels.Receipt, error) {
		switch calls.Add(1) {
		case 2:
			return channels.Receipt{}, envelope.RetryAfter(envelope.ClassRateLimited, time.Second, errors.New("pacing"))
		default:
			return channels.Receipt{}, envelope.Retryable(envelope.ClassUnreachable, errors.New("refused"))
		}
	})
	waitFor(t, "the first call", func() bool { return calls.Load() >= 1 })
	r.idle(t)
	committed(t, te.store)
	r.advance(t, te.clock, pauseRules[envelope.ClassUnreachable].min) // the probe: paced
	waitFor(t, "the next probe, after the paced one", func() bool { return calls.Load() >= 3 })
	committed(t, te.store)
	r.w.paused.mu.Lock()
	ps := r.w.paused.m[envelope.ChannelTelegram]
	r.w.paused.mu.Unlock()
	// Still the same pause, doubled by the refused probe after the paced
	// one; lifted by it, a new one would have begun at 5 s.
	if want := 2 * pauseRules[envelope.ClassUnreachable].min; ps == nil || ps.length != want {
		t.Errorf("pause after a paced probe and a refused one = %+v, want %v long", ps, want)
	}
}

// A provider whose rows each have an endpoint or key of their own (Web
// Push: a subscription whose keys no longer match answers 403) does not
// pause its channel: one stale subscription must not hold up every user's
// push.
func TestWorker_PerMessageEndpointsDoNotPause(t *testing.T) {
	te := newTestEnv(t, queue.Backoff{})
	p, _, r := startPaused(t, te, envelope.ChannelPush, false, nil, 4, func(i int) *envelope.Envelope {
		return queuetest.Nudge(fmt.Sprintf("n-%d", i), fmt.Sprintf("u-%d", i))
	}, func() (channels.Receipt, error) {
		return channels.Receipt{}, envelope.Permanent(envelope.ClassAuthFailed, errors.New("403"))
	})
	waitFor(t, "every row tried", func() bool { return len(p.Calls()) == 4 })
	r.idle(t)
	if got := testutil.ToFloat64(r.w.metrics.paused.WithLabelValues("push")); got != 0 {
		t.Errorf("outbox_channel_paused{push} = %v, want 0", got)
	}
}

// pauses on its own: a failure of a delivery in flight when the pause began
// does not lengthen it, a probe that tells nothing lets the next row be
// tried, and the wait names the first pause to end.
func TestPauses(t *testing.T) {
	var p pauses
	now := t0
	tg, em := envelope.ChannelTelegram, envelope.ChannelEmail
	all := []envelope.Channel{em, tg}
	if ready, probe := p.split(all, now); len(ready) != 2 || len(probe) != 0 {
		t.Fatalf("split with no pause = %v %v", ready, probe)
	}
	if d := first(p.refused(tg, envelope.ClassAuthFailed, now, 0)); d != pauseMin {
		t.Fatalf("first refusal paused for %v", d)
	}
	if d := first(p.refused(tg, envelope.ClassAuthFailed, now.Add(time.Second), 0)); d != 0 {
		t.Errorf("a refusal in flight lengthened the pause by %v", d)
	}
	if ready, probe := p.split(all, now.Add(time.Second)); len(ready) != 1 || ready[0] != em || len(probe) != 0 {
		t.Errorf("split within the pause = %v %v", ready, probe)
	}
	if w := p.wait(now.Add(10 * time.Second)); w != pauseMin-10*time.Second {
		t.Errorf("wait = %v", w)
	}
	end := now.Add(pauseMin)
	_, probe := p.split(all, end)
	if len(probe) != 1 || probe[0] != tg {
		t.Fatalf("split after the pause: probe %v", probe)
	}
	k := envelope.Key{Tenant: "default", EnvelopeID: "x", Segment: 0}
	p.startProbe(tg, k)
	if _, probe := p.split(all, end); len(probe) != 0 {
		t.Errorf("a second probe while one is in flight: %v", probe)
	}
	p.done(tg, envelope.Key{Tenant: "default", EnvelopeID: "other"})
	if _, probe := p.split(all, end); len(probe) != 0 {
		t.Errorf("another row's end freed the probe: %v", probe)
	}
	p.done(tg, k) // a network error: nothing learnt
	if _, probe := p.split(all, end); len(probe) != 1 {
		t.Errorf("after a probe that told nothing: probe %v", probe)
	}
	d := pauseMin
	for range 10 {
		end = end.Add(d)
		d, _ = p.refused(tg, envelope.ClassAuthFailed, end, 0)
	}
	if d != pauseMax {
		t.Errorf("pause after many refused probes = %v, want %v", d, pauseMax)
	}
	if !p.answered(tg) || p.answered(tg) {
		t.Error("answered should lift the pause once")
	}
}

// committed waits until no row of s is sending: a slot is free once its
// call returned, before its commit lands, and moving the clock past the
// lease before that would make the row a recovered lease.
func committed(t *testing.T, s queue.Store) {
	t.Helper()
	waitFor(t, "the commits", func() bool {
		c, err := s.Counts(context.Background(), "")
		return err == nil && c.Total(envelope.StateSending) == 0
	})
}

// syncBuf is a bytes.Buffer safe for the worker's concurrent log writes.
type syncBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func first[A, B any](a A, _ B) A { return a }

// startPaused enqueues n envelopes made by mk and runs a worker with one
// slot whose only provider, on ch, answers every Deliver with deliver (a
// one-service provider when one); logger nil logs nowhere.
func startPaused(t *testing.T, te *testEnv, ch envelope.Channel, one bool, logger *slog.Logger, n int,
	mk func(i int) *envelope.Envelope, deliver func() (channels.Receipt, error)) (*scriptedProvider, []*envelope.Envelope, *running) {
	t.Helper()
	te.fakes[ch].SetOneService(one)
	p := &scriptedProvider{Provider: te.fakes[ch], deliverCtx: func(context.Context) (channels.Receipt, error) { return deliver() }}
	var envs []*envelope.Envelope
	for i := range n {
		envs = append(envs, mk(i))
	}
	te.enqueue(t, envs...)
	cfg := te.config()
	cfg.Providers = map[envelope.Channel]channels.Provider{ch: p}
	cfg.Concurrency = 1
	if logger != nil {
		cfg.Logger = logger
	}
	return p, envs, startWorker(t, cfg)
}
