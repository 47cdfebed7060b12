package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A --data that names a file is refused by every command with one clear
// line (doctor crashed on it, the others blamed the unsubscribe key or a
// missing index).
func TestData_AFileIsNoDataDirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	nudge := writeTemp(t, "nudge.json", withoutExpiry(t, "resurface-nudge.v1.golden.json"))
	want := "the data directory " + file + " is a file, not a directory"
	for _, args := range [][]string{
		{"serve", "--addr", "127.0.0.1:0"},
		{"doctor"}, {"doctor", "--rebuild"}, {"doctor", "--after-restore"},
		{"stats"}, {"ls", "--state", "pending"}, {"compact"},
		{"path", "--user", "u_42"}, {"enqueue", nudge},
	} {
		_, errs, code := runCmd(t, append(args, "--data", file)...)
		if code == exitOK || !strings.Contains(errs, want) {
			t.Errorf("%v = %d %q, want %q", args, code, errs, want)
		}
	}
}
