package fake_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/channeltest"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
)

func key(id string) envelope.Key {
	return envelope.Key{Tenant: "t1", EnvelopeID: id}
}

func emailMsg() *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelEmail, Email: &envelope.EmailMessage{To: "a@example.com", Subject: "s", Text: "t"}}
}

// deliver calls p.Deliver with a bounded context.
func deliver(t testing.TB, p *fake.Provider, k envelope.Key) (channels.Receipt, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return p.Deliver(ctx, k, emailMsg())
}

func TestProvider_Deliver_Steps(t *testing.T) {
	tests := []struct {
		step       fake.Step
		ch         envelope.Channel
		wantErr    bool
		kind       envelope.Kind
		class      envelope.ErrorClass
		delivered  int
		wantReceip bool
	}{
		{step: fake.Succeed, ch: envelope.ChannelEmail, delivered: 1, wantReceip: true},
		{step: fake.FailRetryable, ch: envelope.ChannelEmail, wantErr: true, kind: envelope.KindRetryable, class: envelope.ClassProviderUnavailable},
		{step: fake.FailPermanent, ch: envelope.ChannelEmail, wantErr: true, kind: envelope.KindPermanent, class: envelope.ClassInvalidRequest},
		{step: fake.Gone, ch: envelope.ChannelEmail, wantErr: true, kind: envelope.KindRecipientGone, class: envelope.ClassBounced},
		{step: fake.Gone, ch: envelope.ChannelPush, wantErr: true, kind: envelope.KindRecipientGone, class: envelope.ClassSubscriptionGone},
		{step: fake.Gone, ch: envelope.ChannelTelegram, wantErr: true, kind: envelope.KindRecipientGone, class: envelope.ClassBlockedByUser},
		{step: fake.Gone, ch: envelope.Channel("webhook"), wantErr: true, kind: envelope.KindRecipientGone, class: envelope.ClassInvalidRecipient},
		{step: fake.LoseReceipt, ch: envelope.ChannelEmail, wantErr: true, kind: envelope.KindRetryable, class: envelope.ClassTimeout, delivered: 1},
	}
	for _, tt := range tests {
		t.Run(tt.step.String()+"/"+string(tt.ch), func(t *testing.T) {
			p := fake.New(tt.ch)
			k := key("e1")
			p.Script(k, tt.step)
			rc, err := deliver(t, p, k)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("Deliver: no error, want %s", tt.kind)
				}
				var de *envelope.DeliveryError
				if !errors.As(err, &de) {
					t.Fatalf("Deliver: %T, want *envelope.DeliveryError", err)
				}
				if de.Kind != tt.kind || de.Class != tt.class {
					t.Errorf("error = %s/%s, want %s/%s", de.Kind, de.Class, tt.kind, tt.class)
				}
				if de.RetryAfter != 0 {
					t.Errorf("RetryAfter = %s, want 0 (none set)", de.RetryAfter)
				}
				if rc != (channels.Receipt{}) {
					t.Errorf("receipt = %+v with an error, want zero", rc)
				}
			} else {
				if err != nil {
					t.Fatalf("Deliver: %v", err)
				}
				if rc.ID != "fake-1" {
					t.Errorf("receipt = %q, want fake-1", rc.ID)
				}
			}
			if got := p.Delivered(k); got != tt.delivered {
				t.Errorf("Delivered = %d, want %d", got, tt.delivered)
			}
			calls := p.Calls()
			if len(calls) != 1 || calls[0].Op != fake.OpDeliver || calls[0].Key != k || calls[0].Step != tt.step {
				t.Errorf("Calls = %+v, want one deliver of %v with step %s", calls, k, tt.step)
			}
			// The script is used up: the next call succeeds.
			if _, err := deliver(t, p, k); err != nil {
				t.Errorf("Deliver after the script: %v, want success", err)
			}
		})
	}
}

