package applog

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Directory syncs are group-committed like appends: a new log's entry is
// durable once an fsync of its directory that began after the entry was
// made has returned. Concurrent creators of logs in one directory (a burst
// of new users) then share fsyncs instead of taking one each, in this
// process; the first creator to arrive syncs, the ones that arrive
// meanwhile wait for its next round.
type dirGroup struct {
	mu      sync.Mutex
	leader  bool
	pending []*dirRequest
}

type dirRequest struct {
	err  error
	done chan struct{}
}

var dirGroups sync.Map // directory path → *dirGroup

// syncDirShared returns once an fsync of dir that began after the call has
// returned (and that fsync's error).
func syncDirShared(dir string) error {
	v, _ := dirGroups.LoadOrStore(dir, &dirGroup{})
	g := v.(*dirGroup)
	r := &dirRequest{done: make(chan struct{})}
	g.mu.Lock()
	g.pending = append(g.pending, r)
	if g.leader {
		g.mu.Unlock()
		<-r.done
		return r.err
	}
	g.leader = true
	for len(g.pending) > 0 {
		batch := g.pending
		g.pending = nil
		g.mu.Unlock()
		err := fsyncDir(dir)
		for _, w := range batch {
			w.err = err
			close(w.done)
		}
		g.mu.Lock()
	}
	g.leader = false
	g.mu.Unlock()
	return r.err
}

// fsyncDir opens dir without the os package's poller set-up and syncs it
// through syncDir (the tests' hook).
func fsyncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync log directory: %w", &os.PathError{Op: "open", Path: dir, Err: err})
	}
	df := os.NewFile(uintptr(fd), dir)
	err = syncDir(df)
	df.Close()
	if err != nil {
		return fmt.Errorf("sync log directory: %w", err)
	}
	return nil
}
