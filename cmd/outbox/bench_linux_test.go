package main

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The run's stores go in a directory that asks ext4 to place each in a
// block group of its own (chattr +T), away from a temporary directory's
// recent deletions (bench_test.go checks that it is removed at the end).
func TestBenchRoot_AsksToSpreadStores(t *testing.T) {
	parent := t.TempDir()
	probe := filepath.Join(parent, "probe")
	if err := os.Mkdir(probe, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := dirFlags(probe, fsTopDirFlag); err != nil {
		t.Skipf("the filesystem of %s takes no placement hint: %v", parent, err) // tmpfs and the like; ext4 here
	}
	root, err := benchRoot(parent)
	if err != nil {
		t.Fatal(err)
	}
	flags, err := dirFlags(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&fsTopDirFlag == 0 {
		t.Fatalf("flags of the bench root %#x lack FS_TOPDIR_FL", flags)
	}
}

// dirFlags ORs set into dir's inode flags (when set is not 0) and returns
// them.
func dirFlags(dir string, set uint32) (uint32, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil || set == 0 {
		return flags, err
	}
	if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|set)); err != nil {
		return 0, err
	}
	return unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
}
