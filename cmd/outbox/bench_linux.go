package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// fsTopDirFlag is FS_TOPDIR_FL of linux/fs.h (chattr +T).
const fsTopDirFlag = 0x00020000

// spreadStores marks root FS_TOPDIR_FL (see benchRoot); a filesystem that
// refuses the hint is left as it is.
func spreadStores(root string) {
	if fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		if flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS); err == nil {
			_ = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsTopDirFlag))
		}
		unix.Close(fd)
	}
}

// clockTick is USER_HZ, the unit of the CPU times in /proc (100 on every
// Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// procStat returns a process's parent and its CPU time: its own (user +
// system) and that of its children it has waited for.
func procStat(pid int) (ppid int, own, children time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	// The command name, in parentheses, may hold spaces: fields count from after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0, 0, 0, false
	}
	n := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	// f[0] is field 3 (state): ppid is field 4, utime..cstime fields 14-17.
	ppid = int(n(1))
	own = time.Duration(n(11)+n(12)) * clockTick
	children = time.Duration(n(13)+n(14)) * clockTick
	return ppid, own, children, true
}

func parentPID(pid int) (int, bool) {
	ppid, _, _, ok := procStat(pid)
	return ppid, ok
}

// treeCPU returns the CPU time of root and its children, the living ones
// and those that ended (root's children's time: a PostgreSQL backend that
// exits between two readings is counted once, in the second).
func treeCPU(root int) (time.Duration, bool) {
	_, own, done, ok := procStat(root)
	if !ok {
		return 0, false
	}
	total := own + done
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == root {
			continue
		}
		if ppid, own, _, ok := procStat(pid); ok && ppid == root {
			total += own
		}
	}
	return total, true
}
