package wecom

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/wecom/wxapi"
	"github.com/outboxhq/outbox/envelope"
)

const (
	testCorp   = "ww-canary-corp"
	testSecret = "canary-app-secret-Zq81"
	testUser   = "canary.member-7"
	testText   = "canary text 9f2e 你好"
)

var testKey = envelope.Key{Tenant: "t", EnvelopeID: "reply/1", Segment: 0}

func textTo(user, text string) *envelope.Message {
	return &envelope.Message{Channel: envelope.ChannelWeCom, WeCom: &envelope.WeComMessage{
		User: user, MsgType: envelope.WeComText, Content: text, Segments: 1}}
}

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newProvider(t testing.TB, f *fakeWeCom, mod func(*Options)) (*Provider, *logBuf) {
	t.Helper()
	logs := &logBuf{}
	o := Options{CorpID: testCorp, Apps: []App{{AgentID: 1000002, Secret: testSecret}}, BaseURL: f.srv.URL,
		Clock: f.clock.Now, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if mod != nil {
		mod(&o)
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return p, logs
}

func TestNew_Options(t *testing.T) {
	good := Options{CorpID: "ww1", Apps: []App{{AgentID: 1, Secret: "s"}}}
	for name, mod := range map[string]func(*Options){
		"NoCorp":       func(o *Options) { o.CorpID = "" },
		"NoApps":       func(o *Options) { o.Apps = nil },
		"BadAgent":     func(o *Options) { o.Apps[0].AgentID = 0 },
		"NoSecret":     func(o *Options) { o.Apps[0].Secret = " " },
		"TwiceAgent":   func(o *Options) { o.Apps = append(o.Apps, App{AgentID: 1, Secret: "x"}) },
		"BadBase":      func(o *Options) { o.BaseURL = "ftp://x" },
		"LongInterval": func(o *Options) { o.DuplicateCheckInterval = 5 * time.Hour },
		"NegativeCap":  func(o *Options) { o.DailyCap = -1 },
	} {
		o := good
		o.Apps = append([]App(nil), good.Apps...)
		mod(&o)
		if _, err := New(o); err == nil {
			t.Errorf("%s: New succeeded", name)
		} else if strings.Contains(err.Error(), "s\"") {
			t.Errorf("%s: error quotes a value: %v", name, err)
		}
	}
	if _, err := New(good); err != nil {
		t.Fatal(err)
	}
}

// One gettoken per token lifetime in steady state: a message a minute for
// five hours with 7200 s tokens renewed 5 minutes early fetches three.
func TestToken_OnePerLifetime(t *testing.T) {
	clock := newClock()
	f := newFake(t, clock, testCorp, testSecret)
	p, _ := newProvider(t, f, nil)
	for i := range 300 {
		if _, err := p.Deliver(context.Background(), envelope.Key{EnvelopeID: fmt.Sprint(i)}, textTo(testUser, fmt.Sprint("m", i))); err != nil {
			t.Fatalf("minute %d: %v", i, err)
		}
		clock.Advance(time.Minute)
	}
	if gt, sent, dropped := f.counts(); gt != 3 || sent != 300 || dropped != 0 {
		t.Fatalf("gettoken %d (want 3), sent %d (want 300), dropped %d", gt, sent, dropped)
	}
}

// Concurrent first sends share one gettoken.
func TestToken_OneFetchAtATime(t *testing.T) {
	clock := newClock()
	f := newFake(t, clock, testCorp, testSecret)
	p, _ := newProvider(t, f, nil)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			if _, err := p.Deliver(context.Background(), testKey, textTo(fmt.Sprint("u", i), "hi")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if gt, _, _ := f.counts(); gt != 1 {
		t.Fatalf("%d gettoken calls, want 1", gt)
	}
}

// 40014/42001/40001 on a send: the token is renewed and the send retried
// once; the same answer again is auth_failed.
func TestToken_RefreshAndRetryOnce(t *testing.T) {
	for _, code := range []int{wxapi.CodeInvalidToken, wxapi.CodeExpired, wxapi.CodeCredential} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			clock := newClock()
			f := newFake(t, clock, testCorp, testSecret)
			p, _ := newProvider(t, f, nil)
			f.setScript(code)
			if _, err := p.Deliver(context.Background(), testKey, textTo(testUser, "a")); err != nil {
				t.Fatalf("after one %d: %v", code, err)
			}
			if gt, sent, _ := f.counts(); gt != 2 || sent != 1 {
				t.Fatalf("gettoken %d (want 2), sent %d", gt, sent)
			}
			f.setScript(code, code)
			_, err := p.Deliver(context.Background(), testKey, textTo(testUser, "b"))
			if de := envelope.Classify(err); err == nil || de.Kind != envelope.KindPermanent || de.Class != envelope.ClassAuthFailed {
				t.Fatalf("after two %d: %v, want permanent auth_failed", code, err)
			}
		})
	}
	// A token that expired on WeCom's side (a reset) is renewed too.
	clock := newClock()
	f := newFake(t, clock, testCorp, testSecret)
	p, _ := newProvider(t, f, nil)
	if _, err := p.Deliver(context.Background(), testKey, textTo(testUser, "a")); err != nil {
		t.Fatal(err)
	}
	f.expireAll()
	if _, err := p.Deliver(context.Background(), testKey, textTo(testUser, "b")); err != nil {
		t.Fatalf("after a reset: %v", err)
	}
}

