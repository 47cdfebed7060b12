package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

// Faults of the index outside the kill drill (issue K): a lost or emptied
// index.db, a killed doctor --rebuild, compact racing a starting serve, a
// scrambled index.db. Each runs the binary on real files and checks from
// the provider's side (the sink's journal: one line per Deliver call) that
// nothing is delivered twice.

const faultToken = "index-fault-token-0123456789"

// faultRounds is how many rounds the randomized tests run: a few in make
// test, more with OUTBOX_INDEX_FAULT_ROUNDS (make index-faults).
func faultRounds(short int) int {
	if n, err := strconv.Atoi(os.Getenv("OUTBOX_INDEX_FAULT_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return short
}

// tryServe starts outbox serve on data and waits until it listens or
// exits. It returns the daemon (nil if it exited) and what it printed.
func tryServe(t *testing.T, bin, data string) (*daemon, string, int) {
	t.Helper()
	return launchServe(t, bin, data, []string{"INTERNAL_OUTBOX_TOKEN=" + faultToken}, "--lease", "2s", "--sink-journal")
}

// journal returns the sink's Deliver calls for telegram: how many, and
// how many keys were delivered more than once.
func journal(t *testing.T, data string) (calls, twice int) {
	t.Helper()
	for _, n := range sinkJournal(t, data, "telegram") {
		calls += n
		if n > 1 {
			twice++
		}
	}
	return calls, twice
}

// crashed reports whether a command's output shows a Go panic or fault.
func crashed(out string) bool {
	for _, s := range []string{"panic:", "fatal error:", "goroutine ", "SIGSEGV", "SIGBUS"} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
}

// noCrash fails when a command's output shows a Go panic or fault.
func noCrash(t *testing.T, what, out string) {
	t.Helper()
	if crashed(out) {
		t.Fatalf("%s crashed:\n%s", what, out)
	}
}

// delivered runs serve on a new data directory, enqueues n telegram
// replies over HTTP, waits until the sink delivered each once, and stops.
func delivered(t *testing.T, bin string, n int) string {
	t.Helper()
	data := t.TempDir()
	d := startServe(t, bin, data, faultToken, "--sink-journal")
	for i := 0; i < n; i += 100 {
		var batch []json.RawMessage
		for j := i; j < min(i+100, n); j++ {
			batch = append(batch, replyJSON(fmt.Sprintf("r%04d", j), "u"+strconv.Itoa(j%7)))
		}
		body, _ := json.Marshal(batch)
		if code, b := request(t, "POST", d.base+"/v1/envelopes", faultToken, body); code != 201 {
			t.Fatalf("POST = %d %s", code, b)
		}
	}
	eventually(t, "every reply delivered", func() bool {
		c, _ := journal(t, data)
		return c >= n
	})
	d.stop(t)
	if c, twice := journal(t, data); c != n || twice != 0 {
		t.Fatalf("setup: %d deliveries of %d replies, %d twice", c, n, twice)
	}
	return data
}

// settled waits until the running serve on data has no pending, sending
// or retryable row and returns the counts.
func settled(t *testing.T, bin, data string) queue.Counts {
	t.Helper()
	var c queue.Counts
	eventually(t, "rows settled", func() bool {
		out, code := outbox(t, bin, "stats", "--data", data, "--json")
		if code != 0 {
			return false
		}
		c = queue.Counts{}
		if json.Unmarshal([]byte(out), &c) != nil {
			return false
		}
		return c.Total(envelope.StatePending)+c.Total(envelope.StateSending)+c.Total(envelope.StateRetryable) == 0
	})
	return c
}

// An index.db deleted or emptied while serve was stopped: serve refuses to
// start, naming outbox doctor --rebuild, and delivers nothing; after the
// rebuild every row is unresolved and nothing is delivered again.
func TestFault_LostIndexNotResent(t *testing.T) {
	bin := buildBinary(t)
	for _, how := range []string{"deleted", "emptied"} {
		t.Run(how, func(t *testing.T) {
			const n = 5
			data := delivered(t, bin, n)
			idx := filepath.Join(data, "index.db")
			var err error
			if how == "deleted" {
				err = os.Remove(idx)
			} else {
				err = os.Truncate(idx, 0)
			}
			if err != nil {
				t.Fatal(err)
			}
			d, out, code := tryServe(t, bin, data)
			if d != nil {
				time.Sleep(time.Second)
				d.cmd.Process.Kill()
				d.cmd.Wait()
				c, _ := journal(t, data)
				t.Fatalf("serve started on a lost index and delivered %d of %d replies again", c-n, n)
			}
			noCrash(t, "serve", out)
			if code != exitFailure || !strings.Contains(out, "outbox doctor --rebuild") || !strings.Contains(out, "index") {
				t.Fatalf("serve on a lost index = %d, want 1 with a message naming outbox doctor --rebuild:\n%s", code, out)
			}
			if out, code := outbox(t, bin, "doctor", "--rebuild", "--data", data); code != 0 || !strings.Contains(out, fmt.Sprintf("rebuilt: %d envelopes", n)) {
				t.Fatalf("doctor --rebuild = %d:\n%s", code, out)
			}
			d, out, _ = tryServe(t, bin, data)
			if d == nil {
				t.Fatalf("serve after the rebuild:\n%s", out)
			}
			c := settled(t, bin, data)
			d.stop(t)
			if c.Total(envelope.StateUnresolved) != n {
				t.Fatalf("after the rebuild: %v, want %d unresolved", c, n)
			}
			if calls, _ := journal(t, data); calls != n {
				t.Fatalf("%d deliveries after the rebuild, want %d (nothing again)", calls, n)
			}
		})
	}
}

// An index.db emptied under a running serve (an operator's "> index.db"):
// serve stops by itself with exit 1 and a message naming doctor, without a
// crash (bbolt's memory map read past the file's end was a SIGBUS); every
// acknowledged envelope survives the rebuild, and nothing delivered is
// delivered again.
func TestFault_IndexEmptiedUnderServe(t *testing.T) {
	bin := buildBinary(t)
	// Emptied in place ("> index.db"), removed, or replaced by a copy moved
	// over it (a restore): serve stops by itself in each case.
	for _, fault := range []string{"emptied", "removed", "replaced"} {
		t.Run(fault, func(t *testing.T) { indexFaultUnderServe(t, bin, fault) })
	}
}

func indexFaultUnderServe(t *testing.T, bin, fault string) {
	data := t.TempDir()
	d, out, _ := tryServe(t, bin, data)
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	const n = 20
	var batch []json.RawMessage
	for j := range n {
		batch = append(batch, replyJSON(fmt.Sprintf("r%04d", j), "u"+strconv.Itoa(j%7)))
	}
	body, _ := json.Marshal(batch)
	if code, b := request(t, "POST", d.base+"/v1/envelopes", faultToken, body); code != 201 {
		t.Fatalf("POST = %d %s", code, b)
	}
	eventually(t, "every reply delivered", func() bool { c, _ := journal(t, data); return c >= n })
	index := filepath.Join(data, "index.db")
	var err error
	switch fault {
	case "emptied":
		err = os.Truncate(index, 0)
	case "removed":
		err = os.Remove(index)
	case "replaced":
		var b []byte
		if b, err = os.ReadFile(index); err == nil {
			if err = os.WriteFile(index+".copy", b, 0o600); err == nil {
				err = os.Rename(index+".copy", index)
			}
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	// An emptied index is found by the next call on it: a read (an
	// operator's GET) or the worker's next turn, whichever comes first;
	// a removed or replaced one within a second.
	code := 0 // no answer: serve has stopped by itself already
	req, _ := http.NewRequest("GET", d.base+"/v1/envelopes/r0000", nil)
	req.Header.Set("Authorization", "Bearer "+faultToken)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		code = resp.StatusCode
		resp.Body.Close()
	}
	exited := make(chan error, 1)
	go func() { <-d.scanned; exited <- d.cmd.Wait() }()
	select {
	case err = <-exited:
	case <-time.After(60 * time.Second):
		d.cmd.Process.Signal(syscall.SIGKILL) // reaped by the Wait above
		<-exited
		t.Fatalf("serve still runs a minute after its index was %s (GET answered %d):\n%s", fault, code, d.logs)
	}
	logs := d.logs.String()
	noCrash(t, "serve", logs)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitFailure || !strings.Contains(logs, "the index was damaged under the running store") || !strings.Contains(logs, "outbox doctor --rebuild") {
		t.Fatalf("serve after its index was %s: %v, want exit 1 naming the damage and outbox doctor --rebuild:\n%s", fault, err, logs)
	}
	// A removed or replaced file is still readable until the check finds
	// it (within a second); an emptied one fails the read at once.
	if fault == "emptied" && code != 0 && code != http.StatusServiceUnavailable {
		t.Errorf("GET of an envelope after the index was %s answered %d, want 503 (or no answer: serve stopped)", fault, code)
	}
	if out, code := outbox(t, bin, "doctor", "--rebuild", "--data", data); code != 0 || !strings.Contains(out, fmt.Sprintf("rebuilt: %d envelopes", n)) {
		t.Fatalf("doctor --rebuild = %d:\n%s", code, out)
	}
	d, out, _ = tryServe(t, bin, data)
	if d == nil {
		t.Fatalf("serve after the rebuild:\n%s", out)
	}
	settled(t, bin, data)
	d.stop(t)
	if calls, twice := journal(t, data); calls != n || twice != 0 {
		t.Fatalf("%d deliveries of %d replies, %d twice; want each once", calls, n, twice)
	}
}

// doctor --rebuild killed (SIGKILL) at a random moment, each round on a
// copy of a store whose replies were all delivered: the next serve
// delivers nothing again, whatever the moment.
func TestFault_RebuildKilledNotResent(t *testing.T) {
	bin := buildBinary(t)
	const n = 300
	pristine := delivered(t, bin, n)

	// How long a whole rebuild takes here: the kills fall within it.
	probe := t.TempDir()
	copyDir(t, pristine, probe)
	start := time.Now()
	if out, code := outbox(t, bin, "doctor", "--rebuild", "--data", probe); code != 0 {
		t.Fatalf("doctor --rebuild = %d:\n%s", code, out)
	}
	took := time.Since(start)

	rounds := faultRounds(3)
	killed := 0
	for r := 0; r < rounds; r++ {
		data := t.TempDir()
		copyDir(t, pristine, data)
		cmd := exec.Command(bin, "doctor", "--rebuild", "--data", data)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		delay := time.Duration(rand.Int64N(int64(took))) // within the rebuild
		time.Sleep(delay)
		if cmd.Process.Signal(syscall.SIGKILL) == nil {
			killed++
		}
		cmd.Wait()

		d, out, _ := tryServe(t, bin, data)
		noCrash(t, "serve", out)
		if d == nil {
			// Refusing is safe; the rebuild the message asks for then
			// completes it.
			if !strings.Contains(out, "doctor") {
				t.Fatalf("round %d: serve after a killed rebuild:\n%s", r, out)
			}
			if out, code := outbox(t, bin, "doctor", "--rebuild", "--data", data); code != 0 {
				t.Fatalf("round %d: doctor --rebuild = %d:\n%s", r, code, out)
			}
			if d, out, _ = tryServe(t, bin, data); d == nil {
				t.Fatalf("round %d: serve after the rebuild:\n%s", r, out)
			}
		}
		c := settled(t, bin, data)
		d.stop(t)
		calls, twice := journal(t, data)
		if calls != n || twice != 0 {
			t.Fatalf("round %d (killed %s into a %s rebuild): %d deliveries of %d replies, %d twice; rows %v",
				r, delay.Round(time.Millisecond), took.Round(time.Millisecond), calls, n, twice, c)
		}
		if out, code := outbox(t, bin, "doctor", "--data", data); code != 0 {
			t.Fatalf("round %d: doctor after the killed rebuild = %d:\n%s", r, code, out)
		}
	}
	t.Logf("rebuild %s; %d rounds, %d kills, nothing delivered twice", took.Round(time.Millisecond), rounds, killed)
}

// outbox compact and outbox serve started together, many times: at most
// one daemon ever runs on the data directory (a second serve fails with
// "in use by pid"), and nothing is delivered twice.
func TestFault_CompactRacingServe(t *testing.T) {
	bin := buildBinary(t)
	const n = 300
	data := delivered(t, bin, n)
	rounds := faultRounds(3)
	served, refused := 0, 0
	for r := 0; r < rounds; r++ {
		compact := exec.Command(bin, "compact", "--data", data)
		var cout bytes.Buffer
		compact.Stdout, compact.Stderr = &cout, &cout
		if err := compact.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(r%5) * 5 * time.Millisecond)
		d, out, _ := tryServe(t, bin, data)
		compact.Wait()
		noCrash(t, "compact", cout.String())
		noCrash(t, "serve", out)
		if d == nil {
			refused++
			if !strings.Contains(out, "in use") {
				t.Fatalf("round %d: serve failed for another reason than compact holding the store:\n%s", r, out)
			}
			continue
		}
		served++
		second, out2, _ := tryServe(t, bin, data)
		if second != nil {
			second.stop(t)
			d.stop(t)
			t.Fatalf("round %d: two daemons on one data directory (compact: %s)", r, cout.String())
		}
		if want := "in use by pid " + strconv.Itoa(d.cmd.Process.Pid); !strings.Contains(out2, want) {
			t.Fatalf("round %d: the second serve's error does not say %q:\n%s", r, want, out2)
		}
		d.stop(t)
	}
	if calls, twice := journal(t, data); calls != n || twice != 0 {
		t.Fatalf("%d deliveries of %d replies, %d twice", calls, n, twice)
	}
	if out, code := outbox(t, bin, "doctor", "--data", data); code != 0 {
		t.Fatalf("doctor = %d:\n%s", code, out)
	}
	t.Logf("%d rounds: serve ran in %d, was refused while compact held the store in %d", rounds, served, refused)
}

// A scrambled index.db (pages overwritten with random bytes, the file cut
// to 1 MiB, 200 flipped bytes): serve, doctor and doctor --rebuild never
// crash; serve refuses a damaged file naming outbox doctor; doctor
// --rebuild works on a file that cannot be opened at all; and nothing is
// delivered afterwards (the rows were sent; rebuilt ones are unresolved).
func TestFault_ScrambledIndex(t *testing.T) {
	bin := buildBinary(t)
	pristine := sentStore(t, 4000)
	idx := filepath.Join(pristine, "index.db")
	fi, err := os.Stat(idx)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() <= 1<<20 {
		t.Fatalf("setup: index of %d bytes, want more than 1 MiB", fi.Size())
	}
	for _, kind := range []string{"pages", "truncated", "flipped"} {
		t.Run(kind, func(t *testing.T) {
			data := t.TempDir()
			copyDir(t, pristine, data)
			scramble(t, filepath.Join(data, "index.db"), kind)

			d, out, code := tryServe(t, bin, data)
			noCrash(t, "serve", out)
			if d != nil {
				// The damage left what serve reads intact (free pages).
				if kind == "truncated" {
					t.Fatal("serve started on an index cut short")
				}
				d.stop(t)
			} else if code != exitFailure || !strings.Contains(out, "outbox doctor") {
				t.Fatalf("serve on a %s index = %d, want 1 with a message naming outbox doctor:\n%s", kind, code, out)
			}
			out, code = outbox(t, bin, "doctor", "--data", data)
			noCrash(t, "doctor", out)
			if code != 0 && code != 1 {
				t.Fatalf("doctor = %d:\n%s", code, out)
			}
			out, code = outbox(t, bin, "doctor", "--rebuild", "--data", data)
			noCrash(t, "doctor --rebuild", out)
			if code != 0 || !strings.Contains(out, "rebuilt: 4000 envelopes") {
				t.Fatalf("doctor --rebuild = %d:\n%s", code, out)
			}
			if m, _ := filepath.Glob(filepath.Join(data, "index.db.broken-*")); len(m) == 0 {
				t.Fatal("the damaged index was not kept aside")
			}
			d, out, _ = tryServe(t, bin, data)
			if d == nil {
				t.Fatalf("serve after the rebuild:\n%s", out)
			}
			c := settled(t, bin, data)
			d.stop(t)
			if c.Total(envelope.StateUnresolved) != 4000 {
				t.Fatalf("after the rebuild: %v", c)
			}
			if calls, _ := journal(t, data); calls != 0 {
				t.Fatalf("%d deliveries after the rebuild, want none", calls)
			}
		})
	}
}

// sentStore builds, in this process, a store of n telegram replies that
// were all sent.
func sentStore(t *testing.T, n int) string {
	t.Helper()
	data := t.TempDir()
	q := openDirect(t, data)
	ctx := context.Background()
	for i := 0; i < n; i += 500 {
		var envs []*envelope.Envelope
		for j := i; j < min(i+500, n); j++ {
			e, err := envelope.Parse(replyJSON(fmt.Sprintf("s%05d", j), "u"+strconv.Itoa(j%50)))
			if err != nil {
				t.Fatal(err)
			}
			envs = append(envs, e)
		}
		if _, err := q.Enqueue(ctx, envs...); err != nil {
			t.Fatal(err)
		}
	}
	for {
		ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "setup", Lease: time.Minute, Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) == 0 {
			break
		}
		for _, l := range ls {
			if err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent, Receipt: "m"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	return data
}

// scramble damages an index file the way the operator did.
func scramble(t *testing.T, path, kind string) {
	t.Helper()
	seed := uint64(len(kind))
	scrambleWith(t, path, kind, func() uint64 { // xorshift: the same damage every run
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return seed
	})
}

// scrambleWith damages path by kind ("pages": 8 pages overwritten,
// "truncated": cut to 1 MiB or half its size, "flipped": 200 bytes
// inverted), drawing positions from next.
func scrambleWith(t *testing.T, path, kind string, next func() uint64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const ps = 4096
	switch kind {
	case "pages":
		if len(b)/ps <= 2 {
			t.Fatalf("scramble: %d bytes, too small for pages", len(b))
		}
		for i := 0; i < 8; i++ {
			p := 2 + int(next()%uint64(len(b)/ps-2))
			for j := p * ps; j < (p+1)*ps; j++ {
				b[j] = byte(next())
			}
		}
	case "truncated":
		if len(b) > 1<<20 {
			b = b[:1<<20]
		} else {
			b = b[:len(b)/2]
		}
	case "flipped":
		for i := 0; i < 200; i++ {
			b[next()%uint64(len(b))] ^= 0xff
		}
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// copyDir copies a data directory as cp -a would, also under a running
// serve: what vanishes while it is copied (a compaction's temporary file)
// is left out.
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.Walk(from, func(p string, fi os.FileInfo, err error) error {
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		switch {
		case fi.IsDir():
			return os.MkdirAll(dst, 0o700)
		case !fi.Mode().IsRegular():
			return nil // the socket of a stopped serve
		}
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func openDirect(t *testing.T, data string) *filestore.Queue {
	t.Helper()
	q, err := filestore.Open(data, &filestore.Options{NoSync: true, DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// The data directory moved (mv data data.old) under a running serve, by
// an operator who meant to move it while stopped: no enqueue is
// acknowledged at the old path (serve creates nothing there: a second
// store without an index, with acknowledged envelopes split between the
// two), serve stops by itself naming where the directory went, and serve
// on the new path delivers what was acknowledged, each once.
func TestFault_DataDirMovedUnderServe(t *testing.T) {
	bin := buildBinary(t)
	base := t.TempDir()
	data, moved := filepath.Join(base, "data"), filepath.Join(base, "data.old")
	d, out, _ := tryServe(t, bin, data)
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	const n = 10
	for j := range n {
		if code, b := request(t, "POST", d.base+"/v1/envelopes", faultToken, replyJSON(fmt.Sprintf("r%04d", j), "u"+strconv.Itoa(j%3))); code != 201 {
			t.Fatalf("POST = %d %s", code, b)
		}
	}
	eventually(t, "every reply delivered", func() bool { c, _ := journal(t, data); return c >= n })
	if err := os.Rename(data, moved); err != nil {
		t.Fatal(err)
	}
	// Users with a log (u0) and without (u9): none is acknowledged.
	for j, user := range []string{"u0", "u9", "u1", "u8"} {
		req, _ := http.NewRequest("POST", d.base+"/v1/envelopes", bytes.NewReader(replyJSON(fmt.Sprintf("late%d", j), user)))
		req.Header.Set("Authorization", "Bearer "+faultToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue // serve has stopped already
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("POST for %s after the data directory moved = %d, want 503 (never acknowledged at the old path)", user, resp.StatusCode)
		}
	}
	exited := make(chan error, 1)
	go func() { <-d.scanned; exited <- d.cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-time.After(60 * time.Second):
		d.cmd.Process.Signal(syscall.SIGKILL) // reaped by the Wait above
		<-exited
		t.Fatalf("serve still runs a minute after its data directory moved:\n%s", d.logs)
	}
	logs := d.logs.String()
	noCrash(t, "serve", logs)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitFailure || !strings.Contains(logs, "stopping: the data directory "+data+" was moved to "+moved) {
		t.Fatalf("serve after its data directory moved: %v, want exit 1 naming where it went:\n%s", err, logs)
	}
	if _, err := os.Lstat(data); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("serve made %s again after it moved (%v)", data, err)
	}
	d, out, _ = tryServe(t, bin, moved)
	if d == nil {
		t.Fatalf("serve on the directory where it is now:\n%s", out)
	}
	c := settled(t, bin, moved)
	d.stop(t)
	if got := c.Total(envelope.StateSent); got != n {
		t.Errorf("%d sent, want %d (the acknowledged ones, not the refused)", got, n)
	}
	if calls, twice := journal(t, moved); calls != n || twice != 0 {
		t.Fatalf("%d deliveries of %d replies, %d twice; want each once", calls, n, twice)
	}
}
