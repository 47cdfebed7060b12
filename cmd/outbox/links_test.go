package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// An operator command never follows a symbolic link in place of the
// operator socket: a link to another daemon's socket (another store, or
// anything else listening) is refused with a message, and nothing is
// sent through it.
func TestOperatorCommands_RefuseLinkedSocket(t *testing.T) {
	elsewhere := t.TempDir()
	sock := filepath.Join(elsewhere, "other.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		_, _ = w.Write([]byte("[]"))
	})}
	go srv.Serve(ln)
	defer srv.Close()

	data := t.TempDir()
	if err := os.Symlink(sock, filepath.Join(data, SocketName)); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"ls", "--data", data}, {"stats", "--data", data}, {"requeue", "--data", data, "x"}} {
		var errb bytes.Buffer
		e := &env{Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Stderr: &errb, Getenv: func(string) string { return "" }}
		if code := run(context.Background(), e, args); code != exitFailure || !strings.Contains(errb.String(), "symbolic link") {
			t.Errorf("%v: exit %d, stderr %q; want 1 and a refusal of the link", args, code, errb.String())
		}
	}
	if n := got.Load(); n != 0 {
		t.Fatalf("the socket behind the link got %d requests, want none", n)
	}
}

// serve refuses to start when its operator socket's or its pid file's
// name is a symbolic link, says why, and leaves the link and what it
// points to as they were (it neither follows nor replaces it).
func TestServe_RefusesLinkedSocketAndPidFile(t *testing.T) {
	for _, name := range []string{SocketName, "outbox.pid"} {
		t.Run(name, func(t *testing.T) {
			data, outside := t.TempDir(), t.TempDir()
			target := filepath.Join(outside, "victim")
			if err := os.WriteFile(target, []byte("keep me\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(data, name)
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			var eb lockedBuffer
			e := &env{Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Stderr: &eb, Getenv: func(string) string { return "" }}
			// Bounded: a serve that starts is stopped, and fails the test.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			code := runServe(ctx, e, []string{"--data", data, "--addr", "127.0.0.1:0"})
			if code != exitFailure || !strings.Contains(eb.String(), "symbolic link") {
				t.Fatalf("serve with %s a link: exit %d, want 1 with a refusal:\n%s", name, code, eb.String())
			}
			if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("the link was removed or replaced: %v", err)
			}
			b, _ := os.ReadFile(target)
			fi, _ := os.Stat(target)
			if string(b) != "keep me\n" || fi.Mode().Perm() != 0o644 {
				t.Errorf("the file behind the link changed: %q, mode %v", b, fi.Mode())
			}
		})
	}
}

// serve refuses to start when the unsubscribe key or a sink directory in
// the data directory is a symbolic link to something outside it, naming
// the link, and writes nothing through it (issue K, item 9).
func TestServe_RefusesLinkedKeyAndSinkDirs(t *testing.T) {
	bin := buildBinary(t)
	for _, link := range []string{"unsubscribe.key", "sink", "sink/telegram"} {
		t.Run(link, func(t *testing.T) {
			data, outside := t.TempDir(), t.TempDir()
			target := outside
			if link == "unsubscribe.key" {
				// A key someone else knows: following it would let them
				// forge unsubscribe links.
				target = filepath.Join(outside, "known.key")
				if err := os.WriteFile(target, bytes.Repeat([]byte("k"), 32), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(data, filepath.FromSlash(link))
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
			d, out, code := tryServe(t, bin, data)
			if d != nil {
				d.stop(t)
				t.Fatalf("serve started with %s a symbolic link:\n%s", link, out)
			}
			if code == 0 || !strings.Contains(out, filepath.FromSlash(link)+" in the data directory is a symbolic link") {
				t.Fatalf("serve = %d, want a refusal naming %s:\n%s", code, link, out)
			}
			if strings.Contains(out, outside) {
				t.Errorf("the message names the link's target:\n%s", out)
			}
			if entries, _ := os.ReadDir(outside); link != "unsubscribe.key" && len(entries) != 0 {
				t.Errorf("written through the link: %v", entries)
			}
			if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("the link was replaced: %v, %v", fi, err)
			}
		})
	}
}
