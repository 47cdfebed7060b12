package main

import "runtime/debug"

// version is set with -ldflags "-X main.version=…" (make build: git
// describe); otherwise the build info says it (versionOf).
var version = ""

// release is the newest release (CHANGELOG.md's first version section,
// which a test keeps equal). It names a build that carries no other
// version: built from a source tree without its git history, or with
// -buildvcs=false.
const release = "v0.1.0"

func buildVersion() string {
	if version != "" {
		return version
	}
	bi, _ := debug.ReadBuildInfo()
	return versionOf(bi)
}

// versionOf says which code a binary was built from: the module version
// (go install …@v0.1.0; go build in a git checkout stamps the tag or a
// pseudo-version after it), else the git revision go build recorded, else
// the release the source tree says it follows.
func versionOf(bi *debug.BuildInfo) string {
	if bi == nil {
		return release + "+unknown"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return release + "+unknown"
	}
	v := release + "+" + rev[:min(len(rev), 12)]
	if modified == "true" {
		v += ".dirty"
	}
	return v
}
