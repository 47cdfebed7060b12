//go:build linux

// The fault drill uses Linux only: a loop-mounted ext4, fallocate, statfs.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

// TestDrill_Faults is issue K's fault drill: outbox serve runs under load
// (e-mails over HTTP to the journalled sink, which deduplicates by key;
// Telegram replies over HTTP and from `outbox enqueue` processes to a fake
// Bot API on 127.0.0.1, which cannot), and at random moments one fault of
// faultKinds is applied. After each the drill recovers the way the README
// tells an operator to (restart serve; when serve refuses, run what its
// message names; resolve unresolved rows after looking at the provider's
// side; free the disk) and goes on. At the end it checks from the
// providers' side that every acknowledged envelope was delivered once, is
// unresolved, or ended with a reason, and that no Telegram reply was sent
// twice; it prints the table (and writes it to OUTBOX_FAULTS_REPORT).
//
// make test runs one fault of each kind; make faults runs OUTBOX_FAULTS (200). The
// seed (OUTBOX_FAULTS_SEED) fixes the faults, their order, moments and
// parameters; the processes' own timing still varies.
func TestDrill_Faults(t *testing.T) {
	faults := len(faultKinds)
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_FAULTS")); err == nil && v > 0 {
		faults = v
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("OUTBOX_FAULTS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("OUTBOX_FAULTS_SEED=%q: not a number", v)
		}
		seed = s
	}
	t.Logf("fault drill: %d faults, seed %d (OUTBOX_FAULTS_SEED=%d reproduces the sequence)", faults, seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fault drill failed: reproduce with OUTBOX_FAULTS_SEED=%d OUTBOX_FAULTS=%d", seed, faults)
		}
	})

	bin := buildBinary(t)
	dr := newFaultDrill(t, bin, seed)
	dr.up()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt) // a failure stops the producers before the file system is unmounted
	wg.Add(3)
	go func() { defer wg.Done(); dr.produceEmail(stop, seed) }()
	go func() { defer wg.Done(); dr.produceReplies(stop, seed) }()
	go func() {
		defer wg.Done()
		pick := rand.New(rand.NewPCG(seed, 3))
		var mu sync.Mutex
		appendLoop(bin, dr.data, dr.envDir, dr.acks, stop, 120*time.Millisecond,
			func() (string, string) { mu.Lock(); defer mu.Unlock(); return "c", "c" + strconv.Itoa(pick.IntN(3)) },
			func(id, user string, n int) []byte { return replyToJSON(id, user, strconv.Itoa(1_000_000+n)) })
	}()

	var order []string
	for i := 0; i < faults; i++ {
		if len(order) == 0 { // every kind once per round, in a seeded order
			order = append(order, dr.kinds...)
			dr.rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		}
		kind := order[0]
		order = order[1:]
		time.Sleep(time.Duration(150+dr.rng.IntN(450)) * time.Millisecond) // load before the fault
		dr.checkAlive()
		dr.faultNo = i + 1
		dr.mu.Lock()
		dr.lastFault = kind
		dr.mu.Unlock()
		what := dr.apply(kind)
		dr.applied[kind]++
		t.Logf("fault %d/%d %s: %s", i+1, faults, kind, what)
	}
	halt()
	dr.finish()
}

// faultKinds are the faults the drill applies.
var faultKinds = []string{
	"kill-serve", "pause-serve", "kill-rebuild", "kill-compact",
	"index-deleted", "index-emptied", "index-scrambled", "index-restored",
	"log-deleted", "log-truncated", "log-replaced",
	"disk-full", "no-files", "second-serve", "concurrent-compact",
	"provider-down", "dir-moved", "log-rewrite", "dir-restored",
}

// The drill prunes: terminal rows older than pruneAfter go when a fault
// compacts, and a log whose pruned records fill half of it (from
// rewriteMin bytes) is rewritten without them.
const (
	pruneAfter = "1s"
	rewriteMin = "4096"
)

const (
	faultDrillToken = "fault-drill-token-0123456789"
	faultDrillBot   = "123456:fault-drill-bot"
)

var (
	emailUsers = []string{"e0", "e1", "e2", "e3", "e4"}
	replyUsers = []string{"t0", "t1", "t2", "t3", "t4"}
)

type faultDrill struct {
	t                 *testing.T
	bin, data, envDir string
	mount             string // the small file system's root, "" when not root
	env, args         []string
	rng               *rand.Rand // the driver's only: kinds, moments, parameters
	kinds             []string
	acks              *ackSet
	tg                *fakeTelegram
	client            *http.Client
	email             map[string]any // the e-mail envelope every id is a copy of

	d    *daemon
	base atomic.Value // the running serve's URL, "" while it is down

	mu        sync.Mutex // guards what the producers count
	statuses  map[string]int
	logPath   map[string]string
	logFaults map[string][]logFault // by user
	rebuilds  []int                 // the tick of each rebuild (or possible one)
	faultNo   int                   // the fault being applied
	full      int                   // 507 answers (under mu)
	lastFault string                // its kind, for the producers' tally of errors (under mu)

	applied                     map[string]int
	steps                       map[string]int // recovery steps taken, by kind
	defects                     []string
	known                       map[string]int // defects of the store core already reported, counted apart
	cutUnderServe               bool           // index.db was emptied under the running serve
	rebuildTook, compactTook    time.Duration
	pruneTook                   time.Duration     // serve's last prune through compact
	ended                       map[string]string // envelope id → "state class" of rows ended otherwise than sent, seen before a prune
	restores                    []restoreSpan
	resolvedSent, resolvedRetry int
}

