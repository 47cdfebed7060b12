package sink_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/mail"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/channeltest"
	"github.com/outboxhq/outbox/channels/sink"
	"github.com/outboxhq/outbox/envelope"
)

// Canary values: they may be in the files (that is the sink's job) but
// never in errors, receipts or logs.
const (
	canaryTo       = "canary-user@example.invalid"
	canaryBody     = "canary body text ünïcödé 42"
	canaryHTML     = "<p>canary <b>html</b> body</p>"
	canaryChat     = "-1009988776655"
	canaryEndpoint = "https://push.example.invalid/send/canary-endpoint"
)

var fixedNow = time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC)

func newSink(t testing.TB, dir string, ch envelope.Channel) *sink.Provider {
	t.Helper()
	p, err := sink.New(dir, ch, &sink.Options{Now: func() time.Time { return fixedNow }})
	if err != nil {
		t.Fatalf("sink.New: %v", err)
	}
	return p
}

func emailMessage() *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelEmail, Email: &envelope.EmailMessage{
		To:      canaryTo,
		Subject: "Your week: 3 highlights",
		HTML:    canaryHTML,
		Text:    canaryBody,
		Headers: []envelope.Header{
			{Name: "List-Unsubscribe", Value: "<https://example.invalid/u/ref-1>"},
			{Name: "List-Unsubscribe-Post", Value: "List-Unsubscribe=One-Click"},
		},
	}}
}

func pushMessage() *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelPush, Push: &envelope.PushMessage{
		Subscription: envelope.PushSubscription{Endpoint: canaryEndpoint, Keys: envelope.PushKeys{P256dh: "BPkey", Auth: "authkey"}},
		Payload:      []byte(`{"title":"Revisit","body":"` + canaryBody + `","url":"https://app.example/e/1"}`),
		TTL:          36 * time.Hour,
		Urgency:      envelope.UrgencyLow,
		Topic:        "nudge-1",
	}}
}

func chatMessage(seg int) *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelTelegram, Chat: &envelope.ChatMessage{
		ChatID: canaryChat, Text: canaryBody, ParseMode: envelope.ParseModeHTML, Segment: seg, Segments: 3,
	}}
}

func key(id string, seg int) envelope.Key {
	return envelope.Key{Tenant: "default", EnvelopeID: id, Segment: seg}
}

func deliver(t testing.TB, p *sink.Provider, k envelope.Key, m *envelope.Message) channels.Receipt {
	t.Helper()
	rc, err := p.Deliver(context.Background(), k, m)
	if err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	if want := filepath.Base(p.Path(k)); rc.ID != want {
		t.Errorf("receipt = %q, want the file's base name %q", rc.ID, want)
	}
	return rc
}

func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		dir     string
		ch      envelope.Channel
		wantErr bool
	}{
		{"Email", "d", envelope.ChannelEmail, false},
		{"Push", "d", envelope.ChannelPush, false},
		{"Telegram", "d", envelope.ChannelTelegram, false},
		{"EmptyDir", "", envelope.ChannelEmail, true},
		{"UnknownChannel", "d", envelope.Channel("fax"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := sink.New(tt.dir, tt.ch, nil)
			if (err != nil) != tt.wantErr {
				t.Fatalf("New error = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil {
				want := channels.Capabilities{Name: "sink", Channel: tt.ch, IdempotentRedelivery: true}
				if got := p.Capabilities(); got != want {
					t.Errorf("Capabilities = %+v, want %+v", got, want)
				}
			}
		})
	}
}

func TestProvider_Path(t *testing.T) {
	dir := t.TempDir()
	k := key("env-1", 2)
	for ch, ext := range map[envelope.Channel]string{
		envelope.ChannelEmail: ".eml", envelope.ChannelPush: ".json", envelope.ChannelTelegram: ".json",
	} {
		want := filepath.Join(dir, "sink", string(ch), k.Hash()+ext)
		if got := newSink(t, dir, ch).Path(k); got != want {
			t.Errorf("%s: Path = %q, want %q", ch, got, want)
		}
	}
}

