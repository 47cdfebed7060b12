package queuetest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests when a goroutine started by the contract suite outlives them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