func newFaultDrill(t *testing.T, bin string, seed uint64) *faultDrill {
	dr := &faultDrill{
		t: t, bin: bin, envDir: t.TempDir(),
		rng:  rand.New(rand.NewPCG(seed, 1)),
		acks: newAckSet(), client: &http.Client{Timeout: 5 * time.Second},
		statuses: map[string]int{}, logPath: map[string]string{}, logFaults: map[string][]logFault{},
		applied: map[string]int{}, steps: map[string]int{}, known: map[string]int{},
		rebuildTook: 300 * time.Millisecond, compactTook: 300 * time.Millisecond, pruneTook: 100 * time.Millisecond,
		lastFault: "no fault yet", ended: map[string]string{},
	}
	t.Cleanup(dr.client.CloseIdleConnections)
	dr.kinds = faultKinds
	if os.Geteuid() == 0 {
		dr.mount = smallFS(t)
	}
	if dr.mount == "" {
		t.Log("fault drill: not root (or no loop device), so the data directory is not on a small file system and the disk-full fault is skipped")
		dr.kinds = slicesWithout(faultKinds, "disk-full")
		dr.data = t.TempDir()
	} else {
		dr.data = filepath.Join(dr.mount, "data")
		if err := os.Mkdir(dr.data, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if v := os.Getenv("OUTBOX_FAULTS_KINDS"); v != "" { // a reproducer: only these kinds
		dr.kinds = strings.Split(v, ",")
	}
	dr.tg = newFakeTelegram(t, faultDrillBot, seed)
	dr.env = []string{"INTERNAL_OUTBOX_TOKEN=" + faultDrillToken, "OUTBOX_TELEGRAM_TOKEN=" + faultDrillBot}
	dr.args = []string{"--lease", "1s", "--sink-journal", "--rescan", "200ms", "--backoff-base", "100ms", "--backoff-cap", "1s",
		"--telegram-api", dr.tg.srv.URL, "--shutdown-timeout", "3s",
		"--retention", pruneAfter, "--log-rewrite-min", rewriteMin}
	b, err := os.ReadFile(fixturePath("resurface-nudge.v1.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dr.email); err != nil {
		t.Fatal(err)
	}
	dr.base.Store("")
	for _, u := range append(append(append([]string{}, emailUsers...), replyUsers...), "c0", "c1", "c2") {
		out, code := outbox(t, bin, "path", "--data", dr.data, "--user", u)
		if code != 0 {
			t.Fatalf("outbox path --user %s = %d %s", u, code, out)
		}
		dr.logPath[u] = strings.TrimSpace(out)
	}
	return dr
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func slicesWithout(s []string, drop string) []string {
	var out []string
	for _, v := range s {
		if v != drop {
			out = append(out, v)
		}
	}
	return out
}

// smallFS mounts a 1 GiB ext4 image (a sparse file) on a directory of the
// test's and returns it; unmounted at cleanup. "" if it cannot.
func smallFS(t *testing.T) string { return loopFS(t, "loop") }

// loopFS is smallFS mounted with the given mount options ("loop" and more).
func loopFS(t *testing.T, options string) string {
	return loopFSWith(t, 1<<30, nil, options)
}

// loopFSWith is loopFS of size bytes, made with mkfs.ext4's extra args.
func loopFSWith(t *testing.T, size int64, mkfs []string, options string) string {
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	mk := append(append([]string{"mkfs.ext4", "-q", "-F", "-m", "0"}, mkfs...), img)
	for _, c := range [][]string{mk, {"mount", "-o", options, img, mnt}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Logf("fault drill: %s: %v %s", c[0], err, bytes.TrimSpace(out))
			return ""
		}
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", mnt, err, out)
			exec.Command("umount", "-l", mnt).Run()
		}
	})
	return mnt
}

// fakeTelegram is the Bot API on 127.0.0.1: it answers every sendMessage
// and records it by the envelope id in its text. Telegram cannot
// deduplicate, so two calls for one id are a blind redelivery.
type fakeTelegram struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls map[string]int
	other int // calls whose text names no envelope of the drill
	rng   *rand.Rand
	next  int64
}

// waitCall waits, up to d, for the next call to the fake Bot API.
func (f *fakeTelegram) waitCall(d time.Duration) {
	count := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := f.other
		for _, c := range f.calls {
			n += c
		}
		return n
	}
	n := count()
	for end := time.Now().Add(d); time.Now().Before(end) && count() == n; {
		time.Sleep(200 * time.Microsecond)
	}
}

func newFakeTelegram(t *testing.T, token string, seed uint64) *fakeTelegram {
	return newFakeTelegramOn(t, token, seed, nil)
}

// newFakeTelegramOn is newFakeTelegram serving on ln (nil: a free port).
func newFakeTelegramOn(t *testing.T, token string, seed uint64, ln net.Listener) *fakeTelegram {
	f := &fakeTelegram{calls: map[string]int{}, rng: rand.New(rand.NewPCG(seed, 2))}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/bot"+token+"/sendMessage" {
			http.NotFound(w, r)
			return
		}
		var req struct {
			Text string `json:"text"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
			http.Error(w, `{"ok":false,"error_code":400,"description":"bad json"}`, http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		if id, ok := strings.CutPrefix(req.Text, "hello from "); ok {
			f.calls[id]++
		} else {
			f.other++
		}
		f.next++
		mid := f.next
		delay := time.Duration(f.rng.IntN(20)) * time.Millisecond
		f.mu.Unlock()
		time.Sleep(delay) // an answer a SIGKILL of serve can cut off
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"ok":true,"result":{"message_id":%d}}`, mid)
	}))
	if ln != nil {
		f.srv.Listener.Close()
		f.srv.Listener = ln
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

// down makes the Bot API unreachable for d: its listener is closed (new
// connections are refused), the connections open are cut (a call on one
// may or may not have been counted), and then it listens again on the same
// address (a Telegram outage, or this host's network down).
func (f *fakeTelegram) down(d time.Duration) {
	addr := f.srv.Listener.Addr().String()
	f.srv.Listener.Close()
	f.srv.CloseClientConnections()
	time.Sleep(d)
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		panic("fake telegram: listen again on " + addr + ": " + err.Error())
	}
	f.srv.Listener = ln
	go f.srv.Config.Serve(ln)
}

func (f *fakeTelegram) count(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

// emailJSON is an e-mail nudge for user (the sink delivers it once the
// app has synced the user's consent).
func (dr *faultDrill) emailJSON(id, user string) json.RawMessage {
	m := map[string]any{}
	for k, v := range dr.email {
		m[k] = v
	}
	delete(m, "not_before")
	delete(m, "expires_at")
	m["id"], m["user_id"], m["channel"] = id, user, "email"
	m["recipient"] = map[string]any{"email": user + "@example.org"}
	m["consent_snapshot"] = map[string]any{"digest_enabled": true, "cadence": "daily", "unsubscribe_ref": "unsub_" + user}
	b, _ := json.Marshal(m)
	return b
}

func (dr *faultDrill) count(what string) {
	dr.mu.Lock()
	dr.statuses[what]++
	dr.mu.Unlock()
}

// post sends body to the running serve; code 0 when none runs or the
// request failed.
func (dr *faultDrill) post(path string, body []byte) (int, []byte) {
	base, _ := dr.base.Load().(string)
	if base == "" {
		return 0, nil
	}
	req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+faultDrillToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := dr.client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// enqueue posts envelopes and acknowledges those serve answered created.
func (dr *faultDrill) enqueue(users []string, envs []json.RawMessage) {
	body, _ := json.Marshal(envs)
	since := dr.acks.tick()
	code, b := dr.post("/v1/envelopes", body)
	switch code {
	case 0:
		time.Sleep(20 * time.Millisecond) // no daemon, or it died: nothing acknowledged
		return
	case http.StatusCreated, http.StatusOK:
	default:
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		json.Unmarshal(b, &e)
		dr.mu.Lock()
		during := dr.lastFault
		if code == http.StatusInsufficientStorage {
			dr.full++
		}
		dr.mu.Unlock()
		dr.count(fmt.Sprintf("%d %s (during or after %s)", code, e.Error.Code, during))
		if e.Error.Code == "consent_denied" {
			base, _ := dr.base.Load().(string)
			dr.syncConsent(base) // the app syncs consent again when told it is missing
		}
		time.Sleep(20 * time.Millisecond)
		return
	}
	var res struct {
		Results []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &res); err != nil || len(res.Results) != len(envs) {
		dr.t.Errorf("POST /v1/envelopes = %d with an answer that does not list the %d envelopes: %.200s", code, len(envs), b)
		return
	}
	for i, r := range res.Results {
		if r.Status == "created" {
			dr.acks.ack(r.ID, users[i], "http", since)
		}
	}
	dr.count(strconv.Itoa(code))
}

func (dr *faultDrill) produceEmail(stop <-chan struct{}, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 4))
	for {
		select {
		case <-stop:
			return
		case <-time.After(10 * time.Millisecond):
		}
		var users []string
		var envs []json.RawMessage
		for n := 1 + rng.IntN(4); n > 0; n-- {
			u := emailUsers[rng.IntN(len(emailUsers))]
			id, _ := dr.acks.next("m")
			users, envs = append(users, u), append(envs, dr.emailJSON(id, u))
		}
		dr.enqueue(users, envs)
	}
}

