package filestore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// durableIndex follows what a power cut would leave of index.db: its
// content as of the last sync (syncDB), and now.
type durableIndex struct {
	mu     sync.Mutex
	path   string
	synced []byte
}

// install makes syncDB record the file after each sync, until the test ends.
func (d *durableIndex) install(t *testing.T) {
	old := syncDB
	syncDB = func(db *bolt.DB) error {
		err := old(db)
		if err == nil && db.Path() == d.path {
			b, rerr := os.ReadFile(d.path)
			if rerr == nil {
				d.mu.Lock()
				d.synced = b
				d.mu.Unlock()
			}
		}
		return err
	}
	t.Cleanup(func() { syncDB = old })
}

// torn returns index.db as a power cut could leave it: every page written
// since the last sync new or as it was (zeros past the synced end), at
// one chance in two each (crashfs.WriteTorn's model).
func (d *durableIndex) torn(t *testing.T, r *rand.Rand) []byte {
	t.Helper()
	cur, err := os.ReadFile(d.path)
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	old := d.synced
	d.mu.Unlock()
	const ps = 4096
	out := bytes.Clone(cur)
	for off := 0; off < len(cur); off += ps {
		end := min(off+ps, len(cur))
		var was []byte
		if off < len(old) {
			was = old[off:min(end, len(old))]
		}
		if bytes.Equal(was, cur[off:end]) || r.IntN(2) == 0 {
			continue
		}
		clear(out[off:end])
		copy(out[off:end], was)
	}
	return out
}

// fakeBoot makes bootID answer what the returned value holds ("boot-0"
// first) until the test ends: a test's restart of the machine.
func fakeBoot(t *testing.T) *atomic.Value {
	var boot atomic.Value
	boot.Store("boot-0")
	old := bootID
	bootID = func() string { return boot.Load().(string) }
	t.Cleanup(func() { bootID = old })
	return &boot
}

// unsyncedOptions are openUnsynced's: claims of chat replies skip fsync.
func unsyncedOptions() *Options {
	return &Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, DisableWatcher: true, RescanInterval: -1,
		UnsyncedClaims: []envelope.Channel{envelope.ChannelTelegram}}
}

// A power cut while unsynced index transactions are written out leaves
// the disk with any mix of their pages (bbolt puts no barrier between a
// transaction's pages and its meta page when it does not sync): without
// the checkpoint such an index is refused as damaged or, worse, read as a
// tree of stale pages. Each round here runs unsynced index updates,
// claims and commits and an acknowledged consent change, cuts the power
// (the index torn as above), and opens a copy as after a restart of the
// machine: it must open by itself, pass doctor's check, and hold every
// acknowledged envelope and consent. The same torn copies opened as if the
// machine had not restarted (the checkpoint not used) must show damage,
// or the rounds test nothing.
func TestCheckpoint_PowerCutNeverTearsTheIndex(t *testing.T) {
	dir := t.TempDir()
	defer func(d time.Duration) { syncDelay = d }(syncDelay)
	syncDelay = time.Hour // no timed sync: every round's writes stay unsynced
	boot := fakeBoot(t)
	d := &durableIndex{path: filepath.Join(dir, IndexFile)}
	d.install(t)

	opts := unsyncedOptions()
	q, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	var acked, claimed []string
	var consent queue.ConsentFlags
	damaged := 0
	const rounds = 24
	for round := range rounds {
		for i := range 2 + r.IntN(6) {
			id := fmt.Sprintf("r%d-%d", round, i)
			if _, err := q.Enqueue(ctx, faultEnvelope(id, fmt.Sprintf("u%d", r.IntN(4)))); err != nil {
				t.Fatal(err)
			}
			acked = append(acked, id)
		}
		ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 3, Channels: []envelope.Channel{envelope.ChannelTelegram}})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			if err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent}); err != nil {
				t.Fatal(err)
			}
		}
		if round%3 == 0 { // a synced write: a checkpoint now covers the round so far
			consent = queue.ConsentFlags{DigestEnabled: round%2 == 0, PushEnabled: true, By: "test"}
			if err := q.SetConsent(ctx, "", "c", consent); err != nil {
				t.Fatal(err)
			}
			if _, err := q.Enqueue(ctx, faultEnvelope(fmt.Sprintf("r%d-after", round), "u0")); err != nil {
				t.Fatal(err)
			}
			acked = append(acked, fmt.Sprintf("r%d-after", round))
			// A claim with a channel not in UnsyncedClaims is synced: its
			// row must not come back pending (a blind redelivery).
			ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Hour, Limit: 1, Channels: []envelope.Channel{envelope.ChannelTelegram, envelope.ChannelEmail}})
			if err != nil || len(ls) != 1 {
				t.Fatalf("synced claim: %d leases, %v", len(ls), err)
			}
			claimed = append(claimed, ls[0].Key.EnvelopeID)
		}
		q.barrier()
		torn := d.torn(t, r)

		// After a restart of the machine.
		cut := filepath.Join(t.TempDir(), "data")
		copyTree(t, dir, cut)
		if err := os.WriteFile(filepath.Join(cut, IndexFile), torn, 0o600); err != nil {
			t.Fatal(err)
		}
		boot.Store(fmt.Sprintf("boot-%d", round+1))
		c, err := Open(cut, opts)
		if err != nil {
			t.Fatalf("round %d: Open after the power cut: %v", round, err)
		}
		rep, err := c.Check()
		if err != nil || !rep.OK() {
			t.Fatalf("round %d: doctor after the power cut: %v, %+v", round, err, rep)
		}
		for _, id := range acked {
			if _, err := c.Get(ctx, "", id); err != nil {
				t.Fatalf("round %d: acknowledged envelope %s after the power cut: %v", round, id, err)
			}
		}
		for _, id := range claimed {
			st, err := c.Get(ctx, "", id)
			if err != nil || st.Status != string(envelope.StateSending) {
				t.Fatalf("round %d: envelope %s, claimed with a sync, after the power cut: %v, %v; want sending", round, id, st, err)
			}
		}
		if got, err := c.Consent(ctx, "", "c"); err != nil || got.ConsentFlags != consent {
			t.Fatalf("round %d: consent after the power cut: %+v, %v; want %+v", round, got.ConsentFlags, err, consent)
		}
		c.Close()
		boot.Store("boot-0")

		// As if the machine had not restarted: the torn index as it is.
		same := filepath.Join(t.TempDir(), "data")
		copyTree(t, dir, same)
		if err := os.WriteFile(filepath.Join(same, IndexFile), torn, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(same, opts)
		switch {
		case err != nil: // damaged, or read as a tree of stale pages (taken for a lost index)
			damaged++
		default:
			if rep, err := s.Check(); err != nil || !rep.OK() {
				damaged++
			}
			s.Close()
		}
	}
	t.Logf("%d rounds; without the checkpoint, %d torn indexes were damaged", rounds, damaged)
	if damaged == 0 {
		t.Fatal("no torn index was damaged without the checkpoint: the rounds tear nothing")
	}
}

