package filestore

import (
	"os"
	"syscall"
)

// KillAt makes this process (a test's child) die by SIGKILL when it
// reaches the fault point named point (faultAt).
func KillAt(point string) {
	faultHook = func(p string) {
		if p == point {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}