func (dr *faultDrill) produceReplies(stop <-chan struct{}, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 5))
	for {
		select {
		case <-stop:
			return
		case <-time.After(80 * time.Millisecond):
		}
		u := replyUsers[rng.IntN(len(replyUsers))]
		id, n := dr.acks.next("h")
		dr.enqueue([]string{u}, []json.RawMessage{replyToJSON(id, u, strconv.Itoa(1_000_000+n))})
	}
}

// syncConsent is the app's consent sync with the serve at base: every
// e-mail user consents.
func (dr *faultDrill) syncConsent(base string) {
	for _, u := range emailUsers {
		if base == "" {
			return
		}
		req, _ := http.NewRequest(http.MethodPut, base+"/v1/consent/"+u, strings.NewReader(`{"digest_enabled":true,"email_verified":true,"cadence":"daily"}`))
		req.Header.Set("Authorization", "Bearer "+faultDrillToken)
		req.Header.Set("Content-Type", "application/json")
		if resp, err := dr.client.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
}

func (dr *faultDrill) defect(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	dr.defects = append(dr.defects, s)
	dr.t.Logf("DEFECT: %s", s)
}

func (dr *faultDrill) step(s string) { dr.steps[s]++ }

// run runs an outbox command to its end.
func (dr *faultDrill) run(args ...string) (string, int, time.Duration) {
	start := time.Now()
	out, code := outbox(dr.t, dr.bin, args...)
	noCrashNote(dr, strings.Join(args[:min(2, len(args))], " "), out)
	if args[0] == "doctor" && strings.Contains(out, "rebuilt:") && !slicesContains(args, "--rebuild") {
		dr.rebuilt() // doctor rebuilds an index it cannot open
	}
	return out, code, time.Since(start)
}

// noCrashNote records a Go panic or fault in a command's output.
func noCrashNote(dr *faultDrill, what, out string) {
	if crashed(out) {
		dr.defect("%s crashed: %s", what, crashOf(out))
	}
}

// up starts serve and recovers the way the README says until it runs:
// when serve refuses naming `outbox doctor --rebuild`, that is run; when
// it names `outbox doctor`, doctor is run; "in use" waits for the other
// opener. Then the app syncs consent and the operator resolves the
// unresolved rows. It returns the steps taken.
func (dr *faultDrill) up() string {
	var trail []string
	for attempt := 0; ; attempt++ {
		if attempt == 10 {
			dr.t.Fatalf("serve could not be brought back after: %s", strings.Join(trail, " → "))
		}
		d, out, code := launchServe(dr.t, dr.bin, dr.data, dr.env, dr.args...)
		noCrashNote(dr, "serve", out)
		if d != nil {
			dr.d = d
			dr.cutUnderServe = false
			dr.dropBroken()
			dr.syncConsent(d.base) // before the producers see it: no 409 storm
			dr.base.Store(d.base)
			trail = append(trail, "serve")
			if r := dr.resolve(25); r != "" {
				trail = append(trail, r)
			}
			return strings.Join(trail, " → ")
		}
		msg := firstErrorLine(out)
		switch {
		case strings.Contains(out, "in use"):
			dr.step("serve refused: store in use → wait")
			trail = append(trail, "serve refused (in use)")
			time.Sleep(300 * time.Millisecond)
		case strings.Contains(out, "outbox doctor --rebuild"):
			dr.step("serve refused, names doctor --rebuild → doctor --rebuild")
			trail = append(trail, fmt.Sprintf("serve refused (%s) → doctor --rebuild", reasonOf(msg)))
			dr.rebuild()
		case strings.Contains(out, "outbox doctor"):
			dr.step("serve refused, names doctor → doctor")
			trail = append(trail, fmt.Sprintf("serve refused (%s) → doctor", reasonOf(msg)))
			if out, code, _ := dr.run("doctor", "--data", dr.data); code != 0 && strings.Contains(out, "--rebuild") {
				dr.rebuild()
			}
		default:
			dr.t.Fatalf("serve refused to start (exit %d) without saying what to do:\n%s", code, out)
		}
	}
}

// rebuild runs doctor --rebuild to its end (waiting out another opener).
func (dr *faultDrill) rebuild() {
	for i := 0; i < 10; i++ {
		out, code, took := dr.run("doctor", "--rebuild", "--data", dr.data)
		if code == 0 {
			dr.rebuildTook = took
			dr.rebuilt()
			return
		}
		if !strings.Contains(out, "in use") {
			dr.t.Fatalf("doctor --rebuild = %d:\n%s", code, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	dr.t.Fatal("doctor --rebuild: the store stayed in use")
}

// rebuilt notes that the index was (or may have been) rebuilt from the
// logs: rows whose records a fault took are then gone without a trace.
func (dr *faultDrill) rebuilt() {
	dr.mu.Lock()
	dr.rebuilds = append(dr.rebuilds, dr.acks.tick())
	dr.mu.Unlock()
}

// dropBroken removes the index files rebuilds kept aside (the operator's
// housekeeping once serve runs again): 200 faults would fill the disk.
func (dr *faultDrill) dropBroken() {
	m, _ := filepath.Glob(filepath.Join(dr.data, "index.db.broken-*"))
	for _, f := range m {
		os.Remove(f)
	}
}

func firstErrorLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Error:") {
			return l
		}
	}
	return strings.TrimSpace(out)
}

// reasonOf shortens serve's refusal to a few words for the trail.
func reasonOf(msg string) string {
	switch {
	case strings.Contains(msg, "lost"):
		return "index lost"
	case strings.Contains(msg, "damaged"):
		return "index damaged"
	}
	if len(msg) > 60 {
		msg = msg[:60] + "…"
	}
	return msg
}

// stopServe stops serve with SIGTERM, as an operator does before an
// offline command.
func (dr *faultDrill) stopServe() {
	if dr.d == nil {
		return
	}
	dr.base.Store("")
	d := dr.d
	dr.d = nil
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { <-d.scanned; done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			dr.crashed(fmt.Sprintf("serve exited with %v on SIGTERM", err), d.logs.String())
		}
	case <-time.After(30 * time.Second):
		d.kill()
		dr.defect("serve did not stop on SIGTERM within 30 s")
	}
}

func (dr *faultDrill) killServe() {
	if dr.d == nil {
		return
	}
	dr.base.Store("")
	dr.d.kill()
	dr.d = nil
}

// checkAlive notices a serve that exited by itself (a crash).
func (dr *faultDrill) checkAlive() {
	if dr.d == nil {
		return
	}
	select {
	case <-dr.d.scanned:
		dr.base.Store("")
		err := dr.d.cmd.Wait()
		dr.crashed(fmt.Sprintf("serve exited by itself (%v)", err), dr.d.logs.String())
		dr.d = nil
		dr.up()
	default:
	}
}