// cutCopy copies the data directory dir as a crash of the process leaves
// it (the page cache kept every write).
func cutCopy(t *testing.T, dir string) string {
	t.Helper()
	cut := filepath.Join(t.TempDir(), "data")
	copyTree(t, dir, cut)
	return cut
}

// Only a restart of the machine takes the index back to its checkpoint:
// after a crash of the process alone (the same boot) every write is there,
// and the unsynced ones are kept.
func TestCheckpoint_OnlyARestartOfTheMachineGoesBack(t *testing.T) {
	dir := t.TempDir()
	defer func(d time.Duration) { syncDelay = d }(syncDelay)
	syncDelay = time.Hour
	boot := fakeBoot(t)
	opts := unsyncedOptions()
	q, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, faultEnvelope("e1", "u1")); err != nil {
		t.Fatal(err)
	}
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Hour, Limit: 1, Channels: []envelope.Channel{envelope.ChannelTelegram}})
	if err != nil || len(ls) != 1 {
		t.Fatalf("Claim: %d, %v", len(ls), err)
	}
	if err := q.Commit(ctx, ls[0], queue.Outcome{State: envelope.StateSent}); err != nil { // unsynced
		t.Fatal(err)
	}
	q.barrier()
	status := func(dir string) string {
		t.Helper()
		c, err := Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		st, err := c.Get(ctx, "", "e1")
		if err != nil {
			t.Fatal(err)
		}
		return st.Status
	}
	if got := status(cutCopy(t, dir)); got != queue.StatusDelivered {
		t.Errorf("after a crash of the process: %s, want %s (the unsynced commit kept)", got, queue.StatusDelivered)
	}
	boot.Store("boot-1")
	if got := status(cutCopy(t, dir)); got != string(envelope.StatePending) {
		t.Errorf("after a restart of the machine: %s, want %s (back to the checkpoint, before the unsynced claim)", got, envelope.StatePending)
	}
}

