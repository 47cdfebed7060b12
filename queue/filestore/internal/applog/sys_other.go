//go:build !linux

package applog

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Fdatasync is the default Syncer. Outside Linux it is (*os.File).Sync:
// fsync(2), and on macOS fcntl(F_FULLFSYNC), which also flushes the
// drive's own cache.
func Fdatasync(f *os.File) error { return f.Sync() }

// PathSize returns the size and inode of the file at path, without
// following a symbolic link: a log that is one is a *LinkError.
func PathSize(path string) (int64, uint64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0, 0, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return 0, 0, &LinkError{Path: path}
	}
	return st.Size, uint64(st.Ino), nil
}

// fileSize returns the size and inode of the open file f.
func fileSize(f *os.File) (int64, uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, 0, &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	return st.Size, uint64(st.Ino), nil
}

// samePath reports whether the open file f is the file at path (same
// device and inode); a missing path is os.ErrNotExist.
func samePath(f *os.File, path string) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &a); err != nil {
		return false, err
	}
	if err := unix.Lstat(path, &b); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, os.ErrNotExist
		}
		return false, err
	}
	return a.Ino == b.Ino && a.Dev == b.Dev, nil
}
