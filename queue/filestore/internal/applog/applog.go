// Package applog implements the per-(tenant, user) append logs: safe file
// names derived from ids, appends under an exclusive flock with shared
// fsyncs (group commit), and a reader that stops at the last complete line.
//
// A log is JSON Lines: one envelope per line, each line ending in '\n'. A
// final line without its newline is an append in progress and is never
// read. An appender that finds such a torn tail while it holds the lock
// knows its writer died (writers hold the lock for the whole line), so it
// terminates the torn line with a '\n' first: that line then fails to parse
// and is quarantined by the reader, and the new records stay intact.
// Every appender, the store's own included, writes only its records (and
// that newline) at the end of the file: a log grows by what is appended to
// it, and a reader that follows its size (tail -f) sees each record once it
// is written.
//
// Older builds of the store kept a reserve of spaces at the end of the logs
// they wrote (no newline) and wrote their records over it. Such padding
// reads as an unfinished final line; an append ends it with a newline (the
// line of spaces is then no record, see Lines), and a line that starts
// with spaces is read without them.
package applog

import (
	"bytes"
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"golang.org/x/sys/unix"
)

// Dir is the name of the directory, inside the data directory, that holds
// the logs: <data>/logs/<tenant>/<user>.jsonl.
const Dir = "logs"

// Ext is the extension of a log file.
const Ext = ".jsonl"

// QuarantineExt is the extension of a log's quarantine file.
const QuarantineExt = ".quarantine"

// Name turns an id into a file-name component that cannot escape a
// directory, cannot collide with another id's name (also on case-insensitive
// file systems) and stays short: the id's bytes reduced to [a-z0-9_-] (at
// most 40 of them) then "-" and the first 16 hex digits of SHA-256(id).
func Name(id string) string {
	var b strings.Builder
	for i := 0; i < len(id) && b.Len() < 40; i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		case c >= 'A' && c <= 'Z':
			b.WriteByte(c + 'a' - 'A')
		default:
			b.WriteByte('_')
		}
	}
	sum := sha256.Sum256([]byte(id))
	b.WriteByte('-')
	b.WriteString(hex.EncodeToString(sum[:8]))
	return b.String()
}

// RelPath returns the log's path relative to the data directory. Names
// hold no separator and are never "." or "..", so the parts are joined
// as they are (what filepath.Join would return, without its Clean).
func RelPath(tenant, user string) string {
	const sep = string(filepath.Separator)
	return Dir + sep + Name(tenant) + sep + Name(user) + Ext
}

// Path returns the log's absolute path under dataDir.
func Path(dataDir, tenant, user string) string {
	return filepath.Join(dataDir, RelPath(tenant, user))
}

// ErrSymlink is wrapped by the error of every open or stat of a log whose
// file, or whose tenant directory, is a symbolic link (see LinkError).
var ErrSymlink = errors.New("a symbolic link inside the data directory, never followed")

// LinkError is the error for a log, or a log's tenant directory, that is
// a symbolic link: nothing inside the data directory is followed, so that
// whoever may write there (a foreign appender) cannot make the store read
// or write a file elsewhere. The directory that holds the file is opened
// with O_NOFOLLOW, and the file with openat and O_NOFOLLOW in it.
type LinkError struct {
	Path string // the link
}

func (e *LinkError) Error() string {
	return e.Path + " is a symbolic link: outbox never follows links inside its data directory (replace it with the real file or directory, or remove it)"
}

// Unwrap returns ErrSymlink.
func (e *LinkError) Unwrap() error { return ErrSymlink }

// openDir opens dir, the directory that holds a log, for the *at calls,
// refusing a symbolic link (a *LinkError) with O_NOFOLLOW: the directory
// checked is the one used, with no window for a link swapped in between.
// A missing one is os.ErrNotExist, a file there ENOTDIR.
func openDir(dir string) (int, error) {
	for {
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if errors.Is(err, unix.ENOTDIR) {
				// O_NOFOLLOW with O_DIRECTORY may say ENOTDIR for a link.
				if fi, lerr := os.Lstat(dir); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
					return -1, &LinkError{Path: dir}
				}
			}
			return -1, linkErr(dir, &os.PathError{Op: "open", Path: dir, Err: err})
		}
		return fd, nil
	}
}

// linkErr returns a LinkError when err, from opening path with
// O_NOFOLLOW, is the refusal of a symbolic link (ELOOP; EMLINK on
// FreeBSD), else err.
func linkErr(path string, err error) error {
	if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.EMLINK) {
		return err
	}
	if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
		return &LinkError{Path: path}
	}
	return err
}

// Syncer flushes a file to stable storage; tests inject failures.
type Syncer func(f *os.File) error