// dirMoved moves the data directory away under serve under load (mv
// data data.moved, meant for a stopped serve): serve must stop by itself
// naming where the directory went, and nothing (serve, outbox enqueue)
// may make the data directory again at its old path: what was
// acknowledged there would be split from its index. The operator moves it
// back and starts serve.
func (dr *faultDrill) dirMoved() string {
	if dr.d == nil {
		return "serve not running; " + dr.up()
	}
	aside := dr.data + ".moved"
	d := dr.d
	start := time.Now()
	if err := os.Rename(dr.data, aside); err != nil {
		dr.t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { <-d.scanned; exited <- d.cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Signal(syscall.SIGKILL) // reaped by the Wait above
		err = <-exited
		dr.defect("serve ran on 10 s after its data directory moved")
	}
	took := time.Since(start)
	dr.base.Store("")
	dr.d = nil
	logs := d.logs.String()
	noCrashNote(dr, "serve", logs)
	if !strings.Contains(logs, "was moved to "+aside) {
		dr.defect("serve stopped (%v) after its data directory moved without naming where it went: %s", err, lastLines(logs, 3))
	}
	if _, err := os.Lstat(dr.data); err == nil {
		var made []string
		_ = filepath.WalkDir(dr.data, func(p string, _ os.DirEntry, _ error) error { made = append(made, p); return nil })
		dr.defect("the data directory was made again at its old path after it moved: %v", made)
		dr.t.Fatalf("cannot move the data directory back over what was made at its old path: %v", made)
	}
	if err := os.Rename(aside, dr.data); err != nil {
		dr.t.Fatal(err)
	}
	dr.step("serve stopped itself: its data directory moved → moved back")
	return fmt.Sprintf("moved under serve, which stopped itself in %s; moved back; %s", took.Round(time.Millisecond), dr.up())
}

// knownCut is the store-core defect an index.db emptied under a running
// serve shows: bbolt reads its memory map past the file's new end.
const knownCut = "serve killed after index.db was emptied under it (SIGBUS: bbolt's memory map read past the end of the file, or a bbolt page assertion on the zeros written back)"

// damagedStop is what serve logs when it stops by itself because its
// index was damaged under it (queue/filestore/damage.go).
const damagedStop = "the index was damaged under the running store"

// crashed records a serve that died: the clean stop of a damaged index, a
// known defect or a new one.
func (dr *faultDrill) crashed(what, logs string) {
	if strings.Contains(logs, damagedStop) && !strings.Contains(logs, "panic:") && !strings.Contains(logs, "fatal error:") && !strings.Contains(logs, "SIGBUS") {
		dr.steps["serve stopped itself: its index was damaged under it"]++
		return
	}
	if dr.cutUnderServe && (strings.Contains(logs, "SIGBUS") || strings.Contains(logs, "assertion failed: Page expected to be")) {
		dr.known[knownCut]++
		dr.t.Logf("KNOWN DEFECT (store core): %s: %s", knownCut, firstLine(crashOf(logs)))
		return
	}
	dr.defect("%s: %s", what, crashOf(logs))
}

// crashOf is the start of a Go crash in a daemon's output (its reason and
// the first frames), else its last lines.
func crashOf(logs string) string {
	for _, m := range []string{"panic:", "fatal error:"} {
		if i := strings.Index(logs, m); i >= 0 {
			l := strings.Split(logs[i:], "\n")
			return strings.Join(l[:min(len(l), 24)], "\n")
		}
	}
	return lastLines(logs, 8)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// killDuring starts an offline command and SIGKILLs it within *took (the
// last time it ran to its end); one that ends first updates *took.
func (dr *faultDrill) killDuring(took *time.Duration, args ...string) string {
	cmd := exec.Command(dr.bin, args...)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		dr.t.Fatal(err)
	}
	delay := time.Duration(dr.rng.Int64N(int64(max(*took, 20*time.Millisecond))))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		noCrashNote(dr, args[0], out.String())
		if err == nil {
			*took = time.Since(start)
			return fmt.Sprintf("%s ended before the kill (%s)", strings.Join(args[:len(args)-2], " "), took.Round(time.Millisecond))
		}
		return fmt.Sprintf("%s failed before the kill: %s", args[0], firstErrorLine(out.String()))
	case <-time.After(delay):
		cmd.Process.Signal(syscall.SIGKILL)
		<-done
		return fmt.Sprintf("%s SIGKILLed %s in", strings.Join(args[:len(args)-2], " "), delay.Round(time.Millisecond))
	}
}

// apply applies one fault and recovers; it returns what happened.
func (dr *faultDrill) apply(kind string) string {
	idx := filepath.Join(dr.data, "index.db")
	switch kind {
	case "kill-serve":
		dr.killServe()
		return "SIGKILL; " + dr.up()
	case "pause-serve":
		// A stalled host or a suspended VM: serve stopped (SIGSTOP) for
		// longer than its leases, then resumed; it goes on by itself.
		if dr.d == nil {
			return "serve not running; " + dr.up()
		}
		pause := time.Duration(1200+dr.rng.IntN(1000)) * time.Millisecond
		_ = dr.d.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(pause)
		_ = dr.d.cmd.Process.Signal(syscall.SIGCONT)
		return fmt.Sprintf("SIGSTOP for %v, SIGCONT", pause.Round(time.Millisecond))
	case "kill-rebuild":
		dr.stopServe()
		what := dr.killDuring(&dr.rebuildTook, "doctor", "--rebuild", "--data", dr.data)
		dr.rebuilt() // it may have renamed the new index in before the kill
		return what + "; " + dr.up()
	case "kill-compact":
		dr.stopServe()
		dr.noteEnded()
		what := dr.killDuring(&dr.compactTook, "compact", "--retention", pruneAfter, "--log-rewrite-min", rewriteMin, "--data", dr.data)
		return what + "; " + dr.up()
	case "index-deleted", "index-emptied":
		running := dr.rng.IntN(2) == 0
		if !running {
			dr.stopServe()
		}
		var err error
		if kind == "index-deleted" {
			err = os.Remove(idx)
		} else {
			err = os.Truncate(idx, 0)
		}
		if err != nil {
			dr.t.Fatal(err)
		}
		where := "serve stopped"
		if running {
			dr.cutUnderServe = kind == "index-emptied"
			time.Sleep(time.Duration(100+dr.rng.IntN(300)) * time.Millisecond)
			dr.stopServe()
			where = "under serve, then serve stopped"
		}
		return where + "; " + dr.expectRefusal(kind)
	case "index-restored":
		// A copy taken with serve stopped (a backup), serve run on, then the
		// copy moved back over index.db.
		dr.stopServe()
		saved, err := os.ReadFile(idx)
		if err != nil {
			return "no index to copy; " + dr.up()
		}
		trail := dr.up()
		time.Sleep(time.Duration(200+dr.rng.IntN(400)) * time.Millisecond)
		dr.stopServe()
		if err := os.WriteFile(idx+".restore", saved, 0o600); err != nil {
			dr.t.Fatal(err)
		}
		if err := os.Rename(idx+".restore", idx); err != nil {
			dr.t.Fatal(err)
		}
		return "copy kept; " + trail + "; copy moved back over index.db; " + dr.expectRefusal(kind)
	case "index-scrambled":
		dr.stopServe()
		how := []string{"pages", "truncated", "flipped"}[dr.rng.IntN(3)]
		if fi, err := os.Stat(idx); err == nil && fi.Size() < 3*4096 && how == "pages" {
			how = "flipped"
		}
		scrambleWith(dr.t, idx, how, dr.rng.Uint64)
		out, code, _ := dr.run("doctor", "--data", dr.data)
		return fmt.Sprintf("%s; doctor = %d (%s); %s", how, code, strings.ReplaceAll(strings.TrimSpace(out), "\n", " / "), dr.up())
	case "log-deleted", "log-truncated", "log-replaced":
		return dr.logFault(kind)
	case "disk-full":
		return dr.diskFull()
	case "no-files":
		return dr.noFiles()
	case "second-serve":
		return dr.secondServe()
	case "provider-down":
		hold := time.Duration(500+dr.rng.IntN(1500)) * time.Millisecond
		dr.tg.down(hold)
		return fmt.Sprintf("the Bot API refused connections for %s (connections open were cut)", hold.Round(time.Millisecond))
	case "dir-moved":
		return dr.dirMoved()
	case "log-rewrite":
		return dr.logRewrite()
	case "dir-restored":
		return dr.dirRestored()
	case "concurrent-compact":
		if dr.rng.IntN(2) == 0 {
			// Beside a running serve: compact prunes through it and
			// leaves the index file alone, or is refused.
			dr.noteEnded()
			out, code, _ := dr.run("compact", "--data", dr.data)
			if code == 0 && !strings.Contains(out, "serve is running") {
				dr.defect("compact rewrote the index beside a running serve: %s", strings.TrimSpace(out))
			} else if code != 0 && !strings.Contains(out, "in use") {
				dr.defect("compact beside serve failed otherwise: %s", firstErrorLine(out))
			}
			return fmt.Sprintf("beside serve: exit %d, %s", code, firstLine(out))
		}
		// Racing a starting serve: one opener at a time, never two daemons.
		dr.stopServe()
		cmd := exec.Command(dr.bin, "compact", "--data", dr.data)
		var out lockedBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			dr.t.Fatal(err)
		}
		time.Sleep(time.Duration(dr.rng.IntN(20)) * time.Millisecond)
		trail := dr.up()
		err := cmd.Wait()
		noCrashNote(dr, "compact", out.String())
		return fmt.Sprintf("racing serve's start: compact %v (%s); %s; %s", exitOf(err), firstLine(out.String()), trail, dr.secondServe())
	}
	dr.t.Fatalf("unknown fault %q", kind)
	return ""
}

