//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/internal/crashfs"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/httpapi"
	"github.com/outboxhq/outbox/queue/pgstore"
)

// TestDrill_PowerCut is the power-cut drill: outbox serve keeps its data
// directory on a crash file system (internal/crashfs) while envelopes
// arrive over HTTP and from `outbox enqueue` and deliveries run; at a
// random moment the power goes: nothing that was not fsynced survives
// (strict POSIX: a new file or a rename is lost unless its directory was
// synced), serve and the appenders die, and serve starts again on what
// the disk held. The sink, the stand-in for the provider, keeps its
// journal off the crashing disk (a provider's records survive our power
// cut).
//
// Checked: serve starts after every cut by itself (no rebuild, no
// operator); at the end every acknowledged envelope is there, doctor finds
// nothing wrong, and
//
//   - sink (idempotent): every envelope is delivered and nothing is
//     unresolved (the sink always knows). The sink may see a key twice: a
//     claim of an idempotent provider's row is not fsynced, by design
//     (docs/reliability.md), so a cut can take it back and the row is
//     delivered again under the same key; the report counts those.
//   - telegram (a fake Bot API; not idempotent): no key reaches it twice,
//     whatever the cuts took; a call the cut interrupted may end
//     unresolved, everything else is delivered.
//   - torn (Telegram): as telegram, on a harsher disk: each page written
//     since its file's last sync is there, new, or not (crashfs.WriteTorn),
//     as when the power goes in the middle of the kernel's writeback; the
//     index goes back to its checkpoint and serve starts by itself.
//
// Each round stands for a boot of the machine (OUTBOX_TEST_BOOT_ID): the
// processes of this drill cannot see a real restart.
//   - torn-sink: the sink on the torn disk. Its claims are not synced, as
//     its commits, so the cuts find unsynced index transactions: the
//     index goes back to its checkpoint often, and everything must still
//     be delivered.
//   - rebuild (Telegram): every cut comes during `outbox doctor
//     --rebuild`; serve starts after it (or after the rebuild it asks
//     for), and still no key reaches Telegram twice.
//   - postgres (Telegram): the PostgreSQL store, the server's data
//     directory on the same crashing disk as serve's (one host), fsync and
//     synchronous_commit on; after each cut the server recovers, and serve
//     must start on it (its mark file, on that disk too, must not take the
//     crash for a restore from a backup); the telegram checks.
//
// make powercut runs it (OUTBOX_POWERCUT cuts each; root and /dev/fuse).
func TestDrill_PowerCut(t *testing.T) {
	cuts, err := strconv.Atoi(os.Getenv("OUTBOX_POWERCUT"))
	if err != nil || cuts <= 0 {
		t.Skip("set OUTBOX_POWERCUT to a number of power cuts (root, /dev/fuse); make powercut does")
	}
	for _, variant := range []string{"sink", "telegram", "torn", "torn-sink", "rebuild", "postgres"} {
		t.Run(variant, func(t *testing.T) { powerCutDrill(t, cuts, variant) })
	}
}

// consentLog tracks what the drill's consent writer set: per user, the
// last change serve acknowledged and the changes tried since (one may
// have been made durable just before a cut, its answer lost).
type consentLog struct {
	mu    sync.Mutex
	acked map[string]int   // flags, as flagBits encodes them
	tried map[string][]int // since the last acknowledged one
	n     int              // changes acknowledged
}

func flagBits(digest, push, verified bool) int {
	v := 0
	for i, b := range []bool{digest, push, verified} {
		if b {
			v |= 1 << i
		}
	}
	return v
}

// consentLoop replaces the consent of users k0…k4 with one flag set after
// another until stop is closed.
func consentLoop(client *http.Client, base, token string, cl *consentLog, stop <-chan struct{}) {
	for n := 1; ; n++ {
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		u, v := "k"+strconv.Itoa(rand.IntN(5)), n%8
		cl.mu.Lock()
		cl.tried[u] = append(cl.tried[u], v)
		cl.mu.Unlock()
		body := fmt.Sprintf(`{"digest_enabled":%t,"push_enabled":%t,"email_verified":%t}`, v&1 != 0, v&2 != 0, v&4 != 0)
		req, _ := http.NewRequest("PUT", base+"/v1/consent/"+u, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			cl.mu.Lock()
			cl.acked[u], cl.tried[u] = v, nil
			cl.n++
			cl.mu.Unlock()
		}
	}
}

