package applog

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Fdatasync is the default Syncer: fdatasync(2), which flushes the file's
// data and the metadata needed to read it back (its size), not its
// timestamps.
func Fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }

// A log's size and inode are read with statx asking for nothing else (but
// its type): a query of a file's change time makes its next write stamp
// it with a fine-grained time (Linux 6.13+), which nothing here needs.
const sizeIno = unix.STATX_SIZE | unix.STATX_INO

// PathSize returns the size and inode of the file at path, without
// following a symbolic link: a log that is one is a *LinkError.
func PathSize(path string) (int64, uint64, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, sizeIno|unix.STATX_TYPE, &st); err != nil {
		return 0, 0, &os.PathError{Op: "statx", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return 0, 0, &LinkError{Path: path}
	}
	return int64(st.Size), st.Ino, nil
}

// fileSize returns the size and inode of the open file f.
func fileSize(f *os.File) (int64, uint64, error) {
	var st unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, sizeIno, &st); err != nil {
		return 0, 0, &os.PathError{Op: "statx", Path: f.Name(), Err: err}
	}
	return int64(st.Size), st.Ino, nil
}

// samePath reports whether the open file f is the file at path (same
// device and inode); a missing path is os.ErrNotExist.
func samePath(f *os.File, path string) (bool, error) {
	var a, b unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_INO, &a); err != nil {
		return false, err
	}
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO, &b); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, os.ErrNotExist
		}
		return false, err
	}
	return a.Ino == b.Ino && a.Dev_major == b.Dev_major && a.Dev_minor == b.Dev_minor, nil
}
