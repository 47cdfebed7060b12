package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A command run as another user than the store's (root, typically, on the
// data directory of a serve that runs as its own user) is refused before
// it writes anything: the log or mark it would create, mode 0600, could
// not be read by serve, and an envelope acknowledged as queued would never
// be delivered.
func TestCLI_RefusesAnotherUsersStore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the store's files to another user (CI runs as root)")
	}
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	env := writeTemp(t, "e.json", string(replyJSON("first", "u1")))
	if out, errs, code := runCmd(t, "enqueue", "--data", data, env); code != 0 {
		t.Fatalf("enqueue into a new directory = %d %s %s", code, out, errs)
	}
	if out, errs, code := runCmd(t, "doctor", "--data", data); code != 0 {
		t.Fatalf("doctor = %d %s %s", code, out, errs)
	}
	const nobody = 65534
	if err := filepath.Walk(data, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, nobody, nobody)
	}); err != nil {
		t.Fatal(err)
	}
	before := listTree(t, data)
	other := writeTemp(t, "e2.json", string(replyJSON("second", "u2")))
	for _, args := range [][]string{
		{"enqueue", "--data", data, other},
		{"ls", "--data", data},
		{"doctor", "--rebuild", "--data", data},
		{"compact", "--data", data},
		{"serve", "--data", data, "--addr", "127.0.0.1:0"},
	} {
		out, errs, code := runCmd(t, args...)
		if code != 1 || !strings.Contains(errs+out, "belongs to user") || !strings.Contains(errs+out, "(uid 65534)") || !strings.Contains(errs+out, "sudo -u ") {
			t.Errorf("%v as root on another user's store = %d\nstdout %s\nstderr %s", args[0], code, out, errs)
		}
	}
	if after := listTree(t, data); after != before {
		t.Errorf("the refused commands changed the store:\nbefore %s\nafter  %s", before, after)
	}
}

// listTree lists the paths under dir with their sizes.
func listTree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			rel, _ := filepath.Rel(dir, p)
			b.WriteString(rel + ":" + fi.Mode().String() + " ")
			if !fi.IsDir() {
				b.WriteString(strings.Repeat("#", int(min(fi.Size(), 40))))
			}
			b.WriteString("\n")
		}
		return nil
	})
	return b.String()
}
