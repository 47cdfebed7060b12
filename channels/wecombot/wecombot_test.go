package wecombot

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/channeltest"
	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/envelope"
)

const (
	testKey  = "canary-robot-key-0f3c"
	testText = "canary robot text 值班"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeRobot behaves like the webhook: HTTP 200 always, 93000 for a wrong
// key, 45009 past 20 posts a minute, scripted errcodes, hang.
type fakeRobot struct {
	srv   *httptest.Server
	clock *clock
	mu    sync.Mutex
	posts []postRequest
	at    []time.Time
	code  int
	hang  bool
	hits  int
}

func newFake(t testing.TB, c *clock) *fakeRobot {
	f := &fakeRobot{clock: c}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body first: only then does the server notice a client
		// that gave up (and end r's context).
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.hits++
		hang := f.hang
		f.mu.Unlock()
		if hang {
			<-r.Context().Done()
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		code := 0
		now := f.clock.Now()
		recent := 0
		for _, at := range f.at {
			if now.Sub(at) < time.Minute {
				recent++
			}
		}
		var req postRequest
		switch {
		case r.URL.Path != "/cgi-bin/webhook/send" || r.URL.Query().Get("key") != testKey:
			code = wxapi.CodeRobotKey
		case f.code != 0:
			code = f.code
		case json.Unmarshal(body, &req) != nil:
			code = 40058
		case recent >= PerMinute:
			code = wxapi.CodeFreqLimit
		default:
			f.posts = append(f.posts, req)
			f.at = append(f.at, now)
		}
		msg := "ok"
		if code != 0 {
			msg = "errmsg canary-errmsg-robot"
		}
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(map[string]any{"errcode": code, "errmsg": msg})
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func newProvider(t testing.TB, f *fakeRobot, logger *slog.Logger) *Provider {
	t.Helper()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p, err := New(Options{Robots: map[string]wxapi.Secret{"ops": testKey}, BaseURL: f.srv.URL, Clock: f.clock.Now, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func post(robot, typ, text string) *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelWeComRobot, WeCom: &envelope.WeComMessage{Robot: robot, MsgType: typ, Content: text, Segments: 1}}
}

func newClock() *clock { return &clock{t: time.Date(2026, 5, 4, 9, 0, 0, 0, time.UTC)} }

func TestProvider_Conformance(t *testing.T) {
	channeltest.Exercise(t, channeltest.Harness{
		Channel: envelope.ChannelWeComRobot,
		New: func(t testing.TB, b channeltest.Behaviour, logger *slog.Logger) channels.Provider {
			f := newFake(t, newClock())
			switch b {
			case channeltest.FailRetryable:
				f.code = wxapi.CodeBusy
			case channeltest.FailPermanent:
				f.code = 40058
			case channeltest.RateLimited:
				f.code = wxapi.CodeFreqLimit
			case channeltest.Hang:
				f.hang = true
			}
			return newProvider(t, f, logger)
		},
		Message:    func(envelope.Key) *envelope.Message { return post("ops", envelope.WeComMarkdown, testText) },
		Secrets:    []string{testKey, testText, "canary-errmsg"},
		RetryAfter: MinFreqRetry,
		Unsupported: map[channeltest.Behaviour]string{
			channeltest.RecipientGone: "a robot posts into its group; no answer says a recipient is gone (an invalid key is auth_failed)",
		},
	})
}

// A burst through one robot: 20 posts a minute, the rest wait with the
// time until there is room; WeCom never sees a 21st.
func TestLimit_Burst(t *testing.T) {
	c := newClock()
	f := newFake(t, c)
	p := newProvider(t, f, nil)
	sent, limited := 0, 0
	for i := range 50 {
		_, err := p.Deliver(context.Background(), envelope.Key{EnvelopeID: fmt.Sprint(i)}, post("ops", envelope.WeComText, "x"))
		de := envelope.Classify(err)
		switch {
		case err == nil:
			sent++
		case de.Class == envelope.ClassRateLimited && de.RetryAfter > 0 && de.RetryAfter <= time.Minute:
			limited++
		default:
			t.Fatal(err)
		}
		c.Advance(time.Second)
	}
	// 50 seconds: 20 in the first minute's window.
	if sent != 20 || limited != 30 {
		t.Fatalf("%d sent, %d limited; want 20 and 30", sent, limited)
	}
	c.Advance(time.Minute)
	if _, err := p.Deliver(context.Background(), envelope.Key{}, post("ops", envelope.WeComText, "x")); err != nil {
		t.Fatalf("a minute later: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.posts) != 21 || f.hits != 21 {
		t.Fatalf("WeCom got %d requests, %d posts", f.hits, len(f.posts))
	}
}

func TestDeliver_Errors(t *testing.T) {
	for _, tt := range []struct {
		name  string
		code  int
		msg   *envelope.Message
		kind  envelope.Kind
		class envelope.ErrorClass
		hits  int
	}{
		{"InvalidKey", wxapi.CodeRobotKey, post("ops", envelope.WeComText, testText), envelope.KindPermanent, envelope.ClassAuthFailed, 1},
		{"Freq", wxapi.CodeFreqLimit, post("ops", envelope.WeComText, testText), envelope.KindRetryable, envelope.ClassRateLimited, 1},
		{"Busy", wxapi.CodeBusy, post("ops", envelope.WeComText, testText), envelope.KindRetryable, envelope.ClassProviderUnavailable, 1},
		{"Other", 40008, post("ops", envelope.WeComText, testText), envelope.KindPermanent, envelope.ClassInvalidRequest, 1},
		{"UnknownRobot", 0, post("nope", envelope.WeComText, testText), envelope.KindPermanent, envelope.ClassInvalidRecipient, 0},
		{"TextTooLong", 0, post("ops", envelope.WeComText, strings.Repeat("x", MaxTextBytes+1)), envelope.KindPermanent, envelope.ClassPayloadTooLarge, 0},
		{"MarkdownTooLong", 0, post("ops", envelope.WeComMarkdown, strings.Repeat("x", MaxMarkdownBytes+1)), envelope.KindPermanent, envelope.ClassPayloadTooLarge, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, newClock())
			f.code = tt.code
			var logs bytes.Buffer
			p := newProvider(t, f, slog.New(slog.NewTextHandler(&logs, nil)))
			_, err := p.Deliver(context.Background(), envelope.Key{}, tt.msg)
			de := envelope.Classify(err)
			if err == nil || de.Kind != tt.kind || de.Class != tt.class {
				t.Fatalf("%v, want %s %s", err, tt.kind, tt.class)
			}
			if f.hits != tt.hits {
				t.Errorf("%d requests, want %d", f.hits, tt.hits)
			}
			for _, c := range []string{testKey, testText, "canary-errmsg"} {
				if strings.Contains(logs.String(), c) || strings.Contains(fmt.Sprintf("%v %+v", err, err), c) {
					t.Errorf("canary %q leaked", c)
				}
			}
			if tt.code == wxapi.CodeRobotKey && !strings.Contains(logs.String(), "hint=") {
				t.Errorf("no operator hint for 93000")
			}
		})
	}
	// A markdown of exactly 4096 bytes goes.
	f := newFake(t, newClock())
	if _, err := newProvider(t, f, nil).Deliver(context.Background(), envelope.Key{}, post("ops", envelope.WeComMarkdown, strings.Repeat("好", MaxMarkdownBytes/3))); err != nil {
		t.Fatal(err)
	}
}

func TestDeliver_NeverFollowsRedirects(t *testing.T) {
	target := newFake(t, newClock())
	redir := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.srv.URL+r.URL.RequestURI(), http.StatusFound)
	}))
	defer redir.Close()
	for _, client := range []*http.Client{nil, {Timeout: 5 * time.Second}} {
		p, err := New(Options{Robots: map[string]wxapi.Secret{"ops": testKey}, BaseURL: redir.URL, HTTPClient: client, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Deliver(context.Background(), envelope.Key{}, post("ops", envelope.WeComText, "x"))
		if envelope.Classify(err).Class != envelope.ClassProviderUnavailable || target.hits != 0 {
			t.Fatalf("redirect: %v, target hits %d", err, target.hits)
		}
	}
}

func TestRobotsFromEnv(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "k")
	if err := os.WriteFile(file, []byte(" file-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"OUTBOX_WECOM_ROBOT_OPS_KEY": "k1", "OUTBOX_WECOM_ROBOT_ON_CALL_KEY_FILE": file, "OTHER": "x"}
	var environ []string
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	got, err := RobotsFromEnv(environ, func(k string) string { return env[k] })
	if err != nil || len(got) != 2 || got["ops"] != "k1" || got["on_call"] != "file-key" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"OUTBOX_WECOM_ROBOT_OPS=x", "OUTBOX_WECOM_ROBOT_O-PS_KEY=x", "OUTBOX_WECOM_ROBOT__KEY=x"} {
		name, val, _ := strings.Cut(bad, "=")
		_, err := RobotsFromEnv([]string{bad}, func(k string) string {
			if k == name {
				return val
			}
			return ""
		})
		if err == nil {
			t.Errorf("%s accepted", name)
		} else if strings.Contains(err.Error(), "=x") {
			t.Errorf("error quotes the value: %v", err)
		}
	}
}

// TestE2E_Deliver posts one real markdown message. It runs only with
// OUTBOX_E2E_WECOM_ROBOT_KEY (a group robot's webhook key):
//
//	OUTBOX_E2E_WECOM_ROBOT_KEY=… go test -run E2E -v ./channels/wecombot
func TestE2E_Deliver(t *testing.T) {
	key := os.Getenv("OUTBOX_E2E_WECOM_ROBOT_KEY")
	if key == "" {
		t.Skip("set OUTBOX_E2E_WECOM_ROBOT_KEY to run")
	}
	p, err := New(Options{Robots: map[string]wxapi.Secret{"e2e": wxapi.Secret(key)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.Deliver(ctx, envelope.Key{Tenant: "e2e", EnvelopeID: "e2e"}, post("e2e", envelope.WeComMarkdown,
		"**outbox e2e** "+time.Now().UTC().Format(time.RFC3339)+"\n> a test post from outbox's opt-in tests")); err != nil {
		t.Fatal(err)
	}
}