// Appender appends to logs with group commit: concurrent appends to the same
// log share one write and one fsync. It keeps up to maxOpen logs open between
// appends, closing the least recently used one (when idle) to open another.
// It is safe for concurrent use.
type Appender struct {
	dir     string
	dirInfo os.FileInfo // the data directory when made (mkdirIn)
	sync    Syncer      // nil = no fsync (relaxed mode)

	mu   sync.Mutex
	logs map[string]*group
	open int        // logs with a cached descriptor
	lru  *list.List // of *group with a cached descriptor, most recent first
	// SlowLock, when set (before the first append), is told of an append
	// or withdrawal that has waited LockWarnAfter for another process's
	// flock on its log (acquired false), and then when it got the lock
	// (acquired true, with the whole wait): a foreign appender must hold
	// the lock only for its write and fsync.
	SlowLock func(waited time.Duration, acquired bool)

	// known is every group, most recently used first. Past maxGroups, the
	// least recently used ones nobody holds (and without a descriptor)
	// are forgotten: what they learned about their log is read again if
	// needed. A long-running process that appends to a million users' logs
	// keeps a bounded number of groups.
	known *list.List
}

// maxGroups bounds the groups an Appender remembers (about 200 bytes
// each); tests lower it.
var maxGroups = 16384

// maxOpen bounds the log files an Appender keeps open: an eighth of the
// process's open-file limit (which the Go runtime raises to the hard limit
// at start), between 64 and 4096. Tests lower it.
var maxOpen = openBudget()

func openBudget() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 256
	}
	return int(min(max(lim.Cur/8, 64), 4096))
}

// NewAppender returns an appender for the logs under dataDir. sync nil
// disables fsync (the relaxed durability mode).
func NewAppender(dataDir string, sync Syncer) *Appender {
	fi, _ := os.Stat(dataDir)
	return &Appender{dir: dataDir, dirInfo: fi, sync: sync, logs: map[string]*group{}, lru: list.New(), known: list.New()}
}

// LockWarnAfter is how long an append waits for another process's lock on
// its log before SlowLock is told (tests lower it).
var LockWarnAfter = time.Second

// lock takes f's exclusive flock, telling SlowLock of a long wait.
func (a *Appender) lock(f *os.File) error { return lockFile(f, a.SlowLock) }

// lockFile takes f's exclusive flock. When slow is set and the lock is
// held elsewhere for LockWarnAfter, slow is told (acquired false), and
// again with the whole wait once the lock is taken.
func lockFile(f *os.File, slow func(waited time.Duration, acquired bool)) error {
	fd := int(f.Fd())
	err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
	if !errors.Is(err, unix.EWOULDBLOCK) || slow == nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			err = unix.Flock(fd, unix.LOCK_EX)
		}
		return err
	}
	start, told := time.Now(), make(chan struct{})
	t := time.AfterFunc(LockWarnAfter, func() {
		slow(LockWarnAfter, false)
		close(told)
	})
	err = unix.Flock(fd, unix.LOCK_EX)
	if !t.Stop() {
		<-told // in order
		slow(time.Since(start), true)
	}
	return err
}

// group batches the appends to one log.
type group struct {
	mu      sync.Mutex
	pending []*request
	leader  bool

	io  sync.Mutex // serialises the file I/O and Exclusive
	f   *os.File   // cached descriptor, nil when closed
	ino uint64
	// end is the size at which our last append left the file of inode
	// ino, ending in that append's newline; -1 when unknown (g.io).
	end int64
	// elem is g's place in the Appender's lru while f is open; the rest
	// is under Appender.mu too.
	elem   *list.Element
	rel    string
	all    *list.Element // place in Appender.known
	refs   int           // callers holding g (group … put)
	pinned bool          // directory entries still to sync: never forgotten

	// wmu is held for writing around every write into the file (with
	// what the writer learns of it) and for reading by ReadLines and
	// Settled: they see the log either before a write or after it, with
	// seen updated.
	wmu sync.RWMutex
	// seen is what the last write or ReadLines learned (g.mu): while
	// the file (seenIno) has size seen.size, no newline lies at or after
	// seen.end.
	seen    tail
	seenIno uint64
	// long is the line longer than MaxLine, without a newline yet, that
	// ReadLines last met in the log, and how far it searched it (g.mu).
	long longLine
	// dirs this appender created entries in when it created the log; they
	// are synced after the first append, before it is reported durable.
	dirs []string
}

type request struct {
	data    []byte
	done    chan struct{}
	off     int64
	ino     uint64
	err     error
	written func(off int64, ino uint64)
}

// group returns rel's group, held until put.
func (a *Appender) group(rel string) *group {
	a.mu.Lock()
	defer a.mu.Unlock()
	g := a.logs[rel]
	if g == nil {
		g = &group{end: -1, rel: rel, refs: 1}
		a.logs[rel] = g
		g.all = a.known.PushFront(g)
		a.forget() // never g: it is held already
		return g
	}
	a.known.MoveToFront(g.all)
	g.refs++
	return g
}

// put releases a group returned by group.
func (a *Appender) put(g *group) {
	a.mu.Lock()
	g.refs--
	a.mu.Unlock()
}

