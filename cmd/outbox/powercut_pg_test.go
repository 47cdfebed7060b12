//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// crashPG is a PostgreSQL server of the power-cut drill, its data
// directory on the crashing disk (fsync and synchronous_commit on, the
// defaults), its socket off it.
type crashPG struct {
	bin, data, sock, log string
	asPG                 bool // run as the postgres user (we are root)
	cmd                  *exec.Cmd
	exited               chan struct{}
}

// newCrashPG makes a cluster at data (on the backing disk, before the
// first mount) with its socket in sock.
func newCrashPG(t *testing.T, data, sock string) *crashPG {
	t.Helper()
	initdb, err := pgtest.Bin("initdb")
	if err != nil {
		t.Fatal(err)
	}
	p := &crashPG{bin: filepath.Dir(initdb), data: data, sock: sock, log: filepath.Join(sock, "server.log"), asPG: os.Geteuid() == 0}
	for _, d := range []string{filepath.Dir(data), sock} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if p.asPG {
		for _, d := range []string{filepath.Dir(data), sock} {
			if err := chownToPG(d); err != nil {
				t.Fatal(err)
			}
		}
	}
	if out, err := p.run("initdb", "-D", data, "-U", "outbox", "--auth=trust", "-E", "UTF8", "--locale=C"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	return p
}

func chownToPG(dir string) error {
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("running as root, but there is no postgres user to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(dir, uid, gid)
}

func (p *crashPG) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(p.bin, name), args...)
	if p.asPG {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(p.bin, name)}, args...)...)
	}
	cmd.Dir = p.sock
	return cmd.CombinedOutput()
}

// DSN is the server's connection string.
func (p *crashPG) DSN() string {
	return "host=" + p.sock + " port=5432 user=outbox dbname=postgres sslmode=disable"
}

// start starts the server (after a cut: its crash recovery), as a child
// of this process so that kill can reap it, and waits until it takes
// connections.
func (p *crashPG) start(t *testing.T, cut int) {
	t.Helper()
	args := []string{filepath.Join(p.bin, "postgres"), "-D", p.data, "-k", p.sock, "-c", "listen_addresses=", "-p", "5432", "-c", "max_connections=100"}
	if p.asPG {
		args = append([]string{"setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"}, args...)
	}
	logf, err := os.OpenFile(p.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(args[0], args[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func(c *exec.Cmd) { _ = c.Wait(); close(exited) }(p.cmd)
	p.exited = exited
	ready, _ := pgtest.Bin("pg_isready")
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			b, _ := os.ReadFile(p.log)
			t.Fatalf("PostgreSQL did not start after power cut %d:\n%s", cut, tail(string(b), 3000))
		default:
		}
		if exec.Command(ready, "-q", "-h", p.sock, "-p", "5432", "-U", "outbox", "-d", "postgres").Run() == nil {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(p.log)
			t.Fatalf("PostgreSQL took more than 120 s to start after power cut %d:\n%s", cut, tail(string(b), 3000))
		}
	}
}

// kill SIGKILLs the postmaster and every process under it (the power
// went), and waits until they are gone.
func (p *crashPG) kill() {
	if p.cmd == nil {
		return
	}
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGSTOP) // no new children while they are found
	pids := childrenOf(pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, q := range pids {
		_ = syscall.Kill(q, syscall.SIGKILL)
	}
	<-p.exited
	p.cmd = nil
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		alive := false
		for _, q := range pids {
			if syscall.Kill(q, 0) == nil && !zombie(q) {
				alive = true
			}
		}
		if !alive {
			return
		}
	}
}

// childrenOf returns the pids whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		q, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so split after ")".
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			f := strings.Fields(s[i+1:])
			if len(f) > 1 && f[1] == strconv.Itoa(pid) {
				out = append(out, q)
			}
		}
	}
	return out
}

func zombie(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
