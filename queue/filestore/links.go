package filestore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	"golang.org/x/sys/unix"
)

// ErrSymlink is wrapped by the error of an enqueue (or Append) whose log,
// or whose log's tenant directory, is a symbolic link, and by Open's when
// the data directory's logs directory, index or pid file is one. Nothing
// inside the data directory is followed: whoever may write into logs/ (a
// foreign appender) cannot make the store read or write a file elsewhere.
// Such a log is refused, never followed; the tailer and the rescans skip
// it (logged once, without its name) and outbox doctor lists it.
var ErrSymlink = applog.ErrSymlink

// reportLink logs, once per process and link, that a log or a tenant
// directory is a symbolic link and is skipped: the link that err (from
// opening log rel) names, or rel itself (relative to the data directory)
// when err is nil. The record holds no path: a log's name is derived from
// a user id.
func (q *Queue) reportLink(rel string, err error) {
	key := filepath.Join(q.dir, rel)
	if le := (*applog.LinkError)(nil); errors.As(err, &le) {
		key = le.Path
	}
	if _, seen := q.links.LoadOrStore(key, true); seen || q.log == nil {
		return
	}
	q.log.Warn("a log or tenant directory is a symbolic link: skipped, never followed (outbox doctor lists it)",
		"operation", "ingest", "status", "refused")
}

// reportUnreadable logs, once per path, a log or tenant directory this
// process may not read (another user's: a command run as root that created
// it, mode 0600). It is skipped; the other logs are indexed as usual.
func (q *Queue) reportUnreadable(rel string) {
	if _, seen := q.unreadable.LoadOrStore(rel, true); seen || q.log == nil {
		return
	}
	q.log.Warn("a log or tenant directory cannot be read (permission denied: another user's file?): its records are not indexed until it belongs to the store's user again (chown it, then outbox serve or doctor indexes it)",
		"operation", "ingest", "status", "unreadable")
}

// isLink reports whether a directory entry is a symbolic link.
func isLink(e os.DirEntry) bool { return e.Type()&os.ModeSymlink != 0 }

// checkNotLink fails with a *applog.LinkError when path is a symbolic link
// (a missing path is fine).
func checkNotLink(path string) error {
	fi, err := os.Lstat(path)
	if err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return &applog.LinkError{Path: path}
	}
	return nil
}

// openNoFollow is os.OpenFile that refuses a symbolic link as the final
// component (O_NOFOLLOW) with a *applog.LinkError; for bbolt's index file
// and the pid file.
func openNoFollow(name string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(name, flag|unix.O_NOFOLLOW, perm)
	if err != nil && (errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EMLINK)) {
		if lerr := checkNotLink(name); lerr != nil {
			return nil, lerr
		}
	}
	return f, err
}

// findLinks returns the symbolic links among the tenant directories under
// logs/ and the logs and quarantine files in them, relative to dir.
func findLinks(dir string) []string {
	root := filepath.Join(dir, applog.Dir)
	var out []string
	tenants, _ := os.ReadDir(root)
	for _, t := range tenants {
		rel := filepath.Join(applog.Dir, t.Name())
		if isLink(t) {
			out = append(out, rel)
			continue
		}
		if !t.IsDir() {
			continue
		}
		files, _ := os.ReadDir(filepath.Join(root, t.Name()))
		for _, f := range files {
			if isLink(f) {
				out = append(out, filepath.Join(rel, f.Name()))
			}
		}
	}
	return out
}

// linkProblems are Check's problems for the symbolic links under logs/.
func linkProblems(dir string) []string {
	var out []string
	for _, rel := range findLinks(dir) {
		out = append(out, fmt.Sprintf("%s: a symbolic link, never followed (the records it leads to are not indexed, appends for its user fail); replace it with the real file or directory, or remove it", rel))
	}
	return out
}

// Owner returns the user the store in dir belongs to: the owner of its
// index, else of its logs directory. ok is false for a directory without a
// store yet (or a system that does not say).
func Owner(dir string) (uid int, ok bool) {
	for _, name := range []string{IndexFile, applog.Dir} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return 0, false
		}
		return int(st.Uid), true
	}
	return 0, false
}

// ownerProblems lists the tenant directories and logs that belong to
// another user than index.db (made by a command run as root, mode 0600:
// the store's own process cannot read them), or that this process may not
// read.
func ownerProblems(dir string) []string {
	owner, known := Owner(dir)
	var out []string
	check := func(rel string, fi os.FileInfo) {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && known && int(st.Uid) != owner {
			out = append(out, fmt.Sprintf("%s: belongs to uid %d, not to the store's user (uid %d): serve cannot read it, and its records are not indexed; chown it to the store's user", rel, st.Uid, owner))
		}
	}
	root := filepath.Join(dir, applog.Dir)
	tenants, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	for _, t := range tenants {
		if !t.IsDir() || isLink(t) {
			continue
		}
		rel := filepath.Join(applog.Dir, t.Name())
		if fi, err := t.Info(); err == nil {
			check(rel, fi)
		}
		files, err := os.ReadDir(filepath.Join(root, t.Name()))
		if errors.Is(err, fs.ErrPermission) {
			out = append(out, rel+": cannot be read by this process (permission denied): its logs are not indexed; chown it to the store's user")
			continue
		}
		for _, f := range files {
			if f.IsDir() || filepath.Ext(f.Name()) != applog.Ext || isLink(f) {
				continue
			}
			if fi, err := f.Info(); err == nil {
				check(filepath.Join(rel, f.Name()), fi)
			}
		}
	}
	return out
}

// readNoFollow reads a file of a log's directory with applog.OpenFile's
// rules (no link followed).
func readNoFollow(path string) ([]byte, error) {
	f, err := applog.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