// logRewrite prunes through the running serve under load (outbox
// compact), which rewrites the logs its pruned records fill for the most
// part while the producers and outbox enqueue append to them; one time in
// two serve is SIGKILLed in the middle of it. Nothing acknowledged may be
// lost, and no pruned record delivered again.
func (dr *faultDrill) logRewrite() string {
	if dr.d == nil {
		return "serve not running; " + dr.up()
	}
	inodes := func() map[string]uint64 {
		m := map[string]uint64{}
		for u, p := range dr.logPath {
			if ino, err := applogInode(p); err == nil {
				m[u] = ino
			}
		}
		return m
	}
	before := inodes()
	dr.noteEnded()
	cmd := exec.Command(dr.bin, "compact", "--data", dr.data)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		dr.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	kill := dr.rng.IntN(2) == 0
	var what string
	var err error
	if kill {
		// Late in the command's time: its start is the process's, the
		// prune is serve's work at its end.
		took := max(dr.pruneTook, 5*time.Millisecond)
		delay := took/2 + time.Duration(dr.rng.Int64N(int64(took/2)))
		select {
		case err = <-done:
			what = fmt.Sprintf("the prune ended before the kill (%s)", time.Since(start).Round(time.Millisecond))
		case <-time.After(delay):
			dr.killServe()
			err = <-done
			what = fmt.Sprintf("serve SIGKILLed %s into the prune", delay.Round(time.Millisecond))
		}
	} else {
		err = <-done
	}
	noCrashNote(dr, "compact", out.String())
	if err == nil {
		dr.pruneTook = time.Since(start)
	} else if !kill {
		dr.defect("compact through serve failed: %s", firstErrorLine(out.String()))
	}
	rewritten := 0
	for u, ino := range inodes() {
		if was, ok := before[u]; ok && was != ino {
			rewritten++
		}
	}
	if rewritten > 0 {
		dr.step("log-rewrite: logs rewritten")
	}
	if what == "" {
		what = "through serve"
	}
	what = fmt.Sprintf("%s: %s; %d logs rewritten", what, firstLine(out.String()), rewritten)
	if dr.d == nil {
		what += "; " + dr.up()
	}
	return what
}

// restoreSpan is a copy of the data directory put back: what was
// acknowledged from the tick the copy began to the tick it was put back
// may be gone with it.
type restoreSpan struct{ copied, restored int }

// dirRestored is an operator's restore of the whole data directory: a
// copy taken with serve stopped (the backup; outbox enqueue goes on
// appending meanwhile), serve run on under load for 0.2–0.6 s, stopped,
// the copy put back in one rename (the sink, the recipients' side, kept as
// it is now), then outbox doctor --after-restore and serve. What the
// copy held as still to deliver and went out since must not go out again.
func (dr *faultDrill) dirRestored() string {
	dr.stopServe()
	backup := dr.data + ".backup"
	span := restoreSpan{copied: dr.acks.tick()}
	// The sink (the recipients' side) stays out of the copy: it is not
	// restored, and on the small file system it would fill the disk.
	sink, held := filepath.Join(dr.data, "sink"), dr.data+".sink"
	if err := os.Rename(sink, held); err != nil && !errors.Is(err, os.ErrNotExist) {
		dr.t.Fatal(err)
	}
	copyDir(dr.t, dr.data, backup)
	if err := os.Rename(held, sink); err != nil && !errors.Is(err, os.ErrNotExist) {
		dr.t.Fatal(err)
	}
	trail := dr.up()
	time.Sleep(time.Duration(200+dr.rng.IntN(400)) * time.Millisecond)
	dr.stopServe()
	if err := os.Rename(sink, filepath.Join(backup, "sink")); err != nil && !errors.Is(err, os.ErrNotExist) {
		dr.t.Fatal(err)
	}
	old := dr.data + ".old"
	if err := os.Rename(dr.data, old); err != nil {
		dr.t.Fatal(err)
	}
	if err := os.Rename(backup, dr.data); err != nil {
		dr.t.Fatal(err)
	}
	span.restored = dr.acks.tick()
	dr.mu.Lock()
	dr.restores = append(dr.restores, span)
	dr.mu.Unlock()
	if err := os.RemoveAll(old); err != nil {
		dr.t.Fatal(err)
	}
	// Its exit code is the check's that follows (log faults before may
	// have left problems); the after-restore line says it did its part.
	out, code, _ := dr.run("doctor", "--after-restore", "--data", dr.data)
	said := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "after restore:") {
			said = l
		}
	}
	if said == "" {
		dr.defect("doctor --after-restore = %d without its after-restore line: %s", code, firstErrorLine(out))
	}
	return fmt.Sprintf("copied; %s; the copy put back; %s; %s", trail, said, dr.up())
}

// goneWithRestore reports whether a was acknowledged while a copy that
// was later put back was taken, or after it.
func (dr *faultDrill) goneWithRestore(a ackInfo) bool {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	for _, s := range dr.restores {
		if a.at > s.copied && a.since < s.restored {
			return true
		}
	}
	return false
}

// applogInode is the inode of the file at path.
func applogInode(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Sys().(*syscall.Stat_t).Ino, nil
}

// noteEnded remembers the rows that ended otherwise than sent (dead
// letters, suppressions, expiries), just before a prune may take them: an
// envelope unknown to the store at the end of the drill is then told
// apart from a lost one. Whatever a prune takes ended at least pruneAfter
// before it, so before this look.
func (dr *faultDrill) noteEnded() {
	out, code := outbox(dr.t, dr.bin, "ls", "--data", dr.data, "--tenant", "*", "--json", "--limit", "1000000")
	if code != 0 {
		dr.t.Fatalf("outbox ls before a prune = %d: %s", code, out)
	}
	var page queue.Page
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		dr.t.Fatalf("outbox ls before a prune: %v: %.200s", err, out)
	}
	for _, r := range page.Rows {
		if r.State.Terminal() && r.State != envelope.StateSent {
			dr.ended[r.Key.EnvelopeID] = string(r.State) + " " + string(r.Class)
		}
	}
}

