package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The operator puts back last night's copy of the data directory (taken
// with serve stopped, as docs/operations.md says), in which envelopes
// since delivered are still pending. doctor --after-restore makes those
// deliveries unresolved; what had been delivered and pruned stays pruned
// (the copy's logs are other files, read again from their start): serve
// then sends nothing twice.
func TestFiles_RestoredFromACopy(t *testing.T) {
	bin := buildBinary(t)
	data := filepath.Join(t.TempDir(), "data")
	const token = "restore-token-0123456789abcdef"
	env := []string{"INTERNAL_OUTBOX_TOKEN=" + token}
	sinkFiles := func(dir string) map[string]bool {
		fs, _ := filepath.Glob(filepath.Join(dir, "sink", "telegram", "*"))
		m := map[string]bool{}
		for _, f := range fs {
			m[filepath.Base(f)] = true
		}
		return m
	}
	post := func(d *daemon, id string) {
		t.Helper()
		if code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON(id, "u1", 1)); code != http.StatusCreated {
			t.Fatalf("POST %s = %d %s", id, code, b)
		}
	}

	// r-0 and r-1 delivered, then r-2 and r-3 enqueued while no provider
	// runs; compact prunes r-0 and r-1, whose records stay in u1's log
	// (r-2 and r-3 keep it). The copy is taken then.
	d, out, _ := launchServe(t, bin, data, env)
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	post(d, "r-0")
	post(d, "r-1")
	eventually(t, "r-0 and r-1 delivered", func() bool { return len(sinkFiles(data)) == 2 })
	d.stop(t)
	d, out, _ = launchServe(t, bin, data, env, "--no-sink")
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	post(d, "r-2")
	post(d, "r-3")
	d.stop(t)
	if out, code := outboxEnv(t, bin, env, "compact", "--data", data, "--retention", "1ns"); code != 0 || !strings.Contains(out, "pruned 2 envelopes") {
		t.Fatalf("compact: exit %d\n%s", code, out)
	}
	backup := filepath.Join(t.TempDir(), "backup")
	copyDir(t, data, backup)

	d, out, _ = launchServe(t, bin, data, env)
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	eventually(t, "r-2 and r-3 delivered", func() bool { return len(sinkFiles(data)) == 4 })
	d.stop(t)

	// The restore: the copy put back; the sink (the recipients' side) is
	// what it is now.
	sink := filepath.Join(t.TempDir(), "sink")
	if err := os.Rename(filepath.Join(data, "sink"), sink); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	copyDir(t, backup, data)
	if err := os.RemoveAll(filepath.Join(data, "sink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(sink, filepath.Join(data, "sink")); err != nil {
		t.Fatal(err)
	}
	delivered := sinkFiles(data)

	out, code := outboxEnv(t, bin, env, "doctor", "--data", data, "--after-restore")
	if code != 0 || !strings.Contains(out, "after restore: 2 envelopes had deliveries of unknown fate: they are unresolved") {
		t.Fatalf("doctor --after-restore: exit %d\n%s", code, out)
	}
	d, out, _ = launchServe(t, bin, data, env)
	if d == nil {
		t.Fatalf("serve after doctor --after-restore:\n%s", out)
	}
	post(d, "r-4")
	eventually(t, "r-4 delivered", func() bool { return len(sinkFiles(data)) == 5 })
	if out, code := outboxEnv(t, bin, env, "ls", "--data", data, "--state", "unresolved"); code != 0 || strings.Count(out, "unresolved") != 2 || !strings.Contains(out, "r-2") || !strings.Contains(out, "r-3") {
		t.Errorf("ls --state unresolved: exit %d\n%s", code, out)
	}
	d.stop(t)
	now := sinkFiles(data)
	for f := range delivered {
		delete(now, f)
	}
	if len(now) != 1 {
		t.Errorf("%d new deliveries after the restore, want 1 (r-4): a restored one was sent again", len(now))
	}
	for _, id := range []string{"r-0", "r-1"} {
		if out, code := outbox(t, bin, "show", "--data", data, id); code == 0 {
			t.Errorf("%s, pruned before the copy, is back after the restore:\n%s", id, out)
		}
	}
}
