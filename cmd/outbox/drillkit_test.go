package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// Helpers shared by the drills that run outbox serve as a child process
// under load (the kill drill, the index faults, the fault drill).

// launchServe starts `outbox serve --data data --addr 127.0.0.1:0` with
// env added to the environment and args after the flags, and waits until
// it listens or exits. It returns the daemon (nil if it exited), what it
// printed until then, and its exit code.
func launchServe(t *testing.T, bin, data string, env []string, args ...string) (*daemon, string, int) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--data", data, "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, logs: &lockedBuffer{}, scanned: make(chan struct{})}
	found := make(chan string, 1)
	go func() {
		defer close(d.scanned)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			d.logs.Write([]byte(sc.Text() + "\n"))
			if after, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				found <- after
			}
		}
	}()
	select {
	case d.base = <-found:
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				d.kill()
			}
		})
		return d, d.logs.String(), 0
	case <-d.scanned:
		err := cmd.Wait()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return nil, d.logs.String(), code
	case <-time.After(30 * time.Second):
		d.kill()
		t.Fatalf("serve neither listened nor exited:\n%s", d.logs)
	}
	return nil, "", 0
}

// kill SIGKILLs the daemon and reaps it.
func (d *daemon) kill() {
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.scanned // every read of the pipe before Wait closes it
	d.cmd.Wait()
}

// ackSet records the ids a drill's producers had acknowledged.
type ackSet struct {
	mu    sync.Mutex
	seq   int // ids handed out
	clock int // events: requests started, faults (see tick)
	acked map[string]ackInfo
}

// ackInfo is what the checks need of one acknowledged envelope.
type ackInfo struct {
	user  string
	via   string // "http" (serve answered 201) or "enqueue" (outbox enqueue printed queued)
	since int    // tick when its request started: faults with a later tick came after it
	at    int    // tick when it was acknowledged
}

func newAckSet() *ackSet { return &ackSet{acked: map[string]ackInfo{}} }

// next returns a new id with prefix, unique in the drill.
func (a *ackSet) next(prefix string) (string, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	return fmt.Sprintf("%s-%06d", prefix, a.seq), a.seq
}

// ack records id as acknowledged; since is the tick its request started at.
func (a *ackSet) ack(id, user, via string, since int) {
	a.mu.Lock()
	a.clock++
	a.acked[id] = ackInfo{user: user, via: via, since: since, at: a.clock}
	a.mu.Unlock()
}

// tick orders events: a fault whose tick is later than a request's start
// may have hit that request's envelope.
func (a *ackSet) tick() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.clock++
	return a.clock
}

func (a *ackSet) snapshot() map[string]ackInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := make(map[string]ackInfo, len(a.acked))
	for k, v := range a.acked {
		m[k] = v
	}
	return m
}

// appendLoop is the foreign appender: `outbox enqueue` processes, one
// envelope each (mk builds it for id and user), until stop is closed.
// pause is the wait between two.
func appendLoop(bin, data, envDir string, a *ackSet, stop <-chan struct{}, pause time.Duration, pick func() (prefix, user string), mk func(id, user string, n int) []byte) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(pause):
		}
		prefix, user := pick()
		id, n := a.next(prefix)
		f := filepath.Join(envDir, id+".json")
		os.WriteFile(f, mk(id, user, n), 0o600)
		since := a.tick()
		out, err := exec.Command(bin, "enqueue", "--data", data, f).CombinedOutput()
		if err == nil && strings.Contains(string(out), "queued") {
			a.ack(id, user, "enqueue", since)
		}
		os.Remove(f)
	}
}

// sinkJournal returns the sink's Deliver calls on channel ch by key hash
// (serve --sink-journal writes one line per call).
func sinkJournal(t *testing.T, data, ch string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(data, "sink", ch+".journal"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			per[l]++
		}
	}
	return per
}

// postLoop posts envelopes (ids "h…", for user(), built by mk) to serve at
// base, pause apart, until stop is closed, and records those it answered
// 201.
func postLoop(client *http.Client, base, token string, a *ackSet, stop <-chan struct{}, pause time.Duration, user func() string, mk func(id, user string, n int) []byte) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(pause):
		}
		id, n := a.next("h")
		u := user()
		req, _ := http.NewRequest("POST", base+"/v1/envelopes", bytes.NewReader(mk(id, u, n)))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			continue // the daemon died: not acknowledged
		}
		if resp.StatusCode == http.StatusCreated {
			a.ack(id, u, "http", 0)
		}
		resp.Body.Close()
	}
}

// settle waits (90 s at most) until no row of the store at data is
// pending, sending or retryable, and returns the counts.
func settle(t *testing.T, bin, data string) queue.Counts {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		out, code := outbox(t, bin, "stats", "--data", data, "--tenant", "*", "--json")
		if code == 0 {
			var counts queue.Counts
			if err := jsonUnmarshal([]byte(out), &counts); err == nil && counts.Total(envelope.StatePending)+counts.Total(envelope.StateSending)+counts.Total(envelope.StateRetryable) == 0 {
				return counts
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("deliveries did not settle: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkAcked looks up every acknowledged envelope in q: it reports each
// one missing, and counts them.
func checkAcked(t *testing.T, q queue.Store, acked map[string]ackInfo) (lost, unresolved, delivered int) {
	t.Helper()
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
	return lost, unresolved, delivered
}

// repeated counts the keys called more than once in per (calls by key).
func repeated(per map[string]int) int {
	n := 0
	for _, c := range per {
		if c > 1 {
			n++
		}
	}
	return n
}

// rowsIn counts every row of c.
func rowsIn(c queue.Counts) int {
	n := 0
	for st := range c {
		n += c.Total(st)
	}
	return n
}
