package queue_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/outboxhq/outbox/queue"
)

// Both stores' forms of a storage that refuses writes (a system call's
// errno from the file store, a database store's error matching a
// sentinel) are told apart in one place.
func TestStorageProblemOf(t *testing.T) {
	path := func(errno syscall.Errno) error {
		return fmt.Errorf("append to log: %w", &os.PathError{Op: "write", Path: "/x", Err: errno})
	}
	for _, tc := range []struct {
		err  error
		want queue.StorageProblem
	}{
		{nil, ""},
		{errors.New("other"), ""},
		{queue.ErrUnavailable, ""},
		{path(syscall.ENOSPC), queue.StorageFull},
		{path(syscall.EDQUOT), queue.StorageFull},
		{path(syscall.EROFS), queue.StorageReadOnly},
		{path(syscall.EACCES), queue.StorageDenied},
		{path(syscall.EPERM), queue.StorageDenied},
		{fmt.Errorf("x: %w", fs.ErrPermission), queue.StorageDenied},
		{fmt.Errorf("enqueue: %w", queue.ErrStorageFull), queue.StorageFull},
		{fmt.Errorf("enqueue: %w", queue.ErrStorageReadOnly), queue.StorageReadOnly},
		{fmt.Errorf("enqueue: %w", queue.ErrStorageDenied), queue.StorageDenied},
	} {
		if got := queue.StorageProblemOf(tc.err); got != tc.want {
			t.Errorf("StorageProblemOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