// noFiles lowers running serve's limit of open files (its soft limit,
// prlimit --pid) to about what it has open, for 0.3–1 s under load, then
// gives it back: enqueues are refused (503 overloaded), nothing
// acknowledged is lost, dead-lettered or left leased (see
// TestFault_TooManyOpenFiles).
func (dr *faultDrill) noFiles() string {
	if dr.d == nil {
		return "serve not running; " + dr.up()
	}
	pid := strconv.Itoa(dr.d.cmd.Process.Pid)
	soft := ""
	if b, err := os.ReadFile("/proc/" + pid + "/limits"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(strings.TrimPrefix(l, "Max open files")); len(f) >= 2 && strings.HasPrefix(l, "Max open files") {
				soft = f[0]
			}
		}
	}
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	if soft == "" || err != nil {
		dr.t.Fatalf("no-files: cannot read serve's limits or descriptors: %v", err)
	}
	limit := len(fds) - 1 + dr.rng.IntN(3) // no descriptor left, or one or two
	if out, err := exec.Command("prlimit", "--pid", pid, fmt.Sprintf("--nofile=%d:", limit)).CombinedOutput(); err != nil {
		dr.t.Fatalf("prlimit: %v %s", err, out)
	}
	hold := time.Duration(300+dr.rng.IntN(700)) * time.Millisecond
	time.Sleep(hold)
	if out, err := exec.Command("prlimit", "--pid", pid, "--nofile="+soft+":").CombinedOutput(); err != nil {
		dr.checkAlive()
		if dr.d != nil {
			dr.t.Fatalf("prlimit (give back): %v %s", err, out)
		}
	}
	dr.checkAlive()
	what := fmt.Sprintf("open files limited to %d for %v, then %s again", limit, hold.Round(time.Millisecond), soft)
	if dr.d == nil {
		what += "; " + dr.up()
	}
	return what
}

// secondServe starts another serve on the running one's data directory:
// it must be refused by the lock.
func (dr *faultDrill) secondServe() string {
	if dr.rng.IntN(2) == 0 {
		return dr.copyServe()
	}
	d2, out, _ := launchServe(dr.t, dr.bin, dr.data, dr.env, dr.args...)
	noCrashNote(dr, "second serve", out)
	if d2 != nil {
		d2.kill()
		dr.defect("a second serve started beside pid %d", dr.d.cmd.Process.Pid)
		return "a second serve STARTED"
	}
	if want := "in use by pid " + strconv.Itoa(dr.d.cmd.Process.Pid); !strings.Contains(out, want) {
		dr.defect("the second serve was refused without %q: %s", want, firstErrorLine(out))
	}
	return "a second serve refused (in use)"
}

// copyServe copies the data directory under load (an operator's cp -a)
// and starts serve on the copy: refused, naming the running original.
func (dr *faultDrill) copyServe() string {
	dir := filepath.Join(dr.t.TempDir(), "copy")
	defer os.RemoveAll(dir)
	copyDir(dr.t, dr.data, dir)
	d2, out, _ := launchServe(dr.t, dr.bin, dir, dr.env, dr.args...)
	noCrashNote(dr, "serve on a copy", out)
	if d2 != nil {
		d2.kill()
		dr.defect("serve started on a copy of the data directory beside pid %d", dr.d.cmd.Process.Pid)
		return "serve on a copy STARTED"
	}
	if want := "is a copy of the store in " + dr.data + ", which pid " + strconv.Itoa(dr.d.cmd.Process.Pid); !strings.Contains(out, want) {
		dr.defect("serve on a copy was refused without %q: %s", want, firstErrorLine(out))
	}
	return "serve on a copy of the data directory refused"
}

func exitOf(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}

// expectRefusal starts serve after the index was lost: it must refuse
// (a serve that indexes the logs as new work redelivers them).
func (dr *faultDrill) expectRefusal(kind string) string {
	trail := dr.up()
	if strings.HasPrefix(trail, "serve") && !strings.HasPrefix(trail, "serve refused") {
		dr.defect("%s: serve started without a rebuild", kind)
	}
	return trail
}

// logFault deletes, truncates or replaces a user's log, under serve or
// while it is stopped; what was in the file is gone (rows become
// dead_letter record_lost when claimed), what comes after must be kept.
func (dr *faultDrill) logFault(kind string) string {
	var users []string
	for u, p := range dr.logPath {
		if _, err := os.Lstat(p); err == nil {
			users = append(users, u)
		}
	}
	if len(users) == 0 {
		return "no log yet"
	}
	sort.Strings(users)
	user := users[dr.rng.IntN(len(users))]
	p := dr.logPath[user]
	running := dr.rng.IntN(2) == 0
	if !running {
		dr.stopServe()
	}
	var what string
	switch kind {
	case "log-deleted":
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			dr.t.Fatal(err)
		}
		what = "removed"
	case "log-truncated":
		fi, err := os.Stat(p)
		if err != nil {
			dr.t.Fatal(err)
		}
		size := int64(0)
		if fi.Size() > 0 && dr.rng.IntN(3) > 0 {
			size = dr.rng.Int64N(fi.Size())
		}
		if err := os.Truncate(p, size); err != nil {
			dr.t.Fatal(err)
		}
		what = fmt.Sprintf("cut from %d to %d bytes", fi.Size(), size)
	case "log-replaced":
		b, err := os.ReadFile(p)
		if err != nil {
			dr.t.Fatal(err)
		}
		what = "replaced by a copy"
		if dr.rng.IntN(2) == 0 { // an older copy: the last lines gone
			lines := bytes.SplitAfter(b, []byte("\n"))
			keep := dr.rng.IntN(len(lines))
			b = bytes.Join(lines[:keep], nil)
			what = fmt.Sprintf("replaced by an older copy (%d of %d lines)", keep, len(lines))
		}
		tmp := filepath.Join(filepath.Dir(p), "replace.tmp")
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			dr.t.Fatal(err)
		}
		if err := os.Rename(tmp, p); err != nil {
			dr.t.Fatal(err)
		}
	}
	what = fmt.Sprintf("%s's log %s (%s)", user, what, map[bool]string{true: "under serve", false: "serve stopped"}[running])
	dr.mu.Lock()
	dr.logFaults[user] = append(dr.logFaults[user], logFault{tick: dr.acks.tick(), what: fmt.Sprintf("fault %d %s: %s", dr.faultNo, kind, what)})
	dr.mu.Unlock()
	out, code, _ := dr.run("doctor", "--data", dr.data)
	what += fmt.Sprintf("; doctor = %d", code)
	if strings.Contains(out, "hint:") {
		what += " with a hint"
	}
	if !running {
		what += "; " + dr.up()
	}
	return what
}