func TestProvider_Deliver_Hang(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"Cancel", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }},
		{"Deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Hour)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := fake.New(envelope.ChannelPush)
			k := key("hang")
			p.Script(k, fake.Hang)
			started := make(chan struct{})
			p.OnDeliver(func(envelope.Key) { close(started) })
			ctx, cancel := tc.ctx()
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := p.Deliver(ctx, k, emailMsg())
				done <- err
			}()
			<-started
			select {
			case err := <-done:
				t.Fatalf("Deliver returned %v before its context was cancelled", err)
			default:
			}
			cancel()
			select {
			case err := <-done:
				de := envelope.Classify(err)
				if de.Kind != envelope.KindRetryable || de.Class != envelope.ClassTimeout {
					t.Errorf("error = %s/%s, want retryable/timeout", de.Kind, de.Class)
				}
				if !errors.Is(err, context.Canceled) {
					t.Errorf("error does not wrap the context's error")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Deliver did not return after cancel")
			}
			if p.Delivered(k) != 0 {
				t.Errorf("Delivered = %d after a hang, want 0", p.Delivered(k))
			}
		})
	}
}

func TestProvider_Deliver_Panic(t *testing.T) {
	p := fake.New(envelope.ChannelTelegram)
	k := key("boom")
	p.Script(k, fake.Panic)
	func() {
		defer func() {
			r := recover()
			if r != fake.ErrScriptedPanic {
				t.Errorf("recovered %v, want fake.ErrScriptedPanic", r)
			}
		}()
		_, _ = deliver(t, p, k)
		t.Error("Deliver did not panic")
	}()
	if got := p.Calls(); len(got) != 1 || got[0].Step != fake.Panic {
		t.Errorf("Calls = %+v, want the panicking call recorded", got)
	}
	if p.Delivered(k) != 0 {
		t.Errorf("Delivered = %d, want 0", p.Delivered(k))
	}
}

func TestProvider_Script_Order(t *testing.T) {
	p := fake.New(envelope.ChannelEmail)
	a, b := key("a"), key("b")
	p.Script(a, fake.FailRetryable, fake.FailPermanent)
	p.Script(a, fake.LoseReceipt) // appends
	p.Script(b, fake.Gone)

	want := []struct {
		k    envelope.Key
		step fake.Step
	}{
		{a, fake.FailRetryable},
		{b, fake.Gone},
		{a, fake.FailPermanent},
		{b, fake.Succeed},
		{a, fake.LoseReceipt},
		{a, fake.Succeed},
	}
	for _, w := range want {
		_, _ = deliver(t, p, w.k)
	}
	calls := p.Calls()
	if len(calls) != len(want) {
		t.Fatalf("%d calls, want %d", len(calls), len(want))
	}
	for i, w := range want {
		if calls[i].Key != w.k || calls[i].Step != w.step {
			t.Errorf("call %d = %v/%s, want %v/%s", i, calls[i].Key, calls[i].Step, w.k, w.step)
		}
	}
	if got := p.Delivered(a); got != 2 {
		t.Errorf("Delivered(a) = %d, want 2 (LoseReceipt + Succeed)", got)
	}
	if got := p.Delivered(b); got != 1 {
		t.Errorf("Delivered(b) = %d, want 1", got)
	}
}

func TestProvider_Default(t *testing.T) {
	p := fake.New(envelope.ChannelEmail)
	k := key("d")
	p.Default(fake.FailPermanent)
	p.Script(k, fake.Succeed)
	if _, err := deliver(t, p, k); err != nil {
		t.Fatalf("scripted Succeed: %v", err)
	}
	for range 2 {
		_, err := deliver(t, p, k)
		if de := envelope.Classify(err); de == nil || de.Kind != envelope.KindPermanent {
			t.Fatalf("after the script: %v, want the default permanent failure", err)
		}
	}
	p.Default(fake.Succeed)
	if _, err := deliver(t, p, k); err != nil {
		t.Fatalf("after Default(Succeed): %v", err)
	}
}

