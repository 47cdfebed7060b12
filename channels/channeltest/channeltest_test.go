package channeltest_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/channeltest"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
)

const (
	secretTo   = "canary-to@example.invalid"
	secretBody = "canary-body-31337"
	retryAfter = 3 * time.Second
)

func message(k envelope.Key) *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelEmail, Email: &envelope.EmailMessage{
		To: secretTo, Subject: "hello", Text: secretBody, HTML: "<p>" + secretBody + "</p>",
	}}
}

// mutant wraps the fake provider and breaks one rule of the contract.
type mutant struct {
	*fake.Provider
	flaw   string
	b      channeltest.Behaviour
	logger *slog.Logger
}

// leakyError is an error whose text holds the recipient.
type leakyError struct{ to string }

func (e leakyError) Error() string { return "send to " + e.to + " failed" }

func (m *mutant) Deliver(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Receipt, error) {
	switch m.flaw {
	case "log-secret":
		m.logger.Info("sending", "to", msg.Email.To)
	case "log-id":
		m.logger.Info("sending", "key", key.String())
	case "hang-success":
		if m.b == channeltest.Hang {
			return channels.Receipt{ID: "r"}, nil
		}
	case "ignore-cancel":
		if m.b == channeltest.Hang {
			<-time.After(channeltest.CancelGrace + 2*time.Second)
			return channels.Receipt{}, envelope.Retryable(envelope.ClassTimeout, nil)
		}
	}
	rc, err := m.Provider.Deliver(ctx, key, msg)
	switch m.flaw {
	case "leak-error":
		if err != nil {
			return rc, leakyError{msg.Email.To}
		}
	case "leak-in-class":
		if err != nil {
			return rc, envelope.Retryable(envelope.ErrorClass(msg.Email.To), err)
		}
	case "plain-error":
		if err != nil {
			return rc, errors.New("failed")
		}
	case "all-retryable":
		if de := envelope.Classify(err); de != nil {
			return rc, envelope.Retryable(envelope.ClassProviderUnavailable, err)
		}
	case "short-retry-after":
		if de := envelope.Classify(err); de != nil && de.RetryAfter > 0 {
			return rc, envelope.RetryAfter(de.Class, time.Second, err)
		}
	case "empty-receipt":
		rc = channels.Receipt{}
	case "receipt-leak":
		if err == nil {
			rc.ID = msg.Email.To
		}
	case "receipt-with-error":
		if err != nil {
			rc.ID = "r-1"
		}
	case "hang-permanent":
		if err != nil {
			return rc, envelope.Permanent(envelope.ClassInvalidRequest, err)
		}
	case "hang-unknown-class":
		if m.b == channeltest.Hang {
			return rc, envelope.Retryable(envelope.ClassRateLimited, err)
		}
	}
	return rc, err
}

func (m *mutant) Reconcile(ctx context.Context, key envelope.Key, msg *envelope.Message) (channels.Reconciliation, error) {
	switch m.flaw {
	case "reconcile-rejected":
		return channels.Reconciliation{Outcome: channels.Rejected}, nil
	case "reconcile-leak":
		return channels.Reconciliation{}, leakyError{msg.Email.To}
	}
	return m.Provider.Reconcile(ctx, key, msg)
}

func (m *mutant) Capabilities() channels.Capabilities {
	c := m.Provider.Capabilities()
	switch m.flaw {
	case "wrong-channel":
		c.Channel = envelope.ChannelPush
	case "no-name":
		c.Name = ""
	}
	return c
}

// newFake builds the fake provider answering with b.
func newFake(b channeltest.Behaviour) *fake.Provider {
	p := fake.New(envelope.ChannelEmail)
	switch b {
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
	}
	return p
}

// harness returns a harness whose provider has the given flaw ("" = none).
func harness(flaw string) channeltest.Harness {
	h := channeltest.Harness{
		Channel: envelope.ChannelEmail,
		New: func(t testing.TB, b channeltest.Behaviour, logger *slog.Logger) channels.Provider {
			return &mutant{Provider: newFake(b), flaw: flaw, b: b, logger: logger}
		},
		Message:    message,
		Secrets:    []string{secretTo, secretBody},
		RetryAfter: retryAfter,
	}
	switch flaw {
	case "harness-no-secrets":
		h.Secrets = nil
	case "harness-secret-not-in-message":
		h.Secrets = []string{"canary-elsewhere"}
	case "harness-no-reason":
		h.Unsupported = map[channeltest.Behaviour]string{channeltest.Hang: " "}
	case "harness-accept-unsupported":
		h.Unsupported = map[channeltest.Behaviour]string{channeltest.Accept: "never"}
	case "harness-no-retry-after":
		h.RetryAfter = 0
	case "harness-nil-new":
		h.New = nil
	case "harness-wrong-message-channel":
		h.Message = func(k envelope.Key) *envelope.Message {
			m := message(k)
			m.Channel = envelope.ChannelPush
			return m
		}
	}
	return h
}

