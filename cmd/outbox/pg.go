package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
)

// The PostgreSQL store in the binary: where the DSN comes from, how the
// commands open the store, outbox migrate.

// EnvDatabaseURL names the DSN's environment variable (and, with _FILE, a
// file that holds it).
const EnvDatabaseURL = "OUTBOX_DATABASE_URL"

// dbFlags are the settings of a command that can run on PostgreSQL.
type dbFlags struct {
	url, schema *string
}

// addDBFlags adds --database-url and --database-schema. The URL flag's
// default is never the environment's value: -help prints defaults, and
// the DSN holds a password.
func addDBFlags(s *settings) *dbFlags {
	return &dbFlags{
		url: s.fs.String("database-url", "", "PostgreSQL URL: use the store in that database instead of the files in --data "+
			"(env "+EnvDatabaseURL+" or "+EnvDatabaseURL+"_FILE; the environment is safer: a flag shows in ps)"),
		schema: s.str("database-schema", "OUTBOX_DATABASE_SCHEMA", pgstore.DefaultSchema, "schema of the store's tables (PostgreSQL)"),
	}
}

// dsn returns the DSN: the flag, else OUTBOX_DATABASE_URL or the file
// OUTBOX_DATABASE_URL_FILE names (both set is an error); "" means the
// file store.
func (f *dbFlags) dsn(e *env) (string, error) {
	if v := strings.TrimSpace(*f.url); v != "" {
		return v, nil
	}
	return secret(e, EnvDatabaseURL)
}

// openTimeout bounds connecting and migrating at start: a server that
// does not answer fails the command instead of hanging it.
const openTimeout = 30 * time.Second

func statOK(path string) bool { _, err := os.Stat(path); return err == nil }

// pgMark is the mark file of a PostgreSQL store's schema in a serve's data
// directory (pgstore.Options.MarkFile): the database restored from a
// backup under it is refused.
func pgMark(data, schema string) string { return filepath.Join(data, "pg-"+schema+".mark") }

// pgMarked returns a schema whose serve marked data directory dir, and
// the path of its mark ("" when none did).
func pgMarked(dir string) (schema, mark string) {
	marks, _ := filepath.Glob(pgMark(dir, "*"))
	if len(marks) == 0 {
		return "", ""
	}
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(marks[0]), "pg-"), ".mark"), marks[0]
}

// dataIsDir refuses a data directory that is a file (a mistyped --data).
func dataIsDir(dir string) error {
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return fmt.Errorf("the data directory %s is a file, not a directory: point --data (or OUTBOX_DATA) at a directory", dir)
	}
	return nil
}

// fileStoreDir refuses to use dir as a file store when it is a file, or
// when a serve on PostgreSQL marked it as its data directory and no file
// store was ever opened there. Leaving out the database URL (an environment file not loaded, a
// typo) would otherwise start an empty file store beside the queue in
// PostgreSQL, acknowledging envelopes that no serve on PostgreSQL
// delivers.
func fileStoreDir(dir string) error {
	if err := dataIsDir(dir); err != nil {
		return err
	}
	schema, mark := pgMarked(dir)
	if mark == "" || !neverOpened(dir) {
		return nil
	}
	return fmt.Errorf("%s is the data directory of a serve on PostgreSQL (schema %s), not a file store: pass --database-url, or set %s or %s_FILE; "+
		"without it an empty file store would start there, and what it accepted no serve on PostgreSQL would deliver "+
		"(to make a file store there after all, remove %s)", dir, schema, EnvDatabaseURL, EnvDatabaseURL, mark)
}

// sameSchema refuses a serve on schema when its data directory is marked
// by a serve on another schema only: a schema setting left out on a
// restart would migrate a new, empty queue beside the one in use, and
// what it accepted a serve on the usual schema would never deliver.
func sameSchema(dir, schema string) error {
	if statOK(pgMark(dir, schema)) {
		return nil
	}
	other, mark := pgMarked(dir)
	if mark == "" {
		return nil
	}
	return fmt.Errorf("%s is the data directory of a serve on PostgreSQL schema %s, and this serve is set for schema %s: set --database-schema (or OUTBOX_DATABASE_SCHEMA) to %s; "+
		"otherwise a new, empty queue would start in schema %s, and what it accepted a serve on schema %s would never deliver "+
		"(a serve on schema %s as well needs a data directory of its own)", dir, other, schema, other, schema, other, schema)
}

