package applog

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

func writeLog(t *testing.T, parts ...[]byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "u.jsonl")
	if err := os.WriteFile(path, bytes.Join(parts, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func appendTo(t *testing.T, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

func line(c byte, n int) []byte { return append(bytes.Repeat([]byte{c}, n), '\n') }

// A log larger than the read window is read a window at a time: each
// chunk ends at a newline, More says more follow, and the chunks make the
// log's complete lines (not its unfinished tail).
func TestReadLines_Windows(t *testing.T) {
	var parts [][]byte
	for i := range 40 {
		parts = append(parts, line(byte('a'+i%26), 100<<10))
	}
	complete := bytes.Join(parts, nil)
	path := writeLog(t, complete, []byte(`{"unfinished`))
	var got []byte
	reads := 0
	for at := int64(0); ; reads++ {
		c, err := ReadLines(path, at)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(c.Data)) > readWindow || c.Long || (len(c.Data) > 0 && c.Data[len(c.Data)-1] != '\n') {
			t.Fatalf("chunk of %d bytes at %d, long %v", len(c.Data), at, c.Long)
		}
		got = append(got, c.Data...)
		at += int64(len(c.Data))
		if !c.More {
			break
		}
	}
	if !bytes.Equal(got, complete) || reads < 1 {
		t.Fatalf("read %d bytes in %d reads, want the %d complete ones in several", len(got), reads+1, len(complete))
	}
}

// A line longer than MaxLine is reported, not returned: where it ends,
// and the lines around it read as usual. A line of MaxLine bytes is an
// ordinary line.
func TestReadLines_LongLine(t *testing.T) {
	a, long, b, edge := line('a', 10), line('x', MaxLine+1), line('b', 10), line('e', MaxLine)
	path := writeLog(t, a, long, b, edge)
	c, err := ReadLines(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	longAt := int64(len(a))
	if string(c.Data) != string(a) || !c.Long || c.LongEnd != longAt+int64(len(long)) {
		t.Fatalf("ReadLines(0) = %d bytes, long %v ending at %d; want %q and a long line ending at %d",
			len(c.Data), c.Long, c.LongEnd, a, longAt+int64(len(long)))
	}
	c, err = ReadLines(path, c.LongEnd)
	if err != nil || !bytes.Equal(c.Data, append(append([]byte(nil), b...), edge...)) || c.Long || c.More {
		t.Fatalf("after the long line: %d bytes, long %v, more %v, %v", len(c.Data), c.Long, c.More, err)
	}
	// A long line at the end, without its newline yet.
	path = writeLog(t, a, long[:len(long)-1])
	c, err = ReadLines(path, 0)
	if err != nil || string(c.Data) != string(a) || !c.Long || c.LongEnd != -1 {
		t.Fatalf("unfinished long line: %q, long %v, end %d, %v", c.Data, c.Long, c.LongEnd, err)
	}
	// An unfinished line no longer than MaxLine is no long line.
	path = writeLog(t, a, edge[:len(edge)-1])
	if c, err = ReadLines(path, 0); err != nil || string(c.Data) != string(a) || c.Long || c.More {
		t.Fatalf("unfinished line: %q, long %v, more %v, %v", c.Data, c.Long, c.More, err)
	}
}

// The appender remembers an unfinished long line: a read learns that
// nothing complete follows it (Settled), the next read after an append
// searches only the new bytes, and once its newline is there the lines
// after it are read.
func TestAppender_ReadLines_UnfinishedLongLine(t *testing.T) {
	rel := RelPath("t", "u")
	first := line('a', 10)
	start := int64(len(first))
	var (
		a    *Appender
		path string
		c    Chunk
		n    = ^uint64(0)
	)
	read := func(off int64) Chunk {
		t.Helper()
		c, err := a.ReadLines(rel, off)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The allocations are the process's: measured on three fresh logs,
	// the least of them, so that another test's goroutine ending meanwhile
	// does not count.
	for range 3 {
		dir := t.TempDir()
		a = NewAppender(dir, nil)
		defer a.Close()
		if _, _, err := a.Append(rel, first, nil); err != nil {
			t.Fatal(err)
		}
		path = filepath.Join(dir, rel)
		appendTo(t, path, bytes.Repeat([]byte("x"), 3*MaxLine))
		if c := read(0); string(c.Data) != string(first) || !c.Long || c.LongEnd != -1 {
			t.Fatalf("read = %q, long %v, end %d", c.Data, c.Long, c.LongEnd)
		}
		if !a.Settled(rel) {
			t.Fatal("not settled after a read that found nothing complete past the long line")
		}
		appendTo(t, path, bytes.Repeat([]byte("x"), 2*MaxLine))
		n = min(n, allocs(func() { c = read(start) }))
	}
	if len(c.Data) != 0 || !c.Long || c.LongEnd != -1 || n > scanChunk+4096 {
		t.Fatalf("after an append: %d bytes, long %v, end %d, %d bytes allocated (want the new bytes searched only)", len(c.Data), c.Long, c.LongEnd, n)
	}
	size, _, _ := PathSize(path)
	appendTo(t, path, append([]byte("\n"), line('b', 10)...))
	c = read(start - 1) // as a catch-up reads: from the newline before the offset
	if string(c.Data) != "\n" || !c.Long || c.LongEnd != size+1 {
		t.Fatalf("once ended: %q, long %v, end %d; want it to end at %d", c.Data, c.Long, c.LongEnd, size+1)
	}
	if c = read(c.LongEnd); string(c.Data) != string(line('b', 10)) || c.Long {
		t.Fatalf("after it: %q, long %v", c.Data, c.Long)
	}
}

// Reading a log that ends in a 50 MiB line without a newline allocates
// about one read window, not the line.
func TestReadLines_LongLineMemory(t *testing.T) {
	path := writeLog(t, line('a', 10))
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	var c Chunk
	n := allocs(func() { c, err = ReadLines(path, 0) })
	if err != nil || !c.Long || c.LongEnd != -1 {
		t.Fatalf("ReadLines = %d bytes, long %v, end %d, %v", len(c.Data), c.Long, c.LongEnd, err)
	}
	t.Logf("%d bytes allocated", n)
	if n > readWindow+2*scanChunk {
		t.Fatalf("ReadLines of a 50 MiB line allocated %d bytes, want at most %d", n, readWindow+2*scanChunk)
	}
}

func allocs(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
