package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests when a goroutine of a command (the worker, the servers, the pruner, the poller) outlives them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