func TestExercise_Fake(t *testing.T) {
	channeltest.Exercise(t, harness(""))
}

func TestExercise_Unsupported(t *testing.T) {
	h := harness("")
	h.Unsupported = map[channeltest.Behaviour]string{
		channeltest.Hang:        "the test service cannot hang",
		channeltest.RateLimited: "the test service has no rate limit",
	}
	h.RetryAfter = 0 // allowed: RateLimited is unsupported
	channeltest.Exercise(t, h)
}

const flawEnv = "CHANNELTEST_FLAW"

// TestFlawedProvider runs the suite against one flawed provider; it is
// meant to fail, and only runs in the child processes TestExercise_Catches starts.
func TestFlawedProvider(t *testing.T) {
	flaw := os.Getenv(flawEnv)
	if flaw == "" {
		t.Skip("runs only as a child of TestExercise_Catches")
	}
	channeltest.Exercise(t, harness(flaw))
}

// TestExercise_Catches proves each check can fail: the suite, run against a
// provider (or harness) with one flaw, must fail with the expected message.
func TestExercise_Catches(t *testing.T) {
	if os.Getenv(flawEnv) != "" {
		t.Skip("child process")
	}
	tests := []struct {
		flaw string
		want string
	}{
		{"leak-error", "appears in a returned error's text"},
		{"leak-in-class", "not a stable snake_case class"},
		{"log-secret", "appears in the log output"},
		{"log-id", "envelope id"},
		{"plain-error", "unclassified error"},
		{"all-retryable", "error kind = retryable"},
		{"short-retry-after", "RetryAfter = 1s, want at least the announced 3s"},
		{"empty-receipt", "empty receipt ID"},
		{"receipt-leak", "appears in a receipt"},
		{"receipt-with-error", "want the zero receipt"},
		{"ignore-cancel", "did not return within 5s of its context being cancelled"},
		{"hang-success", "returned success while the service hangs"},
		{"hang-permanent", "error kind = permanent"},
		{"hang-unknown-class", "want a timeout-like class"},
		{"reconcile-rejected", "want accepted or unknown"},
		{"reconcile-leak", "appears in a returned error's text"},
		{"wrong-channel", "Capabilities().Channel"},
		{"no-name", "Capabilities().Name is empty"},
		{"harness-no-secrets", "Secrets is empty"},
		{"harness-secret-not-in-message", "no Secret appears in the message"},
		{"harness-no-reason", "has no reason"},
		{"harness-accept-unsupported", "Accept cannot be Unsupported"},
		{"harness-no-retry-after", "RetryAfter must be positive"},
		{"harness-nil-new", "New is nil"},
		{"harness-wrong-message-channel", "Message returned channel"},
	}
	for _, tt := range tests {
		t.Run(tt.flaw, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestFlawedProvider$", "-test.v")
			cmd.Env = append(os.Environ(), flawEnv+"="+tt.flaw)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("the suite passed (or did not run: %v) against flaw %q; output:\n%s", err, tt.flaw, out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Errorf("flaw %q: output lacks %q:\n%s", tt.flaw, tt.want, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestFlawedProvider") {
				t.Errorf("flaw %q: TestFlawedProvider did not fail:\n%s", tt.flaw, out)
			}
		})
	}
}

func TestBehaviour_String(t *testing.T) {
	seen := make(map[string]bool)
	for _, b := range channeltest.Behaviours {
		s := b.String()
		if s == "" || strings.HasPrefix(s, "Behaviour(") || seen[s] {
			t.Errorf("Behaviour(%d).String() = %q, want a distinct name", int(b), s)
		}
		seen[s] = true
	}
	if got := channeltest.Behaviour(42).String(); got != "Behaviour(42)" {
		t.Errorf("Behaviour(42).String() = %q", got)
	}
}
