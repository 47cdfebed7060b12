package applog

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A log that is a symbolic link, or whose tenant directory is one, to a
// file or directory outside the data directory is never followed: every
// append (the store's appender, a foreign appender), read and stat fails
// with a *LinkError naming the link, and the file outside is neither
// written nor read.
func TestSymlinks_NeverFollowed(t *testing.T) {
	outsideRec := rec(7, 64)
	for _, tc := range []struct {
		name string
		// plant makes the link and returns the file outside that an
		// access through it would reach.
		plant func(t *testing.T, data, outside string) string
	}{
		{"LogIsALink", func(t *testing.T, data, outside string) string {
			target := filepath.Join(outside, "victim.jsonl")
			mustWrite(t, target, outsideRec)
			mustMkdir(t, filepath.Join(data, Dir, "t"))
			mustLink(t, target, filepath.Join(data, Dir, "t", "u.jsonl"))
			return target
		}},
		{"DanglingLogLink", func(t *testing.T, data, outside string) string {
			target := filepath.Join(outside, "created.jsonl")
			mustMkdir(t, filepath.Join(data, Dir, "t"))
			mustLink(t, target, filepath.Join(data, Dir, "t", "u.jsonl"))
			return target
		}},
		{"TenantDirIsALink", func(t *testing.T, data, outside string) string {
			target := filepath.Join(outside, "u.jsonl")
			mustWrite(t, target, outsideRec)
			mustMkdir(t, filepath.Join(data, Dir))
			mustLink(t, outside, filepath.Join(data, Dir, "t"))
			return target
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, outside := t.TempDir(), t.TempDir()
			target := tc.plant(t, data, outside)
			before, beforeErr := os.ReadFile(target)
			rel := filepath.Join(Dir, "t", "u.jsonl")
			path := filepath.Join(data, rel)
			wantLink := func(op string, err error) {
				t.Helper()
				var le *LinkError
				if !errors.As(err, &le) || !errors.Is(err, ErrSymlink) {
					t.Errorf("%s = %v, want a *LinkError", op, err)
				}
			}

			a := NewAppender(data, Fdatasync)
			_, _, err := a.Append(rel, rec(1, 64), nil)
			wantLink("Appender.Append", err)
			_, _, err = a.Append(rel, rec(2, 64), nil) // again: nothing cached lets it through
			wantLink("Appender.Append (again)", err)
			b, err := a.ReadComplete(rel, 0)
			wantLink("Appender.ReadComplete", err)
			if len(b) != 0 {
				t.Errorf("Appender.ReadComplete read %q through the link", b)
			}
			a.Close()
			_, err = AppendLocked(path, rec(3, 64), Fdatasync)
			wantLink("AppendLocked", err)
			b, err = ReadComplete(path, 0)
			wantLink("ReadComplete", err)
			if len(b) != 0 {
				t.Errorf("ReadComplete read %q through the link", b)
			}
			_, err = ReadAt(path, 0, 10)
			wantLink("ReadAt", err)
			if tc.name != "TenantDirIsALink" {
				// (A stat does not check the directories on the way:
				// listing and opening do.)
				_, _, err = PathSize(path)
				wantLink("PathSize", err)
			}

			after, afterErr := os.ReadFile(target)
			if !bytes.Equal(before, after) || (beforeErr == nil) != (afterErr == nil) {
				t.Errorf("the file outside the data directory changed: %q (%v) → %q (%v)", before, beforeErr, after, afterErr)
			}
			if le := new(LinkError); errors.As(err, &le) && le.Path == "" {
				t.Error("LinkError names no path")
			}
		})
	}
}

func mustWrite(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}

func mustLink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