// forget drops the least recently used groups past maxGroups that nobody
// holds, that have no cached descriptor and no directory sync pending.
// a.mu is held.
func (a *Appender) forget() {
	for e := a.known.Back(); e != nil && len(a.logs) > maxGroups; {
		g := e.Value.(*group)
		prev := e.Prev()
		if g.refs == 0 && g.elem == nil && !g.pinned {
			a.known.Remove(e)
			delete(a.logs, g.rel)
		}
		e = prev
	}
}

// Append appends data (one or more complete lines, each ending in '\n') to
// the log at rel (relative to the data directory), creating directories and
// the file as needed. It returns the offset at which data starts and the
// file's inode once data is on stable storage. Either all of data is
// appended or none of it is: a failed write is truncated away before the
// lock is released. written, when not nil, is called with the same offset
// and inode as soon as the batch holding data is on stable storage, before
// any append of that batch returns (so that every caller's records can be
// known to the others before any of them proceeds).
func (a *Appender) Append(rel string, data []byte, written func(off int64, ino uint64)) (int64, uint64, error) {
	if len(data) == 0 || data[len(data)-1] != '\n' {
		return 0, 0, errors.New("applog: append data must end with a newline")
	}
	g := a.group(rel)
	defer a.put(g)
	r := &request{data: data, done: make(chan struct{}), written: written}
	g.mu.Lock()
	g.pending = append(g.pending, r)
	if g.leader {
		g.mu.Unlock()
		<-r.done
		return r.off, r.ino, r.err
	}
	g.leader = true
	for len(g.pending) > 0 {
		batch := g.pending
		g.pending = nil
		g.mu.Unlock()
		a.flush(rel, g, batch)
		g.mu.Lock()
	}
	g.leader = false
	g.mu.Unlock()
	<-r.done
	return r.off, r.ino, r.err
}

// flush writes one batch with one write and one fsync.
func (a *Appender) flush(rel string, g *group, batch []*request) {
	var buf []byte
	if len(batch) == 1 {
		buf = batch[0].data
	} else {
		for _, r := range batch {
			buf = append(buf, r.data...)
		}
	}
	g.io.Lock()
	start, ino, err := a.appendTo(rel, g, buf)
	off := start
	for _, r := range batch {
		r.off, r.ino, r.err = off, ino, err
		off += int64(len(r.data))
		if err == nil && r.written != nil {
			// Still under g.io: an Exclusive of the log (an Erase
			// removing it) comes before the append or after its
			// callbacks, never between them.
			r.written(r.off, r.ino)
		}
	}
	g.io.Unlock()
	for _, r := range batch {
		close(r.done)
	}
}

// appendTo appends buf through the group's cached descriptor (opening it
// if needed), under the log's flock. g.io is held.
//
// The size to append at is read, once the lock is held, from the log's
// path, not from the descriptor: the same one statx also tells whether the
// path still names the cached file. A log deleted or replaced (another
// file renamed over it) under the store would otherwise keep receiving
// appends in a file that no name leads to: they are acknowledged and
// lost. Then the descriptor is dropped and the log opened again (created,
// after a deletion), as any appender does when the file it locked is no
// longer the log. (A deletion between that statx and the write, by a
// process that takes no lock, still takes the record with it, as it would
// an instant later.)
func (a *Appender) appendTo(rel string, g *group, buf []byte) (int64, uint64, error) {
	path := filepath.Join(a.dir, rel)
	for try := 0; ; try++ {
		if g.f == nil {
			if !a.admit(g) {
				// Every cached log is busy: append without caching.
				g.end = -1
				off, err := appendLockedIn(path, buf, a.sync, a.mkdirIn, a.SlowLock)
				ino, _ := Inode(path)
				return off, ino, err
			}
			f, dirs, err := openLog(path, a.mkdirIn)
			if err != nil {
				a.release(g)
				return 0, 0, err
			}
			ino, err := fileInode(f)
			if err != nil {
				f.Close()
				a.release(g)
				return 0, 0, fmt.Errorf("stat log: %w", err)
			}
			if ino != g.ino {
				g.end = -1 // not the file our last append left
			}
			g.f, g.ino = f, ino
			if dirs != nil {
				g.dirs = dirs
			}
		} else {
			a.mu.Lock()
			a.lru.MoveToFront(g.elem)
			a.mu.Unlock()
		}
		if err := a.lock(g.f); err != nil {
			return 0, 0, fmt.Errorf("lock log: %w", err)
		}
		size, ino, err := PathSize(path)
		if err == nil && ino == g.ino {
			return a.appendLocked(g, buf, size)
		}
		_ = unix.Flock(int(g.f.Fd()), unix.LOCK_UN)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, 0, fmt.Errorf("stat log: %w", err)
		}
		// Deleted or replaced since it was opened: open the log again.
		g.f.Close()
		g.f, g.end = nil, -1
		a.release(g)
		g.learn(unknownTail, 0)
		if try == 3 {
			return 0, 0, errors.New("open log: the log is deleted or replaced while it is opened, again and again")
		}
	}
}

