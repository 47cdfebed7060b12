//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The Bot API cannot be reached (nothing listens: a Telegram outage, this
// host's network down). Telegram cannot deduplicate, so a call that may
// have reached it is never resent; but one that made no connection sent
// nothing. serve keeps such replies retryable (provider_unreachable, the
// channel paused), never unresolved, and delivers each once when the
// service answers again.
func TestFault_TelegramUnreachable(t *testing.T) {
	bin := buildBinary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused until the fake listens there
	const token, bot = "unreach-token-0123456789abcdef", "4343:unreach-bot"
	d, out, _ := launchServe(t, bin, t.TempDir(), []string{"INTERNAL_OUTBOX_TOKEN=" + token, "OUTBOX_TELEGRAM_TOKEN=" + bot},
		"--telegram-api", "http://"+addr, "--concurrency", "2")
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	ids := []string{"u-a", "u-b", "u-c", "u-d"}
	for i, id := range ids {
		// Each to a chat of its own: Telegram's pacing of one chat (1/s)
		// is not what this test is about.
		if code, b := request(t, "POST", d.base+"/v1/envelopes", token, replyToJSON(id, fmt.Sprintf("user-%d", i), fmt.Sprintf("42%d", i))); code != http.StatusCreated {
			t.Fatalf("POST %s = %d %s", id, code, b)
		}
	}
	state := func(id string) (string, string) {
		_, b := request(t, "GET", d.base+"/v1/envelopes/"+id, token, nil)
		var st struct {
			Segments []struct {
				State string `json:"state"`
				Class string `json:"error_class"`
			} `json:"segments"`
		}
		if json.Unmarshal(b, &st) != nil || len(st.Segments) != 1 {
			t.Fatalf("GET %s: %s", id, b)
		}
		return st.Segments[0].State, st.Segments[0].Class
	}
	eventually(t, "a reply retryable as provider_unreachable, the channel paused", func() bool {
		s, c := state(ids[0])
		return s == "retryable" && c == "provider_unreachable" && strings.Contains(d.logs.String(), "channel telegram paused for 5s")
	})
	for _, id := range ids {
		if s, _ := state(id); s == "unresolved" || s == "dead_letter" {
			t.Fatalf("%s is %s while the Bot API cannot be reached", id, s)
		}
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	tg := newFakeTelegramOn(t, bot, 3, ln)
	// Within the pause then running, which doubles from 5 s with every
	// refused probe (on a loaded machine the wait above may see several).
	deadline := time.Now().Add(2 * time.Minute)
	for _, id := range ids {
		for s, _ := state(id); s != "sent"; s, _ = state(id) {
			if time.Now().After(deadline) {
				t.Fatalf("%s is %s two minutes after the Bot API answers again:\n%s", id, s, d.logs)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, id := range ids {
		if n := tg.count(id); n != 1 {
			t.Errorf("%s reached Telegram %d times, want 1", id, n)
		}
	}
	if !strings.Contains(d.logs.String(), "channel telegram resumed") {
		t.Errorf("serve did not log the channel resumed:\n%s", d.logs)
	}
}
