package applog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestName_Hostile(t *testing.T) {
	ids := []string{
		"../../etc/passwd", "/abs", `a\b`, "a\x00b", ".", "..", "", strings.Repeat("x", 200),
		strings.Repeat("x", 200) + "y", "User", "user", "USER", "uѕer" /* Cyrillic s */, "user",
		"a/b", "a_b", "a b", "ａ", "CON", "nul",
	}
	seen := map[string]string{}
	for _, id := range ids {
		n := Name(id)
		if strings.ContainsAny(n, "/\\\x00.") || n == "" || len(n) > 57 {
			t.Errorf("Name(%q) = %q: not a safe single path component", id, n)
		}
		for _, r := range n {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				t.Errorf("Name(%q) = %q has %q", id, n, r)
			}
		}
		if prev, ok := seen[n]; ok && prev != id {
			t.Errorf("Name(%q) == Name(%q) == %q", id, prev, n)
		}
		seen[n] = id
		p := Path("/data", "t", id)
		if !strings.HasPrefix(filepath.Clean(p), "/data/logs/") {
			t.Errorf("Path escapes: %q", p)
		}
	}
}

func TestAppendLocked_TornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.jsonl")
	if err := os.WriteFile(path, []byte("{\"a\":1}\n{\"half"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The reader does not see the torn tail.
	b, err := ReadComplete(path, 0)
	if err != nil || string(b) != "{\"a\":1}\n" {
		t.Fatalf("ReadComplete = %q, %v", b, err)
	}
	off, err := AppendLocked(path, []byte("{\"b\":2}\n"), Fdatasync)
	if err != nil {
		t.Fatal(err)
	}
	all, _ := os.ReadFile(path)
	if got := string(all[off:]); got != "{\"b\":2}\n" {
		t.Fatalf("record at %d = %q (file %q)", off, got, all)
	}
	lines := Lines(all, 0)
	if len(lines) != 3 || string(lines[1].Data) != "{\"half" {
		t.Fatalf("lines = %+v", lines)
	}
}

func TestAppendLocked_SyncFailureLeavesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l.jsonl")
	if _, err := AppendLocked(path, []byte("one\n"), nil); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("EIO")
	_, err := AppendLocked(path, []byte("two\n"), func(*os.File) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the sync error", err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != "one\n" {
		t.Fatalf("file after failed append = %q", b)
	}
}

func TestAppender_GroupCommit(t *testing.T) {
	dir := t.TempDir()
	var syncs int
	var mu sync.Mutex
	a := NewAppender(dir, func(f *os.File) error { mu.Lock(); syncs++; mu.Unlock(); return Fdatasync(f) })
	var wg sync.WaitGroup
	offs := make([]int64, 64)
	for i := range offs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off, _, err := a.Append("logs/t/u.jsonl", []byte("0123456789\n"), nil)
			if err != nil {
				t.Error(err)
			}
			offs[i] = off
		}()
	}
	wg.Wait()
	b, err := os.ReadFile(filepath.Join(dir, "logs/t/u.jsonl"))
	if err != nil || len(b) != 64*11 {
		t.Fatalf("size %d", len(b))
	}
	seen := map[int64]bool{}
	for _, o := range offs {
		if o%11 != 0 || seen[o] {
			t.Fatalf("bad or repeated offset %d", o)
		}
		seen[o] = true
	}
	if syncs > 64 || syncs < 1 {
		t.Fatalf("syncs = %d", syncs)
	}
	t.Logf("64 appends, %d fsyncs", syncs)
}

func FuzzLines(f *testing.F) {
	f.Add([]byte("a\nb\n\nc"), int64(0))
	f.Add([]byte("\n\n"), int64(5))
	f.Fuzz(func(t *testing.T, b []byte, base int64) {
		for _, l := range Lines(b, base) {
			if strings.Contains(string(l.Data), "\n") {
				t.Fatal("line contains newline")
			}
			i := l.Off - base
			end := int(i) + len(l.Data)
			if i < 0 || end >= len(b) || b[end] != '\n' {
				t.Fatalf("line at %d not terminated", l.Off)
			}
		}
	})
}

