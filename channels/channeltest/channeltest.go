// Package channeltest holds the conformance suite every channels.Provider
// passes (SPEC §8).
//
// A provider's own test builds a Harness whose New function returns a
// provider wired to a fake of its service (usually an httptest server) that
// answers every call with one Behaviour, and calls Exercise:
//
//	func TestConformance(t *testing.T) {
//		channeltest.Exercise(t, channeltest.Harness{
//			Channel:    envelope.ChannelTelegram,
//			New:        newProviderAgainstFakeService,
//			Message:    canaryMessage,
//			Secrets:    []string{token, chatID, bodyText},
//			RetryAfter: 3 * time.Second,
//		})
//	}
//
// Exercise checks the classification of every behaviour, that Deliver
// returns promptly once its context is cancelled, concurrent use, the
// capabilities, Reconcile after an accepted delivery, and redaction: no
// secret (and no envelope id) may appear in a returned error's text, in a
// receipt or in the provider's log output.
package channeltest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
)

// Behaviour is how the fake service behind a provider answers every call.
type Behaviour int

// The behaviours a Harness's fake service can be asked to produce.
const (
	// Accept: the service accepts the message and returns its id.
	Accept Behaviour = iota
	// FailRetryable: a transient failure (e.g. HTTP 500 or 503).
	FailRetryable
	// FailPermanent: the message can never be sent as is (e.g. HTTP 400).
	FailPermanent
	// RecipientGone: the recipient is dead (a 410 push subscription, a
	// bounced address, a bot blocked by the user).
	RecipientGone
	// RateLimited: the service refuses for now and announces when to come
	// back (HTTP 429 with Retry-After, Telegram's retry_after), namely
	// Harness.RetryAfter.
	RateLimited
	// Hang: the service never answers; only cancelling the call ends it.
	Hang
)

// Behaviours lists every behaviour in a stable order.
var Behaviours = []Behaviour{Accept, FailRetryable, FailPermanent, RecipientGone, RateLimited, Hang}

// String returns the behaviour's name, as used in subtest names.
func (b Behaviour) String() string {
	switch b {
	case Accept:
		return "Accept"
	case FailRetryable:
		return "FailRetryable"
	case FailPermanent:
		return "FailPermanent"
	case RecipientGone:
		return "RecipientGone"
	case RateLimited:
		return "RateLimited"
	case Hang:
		return "Hang"
	}
	return "Behaviour(" + strconv.Itoa(int(b)) + ")"
}

// Harness adapts one provider to the suite.
type Harness struct {
	// Channel is the channel the provider delivers on; Capabilities must
	// report it.
	Channel envelope.Channel

	// New returns a provider whose (fake) service will answer every call
	// with b. logger is where the provider must log: the suite inspects the
	// output for secrets. New may register cleanups on t (closing the fake
	// server); it is called several times, once per subtest.
	New func(t testing.TB, b Behaviour, logger *slog.Logger) channels.Provider

	// Message returns a message for key whose recipient and body contain
	// the canary strings of Secrets. It must set Message.Channel to Channel
	// and be safe for concurrent use. The suite's keys have tenant
	// "ct-tenant", distinct envelope ids and segment 0.
	Message func(key envelope.Key) *envelope.Message

	// Secrets are canary strings (token, API key, recipient, body text)
	// that must never appear in an error's text, a receipt or the log
	// output. At least one is required, and at least one must appear in the
	// messages Message returns.
	Secrets []string

	// RetryAfter is the delay the fake service announces for RateLimited;
	// the provider's error must carry a RetryAfter of at least this much.
	// It must be positive unless RateLimited is Unsupported.
	RetryAfter time.Duration

	// Unsupported maps each behaviour the service cannot produce to the
	// reason why. Those subtests are skipped with the reason in the log.
	// Accept cannot be unsupported, and a reason must not be empty.
	Unsupported map[Behaviour]string
}

// Limits used by the suite.
const (
	// CallTimeout bounds every Deliver and Reconcile call that is not meant
	// to hang.
	CallTimeout = 15 * time.Second
	// CancelGrace is how long Deliver may take to return after its context
	// is cancelled.
	CancelGrace = 5 * time.Second
	// HangCancelAfter is how long the Hang subtest lets a call hang before
	// cancelling it.
	HangCancelAfter = 100 * time.Millisecond
	// Concurrency is the number of goroutines of the concurrent-use subtest.
	Concurrency = 8
)

// timeoutish are the classes accepted for a call ended by its context.
var timeoutish = map[envelope.ErrorClass]bool{
	envelope.ClassTimeout:             true,
	envelope.ClassInterrupted:         true,
	envelope.ClassNetwork:             true,
	envelope.ClassUnreachable:         true, // ended while connecting
	envelope.ClassProviderUnavailable: true,
}

