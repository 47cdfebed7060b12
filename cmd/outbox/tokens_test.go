package main

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue/httpapi"
)

func TestParseTokenFile(t *testing.T) {
	const a, b = "aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb"
	got, err := parseTokenFile([]byte("# the new one first\n" + b + "\r\n\n  " + a + "  \n"))
	if err != nil || len(got) != 2 || got[0] != b || got[1] != a {
		t.Fatalf("parse = %q, %v", got, err)
	}
	for _, tc := range []struct{ file, want string }{
		{a + "\nshort-one\n", "line 2: the token is 9 bytes"},
		{"# x\n" + a + " " + b + "\n", "line 2: a token holds no space"},
		{strings.Repeat(a+"\n", 17), "17 tokens; at most 16"},
	} {
		_, err := parseTokenFile([]byte(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "short-one") || strings.Contains(err.Error(), a) {
			t.Errorf("parse(%q) = %v, want %q", tc.file, err, tc.want)
		}
	}
}

// A leaked token is rotated without a restart: the new one is listed
// beside the old in INTERNAL_OUTBOX_TOKEN_FILE, the clients move, the old
// one is removed; serve follows the file within a poll. A file that
// becomes invalid leaves the tokens in use, and no token is ever logged.
func TestServe_TokenFileRotation(t *testing.T) {
	bin := buildBinary(t)
	const old, next = "old-token-5c0ffee5c0ffee5c0ffee", "new-token-9deadbeef9deadbeef9d"
	file := filepath.Join(t.TempDir(), "tokens")
	write := func(s string) {
		t.Helper()
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil { // as an editor or a secret manager saves it
			t.Fatal(err)
		}
	}
	write(old + "\n")
	d, out, _ := launchServe(t, bin, filepath.Join(t.TempDir(), "data"), []string{"INTERNAL_OUTBOX_TOKEN_FILE=" + file}, "--no-sink")
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	defer d.stop(t)
	status := func(tok string) int {
		code, _ := request(t, "GET", d.base+"/v1/stats", tok, nil)
		return code
	}
	if status(old) != http.StatusOK || status(next) != http.StatusUnauthorized {
		t.Fatalf("at start: old %d, new %d", status(old), status(next))
	}
	write("# rotating: the new one beside the old\n" + old + "\n" + next + "\n")
	eventually(t, "the new token accepted", func() bool { return status(next) == http.StatusOK })
	if status(old) != http.StatusOK {
		t.Fatal("the old token was refused while both are listed")
	}
	write(next + "\n")
	eventually(t, "the old token refused", func() bool { return status(old) == http.StatusUnauthorized })

	write(next + "\ntoo-short\n")
	eventually(t, "the warning", func() bool { return strings.Contains(d.logs.String(), "line 2: the token is 9 bytes") })
	os.Remove(file)
	eventually(t, "the warning of a missing file", func() bool { return strings.Contains(d.logs.String(), "cannot be read (missing)") })
	if status(next) != http.StatusOK || status(old) != http.StatusUnauthorized {
		t.Fatalf("after an invalid file: new %d, old %d", status(next), status(old))
	}
	logs := d.logs.String()
	if strings.Count(logs, "status=reloaded") != 2 || strings.Contains(logs, old) || strings.Contains(logs, next) || strings.Contains(logs, "too-short") {
		t.Fatalf("serve's log:\n%s", logs)
	}
}

// A change to the token file while serve starts (after it read the file,
// before its watcher's first look) is a change: the watcher's baseline is
// the file as it was read. Before, it was the file at the watcher's start,
// and a rotation made in that window was never applied (a flaky
// TestServe_TokenFileRotation under a loaded CI).
func TestWatchTokens_ChangeWhileStarting(t *testing.T) {
	defer func(d time.Duration) { tokenPoll = d }(tokenPoll)
	tokenPoll = 5 * time.Millisecond
	const old, next = "old-token-5c0ffee5c0ffee5c0ffee", "new-token-9deadbeef9deadbeef9d"
	file := filepath.Join(t.TempDir(), "tokens")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file+".tmp", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write(old + "\n")
	e := &env{Getenv: func(k string) string {
		if k == "INTERNAL_OUTBOX_TOKEN_FILE" {
			return file
		}
		return ""
	}}
	tokens, tf, err := serveTokens(e)
	if err != nil {
		t.Fatal(err)
	}
	set, err := httpapi.NewTokens(tokens...)
	if err != nil {
		t.Fatal(err)
	}
	write(old + "\n" + next + "\n") // before the watcher looks
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { watchTokens(ctx, tf, set, slog.New(slog.DiscardHandler)); close(done) }()
	defer func() { cancel(); <-done }()
	for end := time.Now().Add(10 * time.Second); set.Len() != 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the tokens written while serve started were never applied (%d in use)", set.Len())
		}
	}
}
