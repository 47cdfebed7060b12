package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// TestMain runs the tests with one PostgreSQL server for the commands on
// PostgreSQL (pgtest: OUTBOX_TEST_DATABASE_URL, or a throwaway server), and
// fails them when a goroutine of a command (the worker, the servers, the
// pruner, the poller) outlives them.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, func() error { return goleak.Find() })) }
