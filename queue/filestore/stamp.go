package filestore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
)

// StampFile, in the data directory, records that an index was created
// there: Open writes it once the index holds the logs' records, Rebuild
// before it starts. It is what tells a data directory whose index was
// lost (the stamp is there, index.db is missing, empty or without its
// layout) from a new one (no stamp: records in its logs were appended
// before the first Open and are new work). It holds the index layout
// version; its content is informative only.
const StampFile = "store.version"

// IndexLostError is returned by Open when the data directory had an index
// (StampFile) and its logs hold records, but index.db is missing, empty or
// without its layout: indexing those records as new would deliver every
// one of them again. Rebuild (outbox doctor --rebuild) indexes them with
// every row unresolved, for an operator to requeue or resolve.
type IndexLostError struct {
	Dir   string
	State string // "missing or empty", "without its layout"
}

func (e *IndexLostError) Error() string {
	return fmt.Sprintf("store %s: the index %s is %s but the logs hold records: the index was lost, and opening would deliver every envelope again; run \"outbox doctor --rebuild --data %s\" to rebuild it from the logs (rows of unknown fate become unresolved, never redelivered automatically)",
		e.Dir, filepath.Join(e.Dir, IndexFile), e.State, e.Dir)
}

func stampPath(dir string) string { return filepath.Join(dir, StampFile) }

func hasStamp(dir string) bool {
	_, err := os.Lstat(stampPath(dir))
	return err == nil
}

// writeStamp creates StampFile durably (the file and its directory entry)
// if it is not there.
func writeStamp(dir string) error {
	if hasStamp(dir) {
		return nil
	}
	path := stampPath(dir)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", StampFile, err)
	}
	_, err = f.WriteString("outbox index layout " + strconv.Itoa(layoutVersion) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", StampFile, err)
	}
	return nil
}

// checkNotLost fails with *IndexLostError when dir had an index and its
// logs hold records; state says what is wrong with index.db.
func checkNotLost(dir, state string) error {
	if !hasStamp(dir) {
		return nil
	}
	recs, err := logsHoldRecords(dir)
	if err != nil {
		return fmt.Errorf("open store: look at the logs: %w", err)
	}
	if recs {
		return &IndexLostError{Dir: dir, State: state}
	}
	return nil
}

// logsHoldRecords reports whether any log under dir holds anything but
// blanks (an older build's padding): a record, a torn line, a line to
// quarantine all count.
func logsHoldRecords(dir string) (bool, error) {
	logs, err := filepath.Glob(filepath.Join(dir, applog.Dir, "*", "*"+applog.Ext))
	if err != nil {
		return false, err
	}
	buf := make([]byte, 64<<10)
	for _, path := range logs {
		found, err := holdsNonBlank(path, buf)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return false, err
		}
		if found {
			return true, nil
		}
	}
	return false, nil
}

func holdsNonBlank(path string, buf []byte) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for {
		n, err := f.Read(buf)
		if len(bytes.Trim(buf[:n], " \t\r\n")) > 0 {
			return true, nil
		}
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
}