// check compares every user's consent, as serve at base reads it, with
// what was acknowledged (or tried since), and takes it as the new
// acknowledged state.
func (cl *consentLog) check(t *testing.T, client *http.Client, base, token string, cut int) {
	t.Helper()
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for i := 0; i < 5; i++ {
		u := "k" + strconv.Itoa(i)
		req, _ := http.NewRequest("GET", base+"/v1/consent/"+u, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("consent of %s after power cut %d: %v", u, cut, err)
		}
		var c struct {
			Digest   bool `json:"digest_enabled"`
			Push     bool `json:"push_enabled"`
			Verified bool `json:"email_verified"`
		}
		err = json.NewDecoder(resp.Body).Decode(&c)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("consent of %s after power cut %d: %d, %v", u, cut, resp.StatusCode, err)
		}
		got := flagBits(c.Digest, c.Push, c.Verified)
		if got != cl.acked[u] && !slices.Contains(cl.tried[u], got) {
			t.Errorf("consent of %s after power cut %d: flags %03b, want the acknowledged %03b (or one tried since: %v)", u, cut, got, cl.acked[u], cl.tried[u])
		}
		cl.acked[u], cl.tried[u] = got, nil
	}
}

// eraseLog tracks the users the drill's eraser erased (outbox erase
// answered), with the envelopes they had.
type eraseLog struct {
	mu      sync.Mutex
	ids     map[string][]string // user → envelope ids
	pending map[string][]string // erases not answered (the cut), to retry
}

// eraseLoop gives a new user two envelopes and erases the user, again and
// again until stop is closed.
// Each answered erase is signalled on done (when there is room).
func eraseLoop(client *http.Client, bin, base, token, data string, round int, el *eraseLog, done chan<- struct{}, stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		u := fmt.Sprintf("x%d-%d", round, i)
		var ids []string
		for j := 0; j < 2; j++ {
			id := fmt.Sprintf("%s-%d", u, j)
			req, _ := http.NewRequest("POST", base+"/v1/envelopes", bytes.NewReader(replyToJSON(id, u, strconv.Itoa(2_000_000+10*i+j))))
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := client.Do(req)
			if err != nil {
				return // serve is gone
			}
			resp.Body.Close()
			ids = append(ids, id)
		}
		el.mu.Lock()
		el.pending[u] = ids
		el.mu.Unlock()
		if exec.Command(bin, "erase", u, "--data", data).Run() == nil {
			el.mu.Lock()
			el.ids[u] = ids
			delete(el.pending, u)
			el.mu.Unlock()
			select {
			case done <- struct{}{}:
			default:
			}
		}
	}
}

