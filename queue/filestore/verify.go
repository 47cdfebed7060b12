package filestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"os"
	"runtime/debug"

	"github.com/outboxhq/outbox/queue"
	"golang.org/x/sys/unix"
)

// CorruptIndexError reports an index file that is damaged: its structure
// is not a valid bbolt file (pages overwritten, bytes flipped, the file
// truncated), or bbolt panicked reading it. The logs are intact: Rebuild
// (outbox doctor --rebuild) moves the file aside and rebuilds the index.
type CorruptIndexError struct {
	Path   string
	Reason string
}

// Is makes a CorruptIndexError queue.ErrUnavailable: the store cannot
// serve calls until the index is rebuilt (HTTP 503, the worker backs off).
func (e *CorruptIndexError) Is(target error) bool { return target == queue.ErrUnavailable }

func (e *CorruptIndexError) Error() string {
	return fmt.Sprintf("the index %s is damaged (%s): run \"outbox doctor --rebuild\" to move it aside and rebuild it from the logs", e.Path, e.Reason)
}

// The bbolt file format, as far as the check needs it (bbolt's own
// layout, native byte order): every page starts with a 16-byte header
// (id u64, flags u16, count u16, overflow u32); pages 0 and 1 hold a meta
// record after it; branch pages hold count elements (pos u32, ksize u32,
// pgid u64), leaf pages count elements (flags u32, pos u32, ksize u32,
// vsize u32), each element's key at the element's own address + pos and
// a leaf's value right after its key. A leaf element with flag 1 is a
// nested bucket: its value starts with the bucket's root page id (u64)
// and sequence (u64), and a root of 0 means an inline bucket whose leaf
// page follows in the value.
const (
	pageHeaderSize = 16
	elemSize       = 16
	metaSize       = 64
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	branchFlag     = 0x01
	leafFlag       = 0x02
	freelistFlag   = 0x10
	bucketFlag     = 0x01
	noFreelist     = ^uint64(0)
	maxDepth       = 64
)

type boltMeta struct {
	pageSize uint64
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
}

// readMeta decodes and validates the meta record of the page at b.
func readMeta(b []byte) (boltMeta, bool) {
	if len(b) < pageHeaderSize+metaSize {
		return boltMeta{}, false
	}
	m := b[pageHeaderSize : pageHeaderSize+metaSize]
	ne := binary.NativeEndian
	if ne.Uint32(m[0:]) != boltMagic || ne.Uint32(m[4:]) != boltVersion {
		return boltMeta{}, false
	}
	h := fnv.New64a()
	h.Write(m[:56])
	if h.Sum64() != ne.Uint64(m[56:]) {
		return boltMeta{}, false
	}
	return boltMeta{
		pageSize: uint64(ne.Uint32(m[8:])),
		root:     ne.Uint64(m[16:]),
		freelist: ne.Uint64(m[32:]),
		pgid:     ne.Uint64(m[40:]),
		txid:     ne.Uint64(m[48:]),
	}, true
}

// verifyIndexFile checks the structure of the bbolt file at path before
// bbolt reads it: bbolt trusts its file, and a damaged one makes it panic
// (in a goroutine of its own when it rebuilds its free list at Open) or
// fault on a wild page id, which no recover catches. The check reads
// every page reachable from the current meta page, bounds-checked, and
// requires what bbolt relies on: valid meta pages, a file as long as its
// high-water mark, every page id in range, referenced once, with the type,
// element bounds and key order of a B+tree page, and valid nested-bucket
// headers. A file that passes can be opened and walked by bbolt without a
// crash. Values are not interpreted (doctor checks those).
func verifyIndexFile(path string) error {
	return mapIndex(path, func(data []byte) error {
		m, err := currentMeta(data)
		if err != nil {
			return err
		}
		return verifyTree(data, m)
	})
}

