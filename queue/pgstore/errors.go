package pgstore

import (
	"context"
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

// ErrBadURL is returned by Open for a database URL that does not parse
// (the URL is not repeated: it may hold a password).
var ErrBadURL = errors.New("pgstore: the database URL does not parse (it is not repeated here: it may hold a password)")

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
	return "pgstore: " + e.Op + ": the database did not answer within statement_timeout"
}

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

// Is makes a MissingSchemaError queue.ErrUnavailable.
func (e *MissingSchemaError) Is(target error) bool { return target == queue.ErrUnavailable }

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
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.As(err, &te) || errors.As(err, &me)
}

// safeErr names the operation and drops whatever of the DSN an error of
// pgx carries.
func safeErr(op string, err error) error {
	if err == nil || ours(err) {
		return err
	}
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		return ErrBadURL
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