// decodePart returns a MIME part's decoded body (multipart.Reader already
// decodes quoted-printable).
func decodePart(t *testing.T, p *multipart.Part) string {
	t.Helper()
	body, err := io.ReadAll(p)
	if err != nil {
		t.Fatalf("read part: %v", err)
	}
	if strings.EqualFold(p.Header.Get("Content-Transfer-Encoding"), "base64") {
		dec, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(string(body)), ""))
		if err != nil {
			t.Fatalf("base64 part: %v", err)
		}
		body = dec
	}
	return string(body)
}

func TestProvider_Deliver_Email(t *testing.T) {
	dir := t.TempDir()
	p, err := sink.New(dir, envelope.ChannelEmail, &sink.Options{From: "Digest <digest@example.org>", Now: func() time.Time { return fixedNow }})
	if err != nil {
		t.Fatal(err)
	}
	k := key("digest-1", 0)
	deliver(t, p, k, emailMessage())

	raw, err := os.ReadFile(p.Path(k))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the .eml is not an RFC 5322 message: %v", err)
	}
	h := msg.Header
	if got, err := mail.ParseAddress(h.Get("From")); err != nil || got.Address != "digest@example.org" {
		t.Errorf("From = %q (%v), want digest@example.org", h.Get("From"), err)
	}
	if got, err := mail.ParseAddress(h.Get("To")); err != nil || got.Address != canaryTo {
		t.Errorf("To = %q (%v), want %s", h.Get("To"), err, canaryTo)
	}
	dec := new(mime.WordDecoder)
	if subj, err := dec.DecodeHeader(h.Get("Subject")); err != nil || subj != "Your week: 3 highlights" {
		t.Errorf("Subject = %q (%v)", subj, err)
	}
	if d, err := h.Date(); err != nil || !d.Equal(fixedNow) {
		t.Errorf("Date = %v (%v), want %v", d, err, fixedNow)
	}
	if id := h.Get("Message-Id"); !strings.Contains(id, k.Hash()) {
		t.Errorf("Message-ID = %q, want it derived from the key", id)
	}
	if got := h.Get("List-Unsubscribe-Post"); got != "List-Unsubscribe=One-Click" {
		t.Errorf("List-Unsubscribe-Post = %q", got)
	}
	if got := h.Get("List-Unsubscribe"); got != "<https://example.invalid/u/ref-1>" {
		t.Errorf("List-Unsubscribe = %q", got)
	}
	mediaType, params, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil || mediaType != "multipart/alternative" {
		t.Fatalf("Content-Type = %q (%v), want multipart/alternative", h.Get("Content-Type"), err)
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	parts := map[string]string{}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("NextPart: %v", err)
		}
		ct, _, _ := mime.ParseMediaType(part.Header.Get("Content-Type"))
		parts[ct] = decodePart(t, part)
	}
	if got := strings.TrimRight(parts["text/plain"], "\r\n"); got != canaryBody {
		t.Errorf("text/plain part = %q, want %q", got, canaryBody)
	}
	if got := strings.TrimRight(parts["text/html"], "\r\n"); got != canaryHTML {
		t.Errorf("text/html part = %q, want %q", got, canaryHTML)
	}
}

func TestProvider_Deliver_Push(t *testing.T) {
	dir := t.TempDir()
	p := newSink(t, dir, envelope.ChannelPush)
	k := key("nudge-1", 0)
	deliver(t, p, k, pushMessage())

	raw, err := os.ReadFile(p.Path(k))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Endpoint string          `json:"endpoint"`
		TTL      int64           `json:"ttl"`
		Urgency  string          `json:"urgency"`
		Topic    string          `json:"topic"`
		Payload  json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("push file is not JSON: %v\n%s", err, raw)
	}
	if got.Endpoint != canaryEndpoint || got.TTL != 36*3600 || got.Urgency != envelope.UrgencyLow || got.Topic != "nudge-1" {
		t.Errorf("push file = %+v", got)
	}
	var payload map[string]string
	if err := json.Unmarshal(got.Payload, &payload); err != nil || payload["body"] != canaryBody || payload["url"] != "https://app.example/e/1" {
		t.Errorf("payload = %s (%v), want the notification JSON as an object", got.Payload, err)
	}
	if bytes.Contains(raw, []byte("authkey")) || bytes.Contains(raw, []byte("BPkey")) {
		t.Errorf("push file holds the subscription's encryption keys:\n%s", raw)
	}
}