// Every errcode PROVIDERS.md names, on message/send and on gettoken.
func TestDeliver_ErrcodeTable(t *testing.T) {
	tests := []struct {
		code  int
		kind  envelope.Kind
		class envelope.ErrorClass
		after time.Duration
		hint  string
	}{
		{wxapi.CodeBusy, envelope.KindRetryable, envelope.ClassProviderUnavailable, 0, ""},
		{wxapi.CodeFreqLimit, envelope.KindRetryable, envelope.ClassRateLimited, MinFreqRetry, ""},
		{wxapi.CodeConcurrency, envelope.KindRetryable, envelope.ClassRateLimited, MinFreqRetry, ""},
		{wxapi.CodeIPNotTrusted, envelope.KindPermanent, envelope.ClassAuthFailed, 0, "trusted IPs"},
		{wxapi.CodeNoPrivilege, envelope.KindPermanent, envelope.ClassAuthFailed, 0, "permissions"},
		{wxapi.CodeAppMismatch, envelope.KindPermanent, envelope.ClassAuthFailed, 0, "agentid"},
		{wxapi.CodeAllInvalid, envelope.KindRecipientGone, envelope.ClassInvalidRecipient, 0, ""},
		{44004, envelope.KindPermanent, envelope.ClassInvalidRequest, 0, ""},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("send/", tt.code), func(t *testing.T) {
			clock := newClock()
			f := newFake(t, clock, testCorp, testSecret)
			p, logs := newProvider(t, f, nil)
			f.setScript(tt.code)
			rc, err := p.Deliver(context.Background(), testKey, textTo(testUser, testText))
			de := envelope.Classify(err)
			if err == nil || de.Kind != tt.kind || de.Class != tt.class || de.RetryAfter < tt.after || rc != (channels.Receipt{}) {
				t.Fatalf("errcode %d: %v %+v, want %s %s", tt.code, err, rc, tt.kind, tt.class)
			}
			var api *wxapi.APIError
			if !errors.As(err, &api) || api.ErrCode != tt.code {
				t.Errorf("cause %v does not keep the errcode", de.Err)
			}
			if tt.hint != "" && !strings.Contains(logs.String(), tt.hint) {
				t.Errorf("no operator hint %q in the log:\n%s", tt.hint, logs)
			}
			canaries(t, logs.String(), err)
		})
	}
	for _, tt := range []struct {
		code int
		kind envelope.Kind
	}{{wxapi.CodeCredential, envelope.KindPermanent}, {wxapi.CodeCorpID, envelope.KindPermanent},
		{wxapi.CodeSecret, envelope.KindPermanent}, {wxapi.CodeIPNotTrusted, envelope.KindPermanent},
		{wxapi.CodeBusy, envelope.KindRetryable}, {wxapi.CodeFreqLimit, envelope.KindRetryable}} {
		t.Run(fmt.Sprint("gettoken/", tt.code), func(t *testing.T) {
			clock := newClock()
			f := newFake(t, clock, testCorp, testSecret)
			p, logs := newProvider(t, f, nil)
			f.tokenCode = tt.code
			_, err := p.Deliver(context.Background(), testKey, textTo(testUser, testText))
			if de := envelope.Classify(err); err == nil || de.Kind != tt.kind {
				t.Fatalf("gettoken %d: %v, want %s", tt.code, err, tt.kind)
			}
			if _, sent, _ := f.counts(); sent != 0 {
				t.Errorf("sent without a token")
			}
			canaries(t, logs.String(), err)
		})
	}
}