// Every swap of index.db drops the checkpoint first (the old file's must
// never be applied to the new one): a rebuild, a compaction, and an
// Erase's rewrite, which takes the new file's first checkpoint at once.
func TestCheckpoint_SwapsDropIt(t *testing.T) {
	boot := fakeBoot(t)
	for _, swap := range []string{"rebuild", "compact", "erase"} {
		t.Run(swap, func(t *testing.T) {
			dir := t.TempDir()
			storeWith(t, dir, 6)
			before, _ := readCheckpoint(dir)
			if before.txid == 0 {
				t.Fatal("no checkpoint after a clean close")
			}
			switch swap {
			case "rebuild":
				if _, err := Rebuild(dir, nil); err != nil {
					t.Fatal(err)
				}
			case "compact":
				if _, _, err := CompactFile(dir); err != nil {
					t.Fatal(err)
				}
			case "erase":
				q := openFault(t, dir)
				if err := q.Erase(context.Background(), "", "u1"); err != nil {
					t.Fatal(err)
				}
				c, _ := readCheckpoint(dir)
				if c.txid == 0 || c.seq <= before.seq+2 {
					t.Fatalf("checkpoint after the rewrite: tx %d seq %d (before: seq %d); want the new file's", c.txid, c.seq, before.seq)
				}
				var m boltMeta
				err := mapIndex(filepath.Join(dir, IndexFile), func(data []byte) (err error) { m, err = currentMeta(data); return err })
				if err != nil || m.txid != c.txid || !bytes.Equal(c.meta[:], func() []byte {
					b, _ := os.ReadFile(filepath.Join(dir, IndexFile))
					return b[(c.txid%2)*m.pageSize:][:ckptMetaSize]
				}()) {
					t.Fatalf("the checkpoint does not name the rewritten file's last commit (tx %d, %v)", m.txid, err)
				}
				q.Close()
				return
			}
			if c, ok := readCheckpoint(dir); ok && c.txid != 0 {
				t.Fatalf("checkpoint of tx %d left after the %s", c.txid, swap)
			}
			boot.Store("boot-" + swap)
			defer boot.Store("boot-0")
			if from, _, err := rollBack(dir); from != 0 || err != nil {
				t.Fatalf("rollBack after the %s = %d, %v; want nothing", swap, from, err)
			}
			openFault(t, dir).Close()
		})
	}
}

// A clean Close leaves a checkpoint of the last commit: a restart of the
// machine after it loses nothing.
func TestCheckpoint_CloseCoversEveryCommit(t *testing.T) {
	dir := t.TempDir()
	boot := fakeBoot(t)
	opts := unsyncedOptions()
	q, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, faultEnvelope("e1", "u1")); err != nil {
		t.Fatal(err)
	}
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Hour, Limit: 1, Channels: []envelope.Channel{envelope.ChannelTelegram}})
	if err != nil || len(ls) != 1 {
		t.Fatalf("Claim: %d, %v", len(ls), err)
	}
	if err := q.Commit(ctx, ls[0], queue.Outcome{State: envelope.StateSent}); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	boot.Store("boot-1")
	if from, to, err := rollBack(dir); from != 0 || err != nil {
		t.Fatalf("rollBack after a clean close = %d → %d, %v; want nothing to do", from, to, err)
	}
	c, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if st, err := c.Get(ctx, "", "e1"); err != nil || st.Status != queue.StatusDelivered {
		t.Fatalf("after a clean close and a restart: %v, %v; want delivered", st, err)
	}
}

// Past pinLimit the store pins no checkpoint (bbolt could not map the
// grown file again while a pin holds its map) and bbolt syncs every
// commit itself; the checkpoint file then names no transaction, and Open
// never goes back.
func TestCheckpoint_PastThePinLimitEveryCommitIsSynced(t *testing.T) {
	dir := t.TempDir()
	defer func(l int) { pinLimit = l }(pinLimit)
	pinLimit = 1
	boot := fakeBoot(t)
	q := openUnsynced(t, dir)
	defer q.Close()
	ctx := context.Background()
	var synced []bool
	hook := func() error { synced = append(synced, !q.db.Load().NoSync); return nil }
	q.beforeCommit.Store(&hook)
	if _, err := q.Enqueue(ctx, faultEnvelope("e1", "u1")); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Hour, Limit: 1, Channels: []envelope.Channel{envelope.ChannelTelegram}}); err != nil {
		t.Fatal(err)
	}
	q.barrier()
	q.beforeCommit.Store(nil)
	if !q.pinOff || q.pin != nil {
		t.Fatalf("pinOff %v, pin %v: want no pin", q.pinOff, q.pin)
	}
	for i, s := range synced {
		if !s {
			t.Errorf("transaction %d committed without bbolt's sync", i)
		}
	}
	if c, ok := readCheckpoint(dir); !ok || c.txid != 0 {
		t.Fatalf("checkpoint %+v, %v: want one that names no transaction", c.txid, ok)
	}
	boot.Store("boot-1")
	if from, _, err := rollBack(cutCopy(t, dir)); from != 0 || err != nil {
		t.Fatalf("rollBack = %d, %v; want nothing to do", from, err)
	}
}

