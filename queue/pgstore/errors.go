package pgstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxhq/outbox/queue"
)

// A DSN may hold a password, and pgx's connect and parse errors repeat
// parts of it (user, database, host, the string itself): safeErr keeps
// those out of every error the store returns, and so out of every log line.

// The errors whose text says why the store cannot serve, safe to log.
var _ = []queue.Loggable{(*ConnectError)(nil), (*NetError)(nil), (*TimeoutError)(nil),
	(*MissingSchemaError)(nil), (*StateError)(nil), (*RestoredError)(nil)}

// ErrBadURL is returned by Open for a database URL that does not parse
// (the URL is not repeated: it may hold a password).
var ErrBadURL = errors.New("pgstore: the database URL does not parse (it is not repeated here: it may hold a password)")

// badURL is ErrBadURL with what pgx says is wrong, cut to the words before
// any value ("cannot parse pool_max_conns", "pool_max_conns too small"):
// the URL itself and the values in it are never repeated.
func badURL(pce *pgconn.ParseConfigError) error {
	s := pce.Error()
	if i := strings.LastIndex(s, "`: "); i >= 0 {
		s = s[i+3:]
	} else {
		return ErrBadURL
	}
	s, _, _ = strings.Cut(s, ": ")
	if i := strings.Index(s, " ("); i >= 0 && strings.Count(s, "(") != strings.Count(s, ")") {
		s = s[:i] // "cannot parse pool_max_conns (strconv.ParseInt" …
	}
	if s == "" || strings.ContainsAny(s, "`'\"=/@") {
		return ErrBadURL
	}
	return fmt.Errorf("%w: %s", ErrBadURL, s)
}

// ConnectError is a failed connection attempt, without the DSN: only the
// server's answer (an SQLSTATE and its message) or the kind of network
// failure.
type ConnectError struct {
	Op    string
	Cause error // *pgconn.PgError, a context error, or a network error without its address
}

func (e *ConnectError) Error() string {
	return "pgstore: " + e.Op + ": cannot connect to the database: " + e.Cause.Error()
}

func (e *ConnectError) Unwrap() error { return e.Cause }

// Loggable marks its text safe to log (queue.Loggable).
func (e *ConnectError) Loggable() {}

// Is makes a ConnectError queue.ErrUnavailable.
func (e *ConnectError) Is(target error) bool { return target == queue.ErrUnavailable }

// NetError is an operation whose connection failed (reset, closed, timed
// out), without the address pgx's error names.
type NetError struct {
	Op    string
	Cause error // the system call's error, e.g. "read: connection reset by peer"
}

func (e *NetError) Error() string {
	return "pgstore: " + e.Op + ": the connection to the database failed: " + e.Cause.Error()
}

func (e *NetError) Unwrap() error { return e.Cause }

// Loggable marks its text safe to log (queue.Loggable).
func (e *NetError) Loggable() {}

// Is makes a NetError queue.ErrUnavailable.
func (e *NetError) Is(target error) bool { return target == queue.ErrUnavailable }

// lostConnection reports a server's error that ends the connection: a
// connection exception (SQLSTATE class 08) or an operator intervention
// (57P01-57P05: the server shutting down, crashed, or not yet accepting).
func lostConnection(pe *pgconn.PgError) bool {
	return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P")
}

// TimeoutError is a statement the server cancelled at statement_timeout
// (SQLSTATE 57014): the database did not answer in time; try again later.
type TimeoutError struct {
	Op string
}

func (e *TimeoutError) Error() string {
	return "pgstore: " + e.Op + ": the database did not answer within statement_timeout (a busy server, or a session holding a lock on the store's tables: outbox doctor names such a session)"
}

// Loggable marks its text safe to log (queue.Loggable).
func (e *TimeoutError) Loggable() {}

// Is makes a TimeoutError queue.ErrUnavailable.
func (e *TimeoutError) Is(target error) bool { return target == queue.ErrUnavailable }

// MissingSchemaError is a statement on a table that is not there
// (SQLSTATE 42P01, or 3F000 for the schema): the store's schema was dropped
// under it, or the URL names another database. The store cannot serve
// calls until the schema is migrated again.
type MissingSchemaError struct {
	Op string
}

func (e *MissingSchemaError) Error() string {
	return "pgstore: " + e.Op + ": the store's tables are not in the database (its schema was dropped, or the URL names another database): migrate it again (outbox migrate, or pgstore.Migrate)"
}

// Loggable marks its text safe to log (queue.Loggable).
func (e *MissingSchemaError) Loggable() {}

// Is makes a MissingSchemaError queue.ErrUnavailable.
func (e *MissingSchemaError) Is(target error) bool { return target == queue.ErrUnavailable }

