//go:build !linux

package main

import "time"

// spreadStores does nothing outside Linux: the placement hint of benchRoot
// is an ext2/3/4 inode flag.
func spreadStores(string) {}

// The database server's CPU is read from /proc, on Linux only.
func parentPID(int) (int, bool) { return 0, false }

func treeCPU(int) (time.Duration, bool) { return 0, false }