func TestProvider_SetRetryAfter(t *testing.T) {
	p := fake.New(envelope.ChannelTelegram)
	p.Default(fake.FailRetryable)
	p.SetRetryAfter(3 * time.Second)
	_, err := deliver(t, p, key("r"))
	de := envelope.Classify(err)
	if de.Kind != envelope.KindRetryable || de.Class != envelope.ClassRateLimited || de.RetryAfter != 3*time.Second {
		t.Errorf("error = %s/%s/%s, want retryable/rate_limited/3s", de.Kind, de.Class, de.RetryAfter)
	}
	p.SetRetryAfter(0)
	_, err = deliver(t, p, key("r"))
	if de := envelope.Classify(err); de.RetryAfter != 0 || de.Class != envelope.ClassProviderUnavailable {
		t.Errorf("after SetRetryAfter(0): %s/%s, want provider_unavailable without RetryAfter", de.Class, de.RetryAfter)
	}
}

func TestProvider_Capabilities(t *testing.T) {
	p := fake.New(envelope.ChannelPush)
	want := channels.Capabilities{Name: "fake", Channel: envelope.ChannelPush, IdempotentRedelivery: true}
	if got := p.Capabilities(); got != want {
		t.Errorf("Capabilities = %+v, want %+v", got, want)
	}
	p.SetIdempotent(false)
	if p.Capabilities().IdempotentRedelivery {
		t.Error("IdempotentRedelivery still true after SetIdempotent(false)")
	}
}

func TestProvider_OnDeliver(t *testing.T) {
	p := fake.New(envelope.ChannelEmail)
	var seen []envelope.Key
	p.OnDeliver(func(k envelope.Key) {
		// Called before the step is played: nothing recorded yet for k.
		if n := p.Delivered(k); n != 0 {
			t.Errorf("hook saw Delivered = %d, want 0", n)
		}
		seen = append(seen, k)
	})
	_, _ = deliver(t, p, key("x"))
	p.OnDeliver(nil)
	_, _ = deliver(t, p, key("y"))
	if len(seen) != 1 || seen[0] != key("x") {
		t.Errorf("hook saw %v, want [x] only", seen)
	}
}

func reconcile(t testing.TB, p *fake.Provider, k envelope.Key) (channels.Reconciliation, error) {
	t.Helper()
	return p.Reconcile(context.Background(), k, emailMsg())
}

func TestProvider_Reconcile(t *testing.T) {
	tests := []struct {
		name    string
		script  []fake.Step
		want    channels.Outcome
		receipt string
	}{
		{"NeverDelivered", nil, channels.Rejected, ""},
		{"Succeeded", []fake.Step{fake.Succeed}, channels.Accepted, "fake-1"},
		{"LostReceipt", []fake.Step{fake.LoseReceipt}, channels.Accepted, "fake-1"},
		{"FailedRetryable", []fake.Step{fake.FailRetryable}, channels.Rejected, ""},
		{"FailedPermanent", []fake.Step{fake.FailPermanent}, channels.Rejected, ""},
		{"Gone", []fake.Step{fake.Gone}, channels.Rejected, ""},
		{"FailThenLost", []fake.Step{fake.FailRetryable, fake.LoseReceipt}, channels.Accepted, "fake-1"},
		{"TwiceLastReceipt", []fake.Step{fake.Succeed, fake.Succeed}, channels.Accepted, "fake-2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fake.New(envelope.ChannelEmail)
			k := key("rec")
			p.Script(k, tt.script...)
			for range tt.script {
				_, _ = deliver(t, p, k)
			}
			r, err := reconcile(t, p, k)
			if err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
			if r.Outcome != tt.want || r.Receipt.ID != tt.receipt {
				t.Errorf("Reconcile = %s/%q, want %s/%q", r.Outcome, r.Receipt.ID, tt.want, tt.receipt)
			}
			calls := p.Calls()
			last := calls[len(calls)-1]
			if last.Op != fake.OpReconcile || last.Key != k || last.Outcome != tt.want {
				t.Errorf("last call = %+v, want a reconcile of %v answering %s", last, k, tt.want)
			}
		})
	}
}

