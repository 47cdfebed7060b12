package filestore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Append appends envelopes to their users' logs under the data directory
// dir without opening the store: it needs no bbolt and no running daemon.
// Every envelope is validated first; if one is invalid nothing is appended
// and the error is an *EnqueueError. Each log gets one write under its
// exclusive lock, then fsync, then the lock is released. A running store's
// tailer ingests the records within milliseconds; a stopped one does on
// its next Open. Duplicates are appended too (the store ignores them when
// it indexes); use Known to tell the caller beforehand.
//
// The data directory dir must exist: Append makes what is missing inside
// it, never dir itself (a mistyped path would start a store that no
// process reads).
//
// Envelopes for several logs are appended log by log: a failure part-way
// leaves the earlier logs' records in place (they are durable and will be
// delivered); the error says so.
func Append(dir string, envs ...*envelope.Envelope) error {
	return AppendWaiting(dir, nil, envs...)
}

// AppendWaiting is Append that tells waiting when an append has waited a
// second for another process's lock on its log (acquired false: that
// process holds it for longer than a write and an fsync), and again with
// the whole wait once it has the lock. A nil waiting is Append.
func AppendWaiting(dir string, waiting func(waited time.Duration, acquired bool), envs ...*envelope.Envelope) error {
	if fi, err := os.Stat(dir); isNotExist(err) {
		return fmt.Errorf("no data directory %s: nothing was appended (outbox serve makes it when it first starts; make it first to append before that)", dir)
	} else if err == nil && !fi.IsDir() {
		return fmt.Errorf("the data directory %s is not a directory: nothing was appended", dir)
	}
	byLog := map[string][]byte{}
	var order []string
	for i, in := range envs {
		e := in.Clone()
		if e.TenantID == "" {
			e.TenantID = envelope.DefaultTenant
		}
		line, err := envelope.ValidEncoding(e)
		if err != nil {
			return &queue.EnqueueError{Index: i, Tenant: e.TenantID, ID: e.ID, Err: err}
		}
		rel := applog.RelPath(e.TenantID, e.UserID)
		if _, ok := byLog[rel]; !ok {
			order = append(order, rel)
		}
		byLog[rel] = append(append(byLog[rel], line...), '\n')
	}
	for i, rel := range order {
		if _, err := applog.AppendIn(dir, rel, byLog[rel], applog.Fdatasync, waiting); err != nil {
			if i > 0 {
				return fmt.Errorf("append to log %d of %d: %w (the earlier logs' records were appended)", i+1, len(order), err)
			}
			return fmt.Errorf("append to log: %w", err)
		}
	}
	return nil
}

// ErrStoreBusy is returned by Known when a running process holds the store
// (and matched by every *StoreInUseError).
var ErrStoreBusy = errors.New("queue: store is open in another process")

// Known reports which (tenant, id) pairs the store in dir has indexed,
// reading the index without a daemon. It returns ErrStoreBusy when another
// process (outbox serve) has the store open, an empty result when the
// store does not exist yet, and a *CorruptIndexError (never a crash) when
// the index file is damaged.
func Known(dir string, keys []envelope.Key) (out map[envelope.Key]bool, err error) {
	out = map[envelope.Key]bool{}
	path := filepath.Join(dir, IndexFile)
	if fi, err := os.Stat(path); isNotExist(err) || (err == nil && fi.Size() == 0) {
		return out, nil
	}
	lk, err := lockDir(dir, false, 50*time.Millisecond)
	if err != nil {
		if errors.Is(err, ErrStoreBusy) {
			return nil, ErrStoreBusy
		}
		return nil, err
	}
	defer lk.release()
	if _, _, err := rollBack(dir); err != nil { // after a restart of the machine, as Open
		return nil, err
	}
	// A few lookups in a read-only file: a damaged page fails them (a
	// panic, or a fault on a wild page id) without a walk of the file.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, &CorruptIndexError{Path: path, Reason: fmt.Sprint(r)}
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 50 * time.Millisecond})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, ErrStoreBusy
		}
		if isNotExist(err) {
			return out, nil
		}
		return nil, err
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktEnv)
		if b == nil {
			return nil
		}
		for _, k := range keys {
			if b.Get(envKey(tenantOr(k.Tenant), k.EnvelopeID)) != nil {
				out[k] = true
			}
		}
		return nil
	})
	return out, err
}