// verifyIndexAt checks the tree that meta m names in the index at path,
// whatever its own meta pages say.
func verifyIndexAt(path string, m boltMeta) error {
	return mapIndex(path, func(data []byte) error { return verifyTree(data, m) })
}

// mapIndex runs check on the bytes of the index file at path, mapped;
// check's error, a fault or a panic is a *CorruptIndexError.
func mapIndex(path string, check func(data []byte) error) (err error) {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open store index %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("open store index %s: %w", path, err)
	}
	bad := func(format string, a ...any) error {
		return &CorruptIndexError{Path: path, Reason: fmt.Sprintf(format, a...)}
	}
	size := fi.Size()
	if size < 2*pageHeaderSize+2*metaSize {
		return bad("%d bytes, too short for a bbolt file", size)
	}
	if int64(int(size)) != size {
		return bad("%d bytes, too large to check here", size)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("open store index %s: map it: %w", path, err)
	}
	defer unix.Munmap(data)
	_ = unix.Madvise(data, unix.MADV_WILLNEED) // it is all read
	// A fault (the file shrunk under us) or a bounds panic is corruption
	// too, never a crash.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = bad("unreadable: %v", r)
		}
	}()
	if err := check(data); err != nil {
		return bad("%v", err)
	}
	return nil
}

// currentMeta returns the meta record bbolt would use: the valid one with
// the higher transaction id.
func currentMeta(data []byte) (boltMeta, error) {
	// The page size is in the first valid meta page; the second starts
	// one page in.
	m0, ok0 := readMeta(data)
	pageSize := m0.pageSize
	if !ok0 {
		for _, ps := range []uint64{uint64(os.Getpagesize()), 4096, 8192, 16384, 32768, 65536} {
			if m, ok := readMeta(data[min(ps, uint64(len(data))):]); ok && m.pageSize == ps {
				pageSize = ps
				break
			}
		}
	}
	if pageSize < 512 || pageSize > 1<<20 || bits.OnesCount64(pageSize) != 1 {
		return boltMeta{}, errors.New("no valid meta page")
	}
	m1, ok1 := readMeta(data[min(pageSize, uint64(len(data))):])
	if ok0 && m0.pageSize != pageSize {
		ok0 = false
	}
	if ok1 && m1.pageSize != pageSize {
		ok1 = false
	}
	// bbolt uses the valid meta page with the higher transaction id.
	var m boltMeta
	switch {
	case ok0 && ok1:
		m = m0
		if m1.txid > m0.txid {
			m = m1
		}
	case ok0:
		m = m0
	case ok1:
		m = m1
	default:
		return boltMeta{}, errors.New("no valid meta page")
	}
	return m, nil
}

// verifyTree checks the pages of the tree that meta m names (see
// verifyIndexFile).
func verifyTree(data []byte, m boltMeta) error {
	size, pageSize := uint64(len(data)), m.pageSize
	bad := fmt.Errorf
	if m.pgid > uint64(size)/pageSize {
		return bad("truncated: %d bytes, its pages need %d", size, m.pgid*pageSize)
	}
	if m.pgid < 3 {
		return bad("high-water mark %d", m.pgid)
	}
	w := &walker{data: data, ps: pageSize, hwm: m.pgid, seen: make([]uint64, (m.pgid+63)/64)}
	w.mark(0, 0)
	w.mark(1, 0)
	if m.freelist != noFreelist {
		if err := w.freelist(m.freelist); err != nil {
			return err
		}
	}
	if m.root < 2 || m.root >= m.pgid {
		return bad("root page %d out of range", m.root)
	}
	_, err := w.page(m.root, nil, nil, 0)
	return err
}

type walker struct {
	data []byte
	ps   uint64 // page size
	hwm  uint64 // pages below it are in use or free
	seen []uint64
}

// mark records pages id..id+overflow as referenced, failing on a second
// reference.
func (w *walker) mark(id, overflow uint64) error {
	for p := id; p <= id+overflow; p++ {
		if w.seen[p/64]&(1<<(p%64)) != 0 {
			return fmt.Errorf("page %d referenced twice", p)
		}
		w.seen[p/64] |= 1 << (p % 64)
	}
	return nil
}

