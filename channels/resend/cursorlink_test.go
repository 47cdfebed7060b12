package resend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/internal/nofollow"
)

// The Resend cursor file is never read or replaced through a symbolic
// link inside the data directory: both refuse it, naming the file.
func TestFileCursor_RefusesLink(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	target := filepath.Join(outside, "cursor")
	if err := os.WriteFile(target, []byte("planted-cursor\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "resend.cursor")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	c := FileCursor(path)
	ctx := context.Background()
	if got, err := c.LoadCursor(ctx); !errors.Is(err, nofollow.ErrSymlink) || !strings.Contains(err.Error(), "resend.cursor in the data directory is a symbolic link") || got != "" {
		t.Fatalf("LoadCursor through a link = %q, %v", got, err)
	}
	if err := c.SaveCursor(ctx, "next"); !errors.Is(err, nofollow.ErrSymlink) || !strings.Contains(err.Error(), "resend.cursor") {
		t.Fatalf("SaveCursor over a link: %v", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "planted-cursor\n" {
		t.Fatalf("written through the link: %q", b)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v, %v", fi, err)
	}
}
