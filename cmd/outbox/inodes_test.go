//go:build linux

package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/queue/filestore"
)

// The data directory's file system runs out of inodes while it still has
// space (each user's log is a file: many users on a file system made with
// few inodes). Enqueues for a user without a log are answered 507
// storage_full with a message that names inodes, a user with a log goes
// on, and doctor says what is wrong (the free space and inodes, no
// rebuild) instead of "ok".
func TestFault_NoFreeInodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a loop file system: root only (CI runs as root)")
	}
	mnt := loopFSWith(t, 64<<20, []string{"-N", "64"}, "loop")
	if mnt == "" {
		t.Fatal("cannot mount a loop file system")
	}
	bin := buildBinary(t)
	data := filepath.Join(mnt, "data")
	const token = "inode-token-0123456789abcdef"
	env := []string{"INTERNAL_OUTBOX_TOKEN=" + token}
	d, out, _ := launchServe(t, bin, data, env)
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	if code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON("first", "u-0", 1)); code != http.StatusCreated {
		t.Fatalf("POST for the first user = %d %s", code, b)
	}
	full := -1
	for i := 1; i < 100 && full < 0; i++ {
		code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON(fmt.Sprintf("e-%d", i), fmt.Sprintf("u-%d", i), 1))
		switch {
		case code == http.StatusInsufficientStorage:
			if !strings.Contains(string(b), `"storage_full"`) || !strings.Contains(string(b), "no free inodes") {
				t.Errorf("POST without inodes = %d %s, want storage_full naming inodes", code, b)
			}
			full = i
		case code != http.StatusCreated:
			t.Fatalf("POST %d = %d %s", i, code, b)
		}
	}
	if full < 0 {
		t.Fatal("99 users' logs fitted in 64 inodes")
	}
	if code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON("again", "u-0", 1)); code != http.StatusCreated {
		t.Errorf("POST for a user with a log, without inodes = %d %s, want 201", code, b)
	}
	if code, b := request(t, "GET", d.base+"/metrics", "", nil); code != http.StatusOK || !strings.Contains(string(b), `outbox_storage_free_ratio{resource="inodes"} 0`+"\n") {
		t.Errorf("metrics without inodes = %d, want outbox_storage_free_ratio{resource=\"inodes\"} 0:\n%s", code, grepLines(b, "outbox_storage_free_ratio"))
	}
	out, code := outboxEnv(t, bin, nil, "doctor", "--data", data) // through serve
	if code == 0 || !strings.Contains(out, "problem: "+filestore.NoInodesProblem) || !strings.Contains(out, " 0 inodes free") {
		t.Errorf("doctor without inodes: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "do not rebuild") || strings.Contains(out, "rebuilding") {
		t.Errorf("doctor without inodes advises or runs a rebuild:\n%s", out)
	}
	d.stop(t)
	if out, code := outboxEnv(t, bin, nil, "doctor", "--data", data); code != 0 || !strings.Contains(out, "inodes free") {
		t.Errorf("doctor with serve stopped (its socket and pid file freed inodes): exit %d\n%s", code, out)
	}
}

// grepLines is the lines of b that contain s.
func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
