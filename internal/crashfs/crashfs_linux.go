package crashfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FS is a mounted crash file system.
type FS struct {
	backing, mnt string
	srv          *fuse.Server

	mu    sync.Mutex
	cut   bool
	root  ident                      // the backing root
	files map[ident][]byte           // durable data
	dirs  map[ident]map[string]ident // durable entries
	modes map[ident]attr             // type, permissions and owner, as last seen
	// Written since the file's last sync, for WriteTorn: its pages, whether
	// its size changed, and where it was last seen.
	dirty   map[ident]map[int64]bool
	resized map[ident]bool
	paths   map[ident]string
	syncs   int
	dirSync int
}

// pageSize is the unit in which unsynced data reaches a disk, or not.
const pageSize = 4096

// Mount serves backing at mnt (an existing, empty directory). Everything
// already in backing is durable.
func Mount(backing, mnt string) (*FS, error) {
	backing, err := filepath.Abs(backing)
	if err != nil {
		return nil, err
	}
	c := &FS{backing: backing, mnt: mnt, files: map[ident][]byte{}, dirs: map[ident]map[string]ident{}, modes: map[ident]attr{},
		dirty: map[ident]map[int64]bool{}, resized: map[ident]bool{}, paths: map[ident]string{}}
	if c.root, _, err = identOf(backing); err != nil {
		return nil, err
	}
	if err := c.recordTree(backing); err != nil {
		return nil, fmt.Errorf("crashfs: %w", err)
	}
	lb, err := gofs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, err
	}
	ln := lb.(*gofs.LoopbackNode)
	root := &node{LoopbackNode: ln, c: c}
	ln.RootData.RootNode = root
	// No caching of names or attributes in the kernel: every stat sees the
	// backing file as it is (the store compares inodes and sizes).
	zero := time.Duration(0)
	c.srv, err = gofs.Mount(mnt, root, &gofs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		// AllowOther: a server run as another user (PostgreSQL's) uses it too.
		MountOptions: fuse.MountOptions{DirectMount: true, AllowOther: true, FsName: "crashfs", Name: "crashfs", MaxBackground: 64},
	})
	if err != nil {
		return nil, fmt.Errorf("crashfs: mount %s: %w", mnt, err)
	}
	return c, nil
}

// Unmount unmounts the file system; the processes that used it must be
// gone. After 5 s of "busy" it detaches it (lazy unmount).
func (c *FS) Unmount() error {
	var err error
	for i := 0; i < 50; i++ {
		if err = syscall.Unmount(c.mnt, 0); err == nil {
			c.srv.Wait()
			return nil
		}
		time.Sleep(100 * time.Millisecond) // a killed process's files are still closing
	}
	if derr := syscall.Unmount(c.mnt, syscall.MNT_DETACH); derr == nil {
		c.srv.Wait()
	}
	return fmt.Errorf("crashfs: unmount %s: %w", c.mnt, err)
}

// Cut is the power cut: from now on nothing more becomes durable, and
// every fsync fails with EIO.
func (c *FS) Cut() {
	c.mu.Lock()
	c.cut = true
	c.mu.Unlock()
}

// Syncs returns how many file and directory syncs were recorded.
func (c *FS) Syncs() (files, dirs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.syncs, c.dirSync
}

// WriteDurable writes what the disk holds (as of Cut, or of now) into dst,
// a directory that must not exist yet.
func (c *FS) WriteDurable(dst string) error { return c.writeOut(dst, nil) }

// WriteTorn is WriteDurable on a disk that also got some of what was never
// synced: each page written since its file's last sync is there, as it is
// now, or not (one chance in two), and a changed size likewise. Entries of
// directories are still as of their last sync.
func (c *FS) WriteTorn(dst string, rng *rand.Rand) error { return c.writeOut(dst, rng) }

func (c *FS) writeOut(dst string, rng *rand.Rand) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	if err := c.modes[c.root].apply(dst); err != nil {
		return err
	}
	return c.writeDir(dst, c.root, 0, rng)
}

// content is what the disk holds of file ino: its durable data, with (rng
// not nil) a random part of what was written since.
func (c *FS) content(ino ident, rng *rand.Rand) []byte {
	b := c.files[ino]
	if rng == nil || (len(c.dirty[ino]) == 0 && !c.resized[ino]) {
		return b
	}
	now, ok := c.current(ino)
	if !ok {
		return b // gone: only what was synced
	}
	out := append([]byte(nil), b...)
	if c.resized[ino] && rng.IntN(2) == 0 {
		out = resize(out, len(now))
	}
	for pg := range c.dirty[ino] {
		if rng.IntN(2) != 0 {
			continue
		}
		lo, hi := pg*pageSize, min((pg+1)*pageSize, int64(len(now)))
		if lo >= hi {
			continue
		}
		if int64(len(out)) < hi {
			out = resize(out, int(hi))
		}
		copy(out[lo:hi], now[lo:hi])
	}
	return out
}

