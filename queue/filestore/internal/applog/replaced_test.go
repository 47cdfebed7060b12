package applog

import (
	"os"
	"path/filepath"
	"testing"
)

// A log deleted, or replaced by another file (renamed over it), while the
// appender keeps its descriptor open: the next append lands in the file
// that the log's path names (a new one after a deletion), never in the
// unlinked file, and reports that file's inode and offset.
func TestAppender_LogDeletedOrReplacedUnderIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, path string) []byte // returns what the path holds now
	}{
		{"deleted", func(t *testing.T, path string) []byte {
			// Held open, the old file's inode cannot be reused by the
			// new one (it often is, once the old file is gone).
			old, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { old.Close() })
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"replaced", func(t *testing.T, path string) []byte {
			other := rec(9, 40)
			tmp := path + ".tmp"
			if err := os.WriteFile(tmp, other, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
			return other
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rel := filepath.Join(Dir, "t", "u.jsonl")
			path := filepath.Join(dir, rel)
			a := NewAppender(dir, Fdatasync)
			defer a.Close()
			r1, r2 := rec(1, 64), rec(2, 64)
			_, ino1, err := a.Append(rel, r1, nil)
			if err != nil {
				t.Fatal(err)
			}
			before := tc.do(t, path)
			off, ino2, err := a.Append(rel, r2, nil)
			if err != nil {
				t.Fatal(err)
			}
			ino, err := Inode(path)
			if err != nil {
				t.Fatalf("the log's path names no file after the append: %v", err)
			}
			if ino2 != ino || ino2 == ino1 {
				t.Fatalf("append reported inode %d, the path names %d (the old file was %d)", ino2, ino, ino1)
			}
			if off != int64(len(before)) {
				t.Fatalf("record at %d, want %d", off, len(before))
			}
			wantFile(t, path, before, r2)
			want := [][]byte{r2}
			if before != nil {
				want = [][]byte{before, r2}
			}
			wantLines(t, a, rel, want, nil)
		})
	}
}

// A log truncated under the appender (to zero, or into the middle of a
// record): the next append goes at the file's new end, after a newline
// that ends a cut line.
func TestAppender_LogTruncatedUnderIt(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	a := NewAppender(dir, Fdatasync)
	defer a.Close()
	r1, r2, r3 := rec(1, 64), rec(2, 64), rec(3, 64)
	for _, r := range [][]byte{r1, r2} {
		if _, _, err := a.Append(rel, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if off, _, err := a.Append(rel, r3, nil); err != nil || off != 0 {
		t.Fatalf("append after truncation to 0 at %d, %v; want 0", off, err)
	}
	wantFile(t, path, r3)
	if err := os.Truncate(path, 30); err != nil {
		t.Fatal(err)
	}
	if off, _, err := a.Append(rel, r1, nil); err != nil || off != 31 {
		t.Fatalf("append after truncation into a record at %d, %v; want 31", off, err)
	}
	wantFile(t, path, r3[:30], []byte("\n"), r1)
}