// openPG opens the PostgreSQL store (pgstore's errors never repeat the DSN);
// mark is its mark file ("" for none).
func openPG(ctx context.Context, dsn, schema string, noMigrate bool, mark string, o queue.Options) (*pgstore.Store, error) {
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	s, err := pgstore.Open(ctx, dsn, &pgstore.Options{Options: o, Schema: schema, NoMigrate: noMigrate, MarkFile: mark})
	if errors.Is(err, pgstore.ErrNotMigrated) {
		return nil, fmt.Errorf("%w: run outbox migrate (with the same --database-url and --database-schema), or start serve without --no-migrate", err)
	}
	return s, err
}

// fileOnly is the refusal of a command (or flag) that works on the files
// of the file store only.
func fileOnly(e *env, what string) int {
	return fail(e, "%s works on the file store only (--data); with --database-url the store is in PostgreSQL, where it does not apply", what)
}

func init() {
	register(&command{Name: "migrate", Short: "create or upgrade the PostgreSQL schema (--database-url) and print its version", Run: runMigrate})
}

func runMigrate(ctx context.Context, e *env, args []string) int {
	s := newSettings("migrate", e)
	s.usage("Usage: outbox migrate --database-url URL [--database-schema S]\n\nApplies the migrations the schema lacks (in one transaction, under a lock:\nseveral processes starting at once migrate once) and prints the version.\noutbox serve migrates on start unless --no-migrate.\n\nFlags:\n")
	db := addDBFlags(s)
	if code, done := s.parse(args); done {
		return code
	}
	dsn, err := db.dsn(e)
	if err != nil {
		return fail(e, "%v", err)
	}
	if dsn == "" {
		return fail(e, "migrate needs a PostgreSQL store: pass --database-url or set %s (the file store needs no migrations)", EnvDatabaseURL)
	}
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	pool, err := pgstore.Connect(ctx, dsn)
	if err != nil {
		return fail(e, "%v", err)
	}
	defer pool.Close()
	applied, err := pgstore.Migrate(ctx, pool, *db.schema)
	if err != nil {
		return fail(e, "%v", err)
	}
	v, err := pgstore.DatabaseVersion(ctx, pool, *db.schema)
	if err != nil {
		return fail(e, "%v", err)
	}
	if len(applied) == 0 {
		fmt.Fprintf(e.Stdout, "schema %s is at version %d: up to date\n", *db.schema, v)
	} else {
		fmt.Fprintf(e.Stdout, "schema %s migrated to version %d (applied %s)\n", *db.schema, v, joinInts(applied))
	}
	return exitOK
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}

// pgReport is doctor's report on PostgreSQL.
type pgReport struct {
	Server        string            `json:"server_version"`
	Schema        string            `json:"schema"`
	Version       int               `json:"schema_version"`
	Want          int               `json:"want_version"`
	Pending       int               `json:"pending_migrations"`
	Unresolved    int               `json:"unresolved"`
	DeadLetter    int               `json:"dead_letter"`
	ExpiredLeases int               `json:"sending_past_lease_end"`
	Problems      []string          `json:"problems,omitempty"`
	Blockers      []pgstore.Blocker `json:"blockers,omitempty"`
	NotApplicable []string          `json:"not_applicable"`
}

// blockerAge is how long a session's transaction must have been open for
// doctor to name it as holding up the store (shorter waits are the usual
// ones between serves).
var blockerAge = 5 * time.Second // a var for tests