// span checks the header of page id and returns the bytes of the page and
// its overflow pages.
func (w *walker) span(id uint64) ([]byte, uint16, uint16, error) {
	if id < 2 || id >= w.hwm {
		return nil, 0, 0, fmt.Errorf("page id %d out of range (high-water mark %d)", id, w.hwm)
	}
	ne := binary.NativeEndian
	h := w.data[id*w.ps:]
	if got := ne.Uint64(h[0:]); got != id {
		return nil, 0, 0, fmt.Errorf("page %d says it is page %d", id, got)
	}
	flags, count, overflow := ne.Uint16(h[8:]), ne.Uint16(h[10:]), uint64(ne.Uint32(h[12:]))
	if id+overflow >= w.hwm {
		return nil, 0, 0, fmt.Errorf("page %d: %d overflow pages run past the high-water mark %d", id, overflow, w.hwm)
	}
	if err := w.mark(id, overflow); err != nil {
		return nil, 0, 0, err
	}
	return w.data[id*w.ps : (id+overflow+1)*w.ps], flags, count, nil
}

func (w *walker) freelist(id uint64) error {
	p, flags, count, err := w.span(id)
	if err != nil {
		return fmt.Errorf("freelist: %w", err)
	}
	if flags != freelistFlag {
		return fmt.Errorf("freelist page %d has type %#x", id, flags)
	}
	ne := binary.NativeEndian
	first, n := uint64(0), uint64(count)
	if count == 0xFFFF {
		if len(p) < pageHeaderSize+8 {
			return fmt.Errorf("freelist page %d too short", id)
		}
		first, n = 1, ne.Uint64(p[pageHeaderSize:])
	}
	if n > uint64(len(p)) || pageHeaderSize+(first+n)*8 > uint64(len(p)) {
		return fmt.Errorf("freelist page %d: %d ids do not fit", id, n)
	}
	for i := first; i < first+n; i++ {
		if v := ne.Uint64(p[pageHeaderSize+i*8:]); v < 2 || v >= w.hwm {
			return fmt.Errorf("freelist page %d lists page %d, out of range", id, v)
		}
	}
	return nil
}

// elem is one element of a page: a branch element's key and child page,
// or a leaf element's key, value and flags.
type elem struct {
	key, val []byte
	flags    uint32
	child    uint64
}

// elemAt decodes element i of page p, bounds-checked within p.
func elemAt(p []byte, leaf bool, i int) (elem, error) {
	ne := binary.NativeEndian
	at := uint64(pageHeaderSize + i*elemSize)
	e := p[at : at+elemSize]
	var out elem
	var pos, ksize, vsize uint64
	if leaf {
		out.flags = ne.Uint32(e[0:])
		pos, ksize, vsize = uint64(ne.Uint32(e[4:])), uint64(ne.Uint32(e[8:])), uint64(ne.Uint32(e[12:]))
	} else {
		pos, ksize = uint64(ne.Uint32(e[0:])), uint64(ne.Uint32(e[4:]))
		out.child = ne.Uint64(e[8:])
	}
	start := at + pos
	if start+ksize+vsize > uint64(len(p)) {
		return elem{}, fmt.Errorf("element %d runs past its page", i)
	}
	out.key = p[start : start+ksize]
	out.val = p[start+ksize : start+ksize+vsize]
	return out, nil
}

func fits(p []byte, count uint16) error {
	if pageHeaderSize+uint64(count)*elemSize > uint64(len(p)) {
		return fmt.Errorf("%d elements do not fit in %d bytes", count, len(p))
	}
	return nil
}

