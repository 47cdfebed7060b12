package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
)

// benchSchemaPrefix starts the name of every schema a bench run creates
// (one per phase group, dropped with it): one left by a killed run is
// recognisable.
const benchSchemaPrefix = "outbox_bench_"

// pgBench runs on PostgreSQL, each store in a fresh schema. The DSN is a
// secret: nothing here repeats it (pgstore's errors do not).
type pgBench struct {
	dsn    string
	run    string // this run's part of the schema names
	n      int
	info   map[string]any
	server int // the postmaster's pid when its processes are readable here, else 0
}

func (p *pgBench) name() string { return "postgres" }

func (p *pgBench) durability() string {
	return fmt.Sprintf("durable as the server commits (fsync=%v, synchronous_commit=%v)", p.info["pg_fsync"], p.info["pg_synchronous_commit"])
}

func (p *pgBench) sendWhat() string { return "the enqueue (validate, one committed transaction)" }

func (p *pgBench) params() map[string]any { return p.info }

func (p *pgBench) end() error { return nil }

func (p *pgBench) open(ctx context.Context) (*benchStore, error) {
	if p.run == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		p.run = strconv.Itoa(os.Getpid()) + "_" + hex.EncodeToString(b[:])
	}
	p.n++
	schema := benchSchemaPrefix + p.run + "_" + strconv.Itoa(p.n)
	s, err := openPG(ctx, p.dsn, schema, false, "", queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	if p.info == nil {
		p.describe(ctx, s)
	}
	return &benchStore{q: s, close: func() error {
		// Dropped on a context of its own: an interrupted run removes its schema too.
		c, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, err := s.Pool().Exec(c, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		s.Close()
		if err != nil {
			// Only the server's answer: pgx's other errors may name the host.
			var pe *pgconn.PgError
			why := "the connection to the database failed"
			if errors.As(err, &pe) {
				why = pe.Error()
			}
			return fmt.Errorf("could not drop the bench's schema %s (drop it by hand): %s", schema, why)
		}
		return nil
	}}, nil
}

// describe records the server's settings and finds its processes: the
// postmaster.pid of its data directory, when this machine has that file
// and its pid is the parent of this session's backend.
func (p *pgBench) describe(ctx context.Context, s *pgstore.Store) {
	p.info = map[string]any{"pool_max_conns": s.Pool().Config().MaxConns}
	for _, k := range []string{"server_version", "fsync", "synchronous_commit", "wal_sync_method"} {
		var v string
		if err := s.Pool().QueryRow(ctx, `SELECT current_setting($1)`, k).Scan(&v); err == nil {
			p.info["pg_"+k] = v
		}
	}
	var (
		dataDir string
		backend int
	)
	conn, err := s.Pool().Acquire(ctx)
	if err != nil {
		return
	}
	defer conn.Release()
	if err := conn.QueryRow(ctx, `SELECT current_setting('data_directory'), pg_backend_pid()`).Scan(&dataDir, &backend); err != nil {
		return // data_directory needs a superuser or pg_read_all_settings
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pm <= 0 {
		return
	}
	if ppid, ok := parentPID(backend); ok && ppid == pm {
		p.server = pm
		p.info["server_cpu"] = "the server's processes on this machine (postmaster " + strconv.Itoa(pm) + " and its children)"
	}
}

func (p *pgBench) serverCPU() (time.Duration, bool) {
	if p.server == 0 {
		return 0, false
	}
	return treeCPU(p.server)
}
