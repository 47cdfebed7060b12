package pgstore

import (
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// SetEnqueueHooks sets the enqueue group's test hooks: wait is called when
// a call starts waiting for the next group, group with the calls of each
// group that runs. Set them before the store is used.
func SetEnqueueHooks(s *Store, wait func(), group func(calls int)) {
	s.enq.onWait, s.enq.onGroup = wait, group
}

// SetCommitHooks is SetEnqueueHooks for the commit group.
func SetCommitHooks(s *Store, wait func(), group func(calls int)) {
	s.commits.onWait, s.commits.onGroup = wait, group
}

// SafeErr is safeErr of a server's error with the given SQLSTATE.
func SafeErr(op, state string) error {
	return safeErr(op, &pgconn.PgError{Code: state, Message: "the server's message"})
}

// MigrateLockKey is the first key of the migration lock.
const MigrateLockKey = migrateLockKey

// WithHostClock sets the host clock a store opened with o measures the
// database's against.
func WithHostClock(o *Options, now func() time.Time) { o.hostNow = now }

// WithListenHook sets the listener's test hook of a store opened with o:
// called for each notification, with whether it signalled Notify.
func WithListenHook(o *Options, f func(signalled bool)) { o.onListen = f }
