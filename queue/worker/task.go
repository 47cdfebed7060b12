package worker

import (
	"context"
	"errors"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"go.opentelemetry.io/otel/trace"
)

// Task statuses that are not row states.
const (
	statusCommitFailed = "commit_failed"
	statusDeferred     = "deferred"
	// statusRecovered: the row's lease was recovered while the task ran
	// (flight.go); the recovery writes the task's outcome.
	statusRecovered = "recovered"
)

// decision is what the worker does with a Deliver call's result.
type decision struct {
	commit bool          // false: leave the row sending for reconciliation
	out    queue.Outcome // the outcome to commit (its Class also when not committing)
	call   string        // outbox_provider_call_seconds outcome label
}

// decide maps a Deliver result to a decision. interrupted says Run's
// context was cancelled during the call; timedOut says the call's lease
// deadline passed. A call whose effect may have happened at the service
// (a timeout, an interruption) is never committed as retryable: it is left
// sending, so that its lease expires and it is reconciled instead of resent.
func decide(err error, panicked, interrupted, timedOut bool) decision {
	if panicked {
		return decision{commit: true, call: callPanic,
			out: queue.Outcome{State: envelope.StateRetryable, Class: envelope.ClassProviderPanic}}
	}
	if err == nil {
		return decision{commit: true, call: callSent, out: queue.Outcome{State: envelope.StateSent}}
	}
	de := envelope.Classify(err)
	class := de.Class
	switch de.Kind {
	case envelope.KindPermanent:
		if class == "" {
			class = envelope.ClassUnknown
		}
		return decision{commit: true, call: callPermanent,
			out: queue.Outcome{State: envelope.StateDeadLetter, Class: class}}
	case envelope.KindRecipientGone:
		state := envelope.StateBounced
		switch class {
		case "":
			class = envelope.ClassBounced
		case envelope.ClassComplaint:
			state = envelope.StateComplaint
		case envelope.ClassBlockedByUser, envelope.ClassUnsubscribed, envelope.ClassConsentWithdrawn, envelope.ClassNoConsent:
			state = envelope.StateSuppressed
		}
		return decision{commit: true, call: callRecipientGone, out: queue.Outcome{State: state, Class: class}}
	}
	if class == "" {
		class = envelope.ClassUnknown
	}
	switch {
	case class == envelope.ClassUnreachable:
		// No connection was made, whatever ended the call: nothing was sent.
	case interrupted:
		return decision{call: callInterrupted, out: queue.Outcome{State: envelope.StateSending, Class: envelope.ClassInterrupted}}
	case timedOut || class == envelope.ClassTimeout:
		return decision{call: callLost, out: queue.Outcome{State: envelope.StateSending, Class: envelope.ClassTimeout}}
	}
	return decision{commit: true, call: callRetryable,
		out: queue.Outcome{State: envelope.StateRetryable, Class: class, RetryAfter: de.RetryAfter}}
}

// forProvider adjusts a decision for a provider that cannot redeliver
// idempotently (Telegram): a retryable failure whose request may have
// reached the service (a 5xx, a network error, an unknown error) is not
// resent blindly but left for reconciliation, like a lost receipt. Only
// failures that certainly sent nothing (rate limits, quotas, a service
// that could not be reached) are retried.
func forProvider(d decision, idempotent bool) decision {
	if idempotent || !d.commit || d.out.State != envelope.StateRetryable || d.call == callPanic {
		return d
	}
	switch d.out.Class {
	case envelope.ClassRateLimited, envelope.ClassQuotaExceeded, envelope.ClassUnreachable:
		return d
	}
	return decision{call: callLost, out: queue.Outcome{State: envelope.StateSending, Class: d.out.Class}}
}

