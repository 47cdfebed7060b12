package httpapi

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/internal/nofollow"
)

// The unsubscribe key is never read through a symbolic link (a link to a
// file whose bytes someone else knows would let them forge unsubscribe
// tokens), nor created through a dangling one: refused, naming the file.
func TestLoadOrCreateKey_RefusesLink(t *testing.T) {
	for _, dangling := range []bool{false, true} {
		dir, outside := t.TempDir(), t.TempDir()
		target := filepath.Join(outside, "known.key")
		known := bytes.Repeat([]byte("k"), KeySize)
		if !dangling {
			if err := os.WriteFile(target, known, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(target, filepath.Join(dir, KeyFile)); err != nil {
			t.Fatal(err)
		}
		key, err := LoadOrCreateKey(dir)
		if !errors.Is(err, nofollow.ErrSymlink) || !strings.Contains(err.Error(), KeyFile+" in the data directory is a symbolic link") || key != nil {
			t.Fatalf("dangling=%v: LoadOrCreateKey through a link = %x, %v", dangling, key, err)
		}
		if _, err := os.Stat(target); dangling && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a key was created through the dangling link: %v", err)
		}
	}
}
