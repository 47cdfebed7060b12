package wecom

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels/wecom/wxapi"
)

// fakeClock is the injected clock shared by a provider and its fake.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Date(2026, 5, 4, 9, 7, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeWeCom behaves like qyapi.weixin.qq.com for gettoken and message/send:
// always HTTP 200 with errcode/errmsg, tokens that expire on the shared
// clock, the per-member limits applied by dropping silently (errcode 0,
// nothing delivered), the duplicate check, invaliduser for unknown members,
// and scripted errcodes.
type fakeWeCom struct {
	t      testing.TB
	srv    *httptest.Server
	clock  *fakeClock
	corp   string
	secret string
	life   time.Duration

	mu        sync.Mutex
	gettokens int
	seq       int
	tokens    map[string]time.Time // token → expiry
	members   map[string]bool      // known members ("" = every member)
	script    []int                // errcodes answered by the next sends
	tokenCode int                  // errcode of every gettoken when not 0
	hang      bool
	sent      []sentMsg // delivered
	dropped   int       // dropped silently past the limits
	perMember map[string][]time.Time
	bodies    map[string]time.Time // body → first delivery (duplicate check)
	requests  int
}

type sentMsg struct {
	ToUser  string
	MsgType string
	Content string
	AgentID int64
	Body    sendRequest
}

func newFake(t testing.TB, clock *fakeClock, corp, secret string) *fakeWeCom {
	f := &fakeWeCom{t: t, clock: clock, corp: corp, secret: secret, life: 7200 * time.Second,
		tokens: map[string]time.Time{}, perMember: map[string][]time.Time{}, bodies: map[string]time.Time{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func answer(w http.ResponseWriter, code int, extra map[string]any) {
	m := map[string]any{"errcode": code, "errmsg": "errmsg quoting canary-errmsg-secret"}
	if code == 0 {
		m["errmsg"] = "ok"
	}
	for k, v := range extra {
		m[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK) // WeCom answers 200 whatever happened
	_ = json.NewEncoder(w).Encode(m)
}

func (f *fakeWeCom) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	hang := f.hang
	f.requests++
	f.mu.Unlock()
	if hang {
		<-r.Context().Done()
		return
	}
	switch r.URL.Path {
	case "/cgi-bin/gettoken":
		f.gettoken(w, r)
	case "/cgi-bin/message/send":
		f.send(w, r)
	default:
		answer(w, 40000, nil)
	}
}

func (f *fakeWeCom) gettoken(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gettokens++
	q := r.URL.Query()
	switch {
	case f.tokenCode != 0:
		answer(w, f.tokenCode, nil)
	case q.Get("corpid") != f.corp:
		answer(w, wxapi.CodeCorpID, nil)
	case q.Get("corpsecret") != f.secret:
		answer(w, wxapi.CodeCredential, nil)
	default:
		f.seq++
		tok := "canary-token-" + strconv.Itoa(f.seq)
		f.tokens[tok] = f.clock.Now().Add(f.life)
		answer(w, 0, map[string]any{"access_token": tok, "expires_in": int(f.life / time.Second)})
	}
}

func (f *fakeWeCom) send(w http.ResponseWriter, r *http.Request) {
	var req sendRequest
	raw := make([]byte, 0, 4096)
	buf := make([]byte, 4096)
	for {
		n, err := r.Body.Read(buf)
		raw = append(raw, buf[:n]...)
		if err != nil {
			break
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	tok := r.URL.Query().Get("access_token")
	exp, ok := f.tokens[tok]
	switch {
	case !ok:
		answer(w, wxapi.CodeInvalidToken, nil)
		return
	case !now.Before(exp):
		answer(w, wxapi.CodeExpired, nil)
		return
	}
	if len(f.script) > 0 {
		code := f.script[0]
		f.script = f.script[1:]
		answer(w, code, nil)
		return
	}
	if err := json.Unmarshal(raw, &req); err != nil {
		answer(w, 40058, nil)
		return
	}
	c := req.Text
	if req.MsgType == "markdown" {
		c = req.Markdown
	}
	if c == nil || len(c.Content) > 2048 {
		answer(w, 44004, nil)
		return
	}
	if f.members != nil && !f.members[strings.ToLower(req.ToUser)] {
		answer(w, 0, map[string]any{"invaliduser": req.ToUser, "msgid": "msg-none"})
		return
	}
	if req.EnableDuplicateCheck == 1 {
		if first, ok := f.bodies[string(raw)]; ok && now.Sub(first) < time.Duration(req.DuplicateCheckInterval)*time.Second {
			answer(w, 0, map[string]any{"msgid": "msg-dup"})
			return
		}
	}
	// Past 30/min or 1000/h to one member: accepted and dropped.
	key := strconv.FormatInt(req.AgentID, 10) + "|" + strings.ToLower(req.ToUser)
	var minute, hour int
	for _, at := range f.perMember[key] {
		if now.Sub(at) < time.Minute {
			minute++
		}
		if now.Sub(at) < time.Hour {
			hour++
		}
	}
	f.perMember[key] = append(f.perMember[key], now)
	if minute >= 30 || hour >= 1000 {
		f.dropped++
		answer(w, 0, map[string]any{"msgid": "msg-dropped"})
		return
	}
	f.bodies[string(raw)] = now
	f.sent = append(f.sent, sentMsg{ToUser: req.ToUser, MsgType: req.MsgType, Content: c.Content, AgentID: req.AgentID, Body: req})
	answer(w, 0, map[string]any{"invaliduser": "", "msgid": "msg-" + strconv.Itoa(len(f.sent))})
}

func (f *fakeWeCom) counts() (gettokens, sent, dropped int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gettokens, len(f.sent), f.dropped
}

func (f *fakeWeCom) setScript(codes ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script = codes
}

// expireAll makes every token invalid (as a secret reset does).
func (f *fakeWeCom) expireAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens = map[string]time.Time{}
}
