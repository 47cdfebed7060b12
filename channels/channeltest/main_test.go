package channeltest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests when a goroutine of the conformance checks outlives them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