// appendLocked appends buf to the group's file, whose flock is held and
// whose size is size, and releases the flock. g.io is held.
func (a *Appender) appendLocked(g *group, buf []byte, size int64) (int64, uint64, error) {
	var dirErr chan error
	if g.dirs != nil {
		// The first append to a log this appender created: its directory
		// entries are synced while the data is written and synced.
		dirErr = make(chan error, 1)
		go func(dirs []string) { dirErr <- syncDirs(dirs, a.sync) }(g.dirs)
	}
	off, err := appendHeld(g.f, buf, a.sync, g, size)
	if dirErr != nil {
		if derr := <-dirErr; err == nil {
			if err = derr; err == nil {
				g.dirs = nil
			} else {
				// Not durable (a crash may take the new file's name), so
				// not acknowledged: nothing of it may stay behind to be
				// delivered all the same.
				err = fmt.Errorf("sync log directory: %w", err)
				_ = g.f.Truncate(size)
				if a.sync != nil {
					_ = a.sync(g.f)
				}
			}
		}
		a.mu.Lock()
		g.pinned = g.dirs != nil
		a.mu.Unlock()
	}
	_ = unix.Flock(int(g.f.Fd()), unix.LOCK_UN)
	if err != nil {
		g.end = -1
		g.learn(unknownTail, 0) // what is in the file is for readers to find
		return 0, 0, err
	}
	return off, g.ino, nil
}

// admit makes room for g's descriptor among the cached ones, closing the
// least recently used idle one when they are MaxOpen already. It reports
// false when there is no room (every cached log is busy). g.io is held.
func (a *Appender) admit(g *group) bool {
	a.mu.Lock()
	var victim *group
	if a.open >= maxOpen {
		for e := a.lru.Back(); e != nil; e = e.Prev() {
			if c := e.Value.(*group); c != g && c.io.TryLock() {
				victim = c
				break
			}
		}
		if victim == nil {
			a.mu.Unlock()
			return false
		}
		a.lru.Remove(victim.elem)
		victim.elem = nil
		a.open--
	}
	a.open++
	g.elem = a.lru.PushFront(g)
	a.mu.Unlock()
	if victim != nil {
		// Its tail stays known: the next append checks the inode and size.
		victim.f.Close()
		victim.f = nil
		victim.io.Unlock()
	}
	return true
}

// release gives up g's place among the cached descriptors. g.io is held.
func (a *Appender) release(g *group) {
	a.mu.Lock()
	a.open--
	if g.elem != nil {
		a.lru.Remove(g.elem)
		g.elem = nil
	}
	a.mu.Unlock()
}

// Exclusive runs fn while no append to rel can run in this process, with
// the log's cached descriptor closed: fn may remove or replace the file.
func (a *Appender) Exclusive(rel string, fn func()) {
	g := a.group(rel)
	defer a.put(g)
	g.io.Lock()
	defer g.io.Unlock()
	if g.f != nil {
		g.f.Close()
		g.f, g.end = nil, -1
		a.release(g)
	}
	g.learn(unknownTail, 0)
	fn()
	g.end = -1
	g.learn(unknownTail, 0)
}

// Withdraw cuts the log at rel back to start, under its flock and with no
// append of this process running, if its size is still end: it takes back
// an append [start, end) that nothing was appended after. It reports
// whether it did (and, with syncs on, synced the cut).
func (a *Appender) Withdraw(rel string, start, end int64) bool {
	g := a.group(rel)
	defer a.put(g)
	g.io.Lock()
	defer g.io.Unlock()
	f, err := openFile(filepath.Join(a.dir, rel), unix.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close() // releases the flock
	if a.lock(f) != nil {
		return false
	}
	if size, _, err := fileSize(f); err != nil || size != end || start < 0 || start > end {
		return false
	}
	g.wmu.Lock()
	g.learn(unknownTail, 0)
	err = f.Truncate(start)
	g.wmu.Unlock()
	g.end = -1
	return err == nil && (a.sync == nil || a.sync(f) == nil)
}

func (g *group) learn(t tail, ino uint64) {
	g.mu.Lock()
	g.seen, g.seenIno = t, ino
	g.mu.Unlock()
}

// known returns where complete data ends in the log of this size and inode
// as far as this appender knows, or -1.
func (g *group) known(size int64, ino uint64) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seen.size >= 0 && g.seen.size == size && g.seenIno == ino {
		return g.seen.end
	}
	return -1
}

// Settled reports whether the log at rel is still as this appender's last
// write into it (or ReadLines of it) left it: no other process appended
// since. Its complete lines are then known to the caller already: those it
// read, and those it wrote (which their writer indexes).
func (a *Appender) Settled(rel string) bool {
	a.mu.Lock()
	g := a.logs[rel]
	a.mu.Unlock()
	if g == nil {
		return false
	}
	// An append's file event can arrive before its writer has recorded
	// what it wrote: wait for that.
	g.wmu.RLock()
	defer g.wmu.RUnlock()
	size, ino, err := PathSize(filepath.Join(a.dir, rel))
	return err == nil && g.known(size, ino) >= 0
}