// current reads the backing file ino where it is now: a rename after
// writes to it (a new index file swapped in through the descriptor it
// was written by) moves it from the path they were made at.
func (c *FS) current(ino ident) ([]byte, bool) {
	p := c.paths[ino]
	if id, _, err := identOf(p); err != nil || id != ino {
		p = ""
		_ = filepath.WalkDir(c.backing, func(q string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if id, _, err := identOf(q); err == nil && id == ino {
					p = q
					return filepath.SkipAll
				}
			}
			return nil
		})
		if p == "" {
			return nil, false
		}
	}
	b, err := os.ReadFile(p)
	return b, err == nil
}

func resize(b []byte, n int) []byte {
	if n <= len(b) {
		return b[:n]
	}
	return append(b, make([]byte, n-len(b))...)
}

// written records a write of n bytes at off into the file ino at path.
func (c *FS) written(ino ident, path string, off, n int64) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return
	}
	pages := c.dirty[ino]
	if pages == nil {
		pages = map[int64]bool{}
		c.dirty[ino] = pages
	}
	for pg := off / pageSize; pg <= (off+n-1)/pageSize; pg++ {
		pages[pg] = true
	}
	c.paths[ino] = path
}

// sized records a change of the size of the file ino at path.
func (c *FS) sized(ino ident, path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.cut {
		c.resized[ino] = true
		c.paths[ino] = path
	}
}

func (c *FS) writeDir(dst string, ino ident, depth int, rng *rand.Rand) error {
	if depth > 64 {
		return errors.New("crashfs: directories nested too deep (a cycle?)")
	}
	for name, child := range c.dirs[ino] {
		p := filepath.Join(dst, name)
		a := c.modes[child]
		switch {
		case a.mode.IsDir():
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			if err := c.writeDir(p, child, depth+1, rng); err != nil {
				return err
			}
		case a.mode.IsRegular():
			if err := os.WriteFile(p, c.content(child, rng), 0o600); err != nil {
				return err
			}
		default:
			continue // anything else (a socket, a symlink) is not kept
		}
		if err := a.apply(p); err != nil {
			return err
		}
	}
	return nil
}

// recordTree makes everything under dir durable.
func (c *FS) recordTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return c.recordDir(p)
		}
		if d.Type().IsRegular() {
			return c.recordFile(p)
		}
		return nil
	})
}

// recordFile makes the backing file at p durable as it is.
func (c *FS) recordFile(p string) error {
	ino, a, err := identOf(p)
	if err != nil {
		return err
	}
	var b []byte
	if old, ok := c.files[ino]; ok {
		// Only the pages written since the last sync are read again (a
		// database's WAL segment is 16 MB, synced at every commit).
		b, err = readPages(p, old, c.dirty[ino])
	} else {
		b, err = os.ReadFile(p)
	}
	if err != nil {
		return err
	}
	c.files[ino] = b
	c.modes[ino] = a
	delete(c.dirty, ino)
	delete(c.resized, ino)
	return nil
}

// readPages returns old (which it may change) brought to the file at p:
// its size, and the content of the pages listed.
func readPages(p string, old []byte, pages map[int64]bool) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	b := resize(old, int(size))
	for pg := range pages {
		lo := pg * pageSize
		if lo >= size {
			continue
		}
		hi := min(lo+pageSize, size)
		if _, err := f.ReadAt(b[lo:hi], lo); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// recordDir makes the entries of the backing directory at p durable as
// they are (not the data of the files they name).
func (c *FS) recordDir(p string) error {
	ino, a, err := identOf(p)
	if err != nil {
		return err
	}
	des, err := os.ReadDir(p)
	if err != nil {
		return err
	}
	entries := make(map[string]ident, len(des))
	for _, de := range des {
		child, ca, err := identOf(filepath.Join(p, de.Name()))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return err
		}
		entries[de.Name()] = child
		c.modes[child] = ca
	}
	c.dirs[ino] = entries
	c.modes[ino] = a
	return nil
}

// ident names a file of the backing file system for good: its inode
// number with its birth time, since a removed file's number is reused.
type ident struct {
	ino   uint64
	btime int64
}

// attr is what a file's inode says of it besides its data.
type attr struct {
	mode     fs.FileMode
	uid, gid int
}

func (a attr) apply(p string) error {
	if err := os.Chmod(p, a.mode.Perm()); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		return os.Lchown(p, a.uid, a.gid)
	}
	return nil
}