// stableClass is the shape of a stable, low-cardinality error class.
var stableClass = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// Exercise runs the conformance suite against the provider h describes.
func Exercise(t *testing.T, h Harness) {
	t.Helper()
	if !h.valid(t) {
		return
	}
	s := &suite{h: h, log: &lockedBuffer{}}

	t.Run("Capabilities", s.capabilities)
	t.Run("Accept", s.accept)
	t.Run("FailRetryable", func(t *testing.T) {
		s.failure(t, FailRetryable, envelope.KindRetryable)
	})
	t.Run("FailPermanent", func(t *testing.T) {
		s.failure(t, FailPermanent, envelope.KindPermanent)
	})
	t.Run("RecipientGone", func(t *testing.T) {
		s.failure(t, RecipientGone, envelope.KindRecipientGone)
	})
	t.Run("RateLimited", s.rateLimited)
	t.Run("Hang", s.hang)
	t.Run("HangDeadline", s.hangDeadline)
	t.Run("Concurrent", s.concurrent)
	t.Run("ReconcileAfterAccept", s.reconcileAfterAccept)
	t.Run("Redaction", s.redaction)
}

// valid checks the harness itself, so that a broken harness fails loudly
// instead of making the suite pass vacuously.
func (h *Harness) valid(t *testing.T) bool {
	t.Helper()
	ok := true
	bad := func(format string, args ...any) {
		t.Errorf("channeltest: invalid Harness: "+format, args...)
		ok = false
	}
	if !h.Channel.Valid() {
		bad("Channel %q is not a known channel", h.Channel)
	}
	if h.New == nil {
		bad("New is nil")
	}
	if h.Message == nil {
		bad("Message is nil")
	}
	if len(h.Secrets) == 0 {
		bad("Secrets is empty: the redaction checks could not fail")
	}
	for i, s := range h.Secrets {
		if len(s) < 4 {
			bad("Secrets[%d] is shorter than 4 bytes: too short to be a distinctive canary", i)
		}
	}
	for b, why := range h.Unsupported {
		if b == Accept {
			bad("Accept cannot be Unsupported: every provider must deliver")
		}
		if strings.TrimSpace(why) == "" {
			bad("Unsupported[%s] has no reason", b)
		}
	}
	if _, off := h.Unsupported[RateLimited]; !off && h.RetryAfter <= 0 {
		bad("RetryAfter must be positive when RateLimited is supported")
	}
	if !ok {
		return false
	}
	msg := h.Message(envelope.Key{Tenant: "channeltest", EnvelopeID: "harness-check"})
	if msg == nil {
		bad("Message returned nil")
		return false
	}
	if msg.Channel != h.Channel {
		bad("Message returned channel %q, want %q", msg.Channel, h.Channel)
	}
	flat := flatten(msg)
	found := false
	for _, s := range h.Secrets {
		if strings.Contains(flat, s) {
			found = true
			break
		}
	}
	if !found {
		bad("no Secret appears in the message Message returns: the canaries would never reach the provider")
	}
	return ok
}

// flatten renders msg as text for a containment check.
func flatten(msg *envelope.Message) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(msg)
	if msg.Push != nil {
		b.Write(msg.Push.Payload)
	}
	return b.String()
}

// suite is one run of Exercise: the harness and everything the provider
// returned or logged, for the final redaction check.
type suite struct {
	h   Harness
	log *lockedBuffer

	mu       sync.Mutex
	seq      int
	errs     []error
	receipts []channels.Receipt
	ids      []string // envelope ids used: they must not be logged either
}

// key returns a fresh key for one call.
func (s *suite) key(name string) envelope.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	k := envelope.Key{
		Tenant:     "ct-tenant",
		EnvelopeID: fmt.Sprintf("ct-envelope-%s-%d", name, s.seq),
		Segment:    0,
	}
	s.ids = append(s.ids, k.EnvelopeID)
	return k
}

// record keeps what a provider returned for the redaction check.
func (s *suite) record(rc channels.Receipt, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rc != (channels.Receipt{}) {
		s.receipts = append(s.receipts, rc)
	}
	if err != nil {
		s.errs = append(s.errs, err)
	}
}