// SyncLog makes what the log at rel (inode ino) holds durable, and, when
// newFile, the entries of its directory and of the one above (a tenant's
// first log makes both): the index must not refer to bytes that a machine
// crash could take, and bytes another process appended are not known to be
// synced (a writer may not sync, or may not have yet). A log that is no
// longer ino is left alone: it is indexed again from its start when next
// read. In relaxed mode (no Syncer) it does nothing.
func (a *Appender) SyncLog(rel string, ino uint64, newFile bool) error {
	if a.sync == nil {
		return nil
	}
	path := filepath.Join(a.dir, rel)
	f, err := openFile(path, unix.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	if _, fino, err := fileSize(f); err != nil || fino != ino {
		return err
	}
	if err := a.sync(f); err != nil {
		return fmt.Errorf("sync log: %w", err)
	}
	if newFile {
		return syncDirs([]string{filepath.Dir(path), filepath.Dir(filepath.Dir(path))}, a.sync)
	}
	return nil
}

// ReadLines reads the log at rel from offset off like the package's
// ReadLines, but never while this appender writes into the log, without
// reading again what it knows to hold no complete line (a torn tail, an
// older build's padding, a line longer than MaxLine that has no newline
// yet), and without searching such a long line again from its start: the
// search goes on where the last one stopped.
func (a *Appender) ReadLines(rel string, off int64) (Chunk, error) {
	g := a.group(rel)
	defer a.put(g)
	g.wmu.RLock()
	defer g.wmu.RUnlock()
	g.mu.Lock()
	long := g.long
	g.mu.Unlock()
	c, size, ino, known, err := readLines(filepath.Join(a.dir, rel), off, g.known, &long)
	g.mu.Lock()
	g.long = long
	g.mu.Unlock()
	if err == nil && !known && size >= off && !c.More && (!c.Long || c.LongEnd < 0) {
		// No newline lies past the complete lines read (an unfinished
		// long line has none either).
		g.learn(tail{off + int64(len(c.Data)), size}, ino)
	}
	return c, err
}

// Close closes every cached descriptor.
func (a *Appender) Close() {
	a.mu.Lock()
	groups := make([]*group, 0, len(a.logs))
	for _, g := range a.logs {
		groups = append(groups, g)
	}
	a.mu.Unlock()
	for _, g := range groups {
		g.io.Lock()
		if g.f != nil {
			g.f.Close()
			g.f, g.end = nil, -1
			a.release(g)
		}
		g.io.Unlock()
	}
}

// Inode returns the inode number of the file at path.
func Inode(path string) (uint64, error) {
	_, ino, err := PathSize(path)
	return ino, err
}

// FileInode returns the inode number of the open file f.
func FileInode(f *os.File) (uint64, error) { return fileInode(f) }

func fileInode(f *os.File) (uint64, error) {
	_, ino, err := fileSize(f)
	return ino, err
}

// AppendLocked opens (creating) the log at path, takes an exclusive flock,
// terminates a torn tail, appends buf in one write, syncs it with sync (nil =
// no sync) and releases the lock. It returns the offset where buf starts.
// On any failure the file is truncated back to its size before the call.
// It needs no bbolt and no running daemon: foreign-process appenders (the
// CLI's enqueue) use it directly.
func AppendLocked(path string, buf []byte, sync Syncer) (int64, error) {
	return appendLockedIn(path, buf, sync, mkdirAll, nil)
}

func appendLockedIn(path string, buf []byte, sync Syncer, mkdir func(string) ([]string, error), slow func(time.Duration, bool)) (int64, error) {
	for {
		f, dirs, err := openLog(path, mkdir)
		if err != nil {
			return 0, err
		}
		if err := lockFile(f, slow); err != nil {
			f.Close()
			return 0, fmt.Errorf("lock log: %w", err)
		}
		// The file may have been replaced (compacted or removed) between
		// open and lock: then lock the new one.
		same, err := samePath(f, path)
		if err != nil || !same {
			f.Close()
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return 0, fmt.Errorf("stat log: %w", err)
			}
			continue
		}
		off, err := appendHeld(f, buf, sync, nil, -1)
		if err == nil {
			err = syncDirs(dirs, sync)
		}
		f.Close() // releases the flock
		return off, err
	}
}

// ErrDirGone is wrapped by the error of an Appender's append that would
// have to create a directory while the data directory is no longer the
// one the Appender was made for: moved, removed or replaced under the
// running store. The Appender creates what is missing inside the data
// directory (a tenant's directory, logs/), never the data directory
// itself, nor anything at its old path: that would start a second,
// index-less store there and split what is acknowledged between the two.
var ErrDirGone = errors.New("the data directory was moved or removed under the running store")

// mkdirAll creates a log's tenant directory and what is missing above it
// (a foreign appender, AppendLocked: records appended before a store's
// first Open are its first work).
func mkdirAll(dir string) ([]string, error) {
	return []string{filepath.Dir(dir)}, os.MkdirAll(dir, 0o700)
}

