package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/outboxhq/outbox/queue/filestore"
)

// outbox enqueue waiting for another process's lock on a user's log says
// so after a second, and again once it has appended, instead of hanging
// without a word.
func TestEnqueue_SaysItWaitsForALogsLock(t *testing.T) {
	data := t.TempDir()
	digest := writeTemp(t, "digest.json", withoutExpiry(t, "your-week-digest.v1.golden.json"))
	nudge := writeTemp(t, "nudge.json", withoutExpiry(t, "resurface-nudge.v1.golden.json"))
	if code, _, stderr := runCLI(t, "", "enqueue", "--data", data, digest); code != exitOK || stderr != "" {
		t.Fatalf("first enqueue: exit %d, stderr %q", code, stderr)
	}
	holder, err := os.OpenFile(filestore.LogPath(data, "default", "u_42"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	fd, released := int(holder.Fd()), make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(1500 * time.Millisecond) // past the second after which it speaks
		unix.Flock(fd, unix.LOCK_UN)
	}()
	defer func() { <-released }()
	code, stdout, stderr := runCLI(t, "", "enqueue", "--data", data, nudge)
	if code != exitOK {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	for _, want := range []string{"waiting 1s so far for another process's lock on a user's log", "the log's lock was released after"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q, want %q", stderr, want)
		}
	}
	if strings.Contains(stderr, "u_42") || strings.Contains(stderr, ".jsonl") {
		t.Errorf("stderr names the user or the log: %q", stderr)
	}
}
