package applog

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The descriptor cache is sized from the open-file limit: an eighth of it,
// between 64 and 4096. (Linux only: the limit's fields are uint64 here and
// int64 on FreeBSD, and the tests run on Linux.)
func TestOpenBudget_FollowsTheFileLimit(t *testing.T) {
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NOFILE, &orig) })
	for _, c := range []struct{ cur, want uint64 }{{1024, 128}, {256, 64}, {orig.Max, min(max(orig.Max/8, 64), 4096)}} {
		if c.cur > orig.Max {
			continue
		}
		lim := unix.Rlimit{Cur: c.cur, Max: orig.Max}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
		if got := openBudget(); uint64(got) != c.want {
			t.Errorf("open-file limit %d: budget %d, want %d", c.cur, got, c.want)
		}
	}
}