// A new log's directory entries (the file's, and the tenant directory's
// when it was created too) are synced before the first append is reported
// durable; later appends sync only the file.
func TestAppend_NewLogSyncsItsDirectories(t *testing.T) {
	var mu sync.Mutex
	var synced []string
	orig := syncDir
	t.Cleanup(func() { syncDir = orig })
	syncDir = func(f *os.File) error {
		mu.Lock()
		defer mu.Unlock()
		synced = append(synced, f.Name())
		return nil
	}
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := synced
		synced = nil
		return out
	}
	dir := t.TempDir()
	logs := filepath.Join(dir, Dir)
	if err := os.MkdirAll(logs, 0o700); err != nil {
		t.Fatal(err)
	}
	nop := func(*os.File) error { return nil }
	eq := func(what string, got []string, want ...string) {
		t.Helper()
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: synced directories %q, want %q", what, got, want)
		}
	}

	// The foreign-appender path.
	path := filepath.Join(logs, "t1", "u1.jsonl")
	if _, err := AppendLocked(path, []byte("one\n"), nop); err != nil {
		t.Fatal(err)
	}
	eq("new tenant, new log", take(), logs, filepath.Join(logs, "t1"))
	if _, err := AppendLocked(path, []byte("two\n"), nop); err != nil {
		t.Fatal(err)
	}
	eq("existing log", take())
	if _, err := AppendLocked(filepath.Join(logs, "t1", "u2.jsonl"), []byte("one\n"), nop); err != nil {
		t.Fatal(err)
	}
	eq("new log in an existing tenant", take(), filepath.Join(logs, "t1"))
	if _, err := AppendLocked(filepath.Join(logs, "t1", "u3.jsonl"), []byte("one\n"), nil); err != nil {
		t.Fatal(err)
	}
	eq("relaxed mode", take())

	// The in-process appender, whose descriptor stays open.
	a := NewAppender(dir, nop)
	defer a.Close()
	rel := filepath.Join(Dir, "t2", "u1.jsonl")
	for i, want := range [][]string{{logs, filepath.Join(logs, "t2")}, nil} {
		if _, _, err := a.Append(rel, []byte("x\n"), nil); err != nil {
			t.Fatal(err)
		}
		eq("appender, append "+string(rune('1'+i)), take(), want...)
	}

	// A failed directory sync fails the append.
	boom := errors.New("EIO")
	syncDir = func(*os.File) error { return boom }
	if _, err := AppendLocked(filepath.Join(logs, "t3", "u1.jsonl"), []byte("one\n"), nop); !errors.Is(err, boom) {
		t.Fatalf("append with a failing directory sync: err = %v, want it", err)
	}
}

// Logs created at the same time in one directory share its fsyncs: the
// creators that arrive while one is syncing the directory wait for the
// next round, one fsync for all of them.
func TestAppend_NewLogsShareDirectorySyncs(t *testing.T) {
	dir := t.TempDir()
	tenant := filepath.Join(dir, Dir, "t1")
	if err := os.MkdirAll(tenant, 0o700); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	release := make(chan struct{})
	orig := syncDir
	t.Cleanup(func() { syncDir = orig })
	syncDir = func(f *os.File) error {
		if calls.Add(1) == 1 {
			<-release // the first round is in flight while the others arrive
		}
		return nil
	}
	nop := func(*os.File) error { return nil }
	a := NewAppender(dir, nop)
	defer a.Close()
	const n = 8
	errs := make(chan error, n+1)
	go func() {
		_, err := AppendLocked(filepath.Join(tenant, "first.jsonl"), []byte("x\n"), nop)
		errs <- err
	}()
	for calls.Load() == 0 {
		runtime.Gosched()
	}
	for i := range n {
		go func() {
			_, _, err := a.Append(filepath.Join(Dir, "t1", fmt.Sprintf("u%d.jsonl", i)), []byte("x\n"), nil)
			errs <- err
		}()
	}
	v, _ := dirGroups.Load(tenant)
	g := v.(*dirGroup)
	for {
		g.mu.Lock()
		waiting := len(g.pending)
		g.mu.Unlock()
		if waiting == n || calls.Load() > 1 {
			break // all wait for the next round, or (wrongly) sync alone
		}
		runtime.Gosched()
	}
	close(release)
	for range n + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("%d new logs made %d directory fsyncs, want 2 (one in flight, one shared by the rest)", n+1, got)
	}
}

// The in-process appender fails an append to a new log whose directory
// cannot be synced, and syncs it again on the next append.
func TestAppender_FailedDirectorySyncIsRetried(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, Dir, "t1"), 0o700); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("EIO")
	var calls atomic.Int32
	orig := syncDir
	t.Cleanup(func() { syncDir = orig })
	syncDir = func(*os.File) error {
		if calls.Add(1) == 1 {
			return boom
		}
		return nil
	}
	a := NewAppender(dir, func(*os.File) error { return nil })
	defer a.Close()
	rel := filepath.Join(Dir, "t1", "u1.jsonl")
	if _, _, err := a.Append(rel, []byte("one\n"), nil); !errors.Is(err, boom) {
		t.Fatalf("first append: err = %v, want the directory sync's", err)
	}
	if _, _, err := a.Append(rel, []byte("two\n"), nil); err != nil {
		t.Fatal(err)
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("directory fsyncs = %d, want 2 (the failed one, then again)", got)
	}
}

func TestRelPath_IsTheCleanJoin(t *testing.T) {
	for _, tenant := range []string{"", "default", "Acme Corp", "../x", "."} {
		for _, user := range []string{"", "u_42", "..", "a/b", "ユーザー"} {
			if got, want := RelPath(tenant, user), filepath.Join(Dir, Name(tenant), Name(user)+Ext); got != want {
				t.Errorf("RelPath(%q, %q) = %q, want %q", tenant, user, got, want)
			}
		}
	}
}
