package applog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// rec returns a test record of exactly n bytes, newline included.
func rec(i, n int) []byte {
	s := fmt.Sprintf(`{"i":%d,"pad":"`, i)
	s += strings.Repeat("x", n-len(s)-3) + "\"}\n"
	return []byte(s)
}

// data returns the log's bytes up to its reserve, and checks that what
// follows is nothing but spaces.
func data(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := bytes.TrimRight(b, " ")
	if bytes.ContainsAny(b[len(d):], "\n") {
		t.Fatalf("reserve holds a newline")
	}
	return d
}

// wantLines checks that the log reads as exactly these records, each at its
// offset, through both readers.
func wantLines(t *testing.T, a *Appender, rel string, want [][]byte, offs []int64) {
	t.Helper()
	for _, read := range []func() ([]byte, error){
		func() ([]byte, error) { return ReadComplete(filepath.Join(a.dir, rel), 0) },
		func() ([]byte, error) { return a.ReadComplete(rel, 0) },
	} {
		b, err := read()
		if err != nil {
			t.Fatal(err)
		}
		lines := Lines(b, 0)
		if len(lines) != len(want) {
			t.Fatalf("%d lines, want %d: %q", len(lines), len(want), b)
		}
		for i, ln := range lines {
			if string(ln.Data)+"\n" != string(want[i]) || (offs != nil && ln.Off != offs[i]) {
				t.Fatalf("line %d = %q at %d, want %q at %d", i, ln.Data, ln.Off, want[i], offs[i])
			}
		}
	}
}

