package filestore

import (
	"fmt"
	"strconv"
)

// A copy of a data directory (cp -a, a restored backup, a disk cloned for a
// move) holds the same index, with the same identity (its mark id), and
// the same pending rows: two processes on the original and its copy would
// both deliver them. The directory's lock cannot see that (each copy has
// its own lock file), so Open also claims the identity on this host, where
// the system allows it (Linux: an abstract unix socket named after the
// id, which the kernel frees when the process ends, even killed). A copy
// opened while another process has the original open is refused with
// *StoreCopyError. Copies on two hosts are not seen.

// StoreCopyError is returned by Open when another process on this host has
// a store with the same identity open: dir is a copy of it. It matches
// ErrStoreBusy with errors.Is.
type StoreCopyError struct {
	Path  string // the store being opened
	Other string // the directory of the store open elsewhere ("" when unknown)
	PID   int    // the process that has it open (0 when unknown)
}

func (e *StoreCopyError) Error() string {
	other := "another store"
	if e.Other != "" {
		other = "the store in " + e.Other
	}
	by := "another process"
	if e.PID > 0 {
		by = "pid " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("store %s is a copy of %s, which %s has open (the same index identity, %s): both would deliver what is pending in it; stop that process first if this copy is to take its place",
		e.Path, other, by, MarkFile)
}

// Is makes a *StoreCopyError match ErrStoreBusy.
func (e *StoreCopyError) Is(target error) bool { return target == ErrStoreBusy }
