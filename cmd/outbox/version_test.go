package main

import (
	"os/exec"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionOf(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"go install @tag", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}}, "v0.1.0"},
		{"go build past the tag", &debug.BuildInfo{Main: debug.Module{Version: "v0.1.1-0.20261201120000-0123456789ab+dirty"}, Settings: vcs(rev, "true")}, "v0.1.1-0.20261201120000-0123456789ab+dirty"},
		{"revision only", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "false")}, release + "+0123456789ab"},
		{"revision, modified", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "true")}, release + "+0123456789ab.dirty"},
		{"no vcs", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, release + "+unknown"},
		{"no build info", nil, release + "+unknown"},
	} {
		if got := versionOf(c.bi); got != c.want {
			t.Errorf("%s: versionOf = %q, want %q", c.name, got, c.want)
		}
	}
}

// TestVersion_Ldflags: what make build sets is what outbox version prints.
func TestVersion_Ldflags(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v9.8.7-3-gabcdef0"
	code, out, _ := runCLI(t, "", "version")
	if code != exitOK || out != "outbox v9.8.7-3-gabcdef0\n" {
		t.Fatalf("exit %d, %q", code, out)
	}
}

// TestVersion_GoBuild: a plain go build (no ldflags) prints a version, not
// "(devel)": the tag or pseudo-version go stamps, or the release this tree
// follows.
func TestVersion_GoBuild(t *testing.T) {
	bin := buildBinary(t)
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^outbox v\d+\.\d+\.\d+[-+.0-9A-Za-z]*\n$`).Match(out) {
		t.Fatalf("outbox version printed %q", out)
	}
}

// TestVersion_ReleaseIsChangelogs: release names CHANGELOG.md's newest
// release section, so a release bumps both.
func TestVersion_ReleaseIsChangelogs(t *testing.T) {
	log := readFile(t, "../../CHANGELOG.md")
	loc := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`).FindStringSubmatchIndex(log)
	if loc == nil {
		t.Fatal("CHANGELOG.md has no release section (## [X.Y.Z] - YYYY-MM-DD)")
	}
	if u := strings.Index(log, "\n## [Unreleased]\n"); u < 0 || u > loc[0] {
		t.Error("CHANGELOG.md needs a ## [Unreleased] section above the newest release")
	}
	m := []string{log[loc[0]:loc[1]], log[loc[2]:loc[3]]}
	if want := strings.TrimPrefix(release, "v"); m[1] != want {
		t.Fatalf("CHANGELOG.md's newest release is %s, release in version.go is %s: bump both", m[1], release)
	}
}
