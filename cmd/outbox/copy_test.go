//go:build linux

package main

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A copy of a data directory (cp -a to move it, a backup put back beside
// the store it was taken from) started while serve runs on the original
// would deliver every pending row a second time: serve refuses it, naming
// the original and its process, and starts on it once that serve has
// stopped.
func TestServe_ACopyBesideItsRunningOriginalIsRefused(t *testing.T) {
	bin := buildBinary(t)
	orig, copied := filepath.Join(t.TempDir(), "orig"), filepath.Join(t.TempDir(), "copy")
	d, out, code := launchServe(t, bin, orig, nil)
	if d == nil {
		t.Fatalf("serve on the original exited %d:\n%s", code, out)
	}
	copyDir(t, orig, copied)
	d2, out, code := launchServe(t, bin, copied, nil)
	if d2 != nil {
		d2.kill()
		t.Fatal("serve started on a copy of the data directory beside its running original")
	}
	for _, want := range []string{"is a copy of the store in " + orig, "pid " + strconv.Itoa(d.cmd.Process.Pid)} {
		if !strings.Contains(out, want) {
			t.Errorf("serve on the copy exited %d without %q:\n%s", code, want, out)
		}
	}
	if code == 0 {
		t.Error("serve on the copy exited 0")
	}
	d.stop(t)
	d2, out, code = launchServe(t, bin, copied, nil)
	if d2 == nil {
		t.Fatalf("serve on the copy after the original stopped exited %d:\n%s", code, out)
	}
	d2.stop(t)
}