// StateError is a statement the server refused for the state of the
// database, not for the call: it accepts no writes (SQLSTATE 25006: a
// standby, or default_transaction_read_only), its disk is full (53100), it
// is short of memory or connections (class 53), the store's role lacks a
// privilege (42501), or a transaction conflicted with another (40001,
// 40P01) or waited too long for a lock (55P03). It matches
// queue.ErrUnavailable and, where one applies, queue.ErrStorageReadOnly,
// queue.ErrStorageFull or queue.ErrStorageDenied; what is stored is as
// it was (the statement's transaction rolled back whole).
type StateError struct {
	Op    string
	State string // the SQLSTATE
	kind  error  // one of the queue.ErrStorage… sentinels, or nil
	why   string
}

func (e *StateError) Error() string {
	return "pgstore: " + e.Op + ": " + e.why + " (SQLSTATE " + e.State + ")"
}

// Loggable marks its text safe to log (queue.Loggable).
func (e *StateError) Loggable() {}

// Is makes a StateError queue.ErrUnavailable, and its kind.
func (e *StateError) Is(target error) bool {
	return target == queue.ErrUnavailable || (e.kind != nil && target == e.kind)
}

// stateError returns the StateError of a server's error, or nil.
func stateError(op string, pe *pgconn.PgError) *StateError {
	e := &StateError{Op: op, State: pe.Code}
	switch {
	case pe.Code == "25006":
		e.kind, e.why = queue.ErrStorageReadOnly, "the database accepts no writes (it is a standby, or default_transaction_read_only is on): point the URL at the primary"
	case pe.Code == "53100":
		e.kind, e.why = queue.ErrStorageFull, "the database server's disk is full: free space on it"
	case strings.HasPrefix(pe.Code, "53"):
		e.why = "the database server is short of memory or connections"
	case pe.Code == "42501":
		e.kind, e.why = queue.ErrStorageDenied, "the database role has no privilege on the store's schema or tables: grant it (docs/postgresql.md)"
	case pe.Code == "40001", pe.Code == "40P01", pe.Code == "55P03":
		e.why = "the transaction conflicted with another one; retry"
	default:
		return nil
	}
	return e
}

// ours reports errors of the contract (or this package) that go back as they are.
func ours(err error) bool {
	var ee *queue.EnqueueError
	if errors.As(err, &ee) {
		return true
	}
	for _, s := range []error{
		queue.ErrClosed, queue.ErrStaleFence, queue.ErrLeaseLost, queue.ErrInvalidTransition,
		queue.ErrNotFound, queue.ErrNoUser, queue.ErrCrossTenant, queue.ErrConsentDenied,
		queue.ErrBadCursor, ErrSchemaNewer, ErrNotMigrated, ErrBadURL,
	} {
		if errors.Is(err, s) {
			return true
		}
	}
	var ce *ConnectError
	var ne *NetError
	var te *TimeoutError
	var me *MissingSchemaError
	var se *StateError
	var le *MigrateLockError
	var re *RestoredError
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.As(err, &te) || errors.As(err, &me) || errors.As(err, &se) || errors.As(err, &le) || errors.As(err, &re)
}

// safeErr names the operation and drops whatever of the DSN an error of
// pgx carries.
func safeErr(op string, err error) error {
	if err == nil || ours(err) {
		return err
	}
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		return badURL(pce)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return &ConnectError{Op: op, Cause: connectCause(ce)}
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return &NetError{Op: op, Cause: oe.Err}
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && lostConnection(pe) {
		return &NetError{Op: op, Cause: pe}
	}
	if errors.As(err, &pe) && pe.Code == "57014" {
		return &TimeoutError{Op: op}
	}
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") {
		return &MissingSchemaError{Op: op}
	}
	if errors.As(err, &pe) {
		if se := stateError(op, pe); se != nil {
			return se
		}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return &NetError{Op: op, Cause: errors.New("the server closed the connection")}
	}
	return fmt.Errorf("pgstore: %s: %w", op, err)
}

func connectCause(ce *pgconn.ConnectError) error {
	var pe *pgconn.PgError
	if errors.As(ce, &pe) {
		return pe
	}
	for _, c := range []error{context.Canceled, context.DeadlineExceeded} {
		if errors.Is(ce, c) {
			return c
		}
	}
	if strings.Contains(ce.Error(), "server refused TLS connection") {
		return errors.New("the server does not accept TLS, and the URL asks for it (sslmode=require or stronger)")
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(ce, &certErr) {
		return errors.New("the server's TLS certificate did not verify (see sslmode and sslrootcert in the URL)")
	}
	var dnsErr *net.DNSError
	if errors.As(ce, &dnsErr) {
		return errors.New("the host name does not resolve")
	}
	var oe *net.OpError
	if errors.As(ce, &oe) && oe.Err != nil {
		return oe.Err // e.g. "connect: connection refused", without the address
	}
	if pgconn.Timeout(ce) {
		return context.DeadlineExceeded
	}
	return errors.New("the server did not accept the connection")
}
