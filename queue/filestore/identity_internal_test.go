//go:build linux

package filestore

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A copy of a data directory opened while another process has the
// original open is refused, naming that process and the original; once
// the original is closed the copy opens. The copy is refused before its
// index is read (a copy taken under writes may hold a torn one). (The other process is this one,
// made to look like another: its claim is forgotten here and its socket
// answers with another pid.)
func TestIdentity_ACopyBesideItsOriginalIsRefused(t *testing.T) {
	defer func(f func() int) { identityPID = f }(identityPID)
	identityPID = func() int { return 1 }
	orig, copied := filepath.Join(t.TempDir(), "orig"), filepath.Join(t.TempDir(), "copy")
	storeWith(t, orig, 4)
	q := openFault(t, orig)
	held.Delete(q.markID)
	copyTree(t, orig, copied)

	_, err := Open(copied, nil)
	var ce *StoreCopyError
	if !errors.As(err, &ce) || ce.PID != 1 || ce.Other != orig || ce.Path != copied || !errors.Is(err, ErrStoreBusy) {
		t.Fatalf("Open of a copy beside its open original: %v, want *StoreCopyError naming pid 1 and %s", err, orig)
	}
	// A copy taken under writes may hold a torn index: it is still a
	// copy, refused as one before its index is read.
	torn := filepath.Join(t.TempDir(), "torn")
	copyTree(t, orig, torn)
	if err := os.Truncate(filepath.Join(torn, IndexFile), 100); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(torn, nil); !errors.As(err, &ce) {
		t.Fatalf("Open of a torn copy beside its open original: %v, want *StoreCopyError", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := Open(copied, nil)
	if err != nil {
		t.Fatalf("Open of the copy once the original is closed: %v", err)
	}
	defer c.Close()
	if n := rows(t, c); n != 4 {
		t.Fatalf("the copy has %d rows, want 4", n)
	}
	// Two stores of this process with one identity (a test's copy): each
	// opens.
	copyTree(t, copied, orig+"2")
	d, err := Open(orig+"2", nil)
	if err != nil {
		t.Fatalf("a copy opened in the process that has the original open: %v", err)
	}
	d.Close()
}

// The lock file removed under the process that holds the store: another
// opener takes a new lock file, but the identity still tells it the store
// is open, and it is refused as in use (not as a copy of itself).
func TestIdentity_LockFileRemovedUnderItsHolder(t *testing.T) {
	defer func(f func() int) { identityPID = f }(identityPID)
	identityPID = func() int { return 1 }
	dir := filepath.Join(t.TempDir(), "data")
	storeWith(t, dir, 2)
	q := openFault(t, dir)
	defer q.Close()
	held.Delete(q.markID)
	if err := os.Remove(filepath.Join(dir, LockFile)); err != nil {
		t.Fatal(err)
	}
	_, err := Open(dir, nil)
	var ie *StoreInUseError
	if !errors.As(err, &ie) || ie.PID != 1 {
		t.Fatalf("Open beside a holder whose lock file was removed: %v, want *StoreInUseError naming pid 1", err)
	}
}