// Where the process may not map pinMapSize (a limit on its address space),
// the store opens with a map fitted to the file and pins nothing: bbolt
// syncs every commit, and the checkpoint file names no transaction.
func TestCheckpoint_WithoutTheLargeMapEveryCommitIsSynced(t *testing.T) {
	dir := t.TempDir()
	storeWith(t, dir, 3) // an earlier run's checkpoint, which must not stay
	defer func(s int) { pinMapSize = s }(pinMapSize)
	pinMapSize = 1 << 47 // more than a process's address space: ENOMEM
	q := openUnsynced(t, dir)
	defer q.Close()
	var synced []bool
	hook := func() error { synced = append(synced, !q.db.Load().NoSync); return nil }
	q.beforeCommit.Store(&hook)
	if _, err := q.Enqueue(context.Background(), faultEnvelope("e1", "u1")); err != nil {
		t.Fatal(err)
	}
	q.barrier()
	q.beforeCommit.Store(nil)
	if !q.pinOff || q.pin != nil || len(synced) == 0 || !synced[0] {
		t.Fatalf("pinOff %v, pin %v, synced %v: want bbolt's syncs and no pin", q.pinOff, q.pin, synced)
	}
	if c, ok := readCheckpoint(dir); !ok || c.txid != 0 {
		t.Fatalf("checkpoint of tx %d: want one that names no transaction", c.txid)
	}
}

// A store first opened by this version on a full disk has no room for a
// new checkpoint file: it starts anyway (as it did before the checkpoint),
// with every index transaction synced by bbolt, and keeps its checkpoints
// from the next start with room on.
func TestCheckpoint_FullDiskAtTheFirstStart(t *testing.T) {
	dir := t.TempDir()
	storeWith(t, dir, 3)
	if err := os.Remove(filepath.Join(dir, CheckpointFile)); err != nil { // from before the checkpoint
		t.Fatal(err)
	}
	defer func(w func(*os.File, []byte, int64) (int, error)) { writeCkptAt = w }(writeCkptAt)
	writeCkptAt = func(*os.File, []byte, int64) (int, error) {
		return 0, &os.PathError{Op: "write", Path: CheckpointFile, Err: syscall.ENOSPC}
	}
	q := openUnsynced(t, dir)
	if !q.pinOff || q.pin != nil {
		t.Fatalf("pinOff %v, pin %v on a full disk: want no pin", q.pinOff, q.pin)
	}
	var synced []bool
	hook := func() error { synced = append(synced, !q.db.Load().NoSync); return nil }
	q.beforeCommit.Store(&hook)
	if _, err := q.Enqueue(context.Background(), faultEnvelope("e1", "u1")); err != nil {
		t.Fatal(err)
	}
	q.barrier()
	q.beforeCommit.Store(nil)
	if len(synced) == 0 || !synced[0] {
		t.Fatalf("transactions synced by bbolt: %v", synced)
	}
	if _, ok := readCheckpoint(dir); ok {
		t.Fatal("a checkpoint on a full disk")
	}
	q.Close()
	writeCkptAt = func(f *os.File, b []byte, off int64) (int, error) { return f.WriteAt(b, off) }
	q = openUnsynced(t, dir)
	defer q.Close()
	if q.pinOff || q.pin == nil {
		t.Fatal("no checkpoint once the disk has room")
	}
}

// The open store's Check runs bbolt's own check, which reads the free
// list that every commit changes (and a pinned checkpoint keeps full of
// pending pages), between the writer's commits: run beside enqueues,
// claims and commits it neither races with them (go test -race) nor
// stops serve with "concurrent map iteration and map write", as the fault
// drill once saw.
func TestCheckpoint_CheckBesideWrites(t *testing.T) {
	q := openUnsynced(t, t.TempDir())
	defer q.Close()
	ctx := context.Background()
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := q.Enqueue(ctx, faultEnvelope(fmt.Sprintf("w%d", i), fmt.Sprintf("u%d", i%3))); err != nil {
				done <- err
				return
			}
			ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 2, Channels: []envelope.Channel{envelope.ChannelTelegram}})
			if err != nil {
				done <- err
				return
			}
			for _, l := range ls {
				if err := q.Commit(ctx, l, queue.Outcome{State: envelope.StateSent}); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	for range 30 {
		rep, err := q.Check()
		if err != nil || !rep.OK() {
			close(stop)
			t.Fatalf("Check beside writes: %v, %+v", err, rep)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
