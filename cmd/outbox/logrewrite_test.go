package main

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

// Logs rewritten without their pruned records while both serve (HTTP) and
// `outbox enqueue` processes append to the same user's log, and `outbox
// compact` prunes through serve every 300 ms (retention 1 s, rewrites from
// 2 KiB): every acknowledged envelope is delivered exactly once (the
// sink's journal), whichever file its record went to, and the store is
// consistent at the end.
func TestFault_LogRewritesBesideAppends(t *testing.T) {
	bin := buildBinary(t)
	data := t.TempDir()
	const token = "rewrite-token-0123456789abcdef"
	d, out, _ := launchServe(t, bin, data, []string{"INTERNAL_OUTBOX_TOKEN=" + token},
		"--sink-journal", "--retention", "1s", "--log-rewrite-min", "2048", "--lease", "2s")
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	acks := newAckSet()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	mk := func(id, user string, n int) []byte { return replyToJSON(id, user, strconv.Itoa(1000+n%50)) }
	wg.Add(3)
	go func() {
		defer wg.Done()
		postLoop(&http.Client{Timeout: 5 * time.Second}, d.base, token, acks, stop, 3*time.Millisecond, func() string { return "busy" }, mk)
	}()
	go func() {
		defer wg.Done()
		appendLoop(bin, data, t.TempDir(), acks, stop, 10*time.Millisecond, func() (string, string) { return "c", "busy" }, mk)
	}()
	compacts := 0
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			if out, code := outbox(t, bin, "compact", "--data", data); code != 0 {
				t.Errorf("compact beside serve = %d: %s", code, out)
			}
			compacts++
		}
	}()
	time.Sleep(7 * time.Second)
	close(stop)
	wg.Wait()
	settle(t, bin, data)

	_, body := request(t, "GET", d.base+"/metrics", token, nil)
	rewrites := 0.0
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, "outbox_log_compactions_total "); ok {
			rewrites, _ = strconv.ParseFloat(v, 64)
		}
	}
	d.stop(t)
	acked := acks.snapshot()
	journal := sinkJournal(t, data, "telegram")
	viaEnqueue, lost, twice := 0, 0, 0
	for id, a := range acked {
		if a.via == "enqueue" {
			viaEnqueue++
		}
		switch n := journal[envelope.Key{Tenant: envelope.DefaultTenant, EnvelopeID: id}.Hash()]; {
		case n == 0:
			lost++
			t.Errorf("acknowledged %s (%s) never delivered", id, a.via)
		case n > 1:
			twice++
			t.Errorf("acknowledged %s (%s) delivered %d times", id, a.via, n)
		}
	}
	t.Logf("%d acknowledged (%d by outbox enqueue), %d compacts, %d log rewrites; %d lost, %d twice", len(acked), viaEnqueue, compacts, int(rewrites), lost, twice)
	if rewrites < 2 || viaEnqueue == 0 {
		t.Fatalf("%v log rewrites, %d envelopes from outbox enqueue: the test did not race rewrites with both appenders", rewrites, viaEnqueue)
	}
	if out, code := outbox(t, bin, "doctor", "--data", data); code != 0 {
		t.Fatalf("doctor = %d:\n%s", code, out)
	}
}