// pgDoctor checks what applies on PostgreSQL: the connection, the schema's
// version against this outbox's, and the rows an operator (unresolved,
// dead_letter) or a running worker's reconciliation (leases past their
// end) has to take. It migrates nothing.
func pgDoctor(ctx context.Context, e *env, dsn, schema, data string, afterRestore, js bool) int {
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	pool, err := pgstore.Connect(ctx, dsn)
	if err != nil {
		return fail(e, "%v", err)
	}
	defer pool.Close()
	rep := &pgReport{Schema: schema, Want: pgstore.SchemaVersion(),
		NotApplicable: []string{"index", "logs", "quarantine", "consent journal", "rebuild"}}
	if err := pool.QueryRow(ctx, `SHOW server_version`).Scan(&rep.Server); err != nil {
		return fail(e, "the database did not answer SHOW server_version") // pgx's error may name the DSN's parts
	}
	// First, from the server's lock views (they answer while the tables
	// are locked): a session the store waits for. The checks below would
	// wait behind it, so they are skipped then.
	if rep.Blockers, err = pgstore.Blockers(ctx, pool, schema, blockerAge); err != nil {
		return fail(e, "%v", err)
	}
	for _, b := range rep.Blockers {
		rep.Problems = append(rep.Problems, b.String())
	}
	if rep.Version, err = pgstore.DatabaseVersion(ctx, pool, schema); err != nil {
		return fail(e, "%v", err)
	}
	switch {
	case len(rep.Blockers) > 0:
		rep.Problems = append(rep.Problems, "the store's rows were not counted: the queries would wait behind the lock")
	case rep.Version > rep.Want:
		rep.Problems = append(rep.Problems, fmt.Sprintf("schema %s is at version %d, newer than this outbox's %d: run a newer outbox", schema, rep.Version, rep.Want))
	case rep.Version < rep.Want:
		rep.Pending = rep.Want - rep.Version
		rep.Problems = append(rep.Problems, fmt.Sprintf("schema %s is at version %d: %d migration(s) pending (outbox migrate, or start serve without --no-migrate)", schema, rep.Version, rep.Pending))
	default:
		// This host's mark of what serve drew from the database, if serve
		// ran here: a database behind it was restored from a backup.
		mark := pgMark(data, schema)
		if !statOK(mark) || afterRestore {
			mark = ""
		}
		o := &pgstore.Options{Schema: schema, NoMigrate: true, MarkFile: mark, Options: queue.Options{Logger: newLogger(e, "text")}}
		st, err := pgstore.OpenPool(ctx, pool, o)
		var re *pgstore.RestoredError
		if errors.As(err, &re) {
			rep.Problems = append(rep.Problems, err.Error())
			o.MarkFile = ""
			st, err = pgstore.OpenPool(ctx, pool, o)
		}
		if err != nil {
			return fail(e, "%v", err)
		}
		defer st.Close()
		if afterRestore {
			n, err := st.AfterRestore(ctx)
			if err != nil {
				return fail(e, "after restore: %d envelopes settled, then: %v (run it again)", n, err)
			}
			fmt.Fprintln(e.Stdout, afterRestoreLine(n))
			// Every host's mark names the old instance now: this one's is
			// written afresh.
			if m := pgMark(data, schema); statOK(m) {
				o.MarkFile = m
				if s2, err := pgstore.OpenPool(ctx, pool, o); err == nil {
					s2.Close()
				}
			}
		}
		// What serve's readiness asks too: a standby answers every read
		// above and refuses every write.
		if err := st.Ping(ctx); err != nil {
			rep.Problems = append(rep.Problems, err.Error())
		}
		c, err := st.Counts(ctx, "")
		if err != nil {
			return fail(e, "%v", err)
		}
		rep.Unresolved, rep.DeadLetter = c.Total(envelope.StateUnresolved), c.Total(envelope.StateDeadLetter)
		if rep.ExpiredLeases, err = st.ExpiredLeases(ctx); err != nil {
			return fail(e, "%v", err)
		}
	}
	if js {
		printJSON(e, rep)
	} else {
		fmt.Fprintf(e.Stdout, "database: connected (PostgreSQL %s)\n", rep.Server)
		fmt.Fprintf(e.Stdout, "schema %s: version %d (this outbox: %d), migrations pending %d\n", schema, rep.Version, rep.Want, rep.Pending)
		if len(rep.Problems) == 0 {
			fmt.Fprintf(e.Stdout, "rows: unresolved %d (outbox ls --state unresolved), dead_letter %d, sending past their lease end %d (a running serve reconciles them)\n",
				rep.Unresolved, rep.DeadLetter, rep.ExpiredLeases)
		}
		fmt.Fprintf(e.Stdout, "file store checks (%s): do not apply on PostgreSQL\n", strings.Join(rep.NotApplicable, ", "))
		for _, p := range rep.Problems {
			fmt.Fprintln(e.Stdout, "problem:", p)
		}
	}
	if len(rep.Problems) > 0 {
		fmt.Fprintln(e.Stderr, "Error: the PostgreSQL store has problems (see above)")
		return exitFailure
	}
	if !js {
		fmt.Fprintln(e.Stdout, "ok")
	}
	return exitOK
}
