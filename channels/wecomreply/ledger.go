package wecomreply

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Ledger remembers the response_urls already used, so that none is used
// twice: Spend records one (durably, before the call) and reports whether
// it was recorded before. Only a digest of the URL is kept.
type Ledger interface {
	Spend(responseURL string, at time.Time) (already bool, err error)
}

// keep is how long a spent URL is remembered: past it, the URL is dead
// anyway (valid one hour).
const keep = 2 * time.Hour

func digest(u string) string {
	h := sha256.Sum256([]byte(u))
	return hex.EncodeToString(h[:])
}

// MemoryLedger is a Ledger in memory (for tests and embedders that keep
// the rule some other way): it forgets on restart.
type MemoryLedger struct {
	mu    sync.Mutex
	spent map[string]time.Time
}

// NewMemoryLedger returns an empty MemoryLedger.
func NewMemoryLedger() *MemoryLedger { return &MemoryLedger{spent: map[string]time.Time{}} }

// Spend implements Ledger.
func (l *MemoryLedger) Spend(u string, at time.Time) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := digest(u)
	if _, ok := l.spent[d]; ok {
		return true, nil
	}
	l.spent[d] = at
	return false, nil
}

// FileLedger is a Ledger in an append-only file of "digest unix-seconds"
// lines, fsynced on every Spend: a URL spent before a crash stays spent.
// It is safe for concurrent use by one process (the data directory's lock
// keeps it to one).
type FileLedger struct {
	path string

	mu    sync.Mutex
	f     *os.File
	spent map[string]time.Time
	lines int
}

// OpenLedger opens (or creates, 0600) the ledger at path, forgetting
// entries older than two hours. A symbolic link is refused.
func OpenLedger(path string, now time.Time) (*FileLedger, error) {
	l := &FileLedger{path: path, spent: map[string]time.Time{}}
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("wecomreply: ledger %s is not a regular file", filepath.Base(path))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("wecomreply: ledger: %w", err)
	}
	if f, err := os.Open(path); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			d, secs, ok := strings.Cut(sc.Text(), " ")
			n, err := strconv.ParseInt(secs, 10, 64)
			if !ok || err != nil || len(d) != 64 {
				continue // a torn last line
			}
			if at := time.Unix(n, 0); now.Sub(at) < keep {
				l.spent[d] = at
			}
		}
		err := sc.Err()
		_ = f.Close()
		if err != nil {
			return nil, fmt.Errorf("wecomreply: read ledger: %w", err)
		}
	}
	if err := l.rewrite(); err != nil {
		return nil, err
	}
	return l, nil
}

// rewrite writes the live entries to a new file and renames it over the
// ledger, then reopens it for appending. Called with mu held (or before
// the ledger is shared).
func (l *FileLedger) rewrite() error {
	tmp := l.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("wecomreply: write ledger: %w", err)
	}
	w := bufio.NewWriter(f)
	for d, at := range l.spent {
		fmt.Fprintf(w, "%s %d\n", d, at.Unix())
	}
	err = w.Flush()
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, l.path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("wecomreply: write ledger: %w", err)
	}
	if d, err := os.Open(filepath.Dir(l.path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	if l.f != nil {
		_ = l.f.Close()
	}
	l.f, err = os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("wecomreply: open ledger: %w", err)
	}
	l.lines = len(l.spent)
	return nil
}

// Spend implements Ledger: the digest is appended and fsynced before it
// returns false.
func (l *FileLedger) Spend(u string, at time.Time) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := digest(u)
	if _, ok := l.spent[d]; ok {
		return true, nil
	}
	if l.f == nil {
		return false, errors.New("wecomreply: ledger closed")
	}
	if _, err := fmt.Fprintf(l.f, "%s %d\n", d, at.Unix()); err != nil {
		return false, fmt.Errorf("wecomreply: append to ledger: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		return false, fmt.Errorf("wecomreply: sync ledger: %w", err)
	}
	l.spent[d] = at
	l.lines++
	if l.lines > 10000 && l.lines > 2*len(l.spent) {
		for k, t := range l.spent {
			if at.Sub(t) >= keep {
				delete(l.spent, k)
			}
		}
		// Compaction only: the digest is synced already; a failure here
		// leaves the longer file (or a closed ledger, refused by the next
		// Spend, never a second use).
		_ = l.rewrite()
	} else if len(l.spent) > 10000 && l.lines%1000 == 0 {
		for k, t := range l.spent {
			if at.Sub(t) >= keep {
				delete(l.spent, k)
			}
		}
	}
	return false, nil
}

// Close closes the file.
func (l *FileLedger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