// provider builds a provider for b that logs into the suite's buffer.
func (s *suite) provider(t *testing.T, b Behaviour) channels.Provider {
	t.Helper()
	if why, off := s.h.Unsupported[b]; off {
		t.Skipf("behaviour %s unsupported by this provider: %s", b, why)
	}
	logger := slog.New(slog.NewTextHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := s.h.New(t, b, logger)
	if p == nil {
		t.Fatalf("Harness.New(%s) returned nil", b)
	}
	return p
}

// result is one Deliver's outcome.
type result struct {
	rc  channels.Receipt
	err error
}

// deliver calls p.Deliver in a goroutine and waits at most CallTimeout for it.
func (s *suite) deliver(t *testing.T, p channels.Provider, key envelope.Key) (channels.Receipt, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	done := s.start(ctx, p, key)
	select {
	case r := <-done:
		return r.rc, r.err
	case <-time.After(CallTimeout + CancelGrace):
		t.Fatalf("Deliver did not return within %s (its context expired after %s)", CallTimeout+CancelGrace, CallTimeout)
		return channels.Receipt{}, nil
	}
}

// start runs p.Deliver in a goroutine, recording its result, and returns
// the channel the result arrives on.
func (s *suite) start(ctx context.Context, p channels.Provider, key envelope.Key) <-chan result {
	msg := s.h.Message(key)
	done := make(chan result, 1)
	go func() {
		rc, err := p.Deliver(ctx, key, msg)
		s.record(rc, err)
		done <- result{rc, err}
	}()
	return done
}

// classified asserts that err is a *envelope.DeliveryError of kind want with
// a stable class, and returns it.
func classified(t *testing.T, err error, want envelope.Kind) *envelope.DeliveryError {
	t.Helper()
	if err == nil {
		t.Fatalf("Deliver returned no error, want a %s error", want)
	}
	var de *envelope.DeliveryError
	if !errors.As(err, &de) {
		t.Fatalf("Deliver returned an unclassified error (%T); providers must return an *envelope.DeliveryError", err)
	}
	if de.Kind != want {
		t.Errorf("error kind = %s (class %q), want %s", de.Kind, de.Class, want)
	}
	if de.Class == envelope.ClassNone {
		t.Errorf("error class is empty, want a stable class")
	} else if !stableClass.MatchString(string(de.Class)) {
		t.Errorf("error class %q is not a stable snake_case class", de.Class)
	}
	if got := envelope.Classify(err); got != de {
		t.Errorf("envelope.Classify did not return the provider's DeliveryError")
	}
	return de
}

func (s *suite) capabilities(t *testing.T) {
	p := s.provider(t, Accept)
	c := p.Capabilities()
	if c.Name == "" {
		t.Errorf("Capabilities().Name is empty")
	} else if !stableClass.MatchString(c.Name) {
		t.Errorf("Capabilities().Name = %q, want a short lowercase metric label", c.Name)
	}
	if c.Channel != s.h.Channel {
		t.Errorf("Capabilities().Channel = %q, want %q", c.Channel, s.h.Channel)
	}
}

func (s *suite) accept(t *testing.T) {
	p := s.provider(t, Accept)
	rc, err := s.deliver(t, p, s.key("accept"))
	if err != nil {
		t.Fatalf("Deliver: %v, want a receipt and no error", err)
	}
	if rc.ID == "" {
		t.Errorf("Deliver returned an empty receipt ID")
	}
}

func (s *suite) failure(t *testing.T, b Behaviour, want envelope.Kind) {
	p := s.provider(t, b)
	rc, err := s.deliver(t, p, s.key(b.String()))
	classified(t, err, want)
	if rc != (channels.Receipt{}) {
		t.Errorf("Deliver returned receipt %+v with an error, want the zero receipt", rc)
	}
}

func (s *suite) rateLimited(t *testing.T) {
	p := s.provider(t, RateLimited)
	rc, err := s.deliver(t, p, s.key("ratelimited"))
	de := classified(t, err, envelope.KindRetryable)
	if de.RetryAfter < s.h.RetryAfter {
		t.Errorf("RetryAfter = %s, want at least the announced %s", de.RetryAfter, s.h.RetryAfter)
	}
	if rc != (channels.Receipt{}) {
		t.Errorf("Deliver returned receipt %+v with an error, want the zero receipt", rc)
	}
}

// hang cancels a hanging Deliver explicitly.
func (s *suite) hang(t *testing.T) {
	p := s.provider(t, Hang)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := s.start(ctx, p, s.key("hang"))
	timer := time.AfterFunc(HangCancelAfter, cancel)
	defer timer.Stop()
	s.awaitCancelled(t, ctx, done)
}

// hangDeadline lets a hanging Deliver's context reach its deadline.
func (s *suite) hangDeadline(t *testing.T) {
	p := s.provider(t, Hang)
	ctx, cancel := context.WithTimeout(context.Background(), HangCancelAfter)
	defer cancel()
	done := s.start(ctx, p, s.key("hangdeadline"))
	s.awaitCancelled(t, ctx, done)
}

// awaitCancelled waits for ctx to end, then at most CancelGrace for the
// result, and checks it is a retryable, timeout-like failure.
func (s *suite) awaitCancelled(t *testing.T, ctx context.Context, done <-chan result) {
	t.Helper()
	var r result
	select {
	case r = <-done:
		// Returned before the cancellation: the service was meant to hang.
		if r.err == nil {
			t.Fatalf("Deliver returned success while the service hangs")
		}
	case <-ctx.Done():
		select {
		case r = <-done:
		case <-time.After(CancelGrace):
			t.Fatalf("Deliver did not return within %s of its context being cancelled", CancelGrace)
		}
	}
	de := classified(t, r.err, envelope.KindRetryable)
	if !timeoutish[de.Class] {
		t.Errorf("class = %q, want a timeout-like class (timeout, interrupted, network_error, provider_unavailable)", de.Class)
	}
	if r.rc != (channels.Receipt{}) {
		t.Errorf("Deliver returned receipt %+v with an error, want the zero receipt", r.rc)
	}
}

func (s *suite) concurrent(t *testing.T) {
	p := s.provider(t, Accept)
	var wg sync.WaitGroup
	errs := make([]error, Concurrency)
	receipts := make([]channels.Receipt, Concurrency)
	keys := make([]envelope.Key, Concurrency)
	for i := range keys {
		keys[i] = s.key("concurrent")
	}
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	for i := range Concurrency {
		wg.Go(func() {
			receipts[i], errs[i] = p.Deliver(ctx, keys[i], s.h.Message(keys[i]))
			s.record(receipts[i], errs[i])
		})
	}
	wg.Wait()
	for i := range Concurrency {
		if errs[i] != nil {
			t.Errorf("goroutine %d: Deliver: %v", i, errs[i])
		} else if receipts[i].ID == "" {
			t.Errorf("goroutine %d: empty receipt ID", i)
		}
	}
}

func (s *suite) reconcileAfterAccept(t *testing.T) {
	p := s.provider(t, Accept)
	key := s.key("reconcile")
	if _, err := s.deliver(t, p, key); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	type rec struct {
		r   channels.Reconciliation
		err error
	}
	done := make(chan rec, 1)
	go func() {
		r, err := p.Reconcile(ctx, key, s.h.Message(key))
		s.record(r.Receipt, err)
		done <- rec{r, err}
	}()
	var got rec
	select {
	case got = <-done:
	case <-time.After(CallTimeout + CancelGrace):
		t.Fatalf("Reconcile did not return within %s", CallTimeout+CancelGrace)
	}
	if got.err != nil {
		// An error counts as Unknown; it is allowed, and checked for secrets.
		t.Logf("Reconcile returned an error (counts as unknown): %v", got.err)
		return
	}
	switch got.r.Outcome {
	case channels.Accepted, channels.Unknown:
	default:
		t.Errorf("Reconcile after an accepted Deliver = %s, want accepted or unknown", got.r.Outcome)
	}
	if got.r.Outcome != channels.Accepted && got.r.Receipt != (channels.Receipt{}) {
		t.Errorf("Reconcile returned receipt %+v with outcome %s", got.r.Receipt, got.r.Outcome)
	}
}

// redaction checks everything the other subtests gathered.
func (s *suite) redaction(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	logs := s.log.String()
	for _, secret := range s.h.Secrets {
		if strings.Contains(logs, secret) {
			t.Errorf("a secret (Secrets[%d]) appears in the log output", index(s.h.Secrets, secret))
		}
		for _, err := range s.errs {
			if strings.Contains(err.Error(), secret) || strings.Contains(fmt.Sprintf("%+v", err), secret) ||
				strings.Contains(fmt.Sprintf("%v", err), secret) {
				t.Errorf("a secret (Secrets[%d]) appears in a returned error's text", index(s.h.Secrets, secret))
			}
		}
		for _, rc := range s.receipts {
			if strings.Contains(rc.ID, secret) {
				t.Errorf("a secret (Secrets[%d]) appears in a receipt", index(s.h.Secrets, secret))
			}
		}
	}
	for _, id := range s.ids {
		if strings.Contains(logs, id) {
			t.Errorf("envelope id %q appears in the log output; log only classes and labels", id)
		}
		for _, err := range s.errs {
			if strings.Contains(err.Error(), id) {
				t.Errorf("envelope id %q appears in a returned error's text", id)
			}
		}
	}
}

func index(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// lockedBuffer is a bytes.Buffer safe for concurrent writers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