// Partial results: the member in invaliduser is bounced.
func TestDeliver_InvalidUser(t *testing.T) {
	clock := newClock()
	f := newFake(t, clock, testCorp, testSecret)
	f.members = map[string]bool{"known": true}
	p, logs := newProvider(t, f, nil)
	_, err := p.Deliver(context.Background(), testKey, textTo(testUser, testText))
	if de := envelope.Classify(err); err == nil || de.Kind != envelope.KindRecipientGone || de.Class != envelope.ClassInvalidRecipient {
		t.Fatalf("%v, want recipient gone", err)
	}
	if _, err := p.Deliver(context.Background(), testKey, textTo("KNOWN", "hi")); err != nil {
		t.Fatalf("a known member (ids are case-insensitive): %v", err)
	}
	canaries(t, logs.String(), err)
}

// The request: the member, the agentid of the message's app (or the
// default one), text or markdown, the duplicate check with its interval;
// an unknown agentid is refused before any call.
func TestDeliver_Request(t *testing.T) {
	clock := newClock()
	f := newFake(t, clock, testCorp, testSecret)
	p, _ := newProvider(t, f, func(o *Options) {
		o.Apps = append(o.Apps, App{AgentID: 1000005, Secret: testSecret})
		o.DuplicateCheckInterval = 2 * time.Hour
	})
	md := textTo(testUser, "**bold**")
	md.WeCom.MsgType, md.WeCom.Agent = envelope.WeComMarkdown, "1000005"
	for _, m := range []*envelope.Message{textTo(testUser, "plain"), md} {
		if _, err := p.Deliver(context.Background(), testKey, m); err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	got := append([]sentMsg(nil), f.sent...)
	f.mu.Unlock()
	if len(got) != 2 || got[0].AgentID != 1000002 || got[0].MsgType != "text" || got[0].Content != "plain" ||
		got[1].AgentID != 1000005 || got[1].MsgType != "markdown" || got[1].Content != "**bold**" {
		t.Fatalf("sent %+v", got)
	}
	if b := got[0].Body; b.EnableDuplicateCheck != 1 || b.DuplicateCheckInterval != 7200 || b.ToUser != testUser {
		t.Errorf("body %+v", b)
	}
	bad := textTo(testUser, "x")
	bad.WeCom.Agent = "42"
	_, err := p.Deliver(context.Background(), testKey, bad)
	if de := envelope.Classify(err); err == nil || de.Kind != envelope.KindPermanent {
		t.Fatalf("unknown agent: %v", err)
	}
	long := textTo(testUser, strings.Repeat("x", 2049))
	if _, err := p.Deliver(context.Background(), testKey, long); envelope.Classify(err).Class != envelope.ClassPayloadTooLarge {
		t.Fatalf("2049 bytes: %v", err)
	}
}

// A redelivery of the same key is byte-identical and WeCom's duplicate
// check absorbs it; Reconcile replays within the interval (accepted, no
// second message) and answers Unknown after it or for a key it never saw.
func TestRedeliveryAndReconcile(t *testing.T) {
	clock := newClock()
	f := newFake(t, clock, testCorp, testSecret)
	p, _ := newProvider(t, f, nil)
	m := textTo(testUser, testText)
	if _, err := p.Deliver(context.Background(), testKey, m); err != nil {
		t.Fatal(err)
	}
	clock.Advance(10 * time.Minute)
	if _, err := p.Deliver(context.Background(), testKey, m); err != nil {
		t.Fatal(err)
	}
	rec, err := p.Reconcile(context.Background(), testKey, m)
	if err != nil || rec.Outcome != channels.Accepted || rec.Receipt.ID == "" {
		t.Fatalf("Reconcile within the interval: %+v %v", rec, err)
	}
	if _, sent, _ := f.counts(); sent != 1 {
		t.Fatalf("%d messages delivered, want 1", sent)
	}
	clock.Advance(DefaultDuplicateCheckInterval)
	if rec, _ := p.Reconcile(context.Background(), testKey, m); rec.Outcome != channels.Unknown {
		t.Fatalf("Reconcile after the interval: %s, want unknown", rec.Outcome)
	}
	other := envelope.Key{Tenant: "t", EnvelopeID: "never"}
	if rec, _ := p.Reconcile(context.Background(), other, m); rec.Outcome != channels.Unknown {
		t.Fatalf("Reconcile of an unseen key: %s", rec.Outcome)
	}
	if _, sent, _ := f.counts(); sent != 1 {
		t.Fatalf("%d messages delivered, want 1", sent)
	}
}

// A burst to one member: 30 go out in the minute, the rest wait (never
// sent to be dropped); an hour holds 1000; the daily cap holds too.
func TestLimits_Burst(t *testing.T) {
	clock := newClock()
	f := newFake(t, clock, testCorp, testSecret)
	p, _ := newProvider(t, f, func(o *Options) { o.DailyCap = 1500 })
	send := func(user string, i int) error {
		_, err := p.Deliver(context.Background(), envelope.Key{EnvelopeID: fmt.Sprint(i)}, textTo(user, fmt.Sprint("burst ", i)))
		return err
	}
	ok, limited := 0, 0
	for i := range 100 {
		err := send(testUser, i)
		switch de := envelope.Classify(err); {
		case err == nil:
			ok++
		case de.Class == envelope.ClassRateLimited && de.RetryAfter > 0 && de.RetryAfter <= time.Minute:
			limited++
		default:
			t.Fatalf("send %d: %v", i, err)
		}
	}
	if ok != 30 || limited != 70 {
		t.Fatalf("burst of 100: %d sent, %d rate limited; want 30 and 70", ok, limited)
	}
	// Thirty a minute for an hour and more: 1000 in the hour, then wait.
	sent := ok
	for m := 1; m < 70; m++ {
		clock.Advance(time.Minute)
		for i := range 30 {
			if send(testUser, m*100+i) == nil {
				sent++
			}
		}
	}
	if _, delivered, dropped := f.counts(); dropped != 0 || delivered != sent {
		t.Fatalf("WeCom dropped %d (outbox sent past its limits); delivered %d of %d", dropped, delivered, sent)
	}
	// Over 70 minutes the hour limit allows at most 1000 + what left the
	// window in the first 10 minutes.
	if sent > 1000+300 || sent < 1000 {
		t.Fatalf("%d sent in 70 minutes", sent)
	}
	// Daily cap 1500 over members: the rest is quota_exceeded until
	// midnight China time.
	n := 0
	var last error
	for i := range 2000 {
		if last = send(fmt.Sprint("member", i), 10000+i); last == nil {
			n++
		} else {
			break
		}
	}
	de := envelope.Classify(last)
	if sent+n != 1500 || de.Class != envelope.ClassQuotaExceeded {
		t.Fatalf("daily cap: %d sent today, last %v", sent+n, last)
	}
	now := clock.Now().In(wxapi.ChinaTime)
	y, mo, d := now.Date()
	if want := time.Date(y, mo, d+1, 0, 0, 0, 0, wxapi.ChinaTime).Sub(now); de.RetryAfter != want {
		t.Errorf("RetryAfter %s, want %s (midnight China time)", de.RetryAfter, want)
	}
	if _, _, dropped := f.counts(); dropped != 0 {
		t.Fatalf("WeCom dropped %d", dropped)
	}
}

// A redirect is never followed: the token in the URL stays home.
func TestDeliver_NeverFollowsRedirects(t *testing.T) {
	clock := newClock()
	f := newFake(t, clock, testCorp, testSecret)
	target := newFake(t, clock, testCorp, testSecret)
	redir := newFake(t, clock, testCorp, testSecret)
	redir.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.srv.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	})
	_ = f
	for _, client := range []*http.Client{nil, {Timeout: 5 * time.Second}} {
		p, _ := newProvider(t, redir, func(o *Options) { o.HTTPClient = client })
		_, err := p.Deliver(context.Background(), testKey, textTo(testUser, "x"))
		if envelope.Classify(err).Class != envelope.ClassProviderUnavailable {
			t.Fatalf("after a redirect: %v", err)
		}
		target.mu.Lock()
		n := target.requests
		target.mu.Unlock()
		if n != 0 {
			t.Fatalf("the redirect's target got %d requests", n)
		}
	}
}

// canaries fails t when a secret, the member, the text, a token or errmsg
// is in the logs or the error.
func canaries(t *testing.T, logs string, err error) {
	t.Helper()
	for _, c := range []string{testSecret, testCorp, testUser, testText, "canary-token-", "canary-errmsg"} {
		if strings.Contains(logs, c) {
			t.Errorf("canary %q in the log", c)
		}
		if err != nil && (strings.Contains(err.Error(), c) || strings.Contains(fmt.Sprintf("%+v %#v", err, err), c)) {
			t.Errorf("canary %q in the error", c)
		}
	}
}
