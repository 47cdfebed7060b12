package telegram

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/envelope"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testKey = envelope.Key{Tenant: "t1", EnvelopeID: "env-1", Segment: 0}

func TestProvider_Deliver_RequestShape(t *testing.T) {
	for _, tc := range []struct {
		name       string
		chatID     string
		parseMode  string
		noPreview  bool
		wantChatID string // JSON
	}{
		{"PrivateChat", "123456789", "", false, `123456789`},
		{"Supergroup", "-1001234567890", envelope.ParseModeHTML, false, `-1001234567890`},
		{"ChannelUsername", "@outbox_news", envelope.ParseModeHTML, true, `"@outbox_news"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newBotAPI(t, testToken, nil)
			p := mustProvider(t, api, Options{DisableWebPagePreview: tc.noPreview})
			text := "<b>Your reply</b> part 1 — ünïcödé & more"
			rc, err := p.Deliver(context.Background(), testKey, chat(tc.chatID, text, tc.parseMode))
			if err != nil {
				t.Fatalf("Deliver: %v", err)
			}
			if rc.ID != "1001" {
				t.Errorf("receipt = %q, want the message_id 1001", rc.ID)
			}
			msgs := api.messages(t)
			if len(msgs) != 1 {
				t.Fatalf("Bot API got %d requests, want 1", len(msgs))
			}
			m := msgs[0]
			if want := "/bot" + testToken + "/sendMessage"; m.Path != want {
				t.Errorf("path = %q, want %q", m.Path, want)
			}
			if string(m.ChatID) != tc.wantChatID {
				t.Errorf("chat_id = %s, want %s", m.ChatID, tc.wantChatID)
			}
			if m.Text != text || m.ParseMode != tc.parseMode {
				t.Errorf("text/parse_mode = %q/%q, want %q/%q", m.Text, m.ParseMode, text, tc.parseMode)
			}
			if got := m.LinkPreviewOptions != nil && m.LinkPreviewOptions.IsDisabled; got != tc.noPreview {
				t.Errorf("link preview disabled = %v, want %v", got, tc.noPreview)
			}
		})
	}
}

func TestProvider_Deliver_Status(t *testing.T) {
	retryHeader := func(w http.ResponseWriter, _ *sentMessage, _ *http.Request) {
		w.Header().Set("Retry-After", "9")
		writeAPI(w, 429, map[string]any{"ok": false, "error_code": 429, "description": "Too Many Requests"})
	}
	proxyPage := func(w http.ResponseWriter, _ *sentMessage, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, "<html><body>502 Bad Gateway</body></html>")
	}
	garbage := func(w http.ResponseWriter, _ *sentMessage, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "not json")
	}
	for _, tc := range []struct {
		name       string
		respond    func(http.ResponseWriter, *sentMessage, *http.Request)
		token      string // provider's token, when not the API's
		basePath   string
		kind       envelope.Kind
		class      envelope.ErrorClass
		retryAfter time.Duration
		migrated   bool
	}{
		{name: "TooManyRequests", respond: apiError(429, "Too Many Requests: retry after 3", map[string]any{"retry_after": 3}),
			kind: envelope.KindRetryable, class: envelope.ClassRateLimited, retryAfter: 3 * time.Second},
		{name: "TooManyRequestsHeader", respond: retryHeader, kind: envelope.KindRetryable, class: envelope.ClassRateLimited, retryAfter: 9 * time.Second},
		{name: "Blocked", respond: apiError(403, "Forbidden: bot was blocked by the user", nil), kind: envelope.KindRecipientGone, class: envelope.ClassBlockedByUser},
		{name: "Deactivated", respond: apiError(403, "Forbidden: user is deactivated", nil), kind: envelope.KindRecipientGone, class: envelope.ClassBlockedByUser},
		{name: "Kicked", respond: apiError(403, "Forbidden: bot was kicked from the supergroup chat", nil), kind: envelope.KindRecipientGone, class: envelope.ClassBlockedByUser},
		{name: "CantInitiate", respond: apiError(403, "Forbidden: bot can't initiate conversation with a user", nil), kind: envelope.KindRecipientGone, class: envelope.ClassBlockedByUser},
		{name: "NotMember", respond: apiError(403, "Forbidden: bot is not a member of the channel chat", nil), kind: envelope.KindRecipientGone, class: envelope.ClassBlockedByUser},
		{name: "NoRights", respond: apiError(403, "Forbidden: not enough rights to send text messages to the chat", nil), kind: envelope.KindPermanent, class: envelope.ClassInvalidRecipient},
		{name: "ChatNotFound", respond: apiError(400, "Bad Request: chat not found", nil), kind: envelope.KindRecipientGone, class: envelope.ClassInvalidRecipient},
		{name: "CantParseEntities", respond: apiError(400, `Bad Request: can't parse entities: Unsupported start tag "bx" at byte offset 0`, nil), kind: envelope.KindPermanent, class: envelope.ClassInvalidRequest},
		{name: "TooLong", respond: apiError(400, "Bad Request: message is too long", nil), kind: envelope.KindPermanent, class: envelope.ClassInvalidRequest},
		{name: "Migrated", respond: apiError(400, "Bad Request: group chat was upgraded to a supergroup chat", map[string]any{"migrate_to_chat_id": int64(-1001234567890)}),
			kind: envelope.KindPermanent, class: envelope.ClassInvalidRecipient, migrated: true},
		{name: "WrongToken", token: "987654321:AAwrongTOKENwrongTOKENwrongTOKEN1234", kind: envelope.KindPermanent, class: envelope.ClassAuthFailed},
		{name: "NotFoundPath", basePath: "/nope", kind: envelope.KindPermanent, class: envelope.ClassAuthFailed},
		{name: "InternalError", respond: apiError(500, "Internal Server Error", nil), kind: envelope.KindRetryable, class: envelope.ClassProviderUnavailable},
		{name: "ProxyPage", respond: proxyPage, kind: envelope.KindRetryable, class: envelope.ClassProviderUnavailable},
		{name: "OKGarbage", respond: garbage, kind: envelope.KindRetryable, class: envelope.ClassProviderUnavailable},
		{name: "Conflict", respond: apiError(409, "Conflict: something", nil), kind: envelope.KindPermanent, class: envelope.ClassInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newBotAPI(t, testToken, tc.respond)
			opts := Options{BaseURL: api.srv.URL + tc.basePath}
			if tc.token != "" {
				opts.Token = Token(tc.token)
			}
			p := mustProvider(t, api, opts)
			rc, err := p.Deliver(context.Background(), testKey, chat("123456789", "hello", ""))
			var de *envelope.DeliveryError
			if !errors.As(err, &de) {
				t.Fatalf("Deliver = %+v, %v; want a *envelope.DeliveryError", rc, err)
			}
			if de.Kind != tc.kind || de.Class != tc.class || de.RetryAfter != tc.retryAfter {
				t.Errorf("got %s/%s/%s, want %s/%s/%s", de.Kind, de.Class, de.RetryAfter, tc.kind, tc.class, tc.retryAfter)
			}
			if got := errors.Is(err, errMigrated); got != tc.migrated {
				t.Errorf("errors.Is(err, errMigrated) = %v, want %v", got, tc.migrated)
			}
			var ae *APIError
			if !errors.As(err, &ae) || ae.StatusCode == 0 {
				t.Errorf("cause %v is not an APIError with the status", de.Err)
			}
			if strings.Contains(strings.ToLower(err.Error()), "forbidden") || strings.Contains(err.Error(), "Bad Request") {
				t.Errorf("error text %q quotes Telegram's description", err)
			}
			if rc != (channels.Receipt{}) {
				t.Errorf("receipt %+v with an error", rc)
			}
		})
	}
}

