package queue

import (
	"errors"
	"io/fs"
	"syscall"
)

// Errors a store's error matches (errors.Is) when its storage refuses a
// write for its own state, not for the call: the operator has to act. A
// file store returns the system call's error (ENOSPC, EROFS, EACCES …),
// which StorageProblemOf reads as well; a database store returns its own
// error, which matches one of these and ErrUnavailable.
var (
	// ErrStorageFull: no space left (a full disk or quota; a database
	// server whose disk is full).
	ErrStorageFull = errors.New("queue: the store's storage is full")
	// ErrStorageReadOnly: the storage accepts no writes (a file system
	// mounted read-only; a database that is a standby, or read-only).
	ErrStorageReadOnly = errors.New("queue: the store's storage accepts no writes")
	// ErrStorageDenied: the store may not use part of its storage (a file
	// of another user's in its data directory; a database role without a
	// privilege on the store's tables).
	ErrStorageDenied = errors.New("queue: the store may not use part of its storage")
)

// StorageProblem names why a store's storage refused a write (the suffix
// of the HTTP error codes and of the worker's log classes).
type StorageProblem string

const (
	StorageFull     StorageProblem = "full"
	StorageReadOnly StorageProblem = "read_only"
	StorageDenied   StorageProblem = "permission_denied"
)

// StorageProblemOf reports which StorageProblem err is, or "" for none:
// the one place where both stores' forms of these conditions are told
// apart.
func StorageProblemOf(err error) StorageProblem {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrStorageFull), errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return StorageFull
	case errors.Is(err, ErrStorageReadOnly), errors.Is(err, syscall.EROFS):
		return StorageReadOnly
	case errors.Is(err, ErrStorageDenied), errors.Is(err, fs.ErrPermission):
		return StorageDenied
	}
	return ""
}

// Exhausted reports whether err is a process or system resource running
// out (too many open files, no memory or buffers): a passing condition,
// so what failed is tried again later, never judged (a record that could
// not be opened for want of a descriptor is not lost).
func Exhausted(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Loggable is an error whose text says why a store cannot serve and holds
// no secret and no personal data (no DSN or password, no address, no body):
// a database's answer ("too many connections for role …"), a network
// failure without its address. Stores mark such errors so that the logs
// of their callers can say why; every other store error is logged by its
// kind only, since its text may name a user's file or a record.
type Loggable interface {
	error
	Loggable()
}

// Reason returns the text of the first Loggable error in err's chain
// (that error's own text, not what wraps it), or "".
func Reason(err error) string {
	var l Loggable
	if errors.As(err, &l) {
		return l.Error()
	}
	return ""
}
