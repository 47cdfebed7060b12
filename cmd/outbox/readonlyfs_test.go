//go:build linux

package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/queue/filestore"
)

// The data directory's file system turns read-only under a running serve,
// as ext4 does after a disk error (errors=remount-ro; the kernel's own
// trigger, /sys/fs/ext4/DEV/trigger_fs_error). serve stays up: enqueues
// are answered 503 storage_read_only, /readyz 503, reads still answer.
// Then, stopped: doctor can still look and says what is wrong (not "ok",
// and not "rebuild"), and serve does not start, saying the file system is
// read-only.
func TestFault_FileSystemTurnsReadOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a loop file system: root only (CI runs as root)")
	}
	mnt := loopFS(t, "loop,errors=remount-ro")
	if mnt == "" {
		t.Fatal("cannot mount a loop file system")
	}
	src, err := exec.Command("findmnt", "-n", "-o", "SOURCE", mnt).Output()
	if err != nil {
		t.Fatal(err)
	}
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(strings.TrimSpace(string(src))), "trigger_fs_error")
	bin := buildBinary(t)
	data := filepath.Join(mnt, "data")
	const token = "rofs-token-0123456789abcdef"
	env := []string{"INTERNAL_OUTBOX_TOKEN=" + token}
	d, out, _ := launchServe(t, bin, data, env)
	if d == nil {
		t.Fatalf("serve:\n%s", out)
	}
	if code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON("before", "u-1", 1)); code != http.StatusCreated {
		t.Fatalf("POST before = %d %s", code, b)
	}
	eventually(t, "before delivered", func() bool {
		_, b := request(t, "GET", d.base+"/v1/envelopes/before", token, nil)
		return strings.Contains(string(b), `"sent"`)
	})

	if err := os.WriteFile(trigger, []byte("outbox test\n"), 0); err != nil {
		t.Fatalf("trigger a file system error: %v", err)
	}
	code, b := request(t, "POST", d.base+"/v1/envelopes", token, chatJSON("during", "u-2", 1))
	if code != http.StatusServiceUnavailable || !strings.Contains(string(b), `"storage_read_only"`) {
		t.Errorf("POST on a read-only file system = %d %s, want 503 storage_read_only", code, b)
	}
	if code, b := request(t, "GET", d.base+"/readyz", "", nil); code != http.StatusServiceUnavailable {
		t.Errorf("readyz on a read-only file system = %d %s, want 503", code, b)
	}
	if code, b := request(t, "GET", d.base+"/v1/envelopes/before", token, nil); code != http.StatusOK {
		t.Errorf("GET on a read-only file system = %d %s, want 200", code, b)
	}
	d.kill()

	out, code = outboxEnv(t, bin, nil, "doctor", "--data", data)
	if code == 0 || !strings.Contains(out, "problem: "+filestore.ReadOnlyProblem) || !strings.Contains(out, "do not rebuild") {
		t.Errorf("doctor on a read-only file system: exit %d\n%s", code, out)
	}
	if strings.Contains(out, "rebuilding") {
		t.Errorf("doctor rebuilt on a read-only file system:\n%s", out)
	}
	d, out, code = launchServe(t, bin, data, env)
	if d != nil {
		t.Fatal("serve started on a read-only file system")
	}
	if code == 0 || !strings.Contains(out, "the file system is read-only") {
		t.Errorf("serve on a read-only file system: exit %d\n%s", code, out)
	}
}
