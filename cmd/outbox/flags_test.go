package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

// Flags may come before and after the arguments; "--" ends them.
func TestParseFlags_Interspersed(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		as       string
		json     bool
		wantArgs []string
	}{
		{[]string{"ID", "--as", "sent"}, "sent", false, []string{"ID"}},
		{[]string{"--as", "sent", "ID"}, "sent", false, []string{"ID"}},
		{[]string{"show", "u_99", "--json", "--as=retry"}, "retry", true, []string{"show", "u_99"}},
		{[]string{"a", "--json", "b", "c"}, "", true, []string{"a", "b", "c"}},
		{[]string{"a", "--", "--json", "-x"}, "", false, []string{"a", "--json", "-x"}},
		{[]string{"--", "-"}, "", false, []string{"-"}},
		{nil, "", false, nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		as := fs.String("as", "", "")
		js := fs.Bool("json", false, "")
		var errb bytes.Buffer
		if code, done := parseFlags(fs, &env{Stderr: &errb}, tc.args); done {
			t.Fatalf("%q: done with %d: %s", tc.args, code, errb.String())
		}
		if *as != tc.as || *js != tc.json || !slices.Equal(fs.Args(), tc.wantArgs) && len(fs.Args())+len(tc.wantArgs) > 0 {
			t.Errorf("%q: as=%q json=%v args=%q, want %q %v %q", tc.args, *as, *js, fs.Args(), tc.as, tc.json, tc.wantArgs)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var errb bytes.Buffer
	if code, done := parseFlags(fs, &env{Stderr: &errb}, []string{"ID", "--nope"}); !done || code != exitUsage || !strings.Contains(errb.String(), "nope") {
		t.Fatalf("an unknown flag after an argument = %d %v %q", code, done, errb.String())
	}
}

// The README's operator commands put their flags after the arguments.
func TestCLI_FlagsAfterArguments(t *testing.T) {
	data := t.TempDir()
	if out, errs, code := runCmd(t, "demo", "--data", data); code != 0 {
		t.Fatalf("demo = %d %s %s", code, out, errs)
	}
	out, errs, code := runCmd(t, "consent", "set", "u_99", "--data", data, "--digest", "--push", "--email-verified")
	if code != 0 || !strings.Contains(out, "digest_enabled=true push_enabled=true email_verified=true") {
		t.Fatalf("consent set USER --flags = %d %q %q", code, out, errs)
	}
	out, errs, code = runCmd(t, "ls", "--data", data)
	if code != 0 {
		t.Fatalf("ls = %d %s", code, errs)
	}
	row := strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[1])
	tenant, id := row[0], row[1]
	out, errs, code = runCmd(t, "show", id, "--data", data, "--tenant", tenant, "--json")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "{") {
		t.Fatalf("show ID --json = %d %q %q", code, out, errs)
	}
	_, errs, code = runCmd(t, "resolve", id, "--data", data, "--tenant", tenant, "--as", "sent")
	if code == exitUsage || strings.Contains(errs, "--as must be") {
		t.Fatalf("resolve ID --as sent is a usage error: %d %q", code, errs)
	}
}

// outbox enqueue refuses an envelope already past its expires_at (the
// golden reply expired in May 2026) and appends nothing of the call.
func TestEnqueue_RefusesExpired(t *testing.T) {
	data := t.TempDir()
	_, errs, code := runCmd(t, "enqueue", "--data", data, "../../testdata/delivery/reply-text.v1.golden.json")
	if code != exitFailure || !strings.Contains(errs, "expires_at 2026-05-04T21:00:00Z is already past") {
		t.Fatalf("enqueue of an expired envelope = %d %q", code, errs)
	}
	if m, _ := filepath.Glob(filepath.Join(data, "logs", "*", "*")); len(m) != 0 {
		t.Fatalf("appended anyway: %v", m)
	}
}

// outbox consent lift clears a user's suppression an operator checked, and
// says when there is none.
func TestCLI_ConsentLift(t *testing.T) {
	data := t.TempDir()
	q, err := filestore.Open(data, &filestore.Options{NoSync: true, DisableWatcher: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := q.Suppress(ctx, "", "u_7", queue.Suppression{Channel: envelope.ChannelTelegram, Reason: envelope.ClassBlockedByUser}); err != nil {
		t.Fatal(err)
	}
	q.Close()
	out, errs, code := runCmd(t, "consent", "lift", "u_7", "telegram", "--data", data)
	if code != 0 || strings.Contains(out, "suppressed telegram:") || !strings.Contains(out, "lifted telegram blocked_by_user by operator") {
		t.Fatalf("consent lift = %d %q %q", code, out, errs)
	}
	_, errs, code = runCmd(t, "consent", "lift", "u_7", "telegram", "--data", data)
	if code != exitFailure || !strings.Contains(errs, "no telegram suppression to lift") {
		t.Fatalf("consent lift of nothing = %d %q", code, errs)
	}
	if _, errs, code = runCmd(t, "consent", "lift", "u_7", "fax", "--data", data); code != exitUsage || !strings.Contains(errs, "unknown channel") {
		t.Fatalf("consent lift of a bad channel = %d %q", code, errs)
	}
}

// outbox enqueue on a data directory that does not exist (a typo in --data
// or OUTBOX_DATA, or a directory moved away) refuses and makes nothing:
// a store made there would hold envelopes no serve reads.
func TestEnqueue_RefusesMissingDataDir(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "outbx")
	f := filepath.Join(t.TempDir(), "env.json")
	if err := os.WriteFile(f, replyJSON("typo-1", "u1"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs, code := runCmd(t, "enqueue", "--data", missing, f)
	if code != exitFailure || !strings.Contains(errs, "no data directory "+missing) || !strings.Contains(errs, "nothing was appended") {
		t.Fatalf("enqueue to a missing data directory = %d %q", code, errs)
	}
	if _, err := os.Lstat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("enqueue made %s: %v", missing, err)
	}
}