func TestProvider_Deliver_PushNonJSONPayload(t *testing.T) {
	p := newSink(t, t.TempDir(), envelope.ChannelPush)
	m := pushMessage()
	m.Push.Payload = []byte("plain text")
	k := key("n", 0)
	deliver(t, p, k, m)
	raw, _ := os.ReadFile(p.Path(k))
	var got struct{ Payload string }
	if err := json.Unmarshal(raw, &got); err != nil || got.Payload != "plain text" {
		t.Errorf("payload = %q (%v), want the text as a JSON string", got.Payload, err)
	}
}

func TestProvider_Deliver_Telegram(t *testing.T) {
	dir := t.TempDir()
	p := newSink(t, dir, envelope.ChannelTelegram)
	for seg := range 3 {
		k := key("reply-1", seg)
		deliver(t, p, k, chatMessage(seg))
		raw, err := os.ReadFile(p.Path(k))
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("chat file is not JSON: %v", err)
		}
		want := map[string]any{"chat_id": canaryChat, "text": canaryBody, "parse_mode": "HTML", "segment": float64(seg), "segments": float64(3)}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("segment %d: file = %v, want %v", seg, got, want)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "sink", "telegram"))
	if len(entries) != 3 {
		t.Errorf("%d files for 3 segments, want 3", len(entries))
	}
}

// TestProvider_Deliver_Overwrite checks that a redelivery of the same key
// replaces its file (no duplicate, no temporary left behind).
func TestProvider_Deliver_Overwrite(t *testing.T) {
	dir := t.TempDir()
	p := newSink(t, dir, envelope.ChannelTelegram)
	k := key("reply-2", 0)
	first := deliver(t, p, k, chatMessage(0))
	m := chatMessage(0)
	m.Chat.Text = "second version"
	second := deliver(t, p, k, m)
	if first != second {
		t.Errorf("receipts differ across redeliveries: %q, %q", first.ID, second.ID)
	}
	entries, err := os.ReadDir(filepath.Join(dir, "sink", "telegram"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != first.ID {
		t.Errorf("directory holds %v, want only %s", entries, first.ID)
	}
	raw, _ := os.ReadFile(p.Path(k))
	if !bytes.Contains(raw, []byte("second version")) {
		t.Errorf("file was not overwritten:\n%s", raw)
	}
	fi, err := os.Stat(p.Path(k))
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("file mode %v is readable by others; it holds personal data", perm)
	}
}

func TestProvider_Deliver_ConcurrentSameKey(t *testing.T) {
	dir := t.TempDir()
	p := newSink(t, dir, envelope.ChannelEmail)
	k := key("same", 0)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := p.Deliver(context.Background(), k, emailMessage()); err != nil {
				t.Errorf("Deliver: %v", err)
			}
		})
	}
	wg.Wait()
	entries, _ := os.ReadDir(filepath.Join(dir, "sink", "email"))
	if len(entries) != 1 {
		t.Errorf("%d entries after 8 concurrent deliveries of one key, want 1: %v", len(entries), entries)
	}
	raw, _ := os.ReadFile(p.Path(k))
	if _, err := mail.ReadMessage(bytes.NewReader(raw)); err != nil {
		t.Errorf("file torn by concurrent writers: %v", err)
	}
}

