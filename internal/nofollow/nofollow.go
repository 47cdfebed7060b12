// Package nofollow opens files inside the data directory without ever
// following a symbolic link: the final component is opened with
// O_NOFOLLOW and the descriptor checked with fstat, so there is no window
// between a check of the name and its use. Whoever may write into the data
// directory (a foreign appender) cannot make outbox read or write a file
// elsewhere through a link planted there.
package nofollow

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrSymlink is wrapped by every *LinkError.
var ErrSymlink = errors.New("a symbolic link inside the data directory, never followed")

// LinkError is a file or directory inside the data directory that is a
// symbolic link (or, for a file, not a regular file). Name is its path
// relative to the data directory.
type LinkError struct {
	Name    string
	NotFile bool // not a link: another kind of file where a regular one belongs
}

func (e *LinkError) Error() string {
	if e.NotFile {
		return e.Name + " in the data directory is not a regular file (replace it with the real file, or remove it)"
	}
	return e.Name + " in the data directory is a symbolic link: outbox never follows links inside its data directory (replace it with the real file or directory, or remove it)"
}

// Unwrap returns ErrSymlink for a link.
func (e *LinkError) Unwrap() error {
	if e.NotFile {
		return nil
	}
	return ErrSymlink
}

// OpenFile opens the regular file at path the way os.OpenFile does, never
// following a link as its final component: a link, or anything but a
// regular file, is a *LinkError named name (the path relative to the data
// directory).
func OpenFile(path, name string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK, perm)
	if err != nil {
		// ELOOP on Linux and macOS, EMLINK on FreeBSD.
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EMLINK) {
			return nil, &LinkError{Name: name}
		}
		return nil, err
	}
	return regular(f, name)
}

// regular returns f if it is a regular file, else closes it.
func regular(f *os.File, name string) (*os.File, error) {
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, &LinkError{Name: name, NotFile: true}
	}
	return f, nil
}

// ReadFile reads the regular file at path (OpenFile's rules), at most
// limit bytes (a larger file is an error).
func ReadFile(path, name string, limit int64) ([]byte, error) {
	f, err := OpenFile(path, name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s in the data directory is larger than %d bytes", name, limit)
	}
	return b, nil
}

// Dir is an open directory inside the data directory, reached without
// following a link; files are created and renamed relative to it.
type Dir struct {
	f    *os.File
	name string // relative to the data directory
}

// OpenDir opens the directory rel (slash-separated components, relative
// to the data directory dataDir, which may itself be reached through a
// link: it is the operator's choice), creating missing components with
// mode perm when create is set. No component below dataDir is followed
// as a link: one is a *LinkError naming it. A missing component without
// create is os.ErrNotExist.
func OpenDir(dataDir, rel string, create bool, perm os.FileMode) (*Dir, error) {
	fd, err := unix.Open(dataDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dataDir, Err: err}
	}
	name := ""
	for _, part := range splitRel(rel) {
		name = filepath.Join(name, part)
		next, err := openat(fd, part, name, create, perm)
		unix.Close(fd)
		if err != nil {
			return nil, err
		}
		fd = next
	}
	return &Dir{f: os.NewFile(uintptr(fd), filepath.Join(dataDir, rel)), name: name}, nil
}

func splitRel(rel string) []string {
	var out []string
	for _, p := range strings.Split(filepath.ToSlash(filepath.Clean(rel)), "/") {
		if p != "" && p != "." {
			out = append(out, p)
		}
	}
	return out
}

// openat opens directory part below the directory fd, never following a
// link, creating it when create is set and it is missing.
func openat(fd int, part, name string, create bool, perm os.FileMode) (int, error) {
	for try := 0; ; try++ {
		next, err := unix.Openat(fd, part, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		switch {
		case err == nil:
			return next, nil
		case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EMLINK):
			return -1, &LinkError{Name: name}
		case errors.Is(err, unix.ENOTDIR):
			var st unix.Stat_t
			if unix.Fstatat(fd, part, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return -1, &LinkError{Name: name}
			}
			return -1, &os.PathError{Op: "open", Path: name, Err: err}
		case errors.Is(err, unix.ENOENT) && create && try == 0:
			if err := unix.Mkdirat(fd, part, uint32(perm.Perm())); err != nil && !errors.Is(err, unix.EEXIST) {
				return -1, &os.PathError{Op: "mkdir", Path: name, Err: err}
			}
		case errors.Is(err, unix.ENOENT):
			return -1, &os.PathError{Op: "open", Path: name, Err: os.ErrNotExist}
		default:
			return -1, &os.PathError{Op: "open", Path: name, Err: err}
		}
	}
}

// Name is the directory's path relative to the data directory.
func (d *Dir) Name() string { return d.name }

// Close closes the directory.
func (d *Dir) Close() error { return d.f.Close() }

// Sync fsyncs the directory (its entries).
func (d *Dir) Sync() error { return d.f.Sync() }

// OpenFile opens file base in the directory with OpenFile's rules (no
// link followed; only a regular file).
func (d *Dir) OpenFile(base string, flag int, perm os.FileMode) (*os.File, error) {
	name := filepath.Join(d.name, base)
	fd, err := unix.Openat(int(d.f.Fd()), base, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EMLINK) {
			return nil, &LinkError{Name: name}
		}
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.f.Name(), base))
	return regular(f, name)
}

// Lstat describes entry base of the directory without following a link.
func (d *Dir) Lstat(base string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(int(d.f.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return st, &os.PathError{Op: "lstat", Path: filepath.Join(d.name, base), Err: err}
	}
	return st, nil
}

// Rename renames entry from to to within the directory (replacing to,
// and never following a link there: a rename replaces the name itself).
func (d *Dir) Rename(from, to string) error {
	fd := int(d.f.Fd())
	if err := unix.Renameat(fd, from, fd, to); err != nil {
		return &os.PathError{Op: "rename", Path: filepath.Join(d.name, to), Err: err}
	}
	return nil
}

// Remove removes file base of the directory (a link: the link itself).
func (d *Dir) Remove(base string) error {
	if err := unix.Unlinkat(int(d.f.Fd()), base, 0); err != nil {
		return &os.PathError{Op: "remove", Path: filepath.Join(d.name, base), Err: err}
	}
	return nil
}