// mkdirIn creates dir, and what is missing of its parents inside the
// Appender's data directory (mkdirInside).
func (a *Appender) mkdirIn(dir string) ([]string, error) { return mkdirInside(a.dir, a.dirInfo, dir) }

// mkdirInside creates dir, and what is missing of its parents inside the
// data directory dataDir, once it has checked that dataDir is still the
// directory fi (nil: any). It returns the directories whose entries
// changed (dir's parent always, as os.MkdirAll's caller assumes).
func mkdirInside(dataDir string, fi os.FileInfo, dir string) ([]string, error) {
	now, err := os.Stat(dataDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
		return nil, err
	}
	if err != nil || (fi != nil && !os.SameFile(now, fi)) {
		return nil, fmt.Errorf("%s: %w", dataDir, ErrDirGone)
	}
	rel, err := filepath.Rel(dataDir, dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("create %s: outside the data directory %s", dir, dataDir)
	}
	var made []string
	at := dataDir
	for _, name := range strings.Split(rel, string(filepath.Separator)) {
		parent := at
		at = filepath.Join(at, name)
		err := os.Mkdir(at, 0o700)
		switch {
		case err == nil:
			made = append(made, parent)
		case !errors.Is(err, os.ErrExist):
			return nil, err
		}
	}
	if len(made) == 0 {
		made = []string{filepath.Dir(dir)} // made meanwhile by another appender
	}
	return made, nil
}

// AppendIn is AppendLocked for the log rel of the data directory dataDir,
// which must exist (fs.ErrNotExist): it creates what is missing inside it
// (logs/, a tenant's directory), never dataDir itself, so that a foreign
// appender given a wrong path, or a directory moved away under it, starts
// no store that nothing reads. slow, when set, is told of a long wait for
// the log's lock (as an Appender's SlowLock).
func AppendIn(dataDir, rel string, buf []byte, sync Syncer, slow func(waited time.Duration, acquired bool)) (int64, error) {
	fi, err := os.Stat(dataDir)
	if err != nil {
		return 0, err
	}
	return appendLockedIn(filepath.Join(dataDir, rel), buf, sync, func(dir string) ([]string, error) { return mkdirInside(dataDir, fi, dir) }, slow)
}

// openLog opens the log at path for appending, creating it and its
// directory (with mkdir) when missing. dirs are the directories whose
// entries it created: they must be synced (syncDirs) before an append to
// the new file is reported durable, or a machine crash could lose the file
// itself.
func openLog(path string, mkdir func(string) ([]string, error)) (f *os.File, dirs []string, err error) {
	parent := filepath.Dir(path)
	for {
		// The common case, an existing log, without O_CREAT: that takes the
		// directory's lock even when the file exists.
		f, err = openFile(path, unix.O_RDWR, 0)
		if err == nil {
			return f, dirs, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("open log: %w", err)
		}
		f, err = openFile(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err == nil {
			return f, append(dirs, parent), nil
		}
		switch {
		case errors.Is(err, os.ErrExist):
			// Created meanwhile: open it.
		case errors.Is(err, os.ErrNotExist) && dirs == nil:
			// The tenant's directory is missing: its entry is in logs/
			// (and logs/'s in the data directory, when it was made too).
			made, err := mkdir(parent)
			if err != nil {
				return nil, nil, fmt.Errorf("create log directory: %w", err)
			}
			dirs = append(dirs, made...)
		default:
			return nil, nil, fmt.Errorf("open log: %w", err)
		}
	}
}

// openFile opens a log's file (or its quarantine) the way os.OpenFile
// does, without its attempt to register the descriptor with the runtime's
// poller (which a regular file refuses): three fcntls and an epoll_ctl
// fewer per open. No symbolic link is followed: the directory that holds
// the file is opened with O_NOFOLLOW (openDir) and the file with openat
// and O_NOFOLLOW in that very directory; either as a link fails with a
// *LinkError.
func openFile(path string, flags int, perm uint32) (*os.File, error) {
	dfd, err := openDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	for {
		fd, err := unix.Openat(dfd, filepath.Base(path), flags|unix.O_CLOEXEC|unix.O_NOFOLLOW, perm)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, linkErr(path, &os.PathError{Op: "open", Path: path, Err: err})
		}
		return os.NewFile(uintptr(fd), path), nil
	}
}

// OpenFile opens a file of a log's directory (a log, its quarantine) with
// openFile's rules: no symbolic link followed, neither the file nor its
// directory (a *LinkError). flag and perm are os.OpenFile's.
func OpenFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	return openFile(path, flag, uint32(perm.Perm()))
}

// syncDir flushes a directory's entries; tests record or fail it.
var syncDir = (*os.File).Sync

// syncDirs fsyncs directories whose entries changed (relaxed mode: none).
func syncDirs(dirs []string, sync Syncer) error {
	if sync == nil {
		return nil
	}
	for _, d := range dirs {
		if err := syncDirShared(d); err != nil {
			return err
		}
	}
	return nil
}

