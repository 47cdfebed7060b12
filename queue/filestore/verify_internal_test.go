package filestore

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// corrupt damages the index file at path in one of the ways a disk or an
// operator does.
func corrupt(t *testing.T, path, kind string, r *rand.Rand) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const ps = 4096
	switch kind {
	case "pages": // a few whole pages overwritten with random bytes
		for i := 0; i < 1+r.IntN(3); i++ {
			p := r.IntN(len(b) / ps)
			for j := p * ps; j < (p+1)*ps && j < len(b); j++ {
				b[j] = byte(r.Uint32())
			}
		}
	case "truncated": // cut at a random page boundary
		b = b[:ps*(1+r.IntN(len(b)/ps-1))]
	case "flipped": // random bytes flipped
		for i := 0; i < 1+r.IntN(200); i++ {
			b[r.IntN(len(b))] ^= byte(1 + r.IntN(255))
		}
	case "headers": // a page header's id, flags, count or overflow
		p := 2 + r.IntN(len(b)/ps-2)
		b[p*ps+r.IntN(16)] ^= byte(1 + r.IntN(255))
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Whatever the damage, Open, Check and Known answer with an error or a
// working store, never a panic or a crash (a crash kills this test
// binary, a leaked bbolt goroutine fails goleak), and Rebuild always
// restores a store with every row unresolved.
func TestOpen_CorruptIndexNeverCrashes(t *testing.T) {
	src := t.TempDir()
	storeWith(t, src, 40)
	// Compacted: no free pages, whose damage nothing reads, dilute the
	// corruptions (a checkpoint keeps the pages it pins from reuse).
	if _, _, err := CompactFile(src); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(src, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	rounds := 20 // make index-faults: more
	if n, err := strconv.Atoi(os.Getenv("OUTBOX_INDEX_FAULT_ROUNDS")); err == nil && n > 0 {
		rounds = 10 * n
	}
	if testing.Short() {
		rounds = 5
	}
	refused := map[string]int{}
	for i := 0; i < rounds; i++ {
		for _, kind := range []string{"pages", "truncated", "flipped", "headers"} {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			dir := t.TempDir()
			copyTree(t, src, dir)
			path := filepath.Join(dir, IndexFile)
			if err := os.WriteFile(path, good, 0o600); err != nil {
				t.Fatal(err)
			}
			corrupt(t, path, kind, r)
			if _, err := Check(dir); err != nil {
				t.Fatalf("%s #%d: Check = %v, want a report", kind, i, err)
			}
			_, _ = Known(dir, []envelope.Key{{EnvelopeID: "e001"}}) // an answer or an error
			q, err := Open(dir, &Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, DisableWatcher: true, RescanInterval: -1})
			if err == nil {
				// What the check let through is readable without a crash.
				q.Counts(context.Background(), "")
				q.List(context.Background(), queue.ListFilter{Limit: 100})
				q.Check()
				q.Close()
			} else {
				var ce *CorruptIndexError
				if errors.As(err, &ce) {
					refused[kind]++
				}
				if !strings.Contains(err.Error(), "doctor") {
					t.Fatalf("%s #%d: Open = %v, which does not point at outbox doctor", kind, i, err)
				}
			}
			n, err := Rebuild(dir, nil)
			if err != nil || n != 40 {
				t.Fatalf("%s #%d: Rebuild = %d, %v", kind, i, n, err)
			}
			q = openFault(t, dir)
			c, err := q.Counts(context.Background(), "")
			if err != nil || c.Total(envelope.StateUnresolved) != 40 {
				t.Fatalf("%s #%d: after Rebuild %v, %v", kind, i, c, err)
			}
			q.Close()
		}
	}
	t.Logf("refused as damaged, by kind: %v of %d each", refused, rounds)
	for _, kind := range []string{"pages", "truncated", "headers"} {
		if refused[kind] == 0 && rounds >= 20 {
			t.Errorf("no %s corruption was reported as damaged", kind)
		}
	}
}

// The check at Open passes every healthy index, whatever its history
// (nested buckets, deletions, compaction).
func TestVerify_HealthyIndex(t *testing.T) {
	dir := t.TempDir()
	storeWith(t, dir, 300)
	q := openFault(t, dir)
	ctx := context.Background()
	if err := q.Erase(ctx, "", "u1"); err != nil {
		t.Fatal(err)
	}
	q.Close()
	if err := verifyIndexFile(filepath.Join(dir, IndexFile)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := CompactFile(dir); err != nil {
		t.Fatal(err)
	}
	if err := verifyIndexFile(filepath.Join(dir, IndexFile)); err != nil {
		t.Fatalf("after compaction: %v", err)
	}
	if _, err := Rebuild(dir, nil); err != nil {
		t.Fatal(err)
	}
	if err := verifyIndexFile(filepath.Join(dir, IndexFile)); err != nil {
		t.Fatalf("after rebuild: %v", err)
	}
}
