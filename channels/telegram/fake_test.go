package telegram

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"golang.org/x/time/rate"
)

// sentMessage is one sendMessage request the fake Bot API accepted for
// reading.
type sentMessage struct {
	ChatID             json.RawMessage     `json:"chat_id"`
	Text               string              `json:"text"`
	ParseMode          string              `json:"parse_mode"`
	LinkPreviewOptions *linkPreviewOptions `json:"link_preview_options"`
	ContentType        string              `json:"-"`
	Path               string              `json:"-"`
}

// botAPI is a local stand-in for api.telegram.org: it serves
// /bot<token>/sendMessage with the Bot API's status codes and JSON bodies,
// answers 401 for another token and 404 for other paths, as the real one
// does, and records every request.
type botAPI struct {
	srv     *httptest.Server
	token   string
	respond func(w http.ResponseWriter, m *sentMessage, r *http.Request)

	mu     sync.Mutex
	sent   []sentMessage
	bad    []string // why a request was malformed
	nextID int64
}

// newBotAPI starts a fake Bot API for token; respond nil means "accept".
func newBotAPI(t testing.TB, token string, respond func(http.ResponseWriter, *sentMessage, *http.Request)) *botAPI {
	t.Helper()
	b := &botAPI{token: token, respond: respond, nextID: 1000}
	if b.respond == nil {
		b.respond = b.accept
	}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(b.serve))
	b.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	b.srv.Start()
	t.Cleanup(func() {
		b.srv.Close()
		b.srv.Client().CloseIdleConnections()
	})
	return b
}

// writeAPI writes a Bot API answer.
func writeAPI(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// apiError returns a responder answering {"ok":false,…} like the Bot API.
func apiError(status int, description string, params map[string]any) func(http.ResponseWriter, *sentMessage, *http.Request) {
	return func(w http.ResponseWriter, _ *sentMessage, _ *http.Request) {
		body := map[string]any{"ok": false, "error_code": status, "description": description}
		if params != nil {
			body["parameters"] = params
		}
		writeAPI(w, status, body)
	}
}

// accept answers like a successful sendMessage.
func (b *botAPI) accept(w http.ResponseWriter, m *sentMessage, _ *http.Request) {
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	b.mu.Unlock()
	writeAPI(w, http.StatusOK, map[string]any{"ok": true, "result": map[string]any{
		"message_id": id, "date": 1767225600, "chat": map[string]any{"id": json.RawMessage(m.ChatID), "type": "private"}, "text": m.Text,
	}})
}

// hangAPI never answers; it drops the connection once the client gives up.
func hangAPI(_ http.ResponseWriter, _ *sentMessage, r *http.Request) {
	<-r.Context().Done()
	panic(http.ErrAbortHandler)
}

func (b *botAPI) serve(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/bot")
	tok, method, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || tok == "" {
		writeAPI(w, http.StatusNotFound, map[string]any{"ok": false, "error_code": 404, "description": "Not Found"})
		return
	}
	if tok != b.token {
		writeAPI(w, http.StatusUnauthorized, map[string]any{"ok": false, "error_code": 401, "description": "Unauthorized"})
		return
	}
	if method != "sendMessage" {
		writeAPI(w, http.StatusNotFound, map[string]any{"ok": false, "error_code": 404, "description": "Not Found: method not found"})
		return
	}
	var m sentMessage
	raw, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(&m)
	m.ContentType = r.Header.Get("Content-Type")
	m.Path = r.URL.Path
	var why string
	switch {
	case r.Method != http.MethodPost:
		why = "method " + r.Method
	case !strings.HasPrefix(m.ContentType, "application/json"):
		why = "content type " + m.ContentType
	case err != nil:
		why = fmt.Sprintf("body: %v", err)
	case len(m.ChatID) == 0:
		why = "no chat_id"
	}
	b.mu.Lock()
	b.sent = append(b.sent, m)
	if why != "" {
		b.bad = append(b.bad, why)
	}
	b.mu.Unlock()
	if why != "" {
		writeAPI(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: " + why})
		return
	}
	if m.Text == "" {
		writeAPI(w, http.StatusBadRequest, map[string]any{"ok": false, "error_code": 400, "description": "Bad Request: message text is empty"})
		return
	}
	b.respond(w, &m, r)
}

// messages returns what the fake received, failing the test on malformed
// requests.
func (b *botAPI) messages(t testing.TB) []sentMessage {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, why := range b.bad {
		t.Errorf("fake Bot API got a malformed request: %s", why)
	}
	return append([]sentMessage(nil), b.sent...)
}

// testToken is a token of the real shape.
const testToken = "123456789:AAH-test_TOKEN-abcdefghijklmnopqrstu"

// mustProvider builds a provider against b with opts' zero fields filled in
// (no pacing unless opts sets it, so tests run fast).
func mustProvider(t testing.TB, b *botAPI, opts Options) *Provider {
	t.Helper()
	if opts.Token == "" {
		opts.Token = Token(b.token)
	}
	if opts.BaseURL == "" {
		opts.BaseURL = b.srv.URL
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = b.srv.Client()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.PerChat == 0 {
		opts.PerChat = rate.Inf
	}
	if opts.Global == 0 {
		opts.Global = rate.Inf
	}
	p, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// chat returns a chat message.
func chat(chatID, text, parseMode string) *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelTelegram, Chat: &envelope.ChatMessage{
		ChatID: chatID, Text: text, ParseMode: parseMode, Segment: 0, Segments: 1,
	}}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (a log sink).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
