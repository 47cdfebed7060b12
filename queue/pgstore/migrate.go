package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

var migrationName = regexp.MustCompile(`^([0-9]{3})_[a-z0-9_]+\.sql$`)

// migrations returns the embedded migrations in version order; their
// numbers run 1, 2, 3 … without a gap.
func migrations() ([]migration, error) {
	ents, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range ents {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("pgstore: migration file %q is not named NNN_name.sql", e.Name())
		}
		b, err := migrationFiles.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		v, _ := strconv.Atoi(m[1])
		out = append(out, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("pgstore: migration %s: want version %d", m.name, i+1)
		}
	}
	return out, nil
}

// SchemaVersion is the schema version this package's migrations reach.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].version
}

// DefaultSchema is the schema the store uses unless Options.Schema names another.
const DefaultSchema = "outbox"

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func checkSchema(s string) (string, error) {
	if s == "" {
		s = DefaultSchema
	}
	if !schemaName.MatchString(s) {
		return "", fmt.Errorf("pgstore: schema name %q: want lower-case letters, digits and _ (at most 63, not starting with a digit)", s)
	}
	return s, nil
}

// ErrSchemaNewer is returned when the database's schema was migrated by a
// newer version of outbox than this one.
var ErrSchemaNewer = errors.New("pgstore: the database schema is newer than this version of outbox")

// ErrNotMigrated is returned by Open with NoMigrate when the schema is
// missing or older than this version's (run outbox migrate).
var ErrNotMigrated = errors.New("pgstore: the database schema is not migrated to this version")

// migrateLockKey is the first key of the advisory lock that serialises
// migrations (the second is the schema's hash): "outb".
const migrateLockKey = 0x6f757462

// Migrate creates schema (default "outbox") and applies the embedded
// migrations it lacks, in one transaction under an advisory lock, so that
// several processes starting at once migrate once. It records each one in
// schema.migrations and returns the versions it applied. A schema already
// past this package's migrations is ErrSchemaNewer.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) ([]int, error) {
	schema, err := checkSchema(schema)
	if err != nil {
		return nil, err
	}
	ms, err := migrations()
	if err != nil {
		return nil, err
	}
	var applied []int
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := migrateLock(ctx, tx, pool, schema); err != nil {
			return err
		}
		q := pgx.Identifier{schema}.Sanitize()
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+q); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+q+`.migrations (
			version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		cur, err := currentVersion(ctx, tx, q)
		if err != nil {
			return err
		}
		if cur > len(ms) {
			return fmt.Errorf("%w (schema %s is at version %d, this version knows %d)", ErrSchemaNewer, schema, cur, len(ms))
		}
		if _, err := tx.Exec(ctx, `SET LOCAL search_path TO `+q); err != nil {
			return err
		}
		for _, m := range ms[cur:] {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("pgstore: migration %s: %w", m.name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.migrations (version, name) VALUES ($1, $2)`, m.version, strings.TrimSuffix(m.name, ".sql")); err != nil {
				return err
			}
			applied = append(applied, m.version)
		}
		return nil
	})
	if err != nil {
		return nil, safeErr("migrate", err)
	}
	return applied, nil
}

// MigrateLockError is a migration that could not start: another session
// held the schema's migration lock until the caller's context ended (an
// outbox migrating, perhaps itself waiting behind a lock on a table, or a
// session stuck in its migration's transaction).
type MigrateLockError struct {
	Schema string
	PID    int           // the holder's backend pid (0: not seen)
	App    string        // its application_name
	For    time.Duration // how long its transaction had been open
}

func (e *MigrateLockError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("pgstore: migrate: another session held the migration lock of schema %s until the wait ended", e.Schema)
	}
	return fmt.Sprintf("pgstore: migrate: another session holds the migration lock of schema %s (pid %d, application_name %q, in its transaction for %s): an outbox still migrating (perhaps waiting behind a lock on one of the tables), or a stuck session; wait for it, or end it with SELECT pg_terminate_backend(%d)",
		e.Schema, e.PID, e.App, e.For.Round(time.Second), e.PID)
}

// migrateLock takes the schema's migration lock in tx, waiting as long as
// ctx lets it; when it cannot, the error names the session holding it.
func migrateLock(ctx context.Context, tx pgx.Tx, pool *pgxpool.Pool, schema string) error {
	for {
		var got bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, hashtext($2))`, migrateLockKey, schema).Scan(&got); err != nil {
			return err
		}
		if got {
			return nil
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			// The caller's context has ended: ask on one of its own.
			look, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			e := &MigrateLockError{Schema: schema}
			var secs float64
			_ = pool.QueryRow(look, `SELECT l.pid, coalesce(a.application_name, ''), coalesce(extract(epoch FROM now() - a.xact_start), 0)
				FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::bigint::oid AND l.objid = (hashtext($2)::bigint & 4294967295)::oid
				LIMIT 1`, migrateLockKey, schema).Scan(&e.PID, &e.App, &secs)
			e.For = time.Duration(secs * float64(time.Second))
			return e
		case <-t.C:
		}
	}
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func currentVersion(ctx context.Context, q querier, schema string) (int, error) {
	var v int
	err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+schema+`.migrations`).Scan(&v)
	return v, err
}

// DatabaseVersion returns the version schema is migrated to: 0 when it has
// no migrations table (never migrated).
func DatabaseVersion(ctx context.Context, pool *pgxpool.Pool, schema string) (int, error) {
	schema, err := checkSchema(schema)
	if err != nil {
		return 0, err
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, "migrations"}.Sanitize()).Scan(&exists); err != nil {
		return 0, safeErr("check schema", err)
	}
	if !exists {
		return 0, nil
	}
	v, err := currentVersion(ctx, pool, pgx.Identifier{schema}.Sanitize())
	return v, safeErr("check schema", err)
}

// checkVersion reports whether schema is at this package's version (for
// Open with NoMigrate).
func checkVersion(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, schema+".migrations").Scan(&exists); err != nil {
		return safeErr("check schema", err)
	}
	if !exists {
		return fmt.Errorf("%w: schema %s has no migrations table", ErrNotMigrated, schema)
	}
	v, err := currentVersion(ctx, pool, pgx.Identifier{schema}.Sanitize())
	if err != nil {
		return safeErr("check schema", err)
	}
	switch want := SchemaVersion(); {
	case v > want:
		return fmt.Errorf("%w (schema %s is at version %d, this version knows %d)", ErrSchemaNewer, schema, v, want)
	case v < want:
		return fmt.Errorf("%w: schema %s is at version %d, want %d", ErrNotMigrated, schema, v, want)
	}
	return nil
}
