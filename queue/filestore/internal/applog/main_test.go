package applog

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests when a goroutine of the log (the directory syncs of a group commit) outlives them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
