package envelope_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests when a goroutine started by a test outlives them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