func TestProvider_ScriptReconcile(t *testing.T) {
	p := fake.New(envelope.ChannelEmail)
	k := key("sr")
	if _, err := deliver(t, p, k); err != nil {
		t.Fatal(err)
	}
	p.ScriptReconcile(k, channels.Unknown, channels.Rejected, channels.Accepted)
	for i, want := range []struct {
		o  channels.Outcome
		id string
	}{
		{channels.Unknown, ""},
		{channels.Rejected, ""},
		{channels.Accepted, "fake-1"},
		{channels.Accepted, "fake-1"}, // script used up: the record answers
	} {
		r, err := reconcile(t, p, k)
		if err != nil || r.Outcome != want.o || r.Receipt.ID != want.id {
			t.Errorf("Reconcile #%d = %s/%q, %v; want %s/%q", i, r.Outcome, r.Receipt.ID, err, want.o, want.id)
		}
	}
	// Another key is not affected by k's script.
	if r, _ := reconcile(t, p, key("other")); r.Outcome != channels.Rejected {
		t.Errorf("other key = %s, want rejected", r.Outcome)
	}
}

func TestProvider_SetReconcile(t *testing.T) {
	p := fake.New(envelope.ChannelEmail)
	k := key("sf")
	if _, err := deliver(t, p, k); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("service down")
	p.SetReconcile(func(got envelope.Key) (channels.Reconciliation, error) {
		if got != k {
			t.Errorf("fn got key %v, want %v", got, k)
		}
		_ = p.Delivered(got) // the provider is usable from fn (no deadlock)
		return channels.Reconciliation{}, boom
	})
	p.ScriptReconcile(k, channels.Rejected)
	if r, err := reconcile(t, p, k); err != nil || r.Outcome != channels.Rejected {
		t.Errorf("script first: %s, %v; want rejected", r.Outcome, err)
	}
	if _, err := reconcile(t, p, k); !errors.Is(err, boom) {
		t.Errorf("fn: err = %v, want %v", err, boom)
	}
	calls := p.Calls()
	if last := calls[len(calls)-1]; last.Outcome != channels.Unknown {
		t.Errorf("recorded outcome of a failing reconcile = %s, want unknown", last.Outcome)
	}
	p.SetReconcile(nil)
	if r, err := reconcile(t, p, k); err != nil || r.Outcome != channels.Accepted {
		t.Errorf("record restored: %s, %v; want accepted", r.Outcome, err)
	}
}

func TestProvider_Concurrent(t *testing.T) {
	const goroutines, per = 16, 50
	p := fake.New(envelope.ChannelEmail)
	var hooked sync.Map // key → struct{}: the hook runs concurrently too
	p.OnDeliver(func(k envelope.Key) { hooked.Store(k, struct{}{}) })
	for g := range goroutines {
		// Every key fails once, loses a receipt once, then succeeds.
		p.Script(key(fmt.Sprint(g)), fake.FailRetryable, fake.LoseReceipt)
	}
	var wg sync.WaitGroup
	ids := make([][]string, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			k := key(fmt.Sprint(g))
			for range per {
				rc, err := p.Deliver(context.Background(), k, emailMsg())
				if err == nil {
					ids[g] = append(ids[g], rc.ID)
				}
				if _, err := p.Reconcile(context.Background(), k, emailMsg()); err != nil {
					t.Errorf("Reconcile: %v", err)
				}
				_ = p.Calls()
				_ = p.Capabilities()
			}
		})
	}
	// Concurrent configuration changes must be race-free too.
	wg.Go(func() {
		for range per {
			p.SetIdempotent(true)
			p.SetRetryAfter(0)
			p.Default(fake.Succeed)
		}
	})
	wg.Wait()

	seen := make(map[string]bool)
	for g := range goroutines {
		if _, ok := hooked.Load(key(fmt.Sprint(g))); !ok {
			t.Errorf("OnDeliver never saw key %d", g)
		}
		if got := p.Delivered(key(fmt.Sprint(g))); got != per-1 {
			t.Errorf("Delivered(%d) = %d, want %d", g, got, per-1)
		}
		if len(ids[g]) != per-2 {
			t.Errorf("goroutine %d got %d receipts, want %d", g, len(ids[g]), per-2)
		}
		for _, id := range ids[g] {
			if seen[id] {
				t.Errorf("receipt %s issued twice", id)
			}
			seen[id] = true
		}
	}
	if got, want := len(p.Calls()), goroutines*per*2; got != want {
		t.Errorf("%d calls recorded, want %d", got, want)
	}
}

