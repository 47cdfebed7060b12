package filestore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
)

// lockedLog is a log sink safe for concurrent writers.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// recordLine is e as a log line.
func recordLine(t *testing.T, e *envelope.Envelope) []byte {
	t.Helper()
	line, err := envelope.ValidEncoding(e)
	if err != nil {
		t.Fatal(err)
	}
	return append(line, '\n')
}

// A log, or a tenant directory, that is a symbolic link to a file or
// directory outside the data directory is never followed: the records it
// leads to are not indexed (at Open, on a rescan, on a catch-up of that
// log), an enqueue for its user fails with ErrSymlink (the store's and a
// foreign appender's), nothing is written outside, the other logs work,
// the skip is logged once without the log's name, and Check lists the
// link.
func TestSymlinks_LogsAndTenantDirsNeverFollowed(t *testing.T) {
	const tenant, user = "acme", "u_linked"
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dir, outside string, rec []byte) (link, target string)
	}{
		{"LogIsALink", func(t *testing.T, dir, outside string, rec []byte) (string, string) {
			target := filepath.Join(outside, "victim.jsonl")
			if err := os.WriteFile(target, rec, 0o600); err != nil {
				t.Fatal(err)
			}
			link := LogPath(dir, tenant, user)
			if err := os.MkdirAll(filepath.Dir(link), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			return link, target
		}},
		{"TenantDirIsALink", func(t *testing.T, dir, outside string, rec []byte) (string, string) {
			log := LogPath(dir, tenant, user)
			target := filepath.Join(outside, filepath.Base(log))
			if err := os.WriteFile(target, rec, 0o600); err != nil {
				t.Fatal(err)
			}
			link := filepath.Dir(log)
			if err := os.MkdirAll(filepath.Dir(link), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, link); err != nil {
				t.Fatal(err)
			}
			return link, target
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, outside := t.TempDir(), t.TempDir()
			planted := faultEnvelope("outside/1", user)
			planted.TenantID = tenant
			link, target := tc.plant(t, dir, outside, recordLine(t, planted))
			before, _ := os.ReadFile(target)

			var logs lockedLog
			q, err := Open(dir, &Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, DisableWatcher: true, RescanInterval: -1})
			if err != nil {
				t.Fatalf("Open with a linked log: %v (a link is skipped, not fatal)", err)
			}
			defer q.Close()
			ctx := context.Background()
			notIndexed := func(when string) {
				t.Helper()
				if _, err := q.Get(ctx, tenant, "outside/1"); !errors.Is(err, queue.ErrNotFound) {
					t.Fatalf("%s: the record behind the link was indexed (Get = %v)", when, err)
				}
			}
			notIndexed("Open")

			e := faultEnvelope("inside/1", user)
			e.TenantID = tenant
			if _, err := q.Enqueue(ctx, e); !errors.Is(err, ErrSymlink) {
				t.Errorf("Enqueue for the linked log = %v, want ErrSymlink", err)
			}
			if err := Append(dir, e); !errors.Is(err, ErrSymlink) {
				t.Errorf("Append (a foreign appender) to the linked log = %v, want ErrSymlink", err)
			}
			other := faultEnvelope("other/1", "u_plain")
			other.TenantID = "other"
			if _, err := q.Enqueue(ctx, other); err != nil {
				t.Fatalf("Enqueue for another user: %v", err)
			}

			// A rescan, and a catch-up of that one log (an fsnotify
			// event's), skip it without failing.
			if err := q.catchUpAll(false); err != nil {
				t.Fatalf("rescan: %v", err)
			}
			notIndexed("rescan")
			rel := applog.RelPath(tenant, user)
			if err := q.write(ctx, true, func(tx *bolt.Tx) error { return q.catchUp(tx, rel, nil, nil) }); err != nil {
				t.Fatalf("catch-up of the linked log: %v", err)
			}
			notIndexed("catch-up")
			if _, err := q.Get(ctx, "other", "other/1"); err != nil {
				t.Errorf("the other log's envelope: %v", err)
			}

			after, _ := os.ReadFile(target)
			if !bytes.Equal(before, after) {
				t.Errorf("the file outside the data directory changed:\n%q\n→\n%q", before, after)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Errorf("files were created outside the data directory: %v", ents)
			}
			out := logs.String()
			if n := strings.Count(out, "symbolic link: skipped, never followed"); n != 1 {
				t.Errorf("the link was reported %d times, want once:\n%s", n, out)
			}
			if strings.Contains(out, user) || strings.Contains(out, filepath.Base(link)) {
				t.Errorf("the log names the user or the link:\n%s", out)
			}
			rep, err := q.Check()
			if err != nil {
				t.Fatal(err)
			}
			rl, _ := filepath.Rel(dir, link)
			if !strings.Contains(strings.Join(rep.Problems, "\n"), rl+": a symbolic link") {
				t.Errorf("Check does not list %s: %q", rl, rep.Problems)
			}
		})
	}
}

// The data directory's own files are not followed either: a logs
// directory, index file or pid file that is a symbolic link fails Open
// with ErrSymlink, and the file it points to is left as it was.
func TestSymlinks_DataDirFilesRefused(t *testing.T) {
	for _, name := range []string{applog.Dir, IndexFile, "outbox.pid"} {
		t.Run(name, func(t *testing.T) {
			dir, outside := t.TempDir(), t.TempDir()
			target := filepath.Join(outside, "victim")
			if name == applog.Dir {
				if err := os.Mkdir(target, 0o700); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(target, []byte("keep me\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			q, err := Open(dir, &Options{DisableWatcher: true, RescanInterval: -1})
			if err == nil {
				q.Close()
				t.Fatalf("Open with %s a symbolic link succeeded", name)
			}
			if !errors.Is(err, ErrSymlink) || !strings.Contains(err.Error(), "symbolic link") {
				t.Errorf("Open = %v, want ErrSymlink with a clear message", err)
			}
			if name == applog.Dir {
				if ents, _ := os.ReadDir(target); len(ents) != 0 {
					t.Errorf("entries created in the linked directory: %v", ents)
				}
			} else if b, _ := os.ReadFile(target); string(b) != "keep me\n" {
				t.Errorf("the linked file changed: %q", b)
			}
		})
	}
}