// deliver runs one claimed row under an "outbox.deliver" span.
func (w *Worker) deliver(ctx context.Context, l *queue.Lease, callDone func()) result {
	ch := l.Channel
	ctx, span := w.tracer.Start(ctx, spanDeliver, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrChannel.String(string(ch)), attrProvider.String(w.names[ch])))
	r := w.deliverLease(ctx, l, callDone)
	w.paused.done(ch, l.Key)
	endSpan(span, r)
	w.logResult(ctx, "deliver", ch, r)
	return r
}

// deliverLease runs one delivery. callDone is called once the provider call
// has returned: the slot is free for the next claim while this commit is
// still being written, so that claims and commits share transactions. The
// loop may thus compute its wait before the commit lands; a retry's due time
// reaches it through addHint (in settled), which wakes it.
func (w *Worker) deliverLease(ctx context.Context, l *queue.Lease, callDone func()) result {
	ch := l.Channel
	if ctx.Err() != nil {
		return w.release(ctx, l)
	}
	now := w.now()
	if e := l.Envelope; e != nil && !e.ExpiresAt.IsZero() && !now.Before(e.ExpiresAt) {
		return w.commit(ctx, l, queue.Outcome{State: envelope.StateExpired, Class: envelope.ClassExpired})
	}
	msg, ok := w.render(l, now)
	if !ok {
		return w.commit(ctx, l, queue.Outcome{State: envelope.StateDeadLetter, Class: envelope.ClassRenderFailed})
	}
	callCtx, cancel, ok := w.callContext(ctx, l)
	if !ok {
		return w.release(ctx, l) // the lease ran out before the call could start
	}
	defer cancel()
	if lim := w.limiters[ch]; lim != nil {
		if err := lim.Wait(callCtx); err != nil {
			return w.release(ctx, l) // no token within the lease, or shutting down
		}
	}
	if ctx.Err() != nil {
		return w.release(ctx, l)
	}

	if w.flights.note(l, true, nil, false) {
		return result{status: statusRecovered} // recovered before the call: not made
	}
	start, paceStart := time.Now(), w.now()
	rcpt, panicked, err := callDeliver(callCtx, w.providers[ch], l.Key, msg)
	w.pace.addCall(w.now().Sub(paceStart))
	d := forProvider(decide(err, panicked, ctx.Err() != nil, callCtx.Err() != nil), w.idem[ch])
	d.out = w.notePause(ctx, ch, d.out) // before the slot is freed: the next claim sees the pause
	callDone()
	w.metrics.providerCall.WithLabelValues(string(ch), d.call).Observe(time.Since(start).Seconds())
	if panicked {
		w.metrics.panics.WithLabelValues(string(ch)).Inc()
	}
	if !d.commit {
		// Left sending: when the lease expires the row is recovered and
		// reconciled with the provider under the same key.
		w.addHint(l.ExpiresAt)
		return result{status: d.call, class: d.out.Class}
	}
	if d.out.State == envelope.StateSent {
		d.out.Receipt = rcpt.ID
	}
	r := w.commit(ctx, l, d.out)
	if panicked && r.status != statusCommitFailed {
		r.status = callPanic
	}
	return r
}

// reconcile runs one recovered row under an "outbox.reconcile" span.
func (w *Worker) reconcile(ctx context.Context, l *queue.Lease) result {
	ch := l.Channel
	ctx, span := w.tracer.Start(ctx, spanReconcile, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrChannel.String(string(ch)), attrProvider.String(w.names[ch])))
	r := w.reconcileLease(ctx, l)
	endSpan(span, r)
	w.logResult(ctx, "reconcile", ch, r)
	return r
}