// Canary values for the conformance run.
const (
	canaryAddr = "canary-recipient@example.invalid"
	canaryBody = "canary-body-text-7f3a"
	canaryChat = "canary-chat-991122"
	canaryEndp = "https://push.example.invalid/canary-endpoint-55"
)

func conformanceMessage(ch envelope.Channel) func(envelope.Key) *envelope.Message {
	return func(k envelope.Key) *envelope.Message {
		m := &envelope.Message{Channel: ch}
		switch ch {
		case envelope.ChannelEmail:
			m.Email = &envelope.EmailMessage{To: canaryAddr, Subject: "Your week", HTML: "<p>" + canaryBody + "</p>", Text: canaryBody}
		case envelope.ChannelPush:
			m.Push = &envelope.PushMessage{
				Subscription: envelope.PushSubscription{Endpoint: canaryEndp, Keys: envelope.PushKeys{P256dh: "p256dh-canary", Auth: "auth-canary"}},
				Payload:      []byte(`{"title":"t","body":"` + canaryBody + `"}`),
				TTL:          time.Hour, Urgency: envelope.UrgencyNormal,
			}
		case envelope.ChannelTelegram:
			m.Chat = &envelope.ChatMessage{ChatID: canaryChat, Text: canaryBody, Segment: k.Segment, Segments: 1}
		case envelope.ChannelWeCom, envelope.ChannelWeComRobot, envelope.ChannelWeComBotReply:
			m.WeCom = &envelope.WeComMessage{User: canaryChat, Robot: "ops", ResponseURL: canaryEndp,
				MsgType: envelope.WeComMarkdown, Content: canaryBody, Segment: k.Segment, Segments: 1}
		}
		return m
	}
}

func TestProvider_Conformance(t *testing.T) {
	for _, ch := range envelope.Channels {
		t.Run(string(ch), func(t *testing.T) {
			const retryAfter = 2 * time.Second
			channeltest.Exercise(t, channeltest.Harness{
				Channel: ch,
				New: func(t testing.TB, b channeltest.Behaviour, _ *slog.Logger) channels.Provider {
					p := fake.New(ch)
					switch b {
					case channeltest.Accept:
						p.Default(fake.Succeed)
					case channeltest.FailRetryable:
						p.Default(fake.FailRetryable)
					case channeltest.FailPermanent:
						p.Default(fake.FailPermanent)
					case channeltest.RecipientGone:
						p.Default(fake.Gone)
					case channeltest.RateLimited:
						p.Default(fake.FailRetryable)
						p.SetRetryAfter(retryAfter)
					case channeltest.Hang:
						p.Default(fake.Hang)
					default:
						t.Fatalf("unknown behaviour %s", b)
					}
					return p
				},
				Message:    conformanceMessage(ch),
				Secrets:    []string{canaryAddr, canaryBody, canaryChat, canaryEndp, "p256dh-canary", "auth-canary"},
				RetryAfter: retryAfter,
			})
		})
	}
}

func TestStep_String(t *testing.T) {
	seen := make(map[string]bool)
	for s := fake.Succeed; s <= fake.Panic; s++ {
		name := s.String()
		if name == "" || strings.HasPrefix(name, "step(") || seen[name] {
			t.Errorf("Step(%d).String() = %q, want a distinct name", int(s), name)
		}
		seen[name] = true
	}
	if got := fake.Step(99).String(); got != "step(99)" {
		t.Errorf("Step(99).String() = %q", got)
	}
}