func TestProvider_Deliver_InvalidMessage(t *testing.T) {
	api := newBotAPI(t, testToken, nil)
	p := mustProvider(t, api, Options{})
	for _, tc := range []struct {
		name  string
		msg   *envelope.Message
		class envelope.ErrorClass
	}{
		{"Nil", nil, envelope.ClassInvalidRequest},
		{"NotChat", &envelope.Message{Channel: envelope.ChannelPush, Push: &envelope.PushMessage{}}, envelope.ClassInvalidRequest},
		{"NoChatID", chat("  ", "hi", ""), envelope.ClassInvalidRecipient},
		{"EmptyText", chat("1", "", ""), envelope.ClassInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Deliver(context.Background(), testKey, tc.msg)
			de := envelope.Classify(err)
			if de == nil || de.Kind != envelope.KindPermanent || de.Class != tc.class {
				t.Errorf("Deliver = %v, want permanent %s", err, tc.class)
			}
		})
	}
	if n := len(api.messages(t)); n != 0 {
		t.Errorf("Bot API got %d requests, want none", n)
	}
}

func TestProvider_Pacing(t *testing.T) {
	t.Run("PerChatSpacesOneChat", func(t *testing.T) {
		api := newBotAPI(t, testToken, nil)
		p := mustProvider(t, api, Options{PerChat: rate.Every(50 * time.Millisecond), PerChatBurst: 1})
		start := time.Now()
		for range 3 {
			if _, err := p.Deliver(context.Background(), testKey, chat("42", "x", "")); err != nil {
				t.Fatal(err)
			}
		}
		if d := time.Since(start); d < 90*time.Millisecond {
			t.Errorf("3 messages to one chat took %s, want ≥ 100ms at 1 per 50ms", d)
		}
	})
	t.Run("PerChatIsPerChat", func(t *testing.T) {
		api := newBotAPI(t, testToken, nil)
		p := mustProvider(t, api, Options{PerChat: rate.Every(time.Hour), PerChatBurst: 1})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, id := range []string{"1", "2", "3", "4"} {
			if _, err := p.Deliver(ctx, testKey, chat(id, "x", "")); err != nil {
				t.Fatalf("chat %s: %v (other chats must not wait for each other)", id, err)
			}
		}
		// A second message to chat 1 would wait an hour: with a deadline
		// it fails at once, retryable, and sends nothing.
		_, err := p.Deliver(ctx, testKey, chat("1", "x", ""))
		if de := envelope.Classify(err); de == nil || de.Kind != envelope.KindRetryable || de.Class != envelope.ClassRateLimited {
			t.Errorf("second message to a paced chat = %v, want retryable rate_limited", err)
		}
		if n := len(api.messages(t)); n != 4 {
			t.Errorf("Bot API got %d requests, want 4", n)
		}
	})
	t.Run("WaitHonoursCancel", func(t *testing.T) {
		api := newBotAPI(t, testToken, nil)
		p := mustProvider(t, api, Options{PerChat: rate.Every(time.Hour), PerChatBurst: 1})
		if _, err := p.Deliver(context.Background(), testKey, chat("1", "x", "")); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		timer := time.AfterFunc(50*time.Millisecond, cancel)
		defer timer.Stop()
		done := make(chan error, 1)
		go func() {
			_, err := p.Deliver(ctx, testKey, chat("1", "x", ""))
			done <- err
		}()
		select {
		case err := <-done:
			if de := envelope.Classify(err); de == nil || de.Kind != envelope.KindRetryable || de.Class != envelope.ClassTimeout {
				t.Errorf("cancelled wait = %v, want retryable timeout", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Deliver kept waiting for the limiter after its context was cancelled")
		}
		if n := len(api.messages(t)); n != 1 {
			t.Errorf("Bot API got %d requests, want 1", n)
		}
	})
	t.Run("Global", func(t *testing.T) {
		api := newBotAPI(t, testToken, nil)
		p := mustProvider(t, api, Options{Global: rate.Every(time.Hour), GlobalBurst: 2})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, id := range []string{"1", "2"} {
			if _, err := p.Deliver(ctx, testKey, chat(id, "x", "")); err != nil {
				t.Fatal(err)
			}
		}
		_, err := p.Deliver(ctx, testKey, chat("3", "x", ""))
		if de := envelope.Classify(err); de == nil || de.Kind != envelope.KindRetryable || de.Class != envelope.ClassRateLimited {
			t.Errorf("third message over the global limit = %v, want retryable rate_limited", err)
		}
		if n := len(api.messages(t)); n != 2 {
			t.Errorf("Bot API got %d requests, want 2", n)
		}
	})
	t.Run("Defaults", func(t *testing.T) {
		p, err := New(Options{Token: testToken})
		if err != nil {
			t.Fatal(err)
		}
		if p.global.Limit() != DefaultGlobal || p.global.Burst() != DefaultGlobalBurst {
			t.Errorf("global limiter %v/%d, want %v/%d", p.global.Limit(), p.global.Burst(), DefaultGlobal, DefaultGlobalBurst)
		}
		if l := p.chats.get("x"); l.Limit() != DefaultPerChat || l.Burst() != DefaultPerChatBurst {
			t.Errorf("per-chat limiter %v/%d, want %v/%d", l.Limit(), l.Burst(), DefaultPerChat, DefaultPerChatBurst)
		}
	})
}

func TestChatLimiters_Bounded(t *testing.T) {
	c := newChatLimiters(1, 1, 3)
	a := c.get("a")
	c.get("b")
	c.get("c")
	if c.get("a") != a {
		t.Fatalf("a limiter was replaced while the map had room")
	}
	c.get("d") // evicts b, the least recently used
	if n := c.len(); n != 3 {
		t.Errorf("len = %d, want 3", n)
	}
	if c.get("a") != a {
		t.Errorf("a (recently used) was evicted")
	}
	if _, ok := c.m["b"]; ok {
		t.Errorf("b (least recently used) was kept")
	}
	for i := range 100 {
		c.get(fmt.Sprint("chat", i))
	}
	if n := c.len(); n != 3 || len(c.m) != 3 {
		t.Errorf("after 100 chats: list %d, map %d, want 3", n, len(c.m))
	}
}

func TestProvider_ReconcileAndCapabilities(t *testing.T) {
	api := newBotAPI(t, testToken, nil)
	p := mustProvider(t, api, Options{})
	got, err := p.Reconcile(context.Background(), testKey, chat("1", "x", ""))
	if err != nil || got.Outcome != channels.Unknown {
		t.Errorf("Reconcile = %+v, %v; want Unknown", got, err)
	}
	if n := len(api.messages(t)); n != 0 {
		t.Errorf("Reconcile sent %d requests, want none", n)
	}
	want := channels.Capabilities{Name: "telegram", Channel: envelope.ChannelTelegram, IdempotentRedelivery: false, OneService: true}
	if c := p.Capabilities(); c != want {
		t.Errorf("Capabilities = %+v, want %+v", c, want)
	}
}

func TestNew_Validation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    Options
		setting string
	}{
		{"NoToken", Options{}, "Options.Token"},
		{"TokenWithSlash", Options{Token: "123:abc/../x"}, "Options.Token"},
		{"TokenWithSpace", Options{Token: "123:abc def"}, "Options.Token"},
		{"BaseURLScheme", Options{Token: testToken, BaseURL: "ftp://api.example"}, "Options.BaseURL"},
		{"BaseURLQuery", Options{Token: testToken, BaseURL: "https://api.example/?x=1"}, "Options.BaseURL"},
		{"BaseURLRelative", Options{Token: testToken, BaseURL: "api.telegram.org"}, "Options.BaseURL"},
		{"NegativePerChat", Options{Token: testToken, PerChat: -1}, "Options.PerChat"},
		{"NegativePerChatBurst", Options{Token: testToken, PerChatBurst: -1}, "Options.PerChatBurst"},
		{"NegativeGlobal", Options{Token: testToken, Global: -2}, "Options.Global"},
		{"NegativeGlobalBurst", Options{Token: testToken, GlobalBurst: -1}, "Options.GlobalBurst"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.opts)
			if err == nil {
				t.Fatal("New succeeded, want an error")
			}
			if !strings.Contains(err.Error(), tc.setting) {
				t.Errorf("error %q does not name %s", err, tc.setting)
			}
			if tc.opts.Token != "" && strings.Contains(err.Error(), string(tc.opts.Token)) {
				t.Errorf("error %q contains the token", err)
			}
		})
	}
	p, err := New(Options{Token: " " + testToken + "\n", BaseURL: "https://api.example/tg/"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "https://api.example/tg/bot" + testToken + "/sendMessage"; p.endpoint != want {
		t.Errorf("endpoint = %q, want %q", p.endpoint, want)
	}
}
