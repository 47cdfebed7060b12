package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Blocker is a session that holds a lock on the store's tables which
// others wait for, or a table lock that the store's statements would wait
// for (LOCK TABLE, or a schema change, left in an open transaction).
type Blocker struct {
	PID   int           `json:"pid"`
	User  string        `json:"user"`
	App   string        `json:"application_name"`
	State string        `json:"state"`            // pg_stat_activity's: active, idle in transaction …
	For   time.Duration `json:"-"`                // how long its transaction has been open
	Secs  float64       `json:"in_transaction_s"` // For in seconds
	Table string        `json:"table"`            // one of the store's tables it locks
}

func (b Blocker) String() string {
	return fmt.Sprintf("session pid %d (user %q, application_name %q, %s, in its transaction for %s) holds a lock on %s that the store's statements wait for: end its transaction, or end it with SELECT pg_terminate_backend(%d)",
		b.PID, b.User, b.App, b.State, b.For.Round(time.Second), b.Table, b.PID)
}

// Blockers returns the sessions other than the caller's, in a transaction
// open for at least olderThan, that hold a lock on a table of schema which
// another session waits for, or one of the table locks that conflict with
// the store's writes (SHARE and stronger; ACCESS EXCLUSIVE with its reads
// too). It reads only the
// server's lock and activity views, so it answers while those tables are
// locked. The query text of a session is never read (it may hold anyone's
// data).
func Blockers(ctx context.Context, pool *pgxpool.Pool, schema string, olderThan time.Duration) ([]Blocker, error) {
	schema, err := checkSchema(schema)
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `WITH held AS (
			SELECT l.pid, c.relname, l.mode, l.locktype FROM pg_locks l
			JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE l.granted AND n.nspname = $1 AND l.pid <> pg_backend_pid()
		), waited AS ( -- sessions that wait for a lock, and whom they wait for
			SELECT DISTINCT unnest(pg_blocking_pids(l.pid)) AS pid FROM pg_locks l WHERE NOT l.granted
		)
		SELECT DISTINCT ON (h.pid) h.pid, coalesce(a.usename, ''), coalesce(a.application_name, ''), coalesce(a.state, ''),
			coalesce(extract(epoch FROM now() - a.xact_start), 0), h.relname
		FROM held h JOIN pg_stat_activity a ON a.pid = h.pid
		WHERE (h.pid IN (SELECT pid FROM waited)
				-- a table's lock (a row's waiter holds its tuple's in AccessExclusiveLock)
				OR h.locktype = 'relation' AND h.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'))
			AND a.xact_start <= now() - $2 * interval '1 millisecond'
		ORDER BY h.pid, h.relname`, schema, olderThan.Milliseconds())
	if err != nil {
		return nil, safeErr("blockers", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Blocker, error) {
		var (
			b    Blocker
			secs float64
		)
		err := r.Scan(&b.PID, &b.User, &b.App, &b.State, &secs, &b.Table)
		b.For, b.Secs = time.Duration(secs*float64(time.Second)), secs
		b.Table = schema + "." + b.Table
		return b, err
	})
	return out, safeErr("blockers", err)
}