func identOf(p string) (ident, attr, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_BTIME|unix.STATX_TYPE|unix.STATX_MODE, &st); err != nil {
		return ident{}, attr{}, &fs.PathError{Op: "statx", Path: p, Err: err}
	}
	if st.Mask&unix.STATX_BTIME == 0 {
		return ident{}, attr{}, fmt.Errorf("crashfs: %s: the backing file system keeps no birth times", p)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return ident{}, attr{}, err
	}
	return ident{st.Ino, st.Btime.Sec*1e9 + int64(st.Btime.Nsec)}, attr{fi.Mode(), int(st.Uid), int(st.Gid)}, nil
}

// sync records an fsync of the node at rel (relative to the backing
// root).
func (c *FS) sync(rel string, dir bool) syscall.Errno {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return syscall.EIO
	}
	p := filepath.Join(c.backing, rel)
	var err error
	if dir {
		err = c.recordDir(p)
		c.dirSync++
	} else {
		err = c.recordFile(p)
		c.syncs++
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) { // an unlinked file's data does not matter
		return gofs.ToErrno(err)
	}
	return 0
}

// node is a loopback node whose syncs are recorded.
type node struct {
	*gofs.LoopbackNode
	c *FS
}

var (
	_ gofs.NodeWrapChilder    = (*node)(nil)
	_ gofs.NodeFsyncer        = (*node)(nil)
	_ gofs.NodeOpendirHandler = (*node)(nil)
	_ dirStream               = (*dirHandle)(nil)
)

func (n *node) WrapChild(_ context.Context, ops gofs.InodeEmbedder) gofs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*gofs.LoopbackNode), c: n.c}
}

func (n *node) rel() string { return n.Path(n.Root()) }

// Fsync records a file's data (fsync and fdatasync alike). The backing
// file is not synced: the model decides what survives.
func (n *node) Fsync(_ context.Context, _ gofs.FileHandle, _ uint32) syscall.Errno {
	return n.c.sync(n.rel(), n.IsDir())
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	h, ok := fh.(dirStream)
	if !ok {
		return fh, fl, 0
	}
	return &dirHandle{dirStream: h, n: n}, fl, 0
}

type dirStream interface {
	gofs.FileReaddirenter
	gofs.FileReleasedirer
	gofs.FileSeekdirer
	gofs.FileFsyncdirer
}

// dirHandle is an open directory whose fsync is recorded.
type dirHandle struct {
	dirStream
	n *node
}

func (d *dirHandle) Fsyncdir(_ context.Context, _ uint32) syscall.Errno {
	return d.n.c.sync(d.n.rel(), true)
}

// Open and Create hand out files whose writes are recorded.
func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	return n.wrap(fh), fl, errno
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return in, fh, fl, errno
	}
	return in, n.c.wrapAt(fh, filepath.Join(n.c.backing, n.rel(), name)), fl, 0
}

func (n *node) wrap(fh gofs.FileHandle) gofs.FileHandle {
	return n.c.wrapAt(fh, filepath.Join(n.c.backing, n.rel()))
}

func (c *FS) wrapAt(fh gofs.FileHandle, path string) gofs.FileHandle {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		return fh
	}
	id, _, err := identOf(path)
	if err != nil {
		return fh
	}
	return &file{LoopbackFile: lf, c: c, id: id, path: path}
}

// Setattr records a change of size made by path (truncate(2)).
func (n *node) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if f, ok := fh.(*file); ok {
		fh = f.LoopbackFile
	}
	errno := n.LoopbackNode.Setattr(ctx, fh, in, out)
	if _, ok := in.GetSize(); ok && errno == 0 {
		p := filepath.Join(n.c.backing, n.rel())
		if id, _, err := identOf(p); err == nil {
			n.c.sized(id, p)
		}
	}
	return errno
}

// file is an open file whose writes are recorded (for WriteTorn).
type file struct {
	*gofs.LoopbackFile
	c    *FS
	id   ident
	path string
}

// PassthroughFd: never, so that every write comes through Write.
func (f *file) PassthroughFd() (int, bool) { return 0, false }

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, errno := f.LoopbackFile.Write(ctx, data, off)
	f.c.written(f.id, f.path, off, int64(n))
	return n, errno
}

func (f *file) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	n, errno := f.LoopbackFile.Writev(ctx, data, off)
	f.c.written(f.id, f.path, off, int64(n))
	return n, errno
}

func (f *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	errno := f.LoopbackFile.Setattr(ctx, in, out)
	if _, ok := in.GetSize(); ok && errno == 0 {
		f.c.sized(f.id, f.path)
	}
	return errno
}

func (f *file) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	errno := f.LoopbackFile.Allocate(ctx, off, size, mode)
	if errno == 0 {
		f.c.sized(f.id, f.path)
	}
	return errno
}