func (w *Worker) reconcileLease(ctx context.Context, l *queue.Lease) result {
	ch := l.Channel
	if f := w.flights.take(l); f != nil && w.awaitFlight(ctx, l, f) {
		// The row's delivery task ran here: its answer is the truth.
		switch {
		case f.out != nil:
			return w.commit(ctx, l, *f.out)
		case !f.called:
			return w.release(ctx, l)
		}
		// The call's fate is unknown to the task too: ask the provider,
		// now that the call is over.
	}
	if ctx.Err() != nil {
		// Not asked: the lease expires again and the next worker asks.
		return result{status: callInterrupted, class: envelope.ClassInterrupted}
	}
	msg, ok := w.render(l, w.now())
	if !ok {
		// Without the message the provider cannot be asked; the fate of
		// the earlier call stays unknown.
		w.metrics.recoveries.WithLabelValues(channels.Unknown.String()).Inc()
		return w.commit(ctx, l, queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown})
	}
	callCtx, cancel, ok := w.callContext(ctx, l)
	if !ok {
		return result{status: statusDeferred, class: envelope.ClassTimeout}
	}
	defer cancel()
	if lim := w.limiters[ch]; lim != nil {
		if err := lim.Wait(callCtx); err != nil {
			if ctx.Err() != nil {
				return result{status: callInterrupted, class: envelope.ClassInterrupted}
			}
			w.addHint(l.ExpiresAt)
			return result{status: statusDeferred, class: envelope.ClassRateLimited}
		}
	}

	start := time.Now()
	rec, panicked, err := callReconcile(callCtx, w.providers[ch], l.Key, msg)
	outcome := channels.Unknown
	if err == nil && !panicked {
		outcome = rec.Outcome
	}
	if panicked {
		w.metrics.panics.WithLabelValues(string(ch)).Inc()
	}
	w.metrics.providerCall.WithLabelValues(string(ch), outcome.String()).Observe(time.Since(start).Seconds())
	if outcome == channels.Unknown && ctx.Err() != nil {
		// The answer may be the cancellation's doing: leave the row for
		// the next recovery rather than settle it as unresolved.
		return result{status: callInterrupted, class: envelope.ClassInterrupted}
	}
	w.metrics.recoveries.WithLabelValues(outcome.String()).Inc()
	switch outcome {
	case channels.Accepted:
		return w.commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: rec.Receipt.ID})
	case channels.Rejected:
		return w.commit(ctx, l, queue.Outcome{State: envelope.StateRetryable,
			Class: envelope.ClassReconcileRejected, NoAttempt: true})
	}
	return w.commit(ctx, l, queue.Outcome{State: envelope.StateUnresolved, Class: envelope.ClassReconcileUnknown})
}

// awaitFlight waits for the delivery task f of l's row to end, for at
// most half of what is left of l, and reports whether it ended. A call
// that outlives that (a provider that ignores its context) is reconciled
// with the rest of the lease, as any call of unknown fate.
func (w *Worker) awaitFlight(ctx context.Context, l *queue.Lease, f *flight) bool {
	remaining := l.ExpiresAt.Sub(w.now())
	if remaining <= 0 {
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, remaining/2)
	defer cancel()
	select {
	case <-f.done:
		return true
	case <-wctx.Done():
		return false
	}
}

// callContext returns the context of a provider call: Run's context with
// the lease deadline (less a tenth, to leave time for the commit).
func (w *Worker) callContext(ctx context.Context, l *queue.Lease) (context.Context, context.CancelFunc, bool) {
	remaining := l.ExpiresAt.Sub(w.now())
	if remaining <= 0 {
		return nil, nil, false
	}
	c, cancel := context.WithTimeout(ctx, remaining-remaining/10)
	return c, cancel, true
}

// render renders the leased segment; a renderer error or panic is a
// failure (never logged as text).
func (w *Worker) render(l *queue.Lease, now time.Time) (msg *envelope.Message, ok bool) {
	if l.Envelope == nil {
		return nil, false
	}
	defer func() {
		if recover() != nil {
			w.metrics.panics.WithLabelValues(string(l.Channel)).Inc()
			msg, ok = nil, false
		}
	}()
	m, err := w.cfg.Renderer.Render(l.Envelope, l.Key.Segment, now)
	if err != nil || m == nil {
		return nil, false
	}
	return m, true
}

