package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

const unitPath = "../../deploy/outbox.service"

// unitFile is a systemd unit read by the little parser the tests need:
// one KEY=VALUE per line, sections, comments.
type unitFile map[string]map[string][]string // section → key → values

func readUnit(t *testing.T, path string) unitFile {
	t.Helper()
	u := unitFile{}
	section := ""
	for i, line := range strings.Split(readFile(t, path), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.ContainsAny(v, `"'\`) || strings.HasSuffix(line, "\\") {
				t.Fatalf("%s:%d: the test's parser does not read %q", path, i+1, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unitFile) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s= is set %d times, want once", section, key, len(v))
	}
	return v[0]
}

// linuxTool returns the path of a tool the deploy tests need; on Linux (CI
// runs there) a missing one fails the test rather than skipping it.
func linuxTool(t *testing.T, name, pkg string) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skipf("%s checks run on Linux", name)
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is needed to check the deploy files (Debian: apt-get install %s): %v", name, pkg, err)
	}
	return p
}

// TestDeploy_SystemdUnit: systemd-analyze verify accepts the unit without
// a word (unknown keys and bad values are only warnings to it), its
// sandbox keeps the exposure systemd-analyze security computes at most 2.0,
// and it has what the docs promise.
func TestDeploy_SystemdUnit(t *testing.T) {
	analyze := linuxTool(t, "systemd-analyze", "systemd")
	u := readUnit(t, unitPath)
	for key, want := range map[string]string{
		"Type": "exec", "User": "outbox", "StateDirectory": "outbox", "NoNewPrivileges": "yes",
		"ProtectSystem": "strict", "Restart": "on-failure", "PrivateTmp": "yes",
		"LoadCredential":  "internal_outbox_token:/etc/outbox/internal_outbox_token",
		"EnvironmentFile": "-/etc/outbox/outbox.env",
	} {
		if got := u.one(t, "Service", key); got != want {
			t.Errorf("%s=%s, want %s", key, got, want)
		}
	}
	exec0 := strings.Fields(u.one(t, "Service", "ExecStart"))[0]
	if exec0 != "/usr/local/bin/outbox" {
		t.Fatalf("ExecStart runs %s", exec0)
	}

	// verify wants ExecStart's program to exist: the copy names the one just built.
	bin := buildBinary(t)
	dir := t.TempDir()
	unit := filepath.Join(dir, "outbox.service")
	text := strings.Replace(readFile(t, unitPath), "ExecStart="+exec0+" ", "ExecStart="+bin+" ", 1)
	if err := os.WriteFile(unit, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", unit).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err = exec.Command(analyze, "security", "--offline=yes", "--threshold=20", unit).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: exposure above 2.0 (%v)\n%s", err, out)
	}
	if !regexp.MustCompile(`Overall exposure level for outbox.service: [01]\.\d`).Match(out) {
		t.Fatalf("systemd-analyze security said:\n%s", out)
	}
}

// TestDeploy_Sysusers: the sysusers.d file creates the unit's user, with
// its state directory as home.
func TestDeploy_Sysusers(t *testing.T) {
	sysusers := linuxTool(t, "systemd-sysusers", "systemd")
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf, err := filepath.Abs("../../deploy/outbox.sysusers") // a relative one is read under --root
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(sysusers, "--root="+root, conf).CombinedOutput(); err != nil {
		t.Fatalf("systemd-sysusers: %v\n%s", err, out)
	}
	user := readUnit(t, unitPath).one(t, "Service", "User")
	passwd := readFile(t, filepath.Join(root, "etc", "passwd"))
	if !regexp.MustCompile(`(?m)^` + user + `:x:\d+:\d+:[^:]*:/var/lib/outbox:`).MatchString(passwd) {
		t.Fatalf("no user %s with home /var/lib/outbox in:\n%s", user, passwd)
	}
}

// TestDeploy_SystemdUnitRunsServe: the unit's ExecStart and Environment=,
// with systemd's specifiers filled in as systemd would (%S the state
// directories' root, %d the credentials directory), start the current
// serve, which reads the token from the credential. Only the listen port
// is the test's (port 0).
func TestDeploy_SystemdUnitRunsServe(t *testing.T) {
	u := readUnit(t, unitPath)
	root := t.TempDir()
	state, creds := filepath.Join(root, "state"), filepath.Join(root, "credentials")
	if err := os.MkdirAll(filepath.Join(state, u.one(t, "Service", "StateDirectory")), 0o700); err != nil {
		t.Fatal(err)
	}
	const token = "unit-token-0b8f2d61c4e97a35"
	name, _, _ := strings.Cut(u.one(t, "Service", "LoadCredential"), ":")
	if err := os.MkdirAll(creds, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(creds, name), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := strings.NewReplacer("%S", state, "%d", creds)
	expand := func(s string) string {
		s = spec.Replace(s)
		if strings.Contains(s, "%") {
			t.Fatalf("the test does not fill in the specifier in %q", s)
		}
		return s
	}
	bin := buildBinary(t)
	help, _ := exec.Command(bin, "serve", "-help").CombinedOutput()
	var envs []string
	for _, kv := range u["Service"]["Environment"] {
		k, _, _ := strings.Cut(kv, "=")
		if k != "INTERNAL_OUTBOX_TOKEN_FILE" && !strings.Contains(string(help), "(env "+k+")") {
			t.Errorf("Environment=%s: serve has no variable %s", kv, k)
		}
		envs = append(envs, expand(kv))
	}
	args := strings.Fields(u.one(t, "Service", "ExecStart"))
	if len(args) < 2 || args[1] != "serve" {
		t.Fatalf("ExecStart does not run serve: %q", args)
	}
	for i := range args {
		args[i] = expand(args[i])
	}
	d, logs, code := launchServe(t, bin, filepath.Join(root, "unused"), envs, args[2:]...)
	if d == nil {
		t.Fatalf("serve as the unit starts it exited with %d:\n%s", code, logs)
	}
	if _, err := os.Stat(filepath.Join(state, "outbox", "index.db")); err != nil {
		t.Errorf("the store is not in the state directory: %v", err)
	}
	if code, _ := request(t, "GET", d.base+"/healthz", "", nil); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, b := request(t, "GET", d.base+"/v1/envelopes/none?tenant=default", token, nil); code != 404 {
		t.Errorf("with the credential's token: %d %s", code, b)
	}
	if code, _ := request(t, "GET", d.base+"/v1/envelopes/none?tenant=default", "wrong-token-but-long-enough-0000", nil); code != 401 {
		t.Errorf("with another token: %d", code)
	}
	d.stop(t)
}
