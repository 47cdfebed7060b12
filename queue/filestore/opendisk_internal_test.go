package filestore

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
)

// Open failing on a full disk says so, instead of sending the operator to
// outbox doctor for an index that is fine.
func TestPointAtDoctor_FullDisk(t *testing.T) {
	err := pointAtDoctor("/srv/outbox", fmt.Errorf("commit index: %w", &os.PathError{Op: "write", Path: "/srv/outbox/index.db", Err: syscall.ENOSPC}))
	if msg := err.Error(); !strings.Contains(msg, "the file system is full: free space, then retry") || strings.Contains(msg, "outbox doctor") {
		t.Errorf("full disk: %s", msg)
	}
	err = pointAtDoctor("/srv/outbox", fmt.Errorf("read: %w", syscall.EIO))
	if !strings.Contains(err.Error(), "outbox doctor") {
		t.Errorf("I/O error: %s", err)
	}
}
