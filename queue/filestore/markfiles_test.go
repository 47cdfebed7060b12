package filestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// index.mark and index.checkpoint removed under the running store (a
// clean-up of the data directory): the store makes them again, so that an
// older index put back later is still refused.
func TestMarkFilesRemovedUnderTheRunningStore(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	opts := &filestore.Options{DisableWatcher: true, RescanInterval: -1}
	q := mustOpen(t, dir, opts)
	for i := range 3 {
		if _, err := q.Enqueue(ctx, queuetest.Reply(fmt.Sprintf("a%d", i), "u", "hi")); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	index := filepath.Join(dir, filestore.IndexFile)
	old, err := os.ReadFile(index)
	if err != nil {
		t.Fatal(err)
	}
	q = mustOpen(t, dir, opts)
	for _, f := range []string{filestore.MarkFile, filestore.CheckpointFile} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, e1 := os.Stat(filepath.Join(dir, filestore.MarkFile))
		fi, e2 := os.Stat(filepath.Join(dir, filestore.CheckpointFile))
		if e1 == nil && e2 == nil && fi.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("index.mark (%v) and index.checkpoint (%v) not made again 10 s after their removal", e1, e2)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range 3 {
		if _, err := q.Enqueue(ctx, queuetest.Reply(fmt.Sprintf("b%d", i), "u", "hi")); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	// The older index put back (a restore of index.db alone).
	if err := os.WriteFile(index, old, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = filestore.Open(dir, opts)
	var se *filestore.StaleIndexError
	if !errors.As(err, &se) {
		t.Fatalf("Open of an older index put back after the mark was made again = %v, want *StaleIndexError", err)
	}
}