// diskFull fills the small file system under a running serve, keeps the
// load on it, then frees the space (the README: storage_full, free space,
// and what was acknowledged is indexed once there is room).
func (dr *faultDrill) diskFull() string {
	ballast := filepath.Join(dr.mount, "ballast")
	f, err := os.OpenFile(ballast, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		dr.t.Fatal(err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dr.mount, &st); err != nil {
		dr.t.Fatal(err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if free > 1<<20 {
		if err := syscall.Fallocate(int(f.Fd()), 0, 0, free-(1<<20)); err != nil {
			dr.t.Logf("fallocate: %v", err)
		}
	}
	chunk := make([]byte, 4096)
	written := 0
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
		written++
		if written > 1<<16 {
			dr.t.Fatal("disk-full: the file system never filled")
		}
	}
	f.Sync()
	f.Close()
	dr.mu.Lock()
	before := dr.full
	dr.mu.Unlock()
	time.Sleep(time.Duration(300+dr.rng.IntN(700)) * time.Millisecond)
	dr.mu.Lock()
	full := dr.full - before
	dr.mu.Unlock()
	if err := os.Remove(ballast); err != nil {
		dr.t.Fatal(err)
	}
	what := fmt.Sprintf("filled; %d answers 507 storage_full; space freed", full)
	dr.checkAlive()
	if dr.d == nil {
		what += "; " + dr.up()
	}
	return what
}

// resolve is the operator's pass over the unresolved rows: look at the
// provider's side, then resolve --as retry what it never got and --as sent
// (at most sentCap of them; the others are left) what it did.
func (dr *faultDrill) resolve(sentCap int) string {
	base, _ := dr.base.Load().(string)
	retry, sent, cursor := 0, 0, ""
	for {
		u := base + "/v1/envelopes?state=unresolved&limit=1000"
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		req.Header.Set("Authorization", "Bearer "+faultDrillToken)
		resp, err := dr.client.Do(req)
		if err != nil {
			dr.t.Fatalf("list unresolved: %v", err)
		}
		var page queue.Page
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil {
			dr.t.Fatalf("list unresolved = %d %v", resp.StatusCode, err)
		}
		for _, r := range page.Rows {
			as := "retry"
			if dr.received(r.Channel, r.Key) {
				if sent >= sentCap {
					continue
				}
				as = "sent"
			}
			code, b := dr.post("/v1/envelopes/"+url.PathEscape(r.Key.EnvelopeID)+"/resolve", []byte(`{"as":"`+as+`"}`))
			switch {
			case code == 200 && as == "sent":
				sent++
			case code == 200:
				retry++
			case code == 409: // another segment's turn, or it moved meanwhile
			default:
				dr.t.Fatalf("resolve %s --as %s = %d %s", r.Key.EnvelopeID, as, code, b)
			}
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	dr.resolvedSent += sent
	dr.resolvedRetry += retry
	if sent+retry == 0 {
		return ""
	}
	return fmt.Sprintf("resolved %d --as retry, %d --as sent", retry, sent)
}

// received is the provider's side: did the key reach it?
func (dr *faultDrill) received(ch envelope.Channel, k envelope.Key) bool {
	switch ch {
	case envelope.ChannelTelegram:
		return dr.tg.count(k.EnvelopeID) > 0
	case envelope.ChannelEmail:
		_, err := os.Stat(filepath.Join(dr.data, "sink", "email", k.Hash()+".eml"))
		return err == nil
	}
	dr.t.Fatalf("a row on channel %s", ch)
	return false
}

// settle waits until nothing is pending, sending or retryable.
func (dr *faultDrill) settle() queue.Counts {
	deadline := time.Now().Add(5 * time.Minute)
	var c queue.Counts
	stuck := 0
	for {
		out, code := outbox(dr.t, dr.bin, "stats", "--data", dr.data, "--tenant", "*", "--json")
		if code == 0 {
			c = queue.Counts{}
			if json.Unmarshal([]byte(out), &c) == nil && c.Total(envelope.StatePending)+c.Total(envelope.StateRetryable) == 0 {
				if c.Total(envelope.StateSending) == 0 {
					return c
				}
				// The known Recover defect: rows whose records are gone
				// stay sending, re-leased every lease period.
				if dr.onlyLostSending() {
					if stuck++; stuck == 20 { // 4 s: several leases of 1 s
						return c
					}
				} else {
					stuck = 0
				}
			}
		}
		if time.Now().After(deadline) {
			dr.t.Fatalf("deliveries did not settle: %s", out)
		}
		dr.checkAlive()
		time.Sleep(200 * time.Millisecond)
	}
}

// knownStuck is the store-core defect of Recover (queue/filestore
// claim.go): it leases expired rows in its transaction, then reads their
// records; one record gone fails the call, so those rows (and any
// recovered with them) are re-leased every lease period and never end.
const knownStuck = "a sending row whose record a log fault took stays sending for ever (Recover re-leases it, then fails reading the record)"

// onlyLostSending reports whether every sending row's record is gone
// from its log.
func (dr *faultDrill) onlyLostSending() bool {
	base, _ := dr.base.Load().(string)
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/envelopes?state=sending&limit=1000", nil)
	req.Header.Set("Authorization", "Bearer "+faultDrillToken)
	resp, err := dr.client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var page queue.Page
	if json.NewDecoder(resp.Body).Decode(&page) != nil || len(page.Rows) == 0 {
		return false
	}
	for _, r := range page.Rows {
		if dr.recordInLog(r.UserID, r.Key.EnvelopeID) {
			return false
		}
	}
	return true
}

// recordInLog reports whether id's record is in user's log.
func (dr *faultDrill) recordInLog(user, id string) bool {
	b, err := os.ReadFile(dr.logPath[user])
	return err == nil && bytes.Contains(b, []byte(`"id":"`+id+`"`))
}

// finish settles, resolves what the providers never got, and checks every
// acknowledged envelope from the providers' side.
func (dr *faultDrill) finish() {
	t := dr.t
	dr.checkAlive()
	if dr.d == nil {
		dr.up()
	}
	var c queue.Counts
	for pass := 0; pass < 5; pass++ {
		c = dr.settle()
		before := dr.resolvedRetry
		dr.resolve(0)
		if dr.resolvedRetry == before {
			break
		}
	}
	dr.stopServe()
	doctorOut, doctorCode, _ := dr.run("doctor", "--data", dr.data)
	if doctorCode != 0 {
		t.Logf("final outbox doctor = %d:\n%s", doctorCode, doctorOut)
	}

	q, err := filestore.Open(dr.data, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		t.Fatalf("open after the drill: %v", err)
	}
	defer q.Close()
	email := sinkJournal(t, dr.data, "email")
	acked := dr.acks.snapshot()
	var r faultReport
	r.reasons = map[string]int{}
	ids := make([]string, 0, len(acked))
	for id := range acked {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		a := acked[id]
		r.acked++
		if a.via == "http" {
			r.ackedHTTP++
		} else {
			r.ackedEnqueue++
		}
		isEmail := strings.HasPrefix(id, "m-")
		calls := dr.tg.count(id)
		if isEmail {
			k := envelope.Key{Tenant: envelope.DefaultTenant, EnvelopeID: id}
			calls = email[k.Hash()]
			if calls == 0 && dr.received(envelope.ChannelEmail, k) {
				calls = 1 // killed between the sink's file and its journal line
			}
		}
		fault := dr.logFaultAfter(a)
		faulted := fault != ""
		st, gerr := q.Get(context.Background(), "", id)
		state, class := "", envelope.ErrorClass("")
		if gerr == nil {
			state = st.Status
			for _, s := range st.Segments {
				if s.State != envelope.StateSent {
					class = s.Class
					break
				}
			}
		}
		switch {
		case calls == 1:
			r.once++
			if state == string(envelope.StateUnresolved) {
				r.onceUnresolved++
			}
		case calls > 1 && isEmail:
			r.once++
			r.absorbed++
		case calls > 1:
			r.twice++
			t.Errorf("%s (telegram, cannot deduplicate) was sent %d times", id, calls)
		case gerr != nil && dr.ended[id] != "":
			r.reasons["pruned after "+dr.ended[id]]++
		case gerr != nil && dr.goneWithRestore(a):
			r.reasons["acknowledged while the copy was taken or after it: gone with the restore"]++
		case gerr != nil && faulted && dr.rebuiltAfterLogFault(a):
			r.goneRebuilt++
		case gerr != nil && faulted && a.via == "http":
			r.unknownHTTP++
			t.Logf("KNOWN DEFECT (ingest, issue K item 4): %s (user %s) acknowledged by serve, then %s, before the index knew it; no rebuild since: %v", id, a.user, fault, gerr)
		case gerr != nil && faulted:
			r.unknownEnqueue++
		case gerr != nil:
			r.lost++
			t.Errorf("acknowledged %s (%s via %s) lost: %v", id, a.user, a.via, gerr)
		case state == string(envelope.StateUnresolved):
			r.unresolved++
		case state == string(envelope.StateDeadLetter) && class == envelope.ClassRecordLost && !faulted:
			r.lost++
			t.Errorf("acknowledged %s ended record_lost though no fault touched its log", id)
		case state == queue.StatusDelivered:
			r.lost++
			t.Errorf("acknowledged %s is delivered in the index but never reached its provider", id)
		case state == string(envelope.StateSending) && faulted && !dr.recordInLog(a.user, id):
			dr.known[knownStuck]++
			t.Logf("KNOWN DEFECT (store core, Recover): %s (user %s) stays sending after %s took its record", id, a.user, fault)
		case state == string(envelope.StatePending) || state == string(envelope.StateSending) || state == string(envelope.StateRetryable):
			r.lost++
			t.Errorf("acknowledged %s still %s after the drill settled", id, state)
		default:
			r.reasons[state+" "+string(class)]++
		}
	}
	r.faults, r.kinds, r.steps, r.statuses = 0, dr.applied, dr.steps, dr.statuses
	for _, n := range dr.applied {
		r.faults += n
	}
	r.rows = c
	r.resolvedSent, r.resolvedRetry = dr.resolvedSent, dr.resolvedRetry
	r.tgOther = dr.tg.other
	r.doctor = fmt.Sprintf("%d: %s", doctorCode, lastLines(doctorOut, 1))
	r.defects, r.known = dr.defects, dr.known
	table := r.String()
	t.Log("\n" + table)
	if os.Getenv("OUTBOX_FAULTS") != "" {
		fmt.Println(table)
	}
	if p := os.Getenv("OUTBOX_FAULTS_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(table), 0o644); err != nil {
			t.Errorf("write the report: %v", err)
		}
	}
	for _, d := range dr.defects {
		t.Errorf("defect: %s", d)
	}
	if r.tgOther > 0 {
		t.Errorf("%d Telegram calls named no envelope of the drill", r.tgOther)
	}
}

// logFault is a fault of one user's log: when (a tick) and what.
type logFault struct {
	tick int
	what string
}

// rebuiltAfterLogFault reports whether the index was rebuilt after a
// fault of a's log that came after a's request.
func (dr *faultDrill) rebuiltAfterLogFault(a ackInfo) bool {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	for _, f := range dr.logFaults[a.user] {
		if f.tick <= a.since {
			continue
		}
		for _, r := range dr.rebuilds {
			if r > f.tick {
				return true
			}
		}
	}
	return false
}

// logFaultAfter names the first fault of a's user's log after a's
// request started ("" if none).
func (dr *faultDrill) logFaultAfter(a ackInfo) string {
	dr.mu.Lock()
	defer dr.mu.Unlock()
	for _, f := range dr.logFaults[a.user] {
		if f.tick > a.since {
			return f.what
		}
	}
	return ""
}

type faultReport struct {
	faults                          int
	kinds, steps, statuses, reasons map[string]int
	acked, ackedHTTP, ackedEnqueue  int
	once, absorbed, twice, lost     int
	unresolved                      int
	unknownHTTP, unknownEnqueue     int
	goneRebuilt, onceUnresolved     int
	resolvedSent, resolvedRetry     int
	tgOther                         int
	rows                            queue.Counts
	doctor                          string
	defects                         []string
	known                           map[string]int
}

func sortedKeys(m map[string]int) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}

func (r *faultReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| faults applied | %d |\n|---|---|\n", r.faults)
	for _, k := range sortedKeys(r.kinds) {
		fmt.Fprintf(&b, "| &nbsp; %s | %d |\n", k, r.kinds[k])
	}
	fmt.Fprintf(&b, "| envelopes acknowledged | %d (%d by serve over HTTP, %d by outbox enqueue) |\n", r.acked, r.ackedHTTP, r.ackedEnqueue)
	fmt.Fprintf(&b, "| delivered once | %d (%d left unresolved in the index by the operator; %d e-mails delivered again and absorbed by the sink's key) |\n", r.once, r.onceUnresolved, r.absorbed)
	fmt.Fprintf(&b, "| lost | %d |\n", r.lost)
	fmt.Fprintf(&b, "| sent twice to Telegram (cannot deduplicate) | %d |\n", r.twice)
	fmt.Fprintf(&b, "| unresolved, never reached the provider | %d |\n", r.unresolved)
	n := 0
	for _, v := range r.reasons {
		n += v
	}
	fmt.Fprintf(&b, "| ended with a reason | %d |\n", n)
	for _, k := range sortedKeys(r.reasons) {
		fmt.Fprintf(&b, "| &nbsp; %s | %d |\n", k, r.reasons[k])
	}
	fmt.Fprintf(&b, "| never delivered, record taken by a fault of its log, then the index rebuilt (no trace left) | %d |\n", r.goneRebuilt)
	fmt.Fprintf(&b, "| never delivered, unknown to the store after a fault of its log: acknowledged by serve (the ingest known-record defect) | %d |\n", r.unknownHTTP)
	fmt.Fprintf(&b, "| never delivered, unknown to the store after a fault of its log: appended by outbox enqueue, not yet indexed | %d |\n", r.unknownEnqueue)
	fmt.Fprintf(&b, "| operator resolved | %d --as retry (the provider never got them), %d --as sent |\n", r.resolvedRetry, r.resolvedSent)
	for _, k := range sortedKeys(r.steps) {
		fmt.Fprintf(&b, "| recovery: %s | %d |\n", k, r.steps[k])
	}
	for _, k := range sortedKeys(r.statuses) {
		fmt.Fprintf(&b, "| enqueue answers %s | %d |\n", k, r.statuses[k])
	}
	var rows []string
	for _, st := range envelope.States {
		if n := r.rows.Total(st); n > 0 {
			rows = append(rows, fmt.Sprintf("%s %d", st, n))
		}
	}
	fmt.Fprintf(&b, "| rows at the end | %s |\n", strings.Join(rows, ", "))
	fmt.Fprintf(&b, "| final outbox doctor | %s |\n", strings.ReplaceAll(r.doctor, "|", "/"))
	for _, k := range sortedKeys(r.known) {
		fmt.Fprintf(&b, "| known defect: %s | %d |\n", k, r.known[k])
	}
	fmt.Fprintf(&b, "| new defects seen | %d |\n", len(r.defects))
	for _, d := range r.defects {
		fmt.Fprintf(&b, "| &nbsp; %s | |\n", strings.ReplaceAll(d, "|", "/"))
	}
	return b.String()
}
