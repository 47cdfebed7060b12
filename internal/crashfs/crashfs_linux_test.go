package crashfs

import (
	"errors"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// mountForTest mounts a crash file system over a fresh backing directory
// holding one file, or skips when OUTBOX_POWERCUT is unset (make powercut
// sets it: mounting needs root and /dev/fuse).
func mountForTest(t *testing.T) (*FS, string) {
	t.Helper()
	if os.Getenv("OUTBOX_POWERCUT") == "" {
		t.Skip("set OUTBOX_POWERCUT to run the power-cut tests (root, /dev/fuse); make powercut does")
	}
	back, mnt := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(back, "before"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Mount(back, mnt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Unmount() })
	return c, mnt
}

func write(t *testing.T, p, s string, sync bool) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

func syncDir(t *testing.T, p string) {
	t.Helper()
	d, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}

func TestWriteDurable_KeepsOnlyWhatWasSynced(t *testing.T) {
	c, mnt := mountForTest(t)
	m := func(n string) string { return filepath.Join(mnt, n) }

	write(t, m("synced-no-entry"), "a", true) // its directory never synced after it
	write(t, m("before"), "+unsynced", false)
	if err := os.Mkdir(m("sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, m("sub/inner"), "in", true)
	syncDir(t, m("sub"))
	write(t, m("tmp"), "renamed", true)
	if err := os.Rename(m("tmp"), m("final")); err != nil {
		t.Fatal(err)
	}
	write(t, m("entry-only"), "never synced", false)
	if err := os.Chmod(m("final"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(m("final"), 65534, 65534); err != nil { // as another user's server makes its files
		t.Fatal(err)
	}
	syncDir(t, mnt) // now: sub, final, entry-only, synced-no-entry, before
	write(t, m("final"), "+later", false)
	write(t, m("after-dir-sync"), "x", true) // entry not synced
	if err := os.Remove(m("synced-no-entry")); err != nil {
		t.Fatal(err)
	}

	c.Cut()
	f, err := os.OpenFile(m("final"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync after the cut = %v, want EIO", err)
	}
	f.Close()

	out := filepath.Join(t.TempDir(), "disk")
	if err := c.WriteDurable(out); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"before":          "old",
		"final":           "renamed",
		"entry-only":      "",
		"synced-no-entry": "a", // removed after the directory's sync: still there
		"sub/inner":       "in",
	}
	got := map[string]string{}
	err = filepath.WalkDir(out, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(out, p)
		got[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(out, "final")); err != nil {
		t.Fatal(err)
	} else if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o640 || st.Uid != 65534 || st.Gid != 65534 {
		t.Errorf("final: mode %v, owner %d:%d; want -rw-r----- 65534:65534", fi.Mode(), st.Uid, st.Gid)
	}
	if len(got) != len(want) {
		t.Errorf("files after the cut: %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

// WriteTorn keeps what was synced and, of each page written since, either
// its old or its new content.
func TestWriteTorn_EachUnsyncedPageOldOrNew(t *testing.T) {
	c, mnt := mountForTest(t)
	p := filepath.Join(mnt, "f")
	page := func(b byte) string { return strings.Repeat(string(b), pageSize) }
	write(t, p, page('a')+page('a')+page('a'), true)
	syncDir(t, mnt)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(page('b')), pageSize); err != nil { // page 1 rewritten
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(page('c')), 3*pageSize); err != nil { // page 3 appended
		t.Fatal(err)
	}
	f.Close()
	c.Cut()
	seen := map[string]bool{}
	for seed := uint64(0); seed < 32; seed++ {
		out := filepath.Join(t.TempDir(), "disk")
		if err := c.WriteTorn(out, rand.New(rand.NewPCG(seed, 1))); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(out, "f"))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != 3*pageSize && len(b) != 4*pageSize {
			t.Fatalf("seed %d: %d bytes, want 3 or 4 pages", seed, len(b))
		}
		var shape []byte
		for i := 0; i < len(b); i += pageSize {
			pg := b[i : i+pageSize]
			if strings.Count(string(pg), string(pg[0])) != pageSize {
				t.Fatalf("seed %d: page %d mixes bytes", seed, i/pageSize)
			}
			shape = append(shape, pg[0])
		}
		if shape[0] != 'a' || shape[2] != 'a' || (shape[1] != 'a' && shape[1] != 'b') || (len(shape) == 4 && shape[3] != 'c' && shape[3] != 0) {
			t.Fatalf("seed %d: pages %q", seed, shape)
		}
		seen[string(shape)] = true
	}
	if len(seen) < 3 {
		t.Errorf("32 torn disks took %d shapes (%q), want the pages to vary", len(seen), slices.Collect(maps.Keys(seen)))
	}
}

// A file renamed after it was written, and written again through the
// descriptor it was opened by (an index file swapped in), is torn like any
// other: its unsynced pages are there or not, wherever its name went.
func TestWriteTorn_AFileRenamedAfterItsWrites(t *testing.T) {
	c, mnt := mountForTest(t)
	tmp, final := filepath.Join(mnt, "new.tmp"), filepath.Join(mnt, "index")
	page := func(b byte) string { return strings.Repeat(string(b), pageSize) }
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(page('a')+page('a')), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, final); err != nil {
		t.Fatal(err)
	}
	syncDir(t, mnt)
	if _, err := f.WriteAt([]byte(page('b')), pageSize); err != nil { // after the rename, not synced
		t.Fatal(err)
	}
	c.Cut()
	seen := map[byte]bool{}
	for seed := uint64(0); seed < 16; seed++ {
		out := filepath.Join(t.TempDir(), "disk")
		if err := c.WriteTorn(out, rand.New(rand.NewPCG(seed, 2))); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(out, "index"))
		if err != nil || len(b) != 2*pageSize || b[0] != 'a' {
			t.Fatalf("seed %d: %d bytes, %v", seed, len(b), err)
		}
		seen[b[pageSize]] = true
	}
	if !seen['a'] || !seen['b'] {
		t.Errorf("16 torn disks kept page 1 as %q: want both the synced and the unsynced content", slices.Collect(maps.Keys(seen)))
	}
}

// A sync after rewrites, an append and a truncation keeps exactly what the
// file holds then (only its written pages are read again).
func TestWriteDurable_SyncAfterRewritesKeepsTheFile(t *testing.T) {
	c, mnt := mountForTest(t)
	p := filepath.Join(mnt, "g")
	page := func(b byte) string { return strings.Repeat(string(b), pageSize) }
	write(t, p, page('a')+page('a')+page('a'), true)
	syncDir(t, mnt)
	check := func(what string) {
		t.Helper()
		want, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "disk")
		if err := c.WriteDurable(out); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(out, "g"))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("%s: the durable file (%d bytes) is not the file synced (%d bytes)", what, len(got), len(want))
		}
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("bb"), pageSize+100); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(page('c')+"tail"), 3*pageSize); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	check("rewritten and appended")
	if err := f.Truncate(pageSize + 10); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	check("truncated")
	if err := f.Truncate(5 * pageSize); err != nil { // grown: zeros
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("z"), 4*pageSize+7); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	check("grown")
}