// callDeliver calls p.Deliver, containing a panic.
func callDeliver(ctx context.Context, p channels.Provider, key envelope.Key, msg *envelope.Message) (rc channels.Receipt, panicked bool, err error) {
	defer func() {
		if recover() != nil {
			rc, panicked, err = channels.Receipt{}, true, nil
		}
	}()
	rc, err = p.Deliver(ctx, key, msg)
	return rc, false, err
}

// callReconcile calls p.Reconcile, containing a panic.
func callReconcile(ctx context.Context, p channels.Provider, key envelope.Key, msg *envelope.Message) (rec channels.Reconciliation, panicked bool, err error) {
	defer func() {
		if recover() != nil {
			rec, panicked, err = channels.Reconciliation{}, true, nil
		}
	}()
	rec, err = p.Reconcile(ctx, key, msg)
	return rec, false, err
}

// storeContext is the context of a commit or release: it survives Run's
// cancellation (an outcome that is known must be recorded) but is bounded.
func storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), storeOpTimeout)
}

// storeRetryFirst is the first wait before a commit or release that the
// store refused for a passing condition is tried again; it doubles up to
// storeRetryMax.
const (
	storeRetryFirst = 20 * time.Millisecond
	storeRetryMax   = time.Second
)

// untilStored runs op, the commit or release of l after its provider call
// (or instead of it), again while the store refuses it for a passing
// condition (open files or memory run out, the store unreachable for a
// moment), until the lease is about to end, sctx's deadline passes or the
// worker stops (ctx). An outcome not stored is left to the lease's expiry
// and to reconciliation: a provider that cannot be asked (Telegram) makes
// it unresolved, though the worker knew the answer.
func (w *Worker) untilStored(ctx, sctx context.Context, l *queue.Lease, op func() error) error {
	wait := storeRetryFirst
	for {
		err := op()
		if err == nil || !(queue.Exhausted(err) || errors.Is(err, queue.ErrUnavailable)) || errors.Is(err, queue.ErrClosed) {
			return err
		}
		if !l.ExpiresAt.IsZero() && l.ExpiresAt.Sub(w.now()) <= 2*wait {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		case <-sctx.Done():
			t.Stop()
			return err
		}
		wait = min(2*wait, storeRetryMax)
	}
}

// commit commits out for l and counts it. For a retryable outcome it reads
// the row back: the store may have made it dead_letter (attempt limit), and
// its due time is a hint for the loop's timer (and wakes the loop).
func (w *Worker) commit(ctx context.Context, l *queue.Lease, out queue.Outcome) result {
	if w.flights.note(l, false, &out, false) {
		return result{status: statusRecovered, class: out.Class}
	}
	sctx, cancel := storeContext(ctx)
	defer cancel()
	if err := w.untilStored(ctx, sctx, l, func() error { return w.leases.Commit(sctx, l, out) }); err != nil {
		w.logStoreError(ctx, "commit", err)
		return result{status: statusCommitFailed, class: storeClass(err)}
	}
	state, class := out.State, out.Class
	if state == envelope.StateRetryable && !out.NoAttempt {
		state, class = w.settled(sctx, l, state, class)
	}
	ch := string(l.Channel)
	w.metrics.deliveries.WithLabelValues(ch, string(state)).Inc()
	switch state {
	case envelope.StateSent:
		if !l.EnqueuedAt.IsZero() {
			if d := w.now().Sub(l.EnqueuedAt); d >= 0 {
				w.metrics.latency.WithLabelValues(ch).Observe(d.Seconds())
			}
		}
	case envelope.StateRetryable:
		w.metrics.retries.WithLabelValues(ch, string(class)).Inc()
	case envelope.StateDeadLetter:
		w.metrics.deadLetters.WithLabelValues(ch, string(class)).Inc()
	}
	if state == envelope.StateSent {
		class = ""
	}
	return result{status: string(state), class: class}
}

