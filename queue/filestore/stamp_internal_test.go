package filestore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// A data directory whose index was lost (deleted, emptied, or left without
// its layout) while its logs hold records is refused: indexing them again
// would deliver every one a second time. Nothing is created in its place,
// and Rebuild then indexes every record unresolved.
func TestOpen_LostIndexRefused(t *testing.T) {
	for _, how := range []string{"deleted", "emptied", "no layout"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			storeWith(t, dir, 6)
			path := filepath.Join(dir, IndexFile)
			switch how {
			case "deleted":
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			case "emptied":
				if err := os.Truncate(path, 0); err != nil {
					t.Fatal(err)
				}
			case "no layout":
				os.Remove(path)
				db, err := bolt.Open(path, 0o600, nil)
				if err != nil {
					t.Fatal(err)
				}
				db.Close()
			}
			before, _ := os.Stat(path)
			_, err := Open(dir, nil)
			var lost *IndexLostError
			if !errors.As(err, &lost) || !strings.Contains(err.Error(), "outbox doctor --rebuild") {
				t.Fatalf("Open = %v, want *IndexLostError naming outbox doctor --rebuild", err)
			}
			after, _ := os.Stat(path)
			if (before == nil) != (after == nil) || (before != nil && before.Size() != after.Size()) {
				t.Fatalf("the refused Open changed index.db: %v → %v", before, after)
			}
			n, err := Rebuild(dir, nil)
			if err != nil || n != 6 {
				t.Fatalf("Rebuild = %d, %v", n, err)
			}
			q := openFault(t, dir)
			c, err := q.Counts(context.Background(), "")
			if err != nil || c.Total(envelope.StateUnresolved) != 6 {
				t.Fatalf("after Rebuild: %v, %v", c, err)
			}
			if ls, _ := q.Claim(context.Background(), queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 10}); len(ls) != 0 {
				t.Fatalf("%d rebuilt rows claimable", len(ls))
			}
		})
	}
}

// A new data directory opens normally: records appended before the first
// Open are new work, and empty logs (or logs of blanks only) are no
// records, stamp or not.
func TestOpen_NewDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := Append(dir, faultEnvelope("early", "u1")); err != nil {
		t.Fatal(err)
	}
	if hasStamp(dir) {
		t.Fatal("a foreign append wrote the stamp")
	}
	q := openFault(t, dir)
	st, err := q.Get(context.Background(), "", "early")
	if err != nil || st.Segments[0].State != envelope.StatePending {
		t.Fatalf("record appended before the first Open = %+v, %v", st, err)
	}
	q.Close()
	if !hasStamp(dir) {
		t.Fatal("Open did not write the stamp")
	}

	// A stamped directory whose logs are empty or hold blanks only.
	dir = t.TempDir()
	q = openFault(t, dir)
	q.Close()
	os.Remove(filepath.Join(dir, IndexFile))
	log := LogPath(dir, "", "u1")
	os.MkdirAll(filepath.Dir(log), 0o700)
	os.WriteFile(log, []byte("   \n  "), 0o600)
	os.WriteFile(LogPath(dir, "", "u2"), nil, 0o600)
	q = openFault(t, dir)
	if n := rows(t, q); n != 0 {
		t.Fatalf("%d rows from blank logs", n)
	}
}
