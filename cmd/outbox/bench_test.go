package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// outbox bench runs the harness's phases through the real store and worker
// and reports the harness's metric names; --only picks phase groups.
func TestBench_SmallRun(t *testing.T) {
	data := t.TempDir()
	out, errs, code := runCmd(t, "bench", "--json", "--data", data, "-n", "60", "--e2e-n", "20", "--e2e-rate", "2000", "--users", "3", "--only", "p1,e2e")
	if left, _ := os.ReadDir(data); len(left) != 0 {
		t.Errorf("the run left %d stores behind in its data directory", len(left))
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var res struct {
		Metrics map[string]float64 `json:"metrics"`
		Params  map[string]any     `json:"params"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	for _, k := range []string{"send_p1_per_s", "drain_c1_per_s", "e2e_c1_p50_us", "e2e_c4_p99_us", "e2e_c1_send_p50_us"} {
		if res.Metrics[k] <= 0 {
			t.Errorf("metric %s = %v, want > 0", k, res.Metrics[k])
		}
	}
	if v, ok := res.Metrics["duplicates_n"]; !ok || v != 0 {
		t.Errorf("duplicates_n = %v (present %v), want 0", v, ok)
	}
	// It states its durability, including that the claims are not
	// fsynced (the no-op provider redelivers idempotently).
	if d, _ := res.Params["durability"].(string); !strings.HasPrefix(d, "durable") || !strings.Contains(d, "claims unsynced") {
		t.Errorf("params.durability = %q, want the enqueue's and the claims' durability", d)
	}
	if _, ran := res.Metrics["send_p16_per_s"]; ran {
		t.Error("--only p1,e2e ran send_p16")
	}

	_, errs, code = runCmd(t, "bench", "--only", "p2")
	if code != 2 || !strings.Contains(errs, `unknown phase group "p2"`) {
		t.Errorf("--only p2: exit %d, stderr %q; want 2 and the unknown group named", code, errs)
	}
}

// The run's stores go in a directory that asks ext4 to place each in a
// block group of its own (chattr +T), away from a temporary directory's
// recent deletions; the directory is removed at the end (above).
func TestBenchRoot_AsksToSpreadStores(t *testing.T) {
	parent := t.TempDir()
	probe := filepath.Join(parent, "probe")
	if err := os.Mkdir(probe, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := dirFlags(probe, fsTopDirFlag); err != nil {
		t.Skipf("the filesystem of %s takes no placement hint: %v", parent, err) // tmpfs and the like; ext4 here
	}
	root, err := benchRoot(parent)
	if err != nil {
		t.Fatal(err)
	}
	flags, err := dirFlags(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&fsTopDirFlag == 0 {
		t.Fatalf("flags of the bench root %#x lack FS_TOPDIR_FL", flags)
	}
}

// dirFlags ORs set into dir's inode flags (when set is not 0) and returns
// them.
func dirFlags(dir string, set uint32) (uint32, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil || set == 0 {
		return flags, err
	}
	if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|set)); err != nil {
		return 0, err
	}
	return unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
}