// appendHeld appends buf at the end of f (whose flock is held) and syncs
// it: the one way every appender writes. A final line without its newline
// (a torn tail under our lock: its writer died mid-line; or an older
// build's reserve of spaces) is ended with a newline first. It returns
// where buf starts. On failure the file is truncated back to its size
// before the call. g is the store's appender's group of the log (nil for
// the others): a file still of the size its last append left it ends in
// that append's newline, and the write holds g.wmu and records what it
// wrote. size is the file's size when the caller read it under the lock
// (-1: read it here).
func appendHeld(f *os.File, buf []byte, sync Syncer, g *group, size int64) (int64, error) {
	if size < 0 {
		var err error
		if size, _, err = fileSize(f); err != nil {
			return 0, fmt.Errorf("stat log: %w", err)
		}
	}
	start := size
	if size > 0 && (g == nil || g.end != size) {
		var last [1]byte
		if _, err := f.ReadAt(last[:], size-1); err != nil {
			return 0, fmt.Errorf("read log tail: %w", err)
		}
		if last[0] != '\n' {
			buf = append([]byte{'\n'}, buf...)
			start = size + 1
		}
	}
	end := size + int64(len(buf))
	if g != nil {
		g.wmu.Lock()
	}
	n, err := f.WriteAt(buf, size)
	if g != nil {
		if err == nil && n == len(buf) {
			g.learn(tail{end, end}, g.ino)
		}
		g.wmu.Unlock()
	}
	if err == nil && n != len(buf) {
		err = io.ErrShortWrite
	}
	if err != nil {
		err = fmt.Errorf("write log: %w", err)
	} else if sync != nil {
		if err = sync(f); err != nil {
			err = fmt.Errorf("sync log: %w", err)
		}
	}
	if err != nil {
		// Nothing of a failed append may stay behind.
		if g != nil {
			g.wmu.Lock()
			g.learn(unknownTail, 0)
		}
		_ = f.Truncate(size)
		if g != nil {
			g.wmu.Unlock()
		}
		if sync != nil {
			_ = sync(f)
		}
		return 0, err
	}
	if g != nil {
		g.end = end
	}
	return start, nil
}

// tail is what an appender knows about a log: where its last complete
// line ends, and the file's size then.
type tail struct{ end, size int64 }

var unknownTail = tail{-1, -1}

// MaxLine is the longest log line a reader takes, in bytes without its
// newline: the largest envelope (envelope.MaxEnvelopeBytes, which bounds
// the encoding a store appends too) and a margin for the spaces an older
// build's reserve may have left before a record (at most 16 KiB) and a
// '\r'. A longer line is never read into memory: a reader skips past its
// newline (ReadLines reports it), and the store quarantines it.
const MaxLine = envelope.MaxEnvelopeBytes + 64<<10

// readWindow is the most one ReadLines returns, at least MaxLine+1 so that
// a line no longer than MaxLine always fits.
const readWindow = 2 * MaxLine

// scanChunk is the buffer with which the newline of a line longer than
// MaxLine is searched.
const scanChunk = 64 << 10

// Chunk is what ReadLines read of a log from the offset it was given.
type Chunk struct {
	// Data is complete lines (each ending in its newline, none longer
	// than MaxLine) from the offset, possibly none.
	Data []byte
	// More says that complete lines follow Data: read again from the
	// offset plus len(Data).
	More bool
	// Long says that a line longer than MaxLine starts right after Data.
	// Its bytes are not read; LongEnd is the offset just past its newline,
	// or -1 while it has none (an append in progress or a writer that
	// died: nothing after it is complete until it ends).
	Long    bool
	LongEnd int64
}

// longLine is a line longer than MaxLine without a newline, in the file
// of inode ino, from start: searched for its newline up to scanned.
type longLine struct {
	ino            uint64
	start, scanned int64
}

// ReadLines reads the log at path from offset off: its complete lines, at
// most readWindow bytes of them (More says when more follow), and whether
// a line longer than MaxLine follows them (Long, LongEnd). A missing file
// reads as empty. It holds at most readWindow bytes in memory, however
// long a line is.
func ReadLines(path string, off int64) (Chunk, error) {
	c, _, _, _, err := readLines(path, off, nil, nil)
	return c, err
}

// readLines is ReadLines, reading only up to where known, when given, says
// the complete lines end for the size and inode it finds (-1: unknown;
// then known reports false), and with long, when not nil, the long line
// met last (updated: the one met now, or none). A missing log reads as
// empty, with size -1.
func readLines(path string, off int64, known func(size int64, ino uint64) int64, long *longLine) (c Chunk, size int64, ino uint64, wasKnown bool, err error) {
	c.LongEnd = -1
	if known != nil {
		// A log known to hold nothing complete past off is not even
		// opened (a rescan of many logs).
		if size, ino, err := PathSize(path); err == nil {
			if e := known(size, ino); e >= 0 && e <= off {
				return c, size, ino, true, nil
			}
		}
	}
	f, err := openFile(path, unix.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return c, -1, 0, false, nil
		}
		return c, 0, 0, false, err
	}
	defer f.Close()
	if size, ino, err = fileSize(f); err != nil {
		return c, 0, 0, false, err
	}
	end := size
	if known != nil {
		if e := known(size, ino); e >= 0 {
			end, wasKnown = e, true
		}
	}
	var mem longLine
	if long == nil {
		long = &mem
	}
	c, err = readChunk(f, off, end, ino, long)
	return c, size, ino, wasKnown, err
}

