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

// wantFile checks that the file at path holds exactly parts, one after
// the other: nothing was written but what was appended.
func wantFile(t *testing.T, path string, parts ...[]byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := bytes.Join(parts, nil); !bytes.Equal(b, want) {
		t.Fatalf("log holds %d bytes %q,\nwant %d bytes %q", len(b), b, len(want), want)
	}
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

// The store's appender writes nothing but the records it appends, at the
// end of the file: when each sync runs the file is exactly the records so
// far, and each append grows it by its record, so that a reader following
// the file's size (tail -f) sees every record as soon as it is written.
// (Older builds pre-wrote a reserve of spaces and wrote records over it.)
func TestAppender_WritesNothingButItsRecords(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	var at, want int64 // where the next record goes; the size its sync must see
	a := NewAppender(dir, func(f *os.File) error {
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if fi.Size() != want {
			t.Errorf("syncing a log of %d bytes, want exactly the %d bytes of its records", fi.Size(), want)
		}
		return Fdatasync(f)
	})
	defer a.Close()
	var recs [][]byte
	var offs []int64
	for i := range 50 {
		r := rec(i, 60+i*7)
		want = at + int64(len(r))
		off, _, err := a.Append(rel, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if off != at {
			t.Fatalf("record %d at %d, want %d", i, off, at)
		}
		at += int64(len(r))
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != at {
			t.Fatalf("after record %d the log is %d bytes, want %d", i, fi.Size(), at)
		}
		recs, offs = append(recs, r), append(offs, off)
	}
	wantFile(t, path, recs...)
	wantLines(t, a, rel, recs, offs)
}

// Another process appends between the store's appends; each append goes
// after the last, and nothing reads as a record but the three records.
func TestAppender_ForeignAppendBetween(t *testing.T) {
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
	if o1 != 0 || of != 64 || o2 != 128 {
		t.Fatalf("offsets %d, %d, %d, want 0, 64, 128", o1, of, o2)
	}
	wantFile(t, path, r1, f1, r2)
	wantLines(t, a, rel, [][]byte{r1, f1, r2}, []int64{o1, of, o2})
	if !a.Settled(rel) {
		t.Fatal("not settled after reading")
	}
}

// A new appender (a restarted process) appends right after the last
// record.
func TestAppender_RestartAppendsAtTheEnd(t *testing.T) {
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
	b := NewAppender(dir, Fdatasync)
	defer b.Close()
	off, _, err := b.Append(rel, r3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if off != 128 {
		t.Fatalf("record after restart at %d, want 128", off)
	}
	wantFile(t, path, r1, r2, r3)
	wantLines(t, b, rel, [][]byte{r1, r2, r3}, []int64{0, 64, 128})
}

// A writer that died mid-record left a torn line; the next appender ends
// it (it then reads as a bad line) and writes after it.
func TestAppender_TornTail(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	a := NewAppender(dir, Fdatasync)
	r1, r2 := rec(1, 64), rec(2, 64)
	if _, _, err := a.Append(rel, r1, nil); err != nil {
		t.Fatal(err)
	}
	a.Close()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(`{"half`)); err != nil {
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
	wantFile(t, path, r1, []byte("{\"half\n"), r2)
	wantLines(t, b, rel, [][]byte{r1, []byte("{\"half\n"), r2}, []int64{0, 64, 71})
}

// A failed sync leaves nothing of the record behind; the next append takes
// its place.
func TestAppender_FailedAppendLeavesNothing(t *testing.T) {
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
	for _, n := range []int{64, 9000} {
		fail = true
		if _, _, err := a.Append(rel, rec(9, n), nil); !errors.Is(err, boom) {
			t.Fatalf("append of %d bytes with a failing sync: err = %v", n, err)
		}
		fail = false
		wantFile(t, path, r1)
	}
	r2 := rec(2, 64)
	if off, _, err := a.Append(rel, r2, nil); err != nil || off != 64 {
		t.Fatalf("append after failures at %d, %v; want 64", off, err)
	}
	wantLines(t, a, rel, [][]byte{r1, r2}, []int64{0, 64})
}

// A log written by an older build ends in its reserve: spaces without a
// newline after the last record (and, where that build's reserve was ended
// by another appender, a line of spaces, and records with leading spaces).
// It reads as its records; the store's appender and the foreign path both
// append after the padding, ending it with a newline first, and no record
// is lost or changed.
func TestOldReserve_ReadsAndAppends(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	r1, r2, r3, f4, r5 := rec(1, 64), rec(2, 64), rec(3, 64), rec(4, 64), rec(5, 64)
	ended := append(bytes.Repeat([]byte(" "), 300), '\n') // a reserve another appender ended
	lead := bytes.Repeat([]byte(" "), 5)                  // a record after an abandoned reserve
	pad := bytes.Repeat([]byte(" "), 4096-64-len(ended)-len(lead)-64)
	old := bytes.Join([][]byte{r1, ended, lead, r2, pad}, nil)
	if err := os.WriteFile(path, old, 0o600); err != nil {
		t.Fatal(err)
	}
	o2 := int64(64 + len(ended) + len(lead))
	idx := o2 + 64 // where the old build's reader stopped: after r2
	a := NewAppender(dir, Fdatasync)
	wantLines(t, a, rel, [][]byte{r1, r2}, []int64{0, o2})
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if idle, err := NothingPast(f, idx); err != nil || !idle {
		t.Fatalf("NothingPast(the end of r2) = %v, %v on an old log's padding, want true", idle, err)
	}
	f.Close()

	o3, _, err := a.Append(rel, r3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len(old)) + 1; o3 != want {
		t.Fatalf("record after the padding at %d, want %d (after the newline that ends it)", o3, want)
	}
	o4, err := AppendLocked(path, f4, Fdatasync)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	b := NewAppender(dir, Fdatasync)
	defer b.Close()
	o5, _, err := b.Append(rel, r5, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o4 != o3+64 || o5 != o4+64 {
		t.Fatalf("offsets %d, %d, %d: each append must follow the last", o3, o4, o5)
	}
	wantFile(t, path, old, []byte("\n"), r3, f4, r5)
	all := [][]byte{r1, r2, r3, f4, r5}
	offs := []int64{0, o2, o3, o4, o5}
	wantLines(t, b, rel, all, offs)

	// A reader that stopped at the end of r2 (a store's index) reads the
	// new records at their offsets, and nothing else.
	got, err := b.ReadComplete(rel, idx)
	if err != nil {
		t.Fatal(err)
	}
	lines := Lines(got, idx)
	if len(lines) != 3 {
		t.Fatalf("%d lines past the old end, want 3: %q", len(lines), got)
	}
	for i, ln := range lines {
		if string(ln.Data)+"\n" != string(all[2+i]) || ln.Off != offs[2+i] {
			t.Fatalf("line %d past the old end = %q at %d, want %q at %d", i, ln.Data, ln.Off, all[2+i], offs[2+i])
		}
	}
}

// A writer of an older build that died mid-record inside its reserve left
// a torn line followed by spaces; the next append ends that line (a bad
// line for the reader's quarantine) and writes after it.
func TestOldReserve_TornLineInThePadding(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	r1, r2 := rec(1, 64), rec(2, 64)
	torn := append([]byte(`{"half`), bytes.Repeat([]byte(" "), 1000)...)
	if err := os.WriteFile(path, append(append([]byte(nil), r1...), torn...), 0o600); err != nil {
		t.Fatal(err)
	}
	a := NewAppender(dir, Fdatasync)
	defer a.Close()
	wantLines(t, a, rel, [][]byte{r1}, []int64{0})
	off, _, err := a.Append(rel, r2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(64 + len(torn) + 1); off != want {
		t.Fatalf("record at %d, want %d", off, want)
	}
	wantFile(t, path, r1, torn, []byte("\n"), r2)
	wantLines(t, a, rel, [][]byte{r1, append(torn, '\n'), r2}, []int64{0, 64, off})
}

func TestNothingPast(t *testing.T) {
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
	check := func(what string, cases map[int64]bool) {
		t.Helper()
		for off, want := range cases {
			if got, err := NothingPast(f, off); err != nil || got != want {
				t.Errorf("%s: NothingPast(%d) = %v, %v; want %v", what, off, got, err, want)
			}
		}
	}
	check("records only", map[int64]bool{64: true, 63: false, 0: false, 65: false})
	if _, err := f.WriteAt(bytes.Repeat([]byte(" "), 20000), 64); err != nil { // an older build's padding
		t.Fatal(err)
	}
	check("padded", map[int64]bool{64: true, 63: false, 0: false})
	if _, err := f.WriteAt([]byte("{"), 19000); err != nil {
		t.Fatal(err)
	}
	check("a torn line in the padding", map[int64]bool{64: false})
}

// Withdraw cuts a failed batch's append back, only while nothing was
// appended after it; the next append takes its place.
func TestAppender_Withdraw(t *testing.T) {
	dir := t.TempDir()
	rel := filepath.Join(Dir, "t", "u.jsonl")
	path := filepath.Join(dir, rel)
	a := NewAppender(dir, Fdatasync)
	defer a.Close()
	r1, r2, r3, f4 := rec(1, 64), rec(2, 64), rec(3, 64), rec(4, 64)
	for _, r := range [][]byte{r1, r2} {
		if _, _, err := a.Append(rel, r, nil); err != nil {
			t.Fatal(err)
		}
	}
	if !a.Withdraw(rel, 64, 128) {
		t.Fatal("Withdraw of the last append refused")
	}
	wantFile(t, path, r1)
	if off, _, err := a.Append(rel, r3, nil); err != nil || off != 64 {
		t.Fatalf("append after Withdraw at %d, %v; want 64", off, err)
	}
	if _, err := AppendLocked(path, f4, Fdatasync); err != nil {
		t.Fatal(err)
	}
	if a.Withdraw(rel, 64, 128) {
		t.Fatal("Withdraw cut a log another append had grown")
	}
	wantFile(t, path, r1, r3, f4)
	if a.Withdraw(filepath.Join(Dir, "t", "missing.jsonl"), 0, 64) {
		t.Fatal("Withdraw of a missing log reported a cut")
	}
}

// BenchmarkAppend compares one durable 1 KiB append by the store's
// appender (cached descriptor, group commit) with the foreign-appender
// path (open, lock, append, fdatasync, close).
func BenchmarkAppend(b *testing.B) {
	r := rec(1, 1024)
	b.Run("store", func(b *testing.B) {
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
// appending right after its last record.
func TestAppender_EvictsTheLeastRecentlyUsedLog(t *testing.T) {
	orig := maxOpen
	t.Cleanup(func() { maxOpen = orig })
	maxOpen = 2
	dir := t.TempDir()
	a := NewAppender(dir, func(*os.File) error { return nil })
	defer a.Close()
	rels := []string{filepath.Join(Dir, "t", "u1.jsonl"), filepath.Join(Dir, "t", "u2.jsonl"), filepath.Join(Dir, "t", "u3.jsonl")}
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
	for _, rel := range rels {
		wantFile(t, filepath.Join(dir, rel), want[rel]...)
		wantLines(t, a, rel, want[rel], offs[rel])
	}
	if got := len(open()); got != 2 {
		t.Errorf("%d descriptors cached, want at most 2", got)
	}
}

// An appender that has touched many logs remembers a bounded number of
// them: it forgets the least recently used ones nobody holds, and a log it
// forgot is still appended to right after its last record, and read
// right.
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
	for round := range 2 {
		for i := range n {
			r := rec(round*n+i, 100)
			off, _, err := a.Append(rel(i), r, nil)
			if err != nil {
				t.Fatal(err)
			}
			want[i] = append(want[i], r)
			offs[i] = append(offs[i], off)
		}
		if got := remembered(); got > maxGroups {
			t.Fatalf("round %d: %d logs remembered after appending to %d, want at most %d", round, got, n, maxGroups)
		}
	}
	for i := range n {
		wantFile(t, filepath.Join(dir, rel(i)), want[i]...)
		wantLines(t, a, rel(i), want[i], offs[i])
	}
	if got := remembered(); got > maxGroups {
		t.Fatalf("%d logs remembered after reading %d, want at most %d", got, n, maxGroups)
	}
}

// Many goroutines appending to more logs than the appender keeps open or
// remembers: every record lands once, whole, at the offset reported, in
// its own log, which holds nothing else.
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
		n := int64(0)
		for _, p := range ps {
			n += int64(len(p.rec))
		}
		if fi, err := os.Stat(filepath.Join(dir, rel)); err != nil {
			t.Fatal(err)
		} else if fi.Size() != n {
			t.Fatalf("%s: %d bytes, want the %d bytes of its records", rel, fi.Size(), n)
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

// TestAppenderNeverCreatesTheDataDir: an Appender creates what is missing
// inside its data directory (a tenant's directory; logs/ removed under
// it), but after the data directory moved, or was replaced by another,
// it creates nothing at the old path: the append fails with ErrDirGone.
func TestAppenderNeverCreatesTheDataDir(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "data")
	if err := os.MkdirAll(filepath.Join(dir, Dir), 0o700); err != nil {
		t.Fatal(err)
	}
	a := NewAppender(dir, nil)
	defer a.Close()
	if _, _, err := a.Append(RelPath("t1", "u1"), rec(1, 40), nil); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, Dir)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Append(RelPath("t1", "u1"), rec(2, 40), nil); err != nil {
		t.Fatalf("append after logs/ was removed: %v (the data directory is still the same: make logs/ again)", err)
	}
	wantFile(t, Path(dir, "t1", "u1"), rec(2, 40))

	for _, fault := range []string{"moved", "replaced"} {
		if err := os.Rename(dir, filepath.Join(base, fault)); err != nil {
			t.Fatal(err)
		}
		if fault == "replaced" {
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		for _, user := range []string{"u1", "u2"} {
			if _, _, err := a.Append(RelPath("t1", user), rec(3, 40), nil); !errors.Is(err, ErrDirGone) {
				t.Errorf("append for %s after the data directory was %s = %v, want ErrDirGone", user, fault, err)
			}
		}
		var made []string
		_ = filepath.WalkDir(dir, func(p string, _ os.DirEntry, _ error) error {
			if p != dir {
				made = append(made, p)
			}
			return nil
		})
		if _, err := os.Lstat(dir); len(made) > 0 || (fault == "moved" && err == nil) {
			t.Errorf("after the data directory was %s the appender made %s again: %v", fault, dir, made)
		}
		if fault == "replaced" {
			os.Remove(dir)
		}
		if err := os.Rename(filepath.Join(base, fault), dir); err != nil {
			t.Fatal(err)
		}
	}
	// AppendLocked (a foreign appender) still makes a new data directory.
	fresh := filepath.Join(base, "fresh")
	if _, err := AppendLocked(Path(fresh, "t1", "u1"), rec(4, 40), nil); err != nil {
		t.Fatal(err)
	}
}

// logs/ removed under an Appender and made again: the data directory's
// entry for it is synced too before the append is reported durable, or a
// machine crash could take logs/ and the new log with it.
func TestAppenderSyncsTheEntryOfLogsMadeAgain(t *testing.T) {
	var mu sync.Mutex
	var synced []string
	orig := syncDir
	t.Cleanup(func() { syncDir = orig })
	syncDir = func(f *os.File) error {
		mu.Lock()
		defer mu.Unlock()
		synced = append(synced, f.Name())
		return nil
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, Dir), 0o700); err != nil {
		t.Fatal(err)
	}
	a := NewAppender(dir, func(*os.File) error { return nil })
	defer a.Close()
	if err := os.RemoveAll(filepath.Join(dir, Dir)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Append(RelPath("t1", "u1"), rec(1, 40), nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{dir, filepath.Join(dir, Dir), filepath.Dir(Path(dir, "t1", "u1"))} {
		found := false
		for _, s := range synced {
			found = found || s == want
		}
		if !found {
			t.Errorf("%s not synced after logs/ was made again (synced %v)", want, synced)
		}
	}
}