// The store's appender overwrites a pre-written reserve: most of its syncs
// find the file's size unchanged (no journal commit), and every reader
// still sees exactly the records.
func TestReserve_AppendsOverwriteTheReserve(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	sizes := map[int64]int{}
	syncs := 0
	a := NewAppender(dir, func(f *os.File) error {
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		sizes[fi.Size()]++
		syncs++
		return Fdatasync(f)
	})
	defer a.Close()
	var want [][]byte
	var offs []int64
	var at int64
	for i := range 200 {
		r := rec(i, 100)
		off, _, err := a.Append(rel, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if off != at {
			t.Fatalf("record %d at %d, want %d", i, off, at)
		}
		want, offs = append(want, r), append(offs, off)
		at += int64(len(r))
	}
	if got := data(t, filepath.Join(dir, rel)); int64(len(got)) != at {
		t.Fatalf("data %d bytes, want %d", len(got), at)
	}
	if syncs != 200 || len(sizes) > 10 {
		t.Fatalf("%d syncs saw %d different file sizes; want 200 syncs and few sizes (a reserve extended in steps)", syncs, len(sizes))
	}
	wantLines(t, a, rel, want, offs)
}

// Another process appends after the reserve (ending its "line" first); the
// store's appender then writes after that append, and nothing reads as a
// record but the three records.
func TestReserve_ForeignAppendAfterTheReserve(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	a := NewAppender(dir, Fdatasync)
	defer a.Close()
	r1, f1, r2 := rec(1, 64), rec(2, 64), rec(3, 64)
	o1, _, err := a.Append(rel, r1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Settled(rel) {
		t.Fatal("not settled after its own append")
	}
	of, err := AppendLocked(path, f1, Fdatasync)
	if err != nil {
		t.Fatal(err)
	}
	if a.Settled(rel) {
		t.Fatal("settled after another process appended")
	}
	o2, _, err := a.Append(rel, r2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if of <= o1 || o2 != of+int64(len(f1)) {
		t.Fatalf("offsets %d, %d, %d: the store's append must follow the foreign one", o1, of, o2)
	}
	wantLines(t, a, rel, [][]byte{r1, f1, r2}, []int64{o1, of, o2})
	if !a.Settled(rel) {
		t.Fatal("not settled after reading")
	}
}

// A new appender (a restarted process) continues inside the reserve its
// predecessor left, right after the last record.
func TestReserve_RestartContinuesInTheReserve(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	a := NewAppender(dir, Fdatasync)
	r1, r2, r3 := rec(1, 64), rec(2, 64), rec(3, 64)
	for _, r := range [][]byte{r1, r2} {
		if _, _, err := a.Append(rel, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	a.Close()
	fi, _ := os.Stat(path)
	b := NewAppender(dir, Fdatasync)
	defer b.Close()
	off, _, err := b.Append(rel, r3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if off != 128 {
		t.Fatalf("record after restart at %d, want 128", off)
	}
	if fi2, _ := os.Stat(path); fi2.Size() != fi.Size() {
		t.Fatalf("size %d → %d: the restarted appender did not use the reserve", fi.Size(), fi2.Size())
	}
	wantLines(t, b, rel, [][]byte{r1, r2, r3}, []int64{0, 64, 128})
}

// A writer that died mid-record inside the reserve left a torn line; the
// next appender ends it (it then reads as a bad line) and writes after it.
func TestReserve_TornLineInTheReserve(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	a := NewAppender(dir, Fdatasync)
	r1, r2 := rec(1, 64), rec(2, 64)
	if _, _, err := a.Append(rel, r1, nil); err != nil {
		t.Fatal(err)
	}
	a.Close()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(`{"half`), 64); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if b, _ := ReadComplete(path, 0); string(b) != string(r1) {
		t.Fatalf("torn line read: %q", b)
	}
	b := NewAppender(dir, Fdatasync)
	defer b.Close()
	off, _, err := b.Append(rel, r2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if off != 64+7 {
		t.Fatalf("record at %d, want %d", off, 64+7)
	}
	wantLines(t, b, rel, [][]byte{r1, []byte("{\"half\n"), r2}, []int64{0, 64, 71})
}

// A failed sync leaves nothing of the record behind, whether it was
// written into the reserve or extended the file; the next append takes its
// place.
func TestReserve_FailedAppendLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	boom := errors.New("EIO")
	fail := false
	a := NewAppender(dir, func(f *os.File) error {
		if fail {
			return boom
		}
		return Fdatasync(f)
	})
	defer a.Close()
	r1 := rec(1, 64)
	if _, _, err := a.Append(rel, r1, nil); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	for _, n := range []int{64, int(fi.Size())} { // fits the reserve; does not
		fail = true
		if _, _, err := a.Append(rel, rec(9, n), nil); !errors.Is(err, boom) {
			t.Fatalf("append of %d bytes with a failing sync: err = %v", n, err)
		}
		fail = false
		if got := data(t, path); string(got) != string(r1) {
			t.Fatalf("after a failed append of %d bytes the log holds %q", n, got)
		}
		if fi2, _ := os.Stat(path); fi2.Size() != fi.Size() {
			t.Fatalf("failed append of %d bytes changed the size %d → %d", n, fi.Size(), fi2.Size())
		}
	}
	r2 := rec(2, 64)
	if off, _, err := a.Append(rel, r2, nil); err != nil || off != 64 {
		t.Fatalf("append after failures at %d, %v; want 64", off, err)
	}
	wantLines(t, a, rel, [][]byte{r1, r2}, []int64{0, 64})
}

func TestOnlyReserve(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	a := NewAppender(dir, Fdatasync)
	defer a.Close()
	if _, _, err := a.Append(rel, rec(1, 64), nil); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, c := range []struct {
		off  int64
		want bool
	}{{64, true}, {63, false}, {0, false}} {
		if got, err := OnlyReserve(f, c.off); err != nil || got != c.want {
			t.Errorf("OnlyReserve(%d) = %v, %v; want %v", c.off, got, err, c.want)
		}
	}
	if _, err := f.WriteAt([]byte("{"), 100); err != nil {
		t.Fatal(err)
	}
	if got, _ := OnlyReserve(f, 64); got {
		t.Error("OnlyReserve with a torn line after the records = true")
	}
}

// BenchmarkAppend compares one durable 1 KiB append by the store's
// appender writing into its reserve with the same appender appending at
// the end of the file (no reserve: every fdatasync commits the journal),
// and with the foreign-appender path (open, lock, append, fdatasync, close).
func BenchmarkAppend(b *testing.B) {
	r := rec(1, 1024)
	for _, mode := range []string{"reserve", "append"} {
		b.Run(mode, func(b *testing.B) {
			noReserve = mode == "append"
			defer func() { noReserve = false }()
			dir := b.TempDir()
			a := NewAppender(dir, Fdatasync)
			defer a.Close()
			rel := filepath.Join(Dir, "t", "u.jsonl")
			for b.Loop() {
				if _, _, err := a.Append(rel, r, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("foreign", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), Dir, "t", "u.jsonl")
		for b.Loop() {
			if _, err := AppendLocked(path, r, Fdatasync); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// With more logs than descriptors to cache, the least recently used idle
// log is closed to open another, and a log reopened that way goes on
// writing into its reserve (it used to be appended to past the reserve,
// without one, once the cache was full).
func TestAppender_EvictsTheLeastRecentlyUsedLog(t *testing.T) {
	orig := maxOpen
	t.Cleanup(func() { maxOpen = orig })
	maxOpen = 2
	dir := t.TempDir()
	a := NewAppender(dir, func(*os.File) error { return nil })
	defer a.Close()
	rels := []string{filepath.Join(Dir, "t", "u1.jsonl"), filepath.Join(Dir, "t", "u2.jsonl"), filepath.Join(Dir, "t", "u3.jsonl")}
	size := func(rel string) int64 {
		fi, err := os.Stat(filepath.Join(dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	want := map[string][][]byte{}
	var offs = map[string][]int64{}
	app := func(rel string, i int) {
		t.Helper()
		r := rec(i, 100)
		off, _, err := a.Append(rel, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		want[rel] = append(want[rel], r)
		offs[rel] = append(offs[rel], off)
	}
	for i, rel := range rels {
		app(rel, i)
	}
	first := size(rels[0])
	open := func() (names []string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.open != a.lru.Len() {
			t.Fatalf("open = %d, lru holds %d", a.open, a.lru.Len())
		}
		for e := a.lru.Front(); e != nil; e = e.Next() {
			for rel, g := range a.logs {
				if g == e.Value.(*group) {
					names = append(names, filepath.Base(rel))
				}
			}
		}
		return names
	}
	if got := strings.Join(open(), ","); got != "u3.jsonl,u2.jsonl" {
		t.Fatalf("cached after u1, u2, u3: %s, want u3.jsonl,u2.jsonl", got)
	}
	for i := 3; i < 30; i++ {
		app(rels[i%3], i) // each append reopens a log closed by the last
	}
	if got := size(rels[0]); got != first {
		t.Errorf("u1 grew from %d to %d bytes: its records went past its reserve", first, got)
	}
	for _, rel := range rels {
		wantLines(t, a, rel, want[rel], offs[rel])
	}
	if got := len(open()); got != 2 {
		t.Errorf("%d descriptors cached, want at most 2", got)
	}
}

// An appender that has touched many logs remembers a bounded number of
// them: it forgets the least recently used ones nobody holds, and a log it
// forgot is still appended to in its reserve, and read right.
func TestAppender_ForgetsIdleLogs(t *testing.T) {
	origOpen, origGroups := maxOpen, maxGroups
	t.Cleanup(func() { maxOpen, maxGroups = origOpen, origGroups })
	maxOpen, maxGroups = 2, 4
	dir := t.TempDir()
	a := NewAppender(dir, func(*os.File) error { return nil })
	defer a.Close()
	const n = 20
	rel := func(i int) string { return filepath.Join(Dir, "t", fmt.Sprintf("u%02d.jsonl", i)) }
	remembered := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(a.logs) != a.known.Len() {
			t.Fatalf("%d groups, %d in the list", len(a.logs), a.known.Len())
		}
		return len(a.logs)
	}
	want := map[int][][]byte{}
	offs := map[int][]int64{}
	sizes := map[int]int64{}
	for round := range 2 {
		for i := range n {
			r := rec(round*n+i, 100)
			off, _, err := a.Append(rel(i), r, nil)
			if err != nil {
				t.Fatal(err)
			}
			want[i] = append(want[i], r)
			offs[i] = append(offs[i], off)
			if round == 0 {
				fi, err := os.Stat(filepath.Join(dir, rel(i)))
				if err != nil {
					t.Fatal(err)
				}
				sizes[i] = fi.Size()
			}
		}
		if got := remembered(); got > maxGroups {
			t.Fatalf("round %d: %d logs remembered after appending to %d, want at most %d", round, got, n, maxGroups)
		}
	}
	for i := range n {
		fi, err := os.Stat(filepath.Join(dir, rel(i)))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != sizes[i] {
			t.Errorf("log %d grew from %d to %d bytes: the second record went past the reserve", i, sizes[i], fi.Size())
		}
		wantLines(t, a, rel(i), want[i], offs[i])
	}
	if got := remembered(); got > maxGroups {
		t.Fatalf("%d logs remembered after reading %d, want at most %d", got, n, maxGroups)
	}
}

// Large writes (a group commit of many producers' records) earn a reserve
// with room for a few more like them: the log does not change size at
// every sync once its reserve is smaller than a batch.
func TestReserve_LargeWritesEarnALargerReserve(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	var sizes []int64
	a := NewAppender(dir, func(f *os.File) error {
		size, _, err := fileSize(f)
		sizes = append(sizes, size)
		return err
	})
	defer a.Close()
	var want [][]byte
	var offs []int64
	for i := range 40 {
		var batch []byte
		for j := range 16 {
			batch = append(batch, rec(i*16+j, 1100)...)
		}
		off, _, err := a.Append(rel, batch, nil)
		if err != nil {
			t.Fatal(err)
		}
		for j := range 16 {
			want = append(want, rec(i*16+j, 1100))
			offs = append(offs, off+int64(j*1100))
		}
	}
	changed := 0
	for i := range sizes {
		if i == 0 || sizes[i] != sizes[i-1] {
			changed++
		}
	}
	if changed > 12 {
		t.Errorf("%d of %d syncs of 17 KiB batches followed a size change, want at most 12", changed, len(sizes))
	}
	wantLines(t, a, rel, want, offs)
}

// Many goroutines appending to more logs than the appender keeps open or
// remembers: every record lands once, whole, at the offset reported, in
// the reserve of its own log.
func TestAppender_ConcurrentAppendsWithEvictions(t *testing.T) {
	origOpen, origGroups := maxOpen, maxGroups
	t.Cleanup(func() { maxOpen, maxGroups = origOpen, origGroups })
	maxOpen, maxGroups = 3, 5
	dir := t.TempDir()
	a := NewAppender(dir, func(*os.File) error { return nil })
	defer a.Close()
	const workers, each, logs = 8, 150, 20
	type placed struct {
		rel string
		off int64
		rec []byte
	}
	out := make(chan placed, workers*each)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				n := w*each + i
				rel := filepath.Join(Dir, "t", fmt.Sprintf("u%02d.jsonl", (n*7)%logs))
				r := rec(n, 120)
				off, _, err := a.Append(rel, r, nil)
				if err != nil {
					errs <- err
					return
				}
				out <- placed{rel, off, r}
			}
		}()
	}
	wg.Wait()
	close(out)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	byLog := map[string][]placed{}
	for p := range out {
		byLog[p.rel] = append(byLog[p.rel], p)
	}
	total := 0
	for rel, ps := range byLog {
		b, err := ReadComplete(filepath.Join(dir, rel), 0)
		if err != nil {
			t.Fatal(err)
		}
		lines := Lines(b, 0)
		if len(lines) != len(ps) {
			for _, p := range ps {
				found := false
				for _, ln := range lines {
					if ln.Off == p.off {
						found = true
						if string(ln.Data)+"\n" != string(p.rec) {
							t.Logf("at %d: %q, want %q", p.off, ln.Data[:30], p.rec[:30])
						}
					}
				}
				if !found {
					t.Logf("record %q reported at %d: no line starts there; bytes there: %q", p.rec[:20], p.off, b[max(p.off-5, 0):min(p.off+30, int64(len(b)))])
				}
			}
			t.Fatalf("%s: %d lines, %d records appended", rel, len(lines), len(ps))
		}
		at := map[int64]string{}
		for _, ln := range lines {
			at[ln.Off] = string(ln.Data) + "\n"
		}
		for _, p := range ps {
			if at[p.off] != string(p.rec) {
				t.Fatalf("%s: at %d reads %q, want %q", rel, p.off, at[p.off], p.rec)
			}
		}
		total += len(ps)
	}
	if total != workers*each {
		t.Fatalf("%d records placed, want %d", total, workers*each)
	}
	a.mu.Lock()
	open, remembered := a.open, len(a.logs)
	a.mu.Unlock()
	if open > maxOpen || remembered > maxGroups {
		t.Errorf("%d descriptors open (max %d), %d logs remembered (max %d)", open, maxOpen, remembered, maxGroups)
	}
}
