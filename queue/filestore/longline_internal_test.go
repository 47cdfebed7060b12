package filestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
)

// allocatedBy returns the bytes allocated while f ran.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// indexedOffset returns the offset up to which log rel is indexed.
func indexedOffset(t *testing.T, q *Queue, rel string) int64 {
	t.Helper()
	var off int64
	if err := q.viewNow(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bktLogs).Get([]byte(rel)); len(v) == 16 {
			off = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return off
}

// A foreign appender writes 50 MiB on one line (issue K, item 8): the
// store never reads that line into memory (it used to, twice per pass: 50
// MiB for the check for news, 50 MiB for the catch-up, and then decoded
// it), keeps its offset at the line's start while the line has no newline,
// searches only what was appended since on the next pass, and once the
// line ends quarantines it ("line exceeds N bytes") and indexes the lines
// after it.
func TestCatchUp_LongForeignLine(t *testing.T) {
	const total = 50 << 20
	dir := t.TempDir()
	q := openFault(t, dir)
	mustEnqueue(t, q, replyEnv("before", "u1", "hi"))
	rel := applog.RelPath(envelope.DefaultTenant, "u1")
	path := filepath.Join(dir, rel)
	start, _, err := applog.PathSize(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(b []byte) {
		t.Helper()
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	// The line starts like a record and never ends its string.
	write([]byte(`{"schema_version":"1","id":"huge","user_id":"u1","payload":{"text":"`))
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	pass := func(what string, bound uint64) {
		t.Helper()
		var err error
		n := allocatedBy(func() { err = q.catchUpAll(false) })
		if err != nil {
			t.Fatalf("%s: catch-up: %v", what, err)
		}
		t.Logf("%s: %d bytes allocated", what, n)
		if n > bound {
			t.Fatalf("%s: the catch-up allocated %d bytes, want at most %d", what, n, bound)
		}
	}
	for range total / 2 / len(chunk) {
		write(chunk)
	}
	pass("half of the line written", 4*applog.MaxLine)
	if got := indexedOffset(t, q, rel); got != start {
		t.Fatalf("indexed offset %d, want %d (the long line's start)", got, start)
	}
	for range total / 2 / len(chunk) {
		write(chunk)
	}
	// Only what was appended since is searched, in small reads.
	pass("all of it written", applog.MaxLine/4)
	if qr, _ := q.Quarantined(); len(qr) != 0 {
		t.Fatalf("quarantined before the line ended: %+v", qr)
	}

	// The line ends, and a record follows it (one write, as the contract
	// for foreign appenders says).
	after, err := json.Marshal(replyEnv("after", "u1", "still here"))
	if err != nil {
		t.Fatal(err)
	}
	write(append(append([]byte(`"}}`+"\n"), after...), '\n'))
	pass("the line ended", 4*applog.MaxLine)
	qr, err := q.Quarantined()
	if err != nil || len(qr) != 1 {
		t.Fatalf("quarantined %+v, %v; want the long line", qr, err)
	}
	if want := fmt.Sprintf("line exceeds %d bytes", applog.MaxLine); qr[0].Offset != start || qr[0].Reason != want || qr[0].Log != rel {
		t.Fatalf("quarantine record %+v, want offset %d, reason %q", qr[0], start, want)
	}
	for _, id := range []string{"before", "after"} {
		if _, err := q.Get(context.Background(), "", id); err != nil {
			t.Fatalf("Get %s: %v", id, err)
		}
	}
	if _, err := q.Get(context.Background(), "", "huge"); err == nil {
		t.Fatal("the long line was indexed")
	}
	// Nothing is read or quarantined again on a restart.
	q.Close()
	q = openFault(t, dir)
	if err := q.catchUpAll(false); err != nil {
		t.Fatal(err)
	}
	if qr, _ := q.Quarantined(); len(qr) != 1 {
		t.Fatalf("quarantined again after a restart: %+v", qr)
	}
	if _, err := q.Get(context.Background(), "", "after"); err != nil {
		t.Fatal(err)
	}
	// doctor counts no unindexed bytes, without reading the line either.
	var unindexed int64
	if p := checkLog(dir, rel, logValue(t, q, rel), &unindexed); p != "" || unindexed != 0 {
		t.Fatalf("checkLog = %q, %d unindexed bytes", p, unindexed)
	}
}

// logValue returns log rel's entry in the logs bucket.
func logValue(t *testing.T, q *Queue, rel string) []byte {
	t.Helper()
	var v []byte
	if err := q.viewNow(func(tx *bolt.Tx) error {
		v = bytes.Clone(tx.Bucket(bktLogs).Get([]byte(rel)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// The store's own append after a foreign long line that has no newline
// ends that line (as it ends any torn tail): the long line is quarantined
// and the record is indexed.
func TestCatchUp_AppendEndsLongLine(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	mustEnqueue(t, q, replyEnv("before", "u1", "hi"))
	path := LogPath(dir, "", "u1")
	start, _, _ := applog.PathSize(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(bytes.Repeat([]byte("x"), 3*applog.MaxLine)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := q.catchUpAll(false); err != nil {
		t.Fatal(err)
	}
	mustEnqueue(t, q, replyEnv("mine", "u1", "hello"))
	leases := claimAll(t, q)
	wantLeased(t, leases, "before", "mine")
	qr, err := q.Quarantined()
	if err != nil || len(qr) != 1 || qr[0].Offset != start {
		t.Fatalf("quarantined %+v, %v; want the long line at %d", qr, err, start)
	}
}

// A log larger than the read window is indexed a window at a time, also
// when it is indexed again from its start: a replaced log whose first
// record is gone has every other record moved to its new offset, those
// read in a later window included.
func TestCatchUp_ReplacedLogAcrossWindows(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	text := string(bytes.Repeat([]byte("w"), 1000))
	const n = 2600 // about 2.9 MB of records: two windows
	for i := 0; i < n; i += 100 {
		var batch []*envelope.Envelope
		for j := i; j < i+100; j++ {
			batch = append(batch, replyEnv(fmt.Sprintf("r%04d", j), "u1", text))
		}
		if _, err := q.Enqueue(context.Background(), batch...); err != nil {
			t.Fatal(err)
		}
	}
	path := LogPath(dir, "", "u1")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2*applog.MaxLine {
		t.Fatalf("log of %d bytes: not larger than a read window", len(b))
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b[bytes.IndexByte(b, '\n')+1:], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if err := q.catchUpAll(false); err != nil {
		t.Fatal(err)
	}
	var leases = map[string]bool{}
	for {
		ls := claimAll(t, q) // each lease carries its own envelope
		if len(ls) == 0 {
			break
		}
		for id := range ls {
			leases[id] = true
		}
	}
	if len(leases) != n-1 || leases["r0000"] {
		t.Fatalf("%d envelopes claimable, want %d (all but r0000)", len(leases), n-1)
	}
}