// readChunk reads f from off up to (not past) end, as ReadLines. long is
// the long line met last in f (ino: its inode); the search for its
// newline goes on where it stopped when it is still there: f is the same
// file, at least as long, and the lines before it end where it starts.
func readChunk(f *os.File, off, end int64, ino uint64, long *longLine) (Chunk, error) {
	c := Chunk{LongEnd: -1}
	if end <= off {
		return c, nil
	}
	resume := long.ino == ino && long.start >= off && long.start < end && long.start-off <= readWindow &&
		long.scanned >= long.start && long.scanned <= end
	n := min(end-off, readWindow)
	if resume {
		n = long.start - off
	} else {
		*long = longLine{}
	}
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return c, err
	}
	buf = buf[:got]
	if resume && (int64(got) != n || (n > 0 && buf[n-1] != '\n')) {
		// Not the file the long line was met in any more.
		*long = longLine{}
		return readChunk(f, off, end, ino, long)
	}
	// The complete lines, up to one longer than MaxLine.
	i := 0
	for {
		j := bytes.IndexByte(buf[i:], '\n')
		if j < 0 {
			break
		}
		if j > MaxLine {
			c.Data, c.Long, c.LongEnd = buf[:i], true, off+int64(i+j+1)
			return c, nil
		}
		i += j + 1
	}
	c.Data = buf[:i]
	start := off + int64(i) // of what follows the last newline
	switch {
	case resume:
		// buf ends where the long line starts.
	case int64(len(buf)-i) > MaxLine:
		// A line longer than MaxLine starts there, and has no newline in
		// buf: search the rest of the file.
		*long = longLine{ino: ino, start: start, scanned: off + int64(len(buf))}
	case off+int64(len(buf)) < end:
		c.More = true
		return c, nil
	default:
		return c, nil // an unfinished line (no longer than MaxLine), or nothing
	}
	c.Long = true
	at, err := scanNewline(f, long.scanned, end)
	if err != nil {
		return Chunk{LongEnd: -1}, err
	}
	if at < 0 {
		long.scanned = end
		return c, nil
	}
	*long = longLine{}
	c.LongEnd = at + 1
	return c, nil
}

// scanNewline returns the offset of the first newline of f in [from, end),
// or -1, reading scanChunk bytes at a time.
func scanNewline(f *os.File, from, end int64) (int64, error) {
	buf := make([]byte, scanChunk)
	for at := from; at < end; {
		b := buf[:min(end-at, int64(len(buf)))]
		n, err := f.ReadAt(b, at)
		if i := bytes.IndexByte(b[:n], '\n'); i >= 0 {
			return at + int64(i), nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return -1, nil
			}
			return 0, err
		}
		at += int64(n)
	}
	return -1, nil
}

// NothingPast reports whether f holds no record from off to its end: the
// file ends at off, or all that follows is spaces (the padding of an older
// build's reserve).
func NothingPast(f *os.File, off int64) (bool, error) {
	size, _, err := fileSize(f)
	if err != nil || off > size {
		return false, err
	}
	var chunk [8 << 10]byte
	for at := off; at < size; {
		b := chunk[:min(size-at, int64(len(chunk)))]
		if _, err := f.ReadAt(b, at); err != nil {
			return false, err
		}
		for _, c := range b {
			if c != ' ' {
				return false, nil
			}
		}
		at += int64(len(b))
	}
	return true, nil
}

// Line is one complete line of a log.
type Line struct {
	Off  int64  // offset of the line's first byte in the log
	Data []byte // the line without its newline
}

// Lines splits complete log bytes read at offset base into lines, without
// leading whitespace. Blank lines are skipped.
func Lines(buf []byte, base int64) []Line {
	var out []Line
	off := base
	for len(buf) > 0 {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		line := buf[:i]
		// A line may start with the spaces of an older build's reserve,
		// and whitespace-only lines (such a reserve ended by an append's
		// newline) are no records.
		if t := bytes.TrimLeft(line, " \t\r"); len(bytes.TrimSpace(t)) > 0 {
			out = append(out, Line{Off: off + int64(len(line)-len(t)), Data: t})
		}
		off += int64(i + 1)
		buf = buf[i+1:]
	}
	return out
}

// ReadAt reads n bytes of the log at path at offset off.
func ReadAt(path string, off int64, n int) ([]byte, error) {
	f, err := openFile(path, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		return nil, err
	}
	return buf, nil
}
