package pgstore_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// TestMain runs the tests against one PostgreSQL server (pgtest) and fails
// them when a goroutine started by a test outlives it.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m, func() error { return goleak.Find() })) }