func TestProvider_Reconcile(t *testing.T) {
	dir := t.TempDir()
	p := newSink(t, dir, envelope.ChannelPush)
	k := key("n-2", 0)
	r, err := p.Reconcile(context.Background(), k, pushMessage())
	if err != nil || r.Outcome != channels.Rejected || r.Receipt != (channels.Receipt{}) {
		t.Errorf("before delivery: %+v, %v; want rejected", r, err)
	}
	rc := deliver(t, p, k, pushMessage())
	r, err = p.Reconcile(context.Background(), k, pushMessage())
	if err != nil || r.Outcome != channels.Accepted || r.Receipt != rc {
		t.Errorf("after delivery: %+v, %v; want accepted with %q", r, err, rc.ID)
	}
	// A stray temporary file does not count as delivered.
	other := key("n-3", 0)
	tmp := filepath.Join(dir, "sink", "push", "."+filepath.Base(p.Path(other))+".123.tmp")
	if err := os.WriteFile(tmp, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Reconcile(context.Background(), other, pushMessage()); err != nil || r.Outcome != channels.Rejected {
		t.Errorf("with only a temporary file: %+v, %v; want rejected", r, err)
	}
}

func TestProvider_Reconcile_MissingDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "not-mounted")
	p := newSink(t, dir, envelope.ChannelEmail)
	r, err := p.Reconcile(context.Background(), key("x", 0), emailMessage())
	if err == nil || r.Outcome == channels.Rejected {
		t.Errorf("missing data dir: %+v, %v; want an error (unknown), never rejected", r, err)
	}
}

// TestProvider_Deliver_Failures checks real file system failures: each is a
// retryable provider_unavailable error whose text holds no path and nothing
// of the message.
func TestProvider_Deliver_Failures(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T) string // returns the data dir
	}{
		{"MissingDataDir", func(t *testing.T) string {
			return filepath.Join(t.TempDir(), "canary-missing-dir")
		}},
		{"DataDirIsAFile", func(t *testing.T) string {
			f := filepath.Join(t.TempDir(), "canary-file")
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return f
		}},
		{"ChannelDirIsAFile", func(t *testing.T) string {
			d := t.TempDir()
			if err := os.MkdirAll(filepath.Join(d, "sink"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, "sink", "email"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return d
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.setup(t)
			p := newSink(t, dir, envelope.ChannelEmail)
			k := key("fail-1", 0)
			rc, err := p.Deliver(context.Background(), k, emailMessage())
			if err == nil {
				t.Fatalf("Deliver succeeded, want a failure")
			}
			de := envelope.Classify(err)
			if de.Kind != envelope.KindRetryable || de.Class != envelope.ClassProviderUnavailable {
				t.Errorf("error = %s/%s, want retryable/provider_unavailable", de.Kind, de.Class)
			}
			if de.Err == nil {
				t.Errorf("the raw cause is not kept for errors.Is")
			}
			if rc != (channels.Receipt{}) {
				t.Errorf("receipt %+v with an error", rc)
			}
			for _, s := range []string{dir, "canary", k.Hash(), canaryTo, "sink/", string(os.PathSeparator)} {
				if strings.Contains(err.Error(), s) || strings.Contains(fmt.Sprintf("%+v", err), s) {
					t.Errorf("error text %q contains %q", err.Error(), s)
				}
			}
			if _, err := os.Stat(p.Path(k)); err == nil {
				t.Errorf("a file exists after a failed delivery")
			}
		})
	}
}

func TestProvider_Deliver_BadMessage(t *testing.T) {
	p := newSink(t, t.TempDir(), envelope.ChannelEmail)
	tests := []struct {
		name string
		msg  *envelope.Message
	}{
		{"Nil", nil},
		{"OtherChannel", pushMessage()},
		{"MissingBody", &envelope.Message{Channel: envelope.ChannelEmail}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := p.Deliver(context.Background(), key("bad", 0), tt.msg)
			de := envelope.Classify(err)
			if de == nil || de.Kind != envelope.KindPermanent || de.Class != envelope.ClassInvalidRequest {
				t.Fatalf("error = %v, want permanent invalid_request", err)
			}
			if strings.Contains(err.Error(), canaryEndpoint) {
				t.Errorf("error text holds the endpoint")
			}
		})
	}
}