// page walks the B+tree page id and everything below it (nested buckets
// too). Its keys must lie in [lo, hi) (nil: unbounded), in bbolt's order:
// increasing, each branch element's subtree at or above its key and below
// the next element's. It returns the largest key under it.
func (w *walker) page(id uint64, lo, hi []byte, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("page %d: tree deeper than %d", id, maxDepth)
	}
	p, flags, count, err := w.span(id)
	if err != nil {
		return nil, err
	}
	switch flags {
	case branchFlag:
		if err := fits(p, count); err != nil {
			return nil, fmt.Errorf("branch page %d: %w", id, err)
		}
		var max []byte
		running := lo
		e, err := elemAt(p, false, 0)
		for i := 0; i < int(count); i++ {
			if err != nil {
				return nil, fmt.Errorf("branch page %d: %w", id, err)
			}
			if err := keyOrder(e.key, i, running, hi); err != nil {
				return nil, fmt.Errorf("branch page %d: %w", id, err)
			}
			next, nextHi := elem{}, hi
			if i+1 < int(count) {
				if next, err = elemAt(p, false, i+1); err == nil {
					nextHi = next.key
				}
			}
			if err != nil {
				return nil, fmt.Errorf("branch page %d: %w", id, err)
			}
			if max, err = w.page(e.child, e.key, nextHi, depth+1); err != nil {
				return nil, err
			}
			running, e = max, next
		}
		return max, nil
	case leafFlag:
		max, err := w.leaf(p, count, lo, hi, depth)
		if err != nil {
			return nil, fmt.Errorf("leaf page %d: %w", id, err)
		}
		return max, nil
	}
	return nil, fmt.Errorf("page %d has type %#x where a branch or leaf page belongs", id, flags)
}

// leaf checks a leaf page (in the file or inline in a bucket value) and
// walks the nested buckets it holds.
func (w *walker) leaf(p []byte, count uint16, lo, hi []byte, depth int) ([]byte, error) {
	if err := fits(p, count); err != nil {
		return nil, err
	}
	prev := lo
	for i := 0; i < int(count); i++ {
		e, err := elemAt(p, true, i)
		if err != nil {
			return nil, err
		}
		if err := keyOrder(e.key, i, prev, hi); err != nil {
			return nil, err
		}
		prev = e.key
		if e.flags&bucketFlag == 0 {
			continue
		}
		if len(e.val) < 16 {
			return nil, fmt.Errorf("bucket header of %d bytes", len(e.val))
		}
		root := binary.NativeEndian.Uint64(e.val)
		if root != 0 {
			if _, err := w.page(root, nil, nil, depth+1); err != nil {
				return nil, err
			}
			continue
		}
		in := e.val[16:]
		if len(in) < pageHeaderSize {
			return nil, fmt.Errorf("inline bucket of %d bytes", len(in))
		}
		if f := binary.NativeEndian.Uint16(in[8:]); f != leafFlag {
			return nil, fmt.Errorf("inline bucket page has type %#x", f)
		}
		if depth+1 > maxDepth {
			return nil, fmt.Errorf("buckets nested deeper than %d", maxDepth)
		}
		if _, err := w.leaf(in, binary.NativeEndian.Uint16(in[10:]), nil, nil, depth+1); err != nil {
			return nil, fmt.Errorf("inline bucket: %w", err)
		}
	}
	if count == 0 {
		return nil, nil
	}
	return prev, nil
}

// keyOrder checks key i of a page: the first at or above prev (the
// range's low end), the others above prev (the previous key, or the
// previous subtree's largest), all below hi.
func keyOrder(key []byte, i int, prev, hi []byte) error {
	if i == 0 && prev != nil && bytes.Compare(prev, key) > 0 {
		return fmt.Errorf("key %d below its range", i)
	}
	if i > 0 && bytes.Compare(prev, key) >= 0 {
		return fmt.Errorf("key %d out of order", i)
	}
	if hi != nil && bytes.Compare(key, hi) >= 0 {
		return fmt.Errorf("key %d at or above its range", i)
	}
	return nil
}
