//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// A serve paused with SIGSTOP (a suspended VM, a stalled host) while it
// holds leases, beside another serve on the same database: the other
// recovers the paused one's rows once their leases end, and when the
// paused one runs again its late commits are fenced out. From Telegram's
// side (it cannot deduplicate) no message is sent twice; a row the paused
// serve held ends unresolved (the survivor cannot know whether the call
// reached Telegram), never sent by a stale commit; and the paused serve
// works on afterwards.
func TestPG_PausedServeFencedOut(t *testing.T) {
	bin := buildBinary(t)
	schema := pgtest.Schema(t)
	env := pgEnv(schema)
	if out, code := outboxEnv(t, bin, env, "migrate"); code != 0 {
		t.Fatalf("migrate = %d %s", code, out)
	}
	const token, bot = "pause-token-0123456789abcdef", "4242:pause-bot"
	tg := newFakeTelegram(t, bot, 7)
	data := t.TempDir()
	args := []string{"--no-migrate", "--lease", "1s", "--concurrency", "4", "--shutdown-timeout", "3s", "--telegram-api", tg.srv.URL}
	start := func() *daemon {
		d, out, _ := launchServe(t, bin, data, append(env, "INTERNAL_OUTBOX_TOKEN="+token, "OUTBOX_TELEGRAM_TOKEN="+bot), args...)
		if d == nil {
			t.Fatalf("serve:\n%s", out)
		}
		return d
	}
	a := start() // alone at first: every lease taken before b starts is a's

	var (
		mu    sync.Mutex
		acked = map[string]bool{}
	)
	// Posts to a paused serve hang: a timeout, and such a post is not
	// acknowledged (it may still be stored: the checks cover every row).
	client := &http.Client{Timeout: 3 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	var chats atomic.Int64 // a chat per envelope: Telegram paces each chat
	post := func(base, id string) {
		chat := strconv.FormatInt(1000+chats.Add(1), 10)
		req, _ := http.NewRequest("POST", base+"/v1/envelopes", bytes.NewReader(replyToJSON(id, "u"+id[len(id)-1:], chat)))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusCreated {
			mu.Lock()
			acked[id] = true
			mu.Unlock()
		}
	}

	ctx := context.Background()
	table := pgx.Identifier{schema}.Sanitize() + ".deliveries"
	sending := func() map[string]uint64 {
		rows, err := pgtest.Admin().Query(ctx, `SELECT env_id, fence FROM `+table+` WHERE state = 'sending'`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]uint64{}
		for rows.Next() {
			var id string
			var fence int64
			if err := rows.Scan(&id, &fence); err != nil {
				t.Fatal(err)
			}
			out[id] = uint64(fence)
		}
		return out
	}

	// Load on a until it holds leases (Telegram answers after 0–20 ms);
	// then pause it.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				post(a.base, fmt.Sprintf("p-%d-%04d", p, i))
			}
		})
	}
	eventually(t, "the first serve holding leases", func() bool { return len(sending()) >= 2 })
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	close(stop)
	atPause := sending() // a's: b is not running; a cannot change them now
	wg.Wait()            // the posts to a time out
	b := start()
	for i := range 20 {
		post(b.base, fmt.Sprintf("q-%04d", i)) // b works while a is paused
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		rows, err := pgtest.Admin().Query(ctx, `SELECT pid, state, coalesce(wait_event,''), left(query, 80), now() - xact_start FROM pg_stat_activity WHERE datname = current_database()`)
		if err == nil {
			for rows.Next() {
				var pid int
				var st, we, q string
				var age *time.Duration
				_ = rows.Scan(&pid, &st, &we, &q, &age)
				t.Logf("backend %d %s %s %v %q", pid, st, we, age, q)
			}
			rows.Close()
		}
		t.Logf("at pause %v, now %v", atPause, sending())
	})
	eventually(t, "the paused serve's leases recovered by the other", func() bool {
		now := sending()
		for id, f := range atPause {
			if g, ok := now[id]; ok && g == f {
				return false
			}
		}
		return true
	})
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The paused serve works on: it takes and delivers new envelopes.
	eventually(t, "the resumed serve answering", func() bool {
		code, _ := request(t, "GET", a.base+"/healthz", "", nil)
		return code == http.StatusOK
	})
	for i := range 20 {
		post(a.base, fmt.Sprintf("r-%04d", i))
	}
	eventually(t, "every row settled", func() bool {
		out, code := outboxEnv(t, bin, env, "stats", "--json")
		var c queue.Counts
		return code == 0 && json.Unmarshal([]byte(out), &c) == nil &&
			c.Total(envelope.StatePending)+c.Total(envelope.StateSending)+c.Total(envelope.StateRetryable) == 0
	})
	a.stop(t)
	b.stop(t)

	final := map[string]string{}
	fences := map[string]uint64{}
	hist := map[string]string{}
	rows, err := pgtest.Admin().Query(ctx, `SELECT env_id, state, fence, history::text FROM `+table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, state, h string
		var fence int64
		if err := rows.Scan(&id, &state, &fence, &h); err != nil {
			t.Fatal(err)
		}
		final[id], fences[id], hist[id] = state, uint64(fence), h
	}
	rows.Close()
	sent, unresolved := 0, 0
	for id := range acked {
		if _, ok := final[id]; !ok {
			t.Errorf("%s acknowledged, not in the store", id)
		}
	}
	for id := range final { // acknowledged or not: a post cut by the pause may be stored
		calls := tg.count(id)
		switch state := final[id]; {
		case calls > 1:
			t.Errorf("%s sent to Telegram %d times", id, calls)
		case state == string(envelope.StateSent) && calls == 1:
			sent++
		case state == string(envelope.StateUnresolved):
			unresolved++ // the call may or may not have reached Telegram: the operator looks
		default:
			t.Errorf("%s ended %s after %d Telegram calls", id, state, calls)
		}
	}
	// The paused serve's leases: taken over by the other (a newer fence),
	// unless a statement of the paused serve was already at the server
	// (its commit: sent with its own fence). No stale commit lands: a row
	// the other took over is settled by the other (checked above against
	// Telegram's side), never sent by the old fence.
	recovered := 0
	for id, f := range atPause {
		switch {
		case fences[id] > f:
			recovered++
		case final[id] != string(envelope.StateSent):
			t.Errorf("%s, leased by the paused serve with fence %d, ended %s with that fence: %s", id, f, final[id], hist[id])
		}
	}
	if recovered == 0 {
		t.Errorf("no lease of the paused serve was taken over (%d at the pause)", len(atPause))
	}
	if len(atPause) == 0 {
		t.Errorf("the paused serve held no lease at the pause")
	}
	for i := range 20 {
		if id := fmt.Sprintf("r-%04d", i); !acked[id] || final[id] != string(envelope.StateSent) {
			t.Errorf("%s, posted to the resumed serve, ended %s", id, final[id])
		}
	}
	t.Logf("paused serve: acknowledged=%d sent=%d unresolved=%d paused_leases=%d taken_over=%d", len(acked), sent, unresolved, len(atPause), recovered)
}
