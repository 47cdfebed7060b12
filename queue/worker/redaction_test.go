package worker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// canaries hands out unique marker strings and remembers them.
type canaries struct{ all []string }

func (c *canaries) new(kind string) string {
	b := make([]byte, 6)
	rand.Read(b)
	v := "cnry" + kind + base64.RawURLEncoding.EncodeToString(b)
	v = strings.NewReplacer("-", "x", "_", "y").Replace(v)
	c.all = append(c.all, v)
	return v
}

// keep remembers a value that is secret but built elsewhere (push keys).
func (c *canaries) keep(v string) string { c.all = append(c.all, v); return v }

// find returns the canaries contained in s.
func (c *canaries) find(s string) []string {
	var out []string
	for _, v := range c.all {
		if strings.Contains(s, v) {
			out = append(out, v)
		}
	}
	return out
}

// knownClasses are the stable error classes a row may carry.
var knownClasses = map[envelope.ErrorClass]bool{
	envelope.ClassNone: true, envelope.ClassRateLimited: true, envelope.ClassQuotaExceeded: true,
	envelope.ClassTimeout: true, envelope.ClassNetwork: true, envelope.ClassUnreachable: true, envelope.ClassProviderUnavailable: true,
	envelope.ClassInvalidRecipient: true, envelope.ClassSubscriptionGone: true, envelope.ClassPayloadTooLarge: true,
	envelope.ClassInvalidRequest: true, envelope.ClassAuthFailed: true, envelope.ClassBlockedByUser: true,
	envelope.ClassBounced: true, envelope.ClassComplaint: true, envelope.ClassUnsubscribed: true,
	envelope.ClassConsentWithdrawn: true, envelope.ClassNoConsent: true, envelope.ClassIdempotencyConflict: true, envelope.ClassProviderPanic: true,
	envelope.ClassRenderFailed: true, envelope.ClassNoProvider: true, envelope.ClassMaxAttempts: true,
	envelope.ClassExpired: true, envelope.ClassInterrupted: true, envelope.ClassReconcileUnknown: true,
	envelope.ClassReconcileRejected: true, envelope.ClassOperator: true, envelope.ClassUnknown: true,
}