// settled reads back what a committed retryable outcome of l became: the
// store turns it into dead_letter at the attempt limit. It finds the
// history entry of l's attempt (the row may have moved on since), and
// remembers the retry's due time as a hint for the loop's timer.
func (w *Worker) settled(ctx context.Context, l *queue.Lease, state envelope.State, class envelope.ErrorClass) (envelope.State, envelope.ErrorClass) {
	st, err := w.store.Get(ctx, l.Key.Tenant, l.Key.EnvelopeID)
	if err != nil {
		return state, class
	}
	for _, seg := range st.Segments {
		if seg.Index != l.Key.Segment {
			continue
		}
		for i := len(seg.History) - 1; i >= 0; i-- {
			h := seg.History[i]
			if h.Attempt != l.Attempt || (h.State != envelope.StateRetryable && h.State != envelope.StateDeadLetter) {
				continue
			}
			state = h.State
			if h.Class != "" {
				class = h.Class
			}
			if i == len(seg.History)-1 && seg.State == envelope.StateRetryable && !seg.NextAt.IsZero() {
				w.addHint(seg.NextAt)
			}
			break
		}
	}
	return state, class
}

// release gives back a lease whose provider call never started.
func (w *Worker) release(ctx context.Context, l *queue.Lease) result {
	if w.flights.note(l, false, nil, true) {
		return result{status: statusRecovered}
	}
	sctx, cancel := storeContext(ctx)
	defer cancel()
	if err := w.untilStored(ctx, sctx, l, func() error { return w.leases.Release(sctx, l) }); err != nil {
		w.logStoreError(ctx, "release", err)
		return result{status: statusCommitFailed, class: storeClass(err)}
	}
	w.metrics.deliveries.WithLabelValues(string(l.Channel), outcomeReleased).Inc()
	return result{status: outcomeReleased}
}

// notePause pauses ch when its service refused the credentials, could
// not be reached or is out (see pauses), and lifts the pause when the
// service answered. It returns out, where nothing was sent (unreachable,
// quota) with the attempt given back and the retry at the pause's end.
func (w *Worker) notePause(ctx context.Context, ch envelope.Channel, out queue.Outcome) queue.Outcome {
	if !w.oneService[ch] {
		return out
	}
	switch {
	case pausing(out.Class):
		now := w.now()
		d, until := w.paused.refused(ch, out.Class, now, out.RetryAfter)
		if pauseRules[out.Class].giveBack && out.State == envelope.StateRetryable {
			out.NoAttempt, out.RetryAfter = true, max(until.Sub(now), out.RetryAfter)
		}
		if d == 0 {
			return out
		}
		w.metrics.paused.WithLabelValues(string(ch)).Set(1)
		why := "its provider failed three calls in a row (the service is out); its other rows wait, and one is tried when the pause ends"
		switch out.Class {
		case envelope.ClassAuthFailed:
			why = "its provider refused the credentials; its other rows wait, pending, and one is tried when the pause ends (fix the credentials, then restart serve)"
		case envelope.ClassUnreachable:
			why = "its provider could not be reached (no connection was made: its name, the network, a firewall); its rows wait without using their attempts, and one is tried when the pause ends"
		case envelope.ClassQuotaExceeded:
			why = "its provider's sending quota is used up; its rows wait for the reset without using their attempts"
		}
		w.log.WarnContext(ctx, "channel "+string(ch)+" paused for "+d.String()+": "+why,
			"operation", "deliver", "channel", string(ch), "status", "paused", "error_class", string(out.Class))
	case out.Class == envelope.ClassInterrupted, out.Class == envelope.ClassRateLimited:
		// Shutting down, or held back by the provider's own pacing (a
		// Telegram chat's 1/s) before any call: nothing was learnt of the
		// service; the next row is tried.
	default:
		if w.paused.answered(ch) {
			w.metrics.paused.WithLabelValues(string(ch)).Set(0)
			w.log.InfoContext(ctx, "channel "+string(ch)+" resumed: its provider answered",
				"operation", "deliver", "channel", string(ch), "status", "resumed")
		}
	}
	return out
}
