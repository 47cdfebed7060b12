package filestore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// LockFile is the data directory's lock, inside it. Every process that
// opens the index takes it first and holds it until it is done: Open
// (outbox serve, a program embedding the store, the operator commands
// without a daemon), Rebuild, CompactFile and Compact exclusively; Check
// and Known shared. The file is never removed (a lock file removed and
// created again could be held by two processes at once, one on each
// inode); the exclusive holder writes its pid into it for the error of the
// next one. bbolt's own lock on index.db is not enough: a process that
// replaces index.db (compaction, rebuild) would leave a waiter holding the
// lock of the old, unlinked file while a later opener takes the new one.
const LockFile = "lock"

// dirLock is a held lock of a data directory (flock(2) on LockFile).
type dirLock struct {
	f         *os.File
	exclusive bool
}

// lockDir takes the lock of data directory dir, exclusive or shared,
// waiting at most timeout. A held lock fails with *StoreInUseError.
func lockDir(dir string, exclusive bool, timeout time.Duration) (*dirLock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if errors.Is(err, unix.EROFS) && !exclusive {
		// A file system remounted read-only (after disk errors): nothing
		// can write in it, and a look (doctor, Known) is what the operator
		// needs then. flock works on a descriptor opened read-only; a lock
		// file that was never made was never held.
		f, err = os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if isNotExist(err) {
			return &dirLock{}, nil
		}
	}
	if errors.Is(err, unix.EROFS) {
		return nil, fmt.Errorf("open the data directory's lock: %w (the file system is read-only: a disk error may have made the kernel remount it so, see dmesg; outbox doctor can still look at the store)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("open the data directory's lock: %w", err)
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	deadline := time.Now().Add(timeout)
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock the data directory: %w", err)
		}
		if time.Now().After(deadline) {
			pid := lockHolder(f)
			f.Close()
			if pid == 0 {
				pid = readPID(dir)
			}
			return nil, &StoreInUseError{Path: dir, PID: pid}
		}
		time.Sleep(10 * time.Millisecond)
	}
	l := &dirLock{f: f, exclusive: exclusive}
	if exclusive {
		// Best effort: the pid only serves the next opener's error.
		if f.Truncate(0) == nil {
			_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
	}
	return l, nil
}

// writable reports whether the file system of data directory dir accepts
// writes, by opening its lock file for writing (an ext4 that turned
// read-only after a disk error still says rw to statfs and access(2)).
func writable(dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// lockHolder reads the pid written by the exclusive holder (0 if none).
func lockHolder(f *os.File) int {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, _ := strconv.Atoi(string(bytes.TrimSpace(b[:n])))
	return pid
}

// release clears the pid and releases the lock. It is idempotent.
func (l *dirLock) release() {
	if l == nil || l.f == nil {
		return
	}
	if l.exclusive {
		_ = l.f.Truncate(0)
	}
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	_ = l.f.Close()
	l.f = nil
}