func TestProvider_Deliver_Context(t *testing.T) {
	p := newSink(t, t.TempDir(), envelope.ChannelEmail)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel2()
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		class envelope.ErrorClass
	}{
		{"Canceled", canceled, envelope.ClassInterrupted},
		{"DeadlineExceeded", expired, envelope.ClassTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := key("ctx-"+tc.name, 0)
			_, err := p.Deliver(tc.ctx, k, emailMessage())
			de := envelope.Classify(err)
			if de == nil || de.Kind != envelope.KindRetryable || de.Class != tc.class {
				t.Errorf("error = %v, want retryable %s", err, tc.class)
			}
			if !errors.Is(err, tc.ctx.Err()) {
				t.Errorf("error does not wrap the context's error")
			}
			if _, err := os.Stat(p.Path(k)); err == nil {
				t.Errorf("a cancelled delivery wrote its file")
			}
		})
	}
}

func TestProvider_Conformance(t *testing.T) {
	messages := map[envelope.Channel]func(envelope.Key) *envelope.Message{
		envelope.ChannelEmail:    func(envelope.Key) *envelope.Message { return emailMessage() },
		envelope.ChannelPush:     func(envelope.Key) *envelope.Message { return pushMessage() },
		envelope.ChannelTelegram: func(k envelope.Key) *envelope.Message { return chatMessage(k.Segment) },
	}
	for _, ch := range []envelope.Channel{envelope.ChannelWeCom, envelope.ChannelWeComRobot, envelope.ChannelWeComBotReply} {
		messages[ch] = func(k envelope.Key) *envelope.Message {
			return &envelope.Message{Channel: ch, WeCom: &envelope.WeComMessage{User: canaryChat, Robot: "ops",
				ResponseURL: canaryEndpoint, MsgType: envelope.WeComText, Content: canaryBody, Segment: k.Segment, Segments: 1}}
		}
	}
	const why = "a file system sink cannot be made to fail on request; real failures are covered by TestProvider_Deliver_Failures"
	for _, ch := range envelope.Channels {
		t.Run(string(ch), func(t *testing.T) {
			dir := t.TempDir()
			channeltest.Exercise(t, channeltest.Harness{
				Channel: ch,
				New: func(t testing.TB, _ channeltest.Behaviour, _ *slog.Logger) channels.Provider {
					return newSink(t, dir, ch)
				},
				Message: messages[ch],
				Secrets: []string{canaryTo, canaryBody, canaryChat, canaryEndpoint, dir},
				Unsupported: map[channeltest.Behaviour]string{
					channeltest.FailRetryable: why,
					channeltest.FailPermanent: why,
					channeltest.RecipientGone: "a file system sink has no recipients to lose",
					channeltest.RateLimited:   "a file system sink has no rate limit",
					channeltest.Hang:          "a local file write cannot be made to hang; a cancelled context is covered by TestProvider_Deliver_Context",
				},
			})
		})
	}
}

func TestSink_Journal(t *testing.T) {
	dir := t.TempDir()
	p, err := sink.New(dir, envelope.ChannelTelegram, &sink.Options{Journal: true})
	if err != nil {
		t.Fatal(err)
	}
	key := envelope.Key{Tenant: "t", EnvelopeID: "id", Segment: 0}
	msg := &envelope.Message{Channel: envelope.ChannelTelegram, Chat: &envelope.ChatMessage{ChatID: "1", Text: "x", Segments: 1}}
	for i := 0; i < 2; i++ {
		if _, err := p.Deliver(context.Background(), key, msg); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(p.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	if want := key.Hash() + "\n" + key.Hash() + "\n"; string(b) != want {
		t.Fatalf("journal = %q", b)
	}
}