// TestWorker_Redaction runs deliveries that succeed, retry, dead-letter,
// bounce, panic, fail to render and lose their receipt, with a unique
// canary in every id, address, push key, chat id, body and raw provider
// error, and then looks for the canaries in the logs, the metrics
// exposition, the spans, the stored error classes and Run's errors.
func TestWorker_Redaction(t *testing.T) {
	var cn canaries
	tenant := cn.new("tenant")
	te := newTestEnv(t, queue.Backoff{Base: time.Second, NoJitter: true})

	mkDigest := func(prefix string) *envelope.Envelope {
		e := queuetest.Digest(prefix+cn.new("id"), cn.new("user"))
		e.TenantID = tenant
		e.Recipient.Email = cn.new("email") + "@example.com"
		e.ConsentSnapshot.UnsubscribeRef = cn.new("unsub")
		var p envelope.DigestPayload
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			t.Fatal(err)
		}
		p.Sections[0].Items[0].Quote = cn.new("body")
		e.Payload, _ = json.Marshal(p)
		return e
	}
	mkNudge := func() *envelope.Envelope {
		e := queuetest.Nudge(cn.new("id"), cn.new("user"))
		e.TenantID = tenant
		ps := e.Recipient.PushSubscription
		ps.Endpoint = "https://push.example.net/wpush/" + cn.new("endpoint")
		key := make([]byte, 65)
		rand.Read(key)
		key[0] = 4
		ps.Keys.P256dh = cn.keep(base64.RawURLEncoding.EncodeToString(key))
		auth := make([]byte, 16)
		rand.Read(auth)
		ps.Keys.Auth = cn.keep(base64.RawURLEncoding.EncodeToString(auth))
		return e
	}
	chatSeq := 0
	mkReply := func() *envelope.Envelope {
		e := queuetest.Reply(cn.new("id"), cn.new("user"), "reply "+cn.new("body"))
		e.TenantID = tenant
		chatSeq++
		e.Recipient.ChatID = cn.keep(fmt.Sprintf("-100%d7316%d4259", chatSeq, chatSeq))
		return e
	}

	okDigest := mkDigest("")
	retryPush := mkNudge()
	retryReply := mkReply()
	deadDigest := mkDigest("")
	panicPush := mkNudge()
	renderFail := mkDigest("render-fail-")
	lostReply := mkReply()
	goneDigest := mkDigest("")
	all := []*envelope.Envelope{okDigest, retryPush, retryReply, deadDigest, panicPush, renderFail, lostReply, goneDigest}
	te.enqueue(t, all...)

	rawErr := func(kind string) error {
		return fmt.Errorf("upstream answered 4xx: {\"message\":%q,\"to\":%q}", cn.new("raw"+kind), okDigest.Recipient.Email)
	}
	wrap := func(fns ...func() (channels.Receipt, error)) []func() (channels.Receipt, error) { return fns }
	fail := func(err error) func() (channels.Receipt, error) {
		return func() (channels.Receipt, error) { return channels.Receipt{}, err }
	}
	email := &scriptedProvider{Provider: te.fakes[envelope.ChannelEmail], deliver: map[envelope.Key][]func() (channels.Receipt, error){
		keyOf(deadDigest, 0): wrap(fail(envelope.Permanent(envelope.ClassInvalidRequest, rawErr("permanent")))),
		keyOf(goneDigest, 0): wrap(fail(envelope.RecipientGone(envelope.ClassBounced, rawErr("gone")))),
	}}
	panicValue := cn.new("panic")
	push := &scriptedProvider{Provider: te.fakes[envelope.ChannelPush], deliver: map[envelope.Key][]func() (channels.Receipt, error){
		keyOf(retryPush, 0): wrap(fail(envelope.RetryAfter(envelope.ClassRateLimited, time.Second, rawErr("retryafter")))),
		keyOf(panicPush, 0): wrap(func() (channels.Receipt, error) { panic(errors.New(panicValue)) }),
	}}
	telegram := &scriptedProvider{
		Provider: te.fakes[envelope.ChannelTelegram],
		deliver: map[envelope.Key][]func() (channels.Receipt, error){
			keyOf(retryReply, 0): wrap(fail(rawErr("plain"))), // a plain error, not a DeliveryError
		},
		reconcileErr: map[envelope.Key]error{keyOf(lostReply, 0): rawErr("reconcile")},
	}
	te.fakes[envelope.ChannelTelegram].Script(keyOf(lostReply, 0), fake.LoseReceipt)

	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	cfg := te.config()
	cfg.Providers = map[envelope.Channel]channels.Provider{
		envelope.ChannelEmail: email, envelope.ChannelPush: push, envelope.ChannelTelegram: telegram,
	}
	cfg.Logger = jsonLogger(&logs)
	cfg.Registerer = reg
	cfg.TracerProvider = tp
	r := startWorker(t, cfg)

	want := map[*envelope.Envelope]envelope.State{
		okDigest: envelope.StateSent, retryPush: envelope.StateSent, retryReply: envelope.StateSent,
		deadDigest: envelope.StateDeadLetter, panicPush: envelope.StateSent, renderFail: envelope.StateDeadLetter,
		lostReply: envelope.StateUnresolved, goneDigest: envelope.StateBounced,
	}
	for i := 0; ; i++ {
		r.idle(t)
		settled := true
		for e, st := range want {
			settled = settled && segment(t, te.store, keyOf(e, 0)).State == st
		}
		if settled {
			break
		}
		if i == 20 {
			for e := range want {
				t.Logf("%s: %+v", e.ID[:4], segment(t, te.store, keyOf(e, 0)))
			}
			r.mu.Lock()
			for _, ev := range r.events {
				t.Logf("task %s %s: %+v", ev.op, ev.key.EnvelopeID[:8], ev.r)
			}
			r.mu.Unlock()
			t.Fatal("the scenario did not settle")
		}
		r.advance(t, te.clock, time.Minute)
	}
	// A scrape while running, then stop.
	var metricsText bytes.Buffer
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&metricsText, mf); err != nil {
			t.Fatal(err)
		}
	}
	runErr := r.stop(t)

	// The canaries did reach the worker's hands: the providers saw them.
	var seen strings.Builder
	for _, p := range te.fakes {
		for _, c := range p.Calls() {
			fmt.Fprintf(&seen, "%+v %+v %+v %+v\n", c.Key, c.Message.Email, c.Message.Push, c.Message.Chat)
		}
	}
	for _, v := range []string{okDigest.Recipient.Email, retryPush.Recipient.PushSubscription.Endpoint, retryReply.Recipient.ChatID} {
		if !strings.Contains(seen.String(), v) {
			t.Fatalf("test setup: canary %q never reached a provider", v)
		}
	}

	// And the scenario exercised what it claims to.
	for _, s := range []string{`"error_class":"provider_panic"`, `"error_class":"render_failed"`, `"status":"unresolved"`,
		`"status":"dead_letter"`, `"status":"bounced"`, `"status":"retryable"`, `"error_class":"rate_limited"`} {
		if !strings.Contains(logs.String(), s) {
			t.Errorf("logs lack %s", s)
		}
	}
	for _, s := range []string{"outbox_dead_letters_total", "outbox_panics_total", "outbox_lease_recoveries_total",
		"outbox_provider_call_seconds", "outbox_delivery_latency_seconds", "outbox_queue_depth", "outbox_retries_total"} {
		if !strings.Contains(metricsText.String(), s) {
			t.Errorf("metrics lack %s", s)
		}
	}

	if found := cn.find(logs.String()); len(found) > 0 {
		t.Errorf("canaries in the logs: %v\n%s", found, logs.String())
	}
	allowedKeys := map[string]bool{"time": true, "level": true, "msg": true, keyComponent: true, keyOperation: true,
		keyChannel: true, keyProvider: true, keyStatus: true, keyErrorClass: true, keyTraceID: true, "request_id": true}
	for _, line := range decodeLogs(t, &logs) {
		for k := range line {
			if !allowedKeys[k] {
				t.Errorf("log key %q is not one of the allowed keys", k)
			}
		}
	}
	if found := cn.find(metricsText.String()); len(found) > 0 {
		t.Errorf("canaries in the metrics: %v", found)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "channel", "outcome", "class", "result", "state":
				default:
					t.Errorf("metric %s has label %q", mf.GetName(), l.GetName())
				}
			}
		}
	}

	spans := rec.Ended()
	if len(spans) == 0 {
		t.Fatal("no spans recorded")
	}
	names := map[string]int{}
	allowedAttrs := map[attribute.Key]bool{attrChannel: true, attrProvider: true, attrStatus: true, attrErrorClass: true}
	for _, s := range spans {
		names[s.Name()]++
		var text strings.Builder
		text.WriteString(s.Name() + " " + s.Status().Description)
		for _, a := range s.Attributes() {
			if !allowedAttrs[a.Key] {
				t.Errorf("span %s has attribute %s", s.Name(), a.Key)
			}
			text.WriteString(" " + a.Value.String())
		}
		for _, ev := range s.Events() {
			text.WriteString(" " + ev.Name)
			for _, a := range ev.Attributes {
				text.WriteString(" " + string(a.Key) + "=" + a.Value.String())
			}
		}
		if found := cn.find(text.String()); len(found) > 0 {
			t.Errorf("canaries in span %s: %v", s.Name(), found)
		}
	}
	if names[spanDeliver] == 0 || names[spanReconcile] == 0 {
		t.Errorf("spans by name %v, want both %s and %s", names, spanDeliver, spanReconcile)
	}

	for _, e := range all {
		st, err := te.store.Get(context.Background(), e.Tenant(), e.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, seg := range st.Segments {
			classes := []envelope.ErrorClass{seg.Class}
			for _, h := range seg.History {
				classes = append(classes, h.Class)
			}
			for _, c := range classes {
				if !knownClasses[c] || len(cn.find(string(c))) > 0 {
					t.Errorf("stored error class %q is not a stable class", c)
				}
			}
			if len(cn.find(seg.Receipt)) > 0 {
				t.Errorf("stored receipt %q holds a canary", seg.Receipt)
			}
		}
	}

	if runErr != nil {
		t.Errorf("Run: %v", runErr)
	}
	// Run's error when the store fails under it holds no canary either.
	w2, err := New(cfg2(te, cfg))
	if err != nil {
		t.Fatal(err)
	}
	te.store.Close()
	if err := w2.Run(context.Background()); err == nil || len(cn.find(err.Error())) > 0 {
		t.Errorf("Run on a closed store = %v", err)
	}
}

// cfg2 is cfg without a registerer (a second worker for the error check).
func cfg2(_ *testEnv, cfg Config) Config {
	cfg.Registerer = nil
	cfg.TracerProvider = nil
	return cfg
}
