//go:build !linux

package main

// spreadStores does nothing outside Linux: the placement hint of benchRoot
// is an ext2/3/4 inode flag.
func spreadStores(string) {}
