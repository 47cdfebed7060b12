// Package pgtest gives tests a real PostgreSQL server: the one
// OUTBOX_TEST_DATABASE_URL names, or else a throwaway server it starts from
// the machine's binaries (initdb in a temporary directory, a unix socket
// there, no TCP port; as root, run as the postgres user), stopped when the
// tests end. One server per test binary (Main in TestMain), one fresh
// schema per store (Schema).
//
// Without the binaries the tests fail (they never skip): .ci/run installs
// the postgresql package when initdb is missing.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvURL names a server to use instead of a throwaway one.
const EnvURL = "OUTBOX_TEST_DATABASE_URL"

// PasswordUser is a role of the throwaway server that logs in over the
// socket with a password only (Password), for tests of failed logins.
const (
	PasswordUser = "outbox_pw"
	Password     = "pw-canary-3f9a1c"
)

var (
	dsn     string
	admin   *pgxpool.Pool
	private bool // the server is ours
	counter atomic.Int64
	restart func() error // the throwaway server's
	halt    func() error // its crash-stop, for Stop
	resume  func() error // its start, for Start
)

// Main starts (or finds) the server, runs the tests, stops the server and
// returns m.Run's code (1 when the server cannot be had). after, if not
// nil, runs once the tests are done and the server's pool is closed (a
// leak check): a non-nil error fails the run.
func Main(m *testing.M, after func() error) int {
	stop, err := start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		return 1
	}
	code := m.Run()
	stop()
	if after != nil && code == 0 {
		if err := after(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	return code
}

// DSN returns the server's connection string (a superuser's).
func DSN() string { return dsn }

// Private reports whether the server is the throwaway one (PasswordUser exists).
func Private() bool { return private }

// Admin returns a pool on the server for the tests' own queries.
func Admin() *pgxpool.Pool { return admin }

// Restart cuts every connection to the server: the throwaway server is
// stopped at once (as in a crash: no shutdown checkpoint) and started
// again; on a server named by OUTBOX_TEST_DATABASE_URL, every other
// backend is terminated instead. The admin pool drops its connections, which
// the restart cut, and opens new ones.
func Restart() error {
	if restart != nil {
		defer admin.Reset()
		return restart()
	}
	_, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND datname = current_database()`)
	return err
}

// Stop stops the throwaway server at once (as in a crash) and leaves it
// down until Start: for tests of a server that is gone, not just
// restarted. A server named by OUTBOX_TEST_DATABASE_URL cannot be
// stopped (an error).
func Stop() error {
	if halt == nil {
		return errors.New("pgtest: the server named by " + EnvURL + " cannot be stopped")
	}
	return halt()
}

// Start starts the throwaway server again after Stop.
func Start() error {
	if resume == nil {
		return errors.New("pgtest: the server named by " + EnvURL + " cannot be started")
	}
	defer admin.Reset() // its connections died with the server
	return resume()
}

// Schema returns the name of a schema no other test uses, dropped with
// everything in it when t ends.
func Schema(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), counter.Add(1))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A connection a restart cut fails once and leaves the pool.
		var err error
		for range 3 {
			if _, err = admin.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`); err == nil {
				return
			}
		}
		t.Errorf("pgtest: drop schema: %v", err)
	})
	return name
}

func start() (func(), error) {
	if u := os.Getenv(EnvURL); u != "" {
		dsn = u
		if err := connectAdmin(); err != nil {
			return nil, fmt.Errorf("%s is set but the server does not answer: %v", EnvURL, errors.Unwrap(err))
		}
		return func() { admin.Close() }, nil
	}
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outbox-pg-")
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	asPG, err := owner(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	run := func(name string, args ...string) error {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		if asPG {
			cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(bin, name)}, args...)...)
		}
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", name, err, out)
		}
		return nil
	}
	cleanup := func() { os.RemoveAll(dir) }
	if err := run("initdb", "-D", data, "-U", "outbox", "--auth=trust", "-E", "UTF8", "--locale=C", "-N"); err != nil {
		cleanup()
		return nil, err
	}
	hba := "local all " + PasswordUser + " scram-sha-256\nlocal all all trust\n"
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		cleanup()
		return nil, err
	}
	if asPG {
		if err := chownAll(data); err != nil {
			cleanup()
			return nil, err
		}
	}
	// fsync off: only a crash of the machine loses what the server wrote,
	// and a test server's data is worth nothing then. synchronous_commit
	// stays on: a commit is acknowledged once its WAL is written, so that
	// Restart (a crash of the server) keeps every acknowledged commit.
	opts := "-k " + dir + " -c listen_addresses= -p 5432 -c fsync=off -c full_page_writes=off -c max_connections=300"
	if err := run("pg_ctl", "-D", data, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		cleanup()
		return nil, err
	}
	halt = func() error { return run("pg_ctl", "-D", data, "-m", "immediate", "-w", "-t", "60", "stop") }
	resume = func() error {
		return run("pg_ctl", "-D", data, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "60", "-o", opts, "start")
	}
	restart = func() error {
		if err := halt(); err != nil {
			return err
		}
		return resume()
	}
	stopServer := func() {
		_ = run("pg_ctl", "-D", data, "-m", "fast", "-w", "-t", "60", "stop")
		cleanup()
	}
	dsn = "host=" + dir + " port=5432 user=outbox dbname=postgres sslmode=disable"
	if err := connectAdmin(); err != nil {
		stopServer()
		return nil, err
	}
	private = true
	if _, err := admin.Exec(context.Background(), `CREATE ROLE `+PasswordUser+` LOGIN PASSWORD '`+Password+`'`); err != nil {
		admin.Close()
		stopServer()
		return nil, err
	}
	return func() { admin.Close(); stopServer() }, nil
}

func connectAdmin() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return fmt.Errorf("connect: %w", err)
	}
	admin = p
	return nil
}

// Bin returns the path of one of the server's programs (pg_dump, psql …),
// from the directory binDir finds.
func Bin(name string) (string, error) {
	d, err := binDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, name), nil
}

// binDir finds the directory of initdb and pg_ctl: pg_config --bindir,
// the newest /usr/lib/postgresql/*/bin, or the PATH.
func binDir() (string, error) {
	has := func(d string) bool {
		_, err := os.Stat(filepath.Join(d, "initdb"))
		return err == nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); has(d) {
			return d, nil
		}
	}
	ds, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(ds, func(i, j int) bool { return version(ds[i]) > version(ds[j]) })
	for _, d := range ds {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, pg_ctl) on this machine: the PostgreSQL tests need them " +
		"(.ci/run installs the postgresql package when initdb is missing: apt-get install -y postgresql), or set " + EnvURL)
}

func version(d string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
	return n
}

// owner makes dir the postgres user's when we run as root (the server
// refuses to run as root) and reports whether commands must run as it.
func owner(dir string) (bool, error) {
	if os.Geteuid() != 0 {
		return false, nil
	}
	if _, err := user.Lookup("postgres"); err != nil {
		return false, errors.New("running as root, but there is no postgres user to run the server as (the postgresql package creates it)")
	}
	return true, chownAll(dir)
}

func chownAll(dir string) error {
	u, err := user.Lookup("postgres")
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
