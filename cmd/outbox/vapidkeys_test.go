package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/channels/webpush"
)

// runVAPID runs `outbox vapid-keys args…` in-process.
func runVAPID(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }}
	code = run(context.Background(), e, append([]string{"vapid-keys"}, args...))
	return code, out.String(), errOut.String()
}

// envLines parses NAME=value lines.
func envLines(t *testing.T, s string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || v == "" {
			t.Fatalf("output line %q is not NAME=value", line)
		}
		m[k] = v
	}
	return m
}

func TestVAPIDKeys_Print(t *testing.T) {
	code, stdout, stderr := runVAPID(t)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	lines := envLines(t, stdout)
	if len(lines) != 2 {
		t.Fatalf("stdout has %d lines, want 2:\n%s", len(lines), stdout)
	}
	keys := webpush.Keys{Public: lines["OUTBOX_VAPID_PUBLIC_KEY"], Private: webpush.Secret(lines["OUTBOX_VAPID_PRIVATE_KEY"])}
	if err := keys.Validate(); err != nil {
		t.Fatalf("printed keys are not a valid pair (public first, then private): %v", err)
	}
	// What is printed is what KeysFromEnv reads back.
	got, err := webpush.KeysFromEnv(func(k string) string { return lines[k] })
	if err != nil || got != keys {
		t.Errorf("KeysFromEnv on the printed lines: %v", err)
	}
	_, again, _ := runVAPID(t)
	if again == stdout {
		t.Errorf("two runs printed the same pair")
	}
}

func TestVAPIDKeys_Out(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	code, stdout, stderr := runVAPID(t, "--out", dir)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	lines := envLines(t, stdout)
	wantPub, wantPriv := filepath.Join(dir, webpush.PublicKeyFile), filepath.Join(dir, webpush.PrivateKeyFile)
	if lines["OUTBOX_VAPID_PUBLIC_KEY_FILE"] != wantPub || lines["OUTBOX_VAPID_PRIVATE_KEY_FILE"] != wantPriv || len(lines) != 2 {
		t.Errorf("stdout = %q, want the two _FILE lines for %s", stdout, dir)
	}
	priv, err := os.ReadFile(wantPriv)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stdout, strings.TrimSpace(string(priv))) || strings.Contains(stderr, strings.TrimSpace(string(priv))) {
		t.Errorf("the private key was printed although it was written to a file")
	}
	if runtime.GOOS != "windows" {
		for _, p := range []string{wantPub, wantPriv} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s has mode %o, want 600", filepath.Base(p), fi.Mode().Perm())
			}
		}
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("created directory mode = %v (%v), want 700", fi.Mode().Perm(), err)
		}
	}
	keys, err := webpush.KeysFromEnv(func(k string) string { return lines[k] })
	if err != nil {
		t.Fatalf("KeysFromEnv on the written files: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("directory holds %d entries, want just the 2 key files (no temp files left)", len(entries))
	}

	// A second run refuses to replace the pair.
	code, _, stderr = runVAPID(t, "--out", dir)
	if code != exitFailure || !strings.Contains(stderr, "--force") {
		t.Errorf("second run: exit %d, stderr %q; want failure mentioning --force", code, stderr)
	}
	same, err := webpush.KeysFromEnv(func(k string) string { return lines[k] })
	if err != nil || same != keys {
		t.Errorf("the refused run changed the key files")
	}

	// --force replaces it.
	if code, _, stderr = runVAPID(t, "--out", dir, "--force"); code != exitOK {
		t.Fatalf("--force: exit %d, stderr %q", code, stderr)
	}
	replaced, err := webpush.KeysFromEnv(func(k string) string { return lines[k] })
	if err != nil || replaced == keys {
		t.Errorf("--force did not write a new valid pair (err %v)", err)
	}
}

func TestVAPIDKeys_Usage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"extra"}, exitUsage, "takes no arguments"},
		{[]string{"--force"}, exitUsage, "--force needs --out"},
		{[]string{"--bogus"}, exitUsage, "Try: outbox help vapid-keys"},
		{[]string{"-help"}, exitOK, "Usage: outbox vapid-keys"},
	} {
		code, stdout, stderr := runVAPID(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("vapid-keys %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
		if stdout != "" {
			t.Errorf("vapid-keys %v printed %q on stdout", tc.args, stdout)
		}
	}
}
