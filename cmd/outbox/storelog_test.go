package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// serve's first lines say which file store it opened: a new, empty one
// (a mistyped --data shows), or what waits in it.
func TestServe_LogsTheStoreItOpened(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	logged := func() string {
		t.Helper()
		fresh := neverOpened(dir)
		q, err := filestore.Open(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		var b bytes.Buffer
		logFileStore(ctx, slog.New(slog.NewTextHandler(&b, nil)), q, dir, fresh)
		if _, err := q.Enqueue(ctx, queuetest.Reply("r-1", "u-1", "hi")); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	if out := logged(); !strings.Contains(out, "store: files in "+dir+": a new, empty store (if one was expected there, check --data)") {
		t.Errorf("first start logged %q", out)
	}
	if out := logged(); !strings.Contains(out, "store: files in "+dir+": 1 pending, 0 retryable, 0 unresolved, 0 dead_letter") {
		t.Errorf("second start logged %q", out)
	}
}
