// Package crashfs is a file system for power-loss tests: a FUSE loopback
// over a backing directory that remembers what a real disk would still
// hold after the power went out, and can write that out as a directory.
//
// The model is POSIX's, strictly: a file's data is durable as of its last
// fsync or fdatasync, a directory's entries as of its last fsync, and
// nothing else is (no write reaches the disk by itself, a rename or a new
// file is lost unless its directory was synced). A file whose entry
// survives but whose data was never synced comes back empty. What existed
// when the file system was mounted is durable.
//
// The process that mounts it serves it: it must not map a file of the
// mount into memory (bbolt does), since a page fault there waits for a
// server that may be waiting for the garbage collector, which waits for
// the faulting thread.
//
// Linux only (it needs /dev/fuse, and root to mount without fusermount).
package crashfs
