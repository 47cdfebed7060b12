package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

// TestDrill_Kill is the kill drill: outbox serve runs with the sink
// provider (idempotent, journalled); envelopes arrive over HTTP and from
// `outbox enqueue` processes while deliveries run; the daemon is SIGKILLed
// at random moments and restarted. At the end every acknowledged envelope
// must be delivered (or terminal, or unresolved with an explanation), no
// key may have been delivered twice, and the store must pass doctor.
//
// make test runs a short form (OUTBOX_DRILL_KILLS, default 4); make drill
// runs 50 kills and prints the figures.
func TestDrill_Kill(t *testing.T) {
	kills := 4
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_DRILL_KILLS")); err == nil && v > 0 {
		kills = v
	}
	bin := buildBinary(t)
	data := t.TempDir()
	const token = "drill-token-0123456789"
	envDir := t.TempDir()

	var (
		mu    sync.Mutex
		acked = map[string]bool{}
		seq   int
	)
	nextID := func(prefix string) string {
		mu.Lock()
		defer mu.Unlock()
		seq++
		return fmt.Sprintf("%s-%06d", prefix, seq)
	}
	ack := func(id string) {
		mu.Lock()
		acked[id] = true
		mu.Unlock()
	}

	start := func() (*exec.Cmd, string) {
		cmd := exec.Command(bin, "serve", "--data", data, "--addr", "127.0.0.1:0", "--lease", "1s", "--sink-journal", "--rescan", "200ms")
		cmd.Env = append(os.Environ(), "INTERNAL_OUTBOX_TOKEN="+token)
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		addr := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if a, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
					addr <- a
				}
			}
		}()
		select {
		case a := <-addr:
			return cmd, a
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatal("serve did not start")
		}
		return nil, ""
	}

	client := &http.Client{Timeout: 2 * time.Second}
	for k := 0; k < kills; k++ {
		cmd, base := start()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		// HTTP producers.
		for p := 0; p < 2; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					id := nextID("h")
					req, _ := http.NewRequest("POST", base+"/v1/envelopes", bytes.NewReader(replyJSON(id, "u"+strconv.Itoa(rand.IntN(5)))))
					req.Header.Set("Authorization", "Bearer "+token)
					resp, err := client.Do(req)
					if err != nil {
						continue // the daemon died: not acknowledged
					}
					if resp.StatusCode == http.StatusCreated {
						ack(id)
					}
					resp.Body.Close()
				}
			}()
		}
		// A foreign appender process.
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := nextID("c")
				f := filepath.Join(envDir, id+".json")
				os.WriteFile(f, replyJSON(id, "c"+strconv.Itoa(rand.IntN(3))), 0o600)
				out, err := exec.Command(bin, "enqueue", "--data", data, f).CombinedOutput()
				if err == nil && strings.Contains(string(out), "queued") {
					ack(id)
				}
			}
		}()
		time.Sleep(time.Duration(150+rand.IntN(500)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		close(stop)
		wg.Wait()
	}

	// Final run: let everything settle (expired leases are reconciled).
	cmd, base := start()
	_ = base
	settle := time.Now().Add(90 * time.Second)
	var counts queue.Counts
	for {
		out, code := outbox(t, bin, "stats", "--data", data, "--tenant", "*", "--json")
		if code == 0 {
			counts = queue.Counts{}
			if err := jsonUnmarshal([]byte(out), &counts); err == nil && counts.Total(envelope.StatePending)+counts.Total(envelope.StateSending)+counts.Total(envelope.StateRetryable) == 0 {
				break
			}
		}
		if time.Now().After(settle) {
			t.Fatalf("deliveries did not settle: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()

	if out, code := outbox(t, bin, "doctor", "--data", data); code != 0 {
		t.Fatalf("doctor after the drill: %s", out)
	}
	q, err := filestore.Open(data, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	lost, unresolved, delivered := 0, 0, 0
	for id := range acked {
		st, err := q.Get(context.Background(), "", id)
		if err != nil {
			lost++
			t.Errorf("acknowledged %s lost: %v", id, err)
			continue
		}
		switch st.Status {
		case queue.StatusDelivered:
			delivered++
		case string(envelope.StateUnresolved):
			unresolved++
		}
	}
	// No key delivered twice: the sink journals every Deliver call, and
	// every call follows a claim written to the index, so any repeat means
	// a lease was lost or ignored.
	journal, _ := os.ReadFile(filepath.Join(data, "sink", "telegram.journal"))
	per := map[string]int{}
	dups := 0
	for _, l := range strings.Split(strings.TrimSpace(string(journal)), "\n") {
		if l == "" {
			continue
		}
		per[l]++
		if per[l] == 2 {
			dups++
		}
	}
	rows := 0
	for st := range counts {
		rows += counts.Total(st)
	}
	report := fmt.Sprintf("kill drill: kills=%d acknowledged=%d rows=%d delivered=%d lost=%d duplicates=%d unresolved=%d deliver_calls=%d",
		kills, len(acked), rows, delivered, lost, dups, unresolved, len(per))
	t.Log(report)
	if os.Getenv("OUTBOX_DRILL_KILLS") != "" {
		fmt.Println(report)
	}
	if lost > 0 || dups > 0 {
		t.Fatalf("drill failed: %s", report)
	}
	// The sink can always answer Reconcile, so nothing may stay unresolved.
	if unresolved > 0 {
		t.Fatalf("drill: %d unresolved rows with a provider that always knows: %s", unresolved, report)
	}
}