// check asks serve at base for every erased user's envelopes: none may
// be back. Erases the cut left unanswered are run again first, as the app
// would (an erase cut short may have removed the logs already).
func (el *eraseLog) check(t *testing.T, client *http.Client, bin, base, token, data string, cut int) {
	t.Helper()
	el.mu.Lock()
	defer el.mu.Unlock()
	for u, ids := range el.pending {
		if out, err := exec.Command(bin, "erase", u, "--data", data).CombinedOutput(); err != nil {
			t.Fatalf("erase %s again after power cut %d: %v\n%s", u, cut, err, out)
		}
		el.ids[u] = ids
		delete(el.pending, u)
	}
	for u, ids := range el.ids {
		for _, id := range ids {
			req, _ := http.NewRequest("GET", base+"/v1/envelopes/"+id, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("look up %s after power cut %d: %v", id, cut, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("envelope %s of erased user %s after power cut %d: %d, want 404 (an acknowledged erase undone)", id, u, cut, resp.StatusCode)
			}
		}
	}
}

// powerCutDrill runs the drill in one variant: "sink" or "telegram" (the
// provider; the cut comes under load, or during `outbox compact` every
// fourth time), "torn" (telegram on a disk that may hold part of what was
// not synced), "rebuild" (Telegram; every cut comes during `outbox doctor
// --rebuild`, after some load: a rebuild makes every row it cannot know
// unresolved, delivered ones included), or "postgres" (Telegram; the cut
// under load, with the database on the same disk).
func powerCutDrill(t *testing.T, cuts int, variant string) {
	t.Setenv("OUTBOX_TEST_BOOT_ID", "powercut") // set again for each round
	bin := buildBinary(t)
	// Searchable by others: PostgreSQL's server runs as its own user.
	root, err := os.MkdirTemp("", "outbox-powercut-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	mnt := filepath.Join(root, "mnt") // the mount point, the same path for every serve
	disk := filepath.Join(root, "disk-0")
	// serve's data directory: the whole disk, or beside PostgreSQL's (one
	// host: the database and outbox lose power together).
	data, dataOnDisk := mnt, disk
	if variant == "postgres" {
		data, dataOnDisk = filepath.Join(mnt, "outbox"), filepath.Join(disk, "outbox")
	}
	sinkDir := filepath.Join(root, "provider")
	for _, d := range []string{mnt, sinkDir, filepath.Join(dataOnDisk, "sink")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{root, mnt, disk} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	var pg *crashPG
	if variant == "postgres" {
		pg = newCrashPG(t, filepath.Join(disk, "pg"), filepath.Join(root, "pgsock"))
		pg.data = filepath.Join(mnt, "pg") // where it runs
		t.Setenv(EnvDatabaseURL, pg.DSN()) // serve, stats, enqueue and doctor inherit it
	}
	// The file system mounted now, unmounted at the end whatever fails:
	// this clean-up, registered before any serve's, runs after them.
	var mounted *crashfs.FS
	mount := func(cut int) *crashfs.FS {
		c, err := crashfs.Mount(disk, mnt)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount(sinkDir, filepath.Join(data, "sink"), "", syscall.MS_BIND, ""); err != nil {
			_ = c.Unmount()
			t.Fatalf("bind the sink's directory: %v", err)
		}
		mounted = c
		if pg != nil {
			pg.start(t, cut)
		}
		return c
	}
	unmount := func(c *crashfs.FS) {
		mounted = nil
		if pg != nil {
			pg.kill()
		}
		if err := syscall.Unmount(filepath.Join(data, "sink"), 0); err != nil {
			t.Errorf("unbind the sink's directory: %v", err)
		}
		if err := c.Unmount(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() {
		if mounted != nil {
			unmount(mounted)
		}
	})

	const token = "drill-token-0123456789"
	env := []string{"INTERNAL_OUTBOX_TOKEN=" + token}
	args := []string{"--lease", "1s", "--sink-journal", "--rescan", "200ms"}
	var tg *fakeTelegram
	pause := time.Duration(0) // between two envelopes of a producer
	sink := variant == "sink" || variant == "torn-sink"
	if !sink {
		// Telegram takes 30 messages/s in all: a load it can drain.
		pause = 40 * time.Millisecond
		tg = newFakeTelegram(t, faultDrillBot, 1)
		env = append(env, "OUTBOX_TELEGRAM_TOKEN="+faultDrillBot)
		args = append(args, "--telegram-api", tg.srv.URL)
	}
	envDir := t.TempDir()
	acks := newAckSet()
	rebuiltAgain, wentBack := 0, 0
	// start starts serve; only after a cut during a rebuild may it ask for
	// one (the operator's step, done here).
	start := func(cut int, afterRebuild bool) *daemon {
		d, out, _ := launchServe(t, bin, data, env, args...)
		if strings.Contains(out, "rolled_back") { // the index went back to its checkpoint
			wentBack++
		}
		if d == nil && afterRebuild && strings.Contains(out, "doctor --rebuild") {
			t.Logf("after power cut %d serve asked for a rebuild: %s", cut, firstErrorLine(out))
			rebuiltAgain++
			if out, code := outbox(t, bin, "doctor", "--rebuild", "--data", data); code != 0 {
				t.Fatalf("doctor --rebuild after power cut %d: %s", cut, out)
			}
			d, out, _ = launchServe(t, bin, data, env, args...)
		}
		if d == nil {
			t.Fatalf("serve did not start after power cut %d:\n%s", cut, out)
		}
		return d
	}
	// A chat per envelope: Telegram paces each chat.
	mk := func(id, u string, n int) []byte { return replyToJSON(id, u, strconv.Itoa(1_000_000+n)) }
	client := &http.Client{Timeout: 2 * time.Second}
	consent := &consentLog{acked: map[string]int{}, tried: map[string][]int{}}
	erased := &eraseLog{ids: map[string][]string{}, pending: map[string][]string{}}
	// The unsubscribe key, made at the first start, signs the links of
	// every e-mail sent: a cut must not replace it.
	var key []byte
	sameKey := func(cut int) {
		b, err := os.ReadFile(filepath.Join(data, httpapi.KeyFile))
		switch {
		case err != nil:
			t.Fatalf("unsubscribe key after power cut %d: %v", cut, err)
		case key == nil:
			key = b
		case !bytes.Equal(b, key):
			t.Fatalf("the unsubscribe key changed after power cut %d: every unsubscribe link sent before it is broken", cut)
		}
	}
	fileSyncs, dirSyncs := 0, 0
	tornRNG := rand.New(rand.NewPCG(rand.Uint64(), 3))
	compacts, compactsCut, compactTook := 0, 0, 100*time.Millisecond
	rebuilds, rebuildsCut, rebuildTook, lastRebuild := 0, 0, 100*time.Millisecond, false
	for k := 0; k < cuts; k++ {
		// Each round is a boot of the machine: the store's index goes back
		// to its checkpoint after a cut (and only after one), as after a
		// restart of the machine.
		os.Setenv("OUTBOX_TEST_BOOT_ID", fmt.Sprintf("powercut-%d", k))
		c := mount(k)
		d := start(k, lastRebuild)
		lastRebuild = false
		consent.check(t, client, d.base, token, k)
		erased.check(t, client, bin, d.base, token, data, k)
		sameKey(k)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		// Users old and new: a user's first envelope makes its log.
		user := func(p string) string {
			if rand.IntN(4) == 0 {
				return fmt.Sprintf("%s%d-%d", p, k, rand.IntN(3))
			}
			return p + strconv.Itoa(rand.IntN(5))
		}
		for p := 0; p < 2; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				postLoop(client, d.base, token, acks, stop, pause, func() string { return user("u") }, mk)
			}()
		}
		wg.Add(3)
		go func() {
			defer wg.Done()
			consentLoop(client, d.base, token, consent, stop)
		}()
		erasedNow := make(chan struct{}, 1)
		go func() {
			defer wg.Done()
			eraseLoop(client, bin, d.base, token, data, k, erased, erasedNow, stop)
		}()
		go func() {
			defer wg.Done()
			appendLoop(bin, data, envDir, acks, stop, pause, func() (string, string) { return "c", user("c") }, mk)
		}()
		wait := time.Duration(150+rand.IntN(600)) * time.Millisecond
		if k%4 == 1 {
			// Right after an erase was answered (the first one after some
			// load; within 2 s).
			time.Sleep(wait / 2)
			select {
			case <-erasedNow:
			default:
			}
			select {
			case <-erasedNow:
			case <-time.After(2 * time.Second):
			}
		} else {
			time.Sleep(wait)
		}
		if variant == "torn" && k%2 == 0 {
			// Within a few milliseconds of a Telegram call: its commit,
			// not synced, is being written (the index must go back to its
			// checkpoint, whatever of it the disk kept).
			tg.waitCall(time.Second)
			time.Sleep(time.Duration(1+rand.IntN(4)) * time.Millisecond)
		}
		if pg == nil && (k%4 == 3 || variant == "rebuild") {
			// Every fourth cut comes during `outbox compact`, which
			// rewrites the index file beside the old one and renames it
			// over it, or, with Telegram (rows of unknown fate may end
			// unresolved there), every other time during `outbox doctor
			// --rebuild`; serve stopped for it.
			close(stop)
			wg.Wait()
			d.stop(t)
			if variant == "rebuild" {
				rebuilds++
				lastRebuild = true
				if cutDuring(c, &rebuildTook, exec.Command(bin, "doctor", "--rebuild", "--data", data)) {
					rebuildsCut++
				}
			} else {
				compacts++
				if cutDuring(c, &compactTook, exec.Command(bin, "compact", "--data", data)) {
					compactsCut++
				}
			}
		} else {
			c.Cut() // the power goes: what was not synced is gone
			d.kill()
			if pg != nil {
				pg.kill()
			}
			close(stop)
			wg.Wait()
		}
		fs, ds := c.Syncs()
		fileSyncs, dirSyncs = fileSyncs+fs, dirSyncs+ds
		unmount(c)
		next := filepath.Join(root, "disk-"+strconv.Itoa(k+1))
		write := c.WriteDurable
		if variant == "torn" || variant == "torn-sink" {
			write = func(dst string) error { return c.WriteTorn(dst, tornRNG) }
		}
		if err := write(next); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(disk); err != nil {
			t.Fatal(err)
		}
		disk = next
	}

	// The last start: no more cuts; let everything settle.
	os.Setenv("OUTBOX_TEST_BOOT_ID", fmt.Sprintf("powercut-%d", cuts))
	c := mount(cuts)
	d := start(cuts, lastRebuild)
	consent.check(t, client, d.base, token, cuts)
	erased.check(t, client, bin, d.base, token, data, cuts)
	sameKey(cuts)
	counts := settle(t, bin, data)
	d.stop(t)
	if out, code := outbox(t, bin, "doctor", "--data", data); code != 0 {
		t.Fatalf("doctor after the drill: %s", out)
	}
	per := sinkJournal(t, data, "telegram")
	var q queue.Store
	if pg != nil {
		q, err = pgstore.Open(context.Background(), pg.DSN(), &pgstore.Options{NoMigrate: true})
	} else {
		// From the backing directory, unmounted: bbolt maps the index, and
		// a page fault served by this very process can deadlock with its
		// garbage collector.
		unmount(c)
		q, err = filestore.Open(disk, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	}
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	acked := acks.snapshot()
	lost, unresolved, delivered := checkAcked(t, q, acked)
	if tg != nil {
		tg.mu.Lock()
		per = maps.Clone(tg.calls)
		tg.mu.Unlock()
	}
	again, rows := repeated(per), rowsIn(counts)
	report := fmt.Sprintf("power-cut drill (%s): cuts=%d acknowledged=%d rows=%d delivered=%d lost=%d unresolved=%d deliver_calls=%d keys_delivered_again=%d consent_changes=%d users_erased=%d compacts=%d compacts_cut=%d rebuilds=%d rebuilds_cut=%d rebuilt_again=%d index_went_back=%d file_syncs=%d dir_syncs=%d",
		variant, cuts, len(acked), rows, delivered, lost, unresolved, len(per), again, consent.n, len(erased.ids), compacts, compactsCut, rebuilds, rebuildsCut, rebuiltAgain, wentBack, fileSyncs, dirSyncs)
	t.Log(report)
	fmt.Println(report)
	switch {
	case lost > 0:
		t.Fatalf("drill failed, acknowledged envelopes lost: %s", report)
	case tg == nil && (unresolved > 0 || delivered != len(acked)):
		t.Fatalf("drill failed, not everything delivered by a provider that always knows: %s", report)
	case tg != nil && again > 0:
		t.Fatalf("drill failed, keys sent twice to a provider that cannot tell: %s", report)
	case tg != nil && delivered+unresolved != len(acked):
		t.Fatalf("drill failed, envelopes neither delivered nor unresolved: %s", report)
	}
}

// cutDuring runs cmd and cuts the power on c at a random moment within
// twice *took (the time such a run last took), killing cmd; a run that
// ends first sets *took, and the power is cut after it (the cut then finds
// what its end left). It reports whether the cut came while cmd ran.
func cutDuring(c *crashfs.FS, took *time.Duration, cmd *exec.Cmd) bool {
	start := time.Now()
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			*took = time.Since(start)
		}
		c.Cut()
		return false
	case <-time.After(time.Duration(rand.Int64N(int64(max(2**took, 10*time.Millisecond))))):
		c.Cut()
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		return true
	}
}
