//go:build linux

package filestore

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// identityPID is the pid a holder of an identity answers with (a test's
// hook: another process, seen from this one).
var identityPID = os.Getpid

// claimIdentity claims the store identity id for dir on this host (see
// identity.go). It returns the function that gives the claim up, or
// *StoreCopyError when another process holds it. Where the claim cannot
// be made (no abstract sockets) nothing is claimed.
func claimIdentity(id, dir string) (release func(), err error) {
	if id == "" || heldHere(id) {
		// No identity yet; or this process holds the original (a program,
		// or a test, that opened a copy beside it): its own affair.
		return func() {}, nil
	}
	name := "@outbox-store-" + id
	for range 3 {
		ln, err := net.Listen("unix", name)
		if err == nil {
			where := dir // as another process's error will name it
			if abs, err := filepath.Abs(dir); err == nil {
				where = abs
			}
			stop := serveIdentity(ln.(*net.UnixListener), where)
			held.Store(id, true)
			var once sync.Once
			return func() { once.Do(func() { held.Delete(id); stop() }) }, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return func() {}, nil
		}
		pid, other, ok := askIdentity(name)
		switch {
		case !ok: // the holder has just let it go: claim it again
		case pid == os.Getpid():
			return func() {}, nil // this process, between a claim and its record
		case sameDir(other, dir):
			// Not a copy: this very directory, whose lock file was
			// removed or replaced under its holder.
			return nil, &StoreInUseError{Path: dir, PID: pid}
		default:
			return nil, &StoreCopyError{Path: dir, Other: other, PID: pid}
		}
	}
	return func() {}, nil
}

// sameDir reports whether paths a and b lead to one directory.
func sameDir(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// held are the identities this process has claimed.
var held sync.Map

func heldHere(id string) bool {
	_, ok := held.Load(id)
	return ok
}

// serveIdentity answers each connection to the identity's socket with the
// holder's pid and directory, until release.
func serveIdentity(ln *net.UnixListener, dir string) (release func()) {
	ln.SetUnlinkOnClose(false) // abstract: nothing to unlink
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				time.Sleep(10 * time.Millisecond) // out of descriptors: the asker gives up, and refuses nothing
				continue
			}
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = fmt.Fprintf(c, "%d\t%s\n", identityPID(), dir)
			_ = c.Close()
		}
	}()
	return func() {
		_ = ln.Close()
		wg.Wait()
	}
}

// askIdentity asks the holder of the identity socket name who it is.
func askIdentity(name string) (pid int, dir string, ok bool) {
	c, err := net.DialTimeout("unix", name, time.Second)
	if err != nil {
		return 0, "", false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, "", true // held, by a process that did not say who
	}
	p, d, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
	pid, _ = strconv.Atoi(p)
	return pid, d, true
}
