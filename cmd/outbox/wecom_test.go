package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeQyapi counts WeCom application sends and robot posts, always HTTP
// 200 with errcode 0.
type fakeQyapi struct {
	mu    sync.Mutex
	sends []string
	posts []string
}

func (f *fakeQyapi) handler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	ans := map[string]any{"errcode": 0, "errmsg": "ok"}
	switch r.URL.Path {
	case "/cgi-bin/gettoken":
		if r.URL.Query().Get("corpsecret") != "canary-serve-secret" {
			ans["errcode"] = 40001
		}
		ans["access_token"], ans["expires_in"] = "tok", 7200
	case "/cgi-bin/message/send":
		f.sends = append(f.sends, string(body))
		ans["msgid"] = "m1"
	case "/cgi-bin/webhook/send":
		if r.URL.Query().Get("key") != "canary-serve-robot-key" {
			ans["errcode"] = 93000
		}
		f.posts = append(f.posts, string(body))
	}
	_ = json.NewEncoder(w).Encode(ans)
}

// outbox serve starts the WeCom providers from configuration alone (the
// application, a robot named by OUTBOX_WECOM_ROBOT_OPS_KEY, the AI bot
// replies with their ledger in the data directory) and delivers the golden
// envelopes through them; no secret reaches the log.
func TestServe_WeComFromConfiguration(t *testing.T) {
	f := &fakeQyapi{}
	srv := httptest.NewServer(http.HandlerFunc(f.handler))
	defer srv.Close()
	data := t.TempDir()
	vars := map[string]string{
		"INTERNAL_OUTBOX_TOKEN":      "serve-test-token-0123456789",
		"OUTBOX_WECOM_API":           srv.URL,
		"OUTBOX_WECOM_CORP_ID":       "ww-corp",
		"OUTBOX_WECOM_AGENT_ID":      "1000002",
		"OUTBOX_WECOM_SECRET":        "canary-serve-secret",
		"OUTBOX_WECOM_ROBOT_OPS_KEY": "canary-serve-robot-key",
		"OUTBOX_WECOM_BOT_REPLIES":   "true",
	}
	var errb lockedBuffer
	e := &env{Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Stderr: &errb,
		Getenv: func(k string) string { return vars[k] },
		Environ: func() []string {
			var out []string
			for k, v := range vars {
				out = append(out, k+"="+v)
			}
			return out
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- runServe(ctx, e, []string{"--data", data, "--addr", "127.0.0.1:0", "--no-sink"}) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("serve did not stop")
		}
	}()
	re := regexp.MustCompile(`listening on (http://\S+)`)
	var base string
	eventually(t, "serve listening", func() bool {
		if m := re.FindStringSubmatch(errb.String()); m != nil {
			base = m[1]
			return true
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d:\n%s", code, errb.String())
		default:
		}
		return false
	})
	for _, want := range []string{"wecom: wecom", "wecom_robot: wecom_robot", "wecom_bot_reply: wecom_bot_reply"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("start-up log lacks %q:\n%s", want, errb.String())
		}
	}
	if _, err := os.Stat(filepath.Join(data, ledgerName)); err != nil {
		t.Errorf("reply ledger: %v", err)
	}
	for _, name := range []string{"reply-text.v1.wecom.golden.json", "reply-text.v1.wecom_robot.golden.json"} {
		b, err := os.ReadFile(fixturePath(name))
		if err != nil {
			t.Fatal(err)
		}
		// The fixtures' expires_at is in the past of the test's clock.
		b = regexp.MustCompile(`"expires_at": "[^"]*",\s*`).ReplaceAll(b, nil)
		if code, body := request(t, http.MethodPost, base+"/v1/envelopes", vars["INTERNAL_OUTBOX_TOKEN"], b); code != http.StatusCreated {
			t.Fatalf("%s: %d %s", name, code, body)
		}
	}
	eventually(t, "3 application messages and 2 robot posts", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.sends) == 3 && len(f.posts) == 2
	})
	f.mu.Lock()
	if !strings.Contains(f.sends[0], `"touser":"zhangsan"`) || !strings.Contains(f.sends[0], `"agentid":1000002`) || !strings.Contains(f.posts[0], `"msgtype":"markdown"`) {
		t.Errorf("requests: %s / %s", f.sends[0], f.posts[0])
	}
	f.mu.Unlock()
	for _, s := range []string{"canary-serve-secret", "canary-serve-robot-key"} {
		if strings.Contains(errb.String(), s) {
			t.Errorf("secret %q in the log", s)
		}
	}
}

// A half configuration refuses the start, naming what is missing and no
// value.
func TestServe_WeComHalfConfigured(t *testing.T) {
	for name, vars := range map[string]map[string]string{
		"SecretWithoutCorp": {"OUTBOX_WECOM_SECRET": "canary-half-secret"},
		"CorpWithoutSecret": {"OUTBOX_WECOM_CORP_ID": "ww1", "OUTBOX_WECOM_AGENT_ID": "1"},
		"BadAgent":          {"OUTBOX_WECOM_SECRET": "canary-half-secret", "OUTBOX_WECOM_CORP_ID": "ww1", "OUTBOX_WECOM_AGENT_ID": "x"},
	} {
		t.Run(name, func(t *testing.T) {
			_, errb, stop := startServeEnv(t, vars)
			code := stop()
			if code == 0 || !strings.Contains(errb.String(), "wecom") || strings.Contains(errb.String(), "canary-half-secret") {
				t.Fatalf("exit %d:\n%s", code, errb.String())
			}
		})
	}
}
