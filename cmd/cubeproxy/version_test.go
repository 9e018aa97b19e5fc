package main

import (
	"runtime/debug"
	"testing"
)

// A binary built without -X main.version (make build, go build, go
// install) reports what the Go toolchain recorded of its source, so that
// the version in logs, the registry entry and telemetry tells builds
// apart: every one of them said "dev".
func TestVersionFromBuildInfo(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified},
		}}
	}
	for _, tc := range []struct {
		name, set string
		info      *debug.BuildInfo
		want      string
	}{
		{"set at build time", "v1.4.0", vcs("0123456789abcdef0123", "false"), "v1.4.0"},
		{"a clean checkout", "dev", vcs("0123456789abcdef0123", "false"), "dev-0123456789ab"},
		{"a modified checkout", "dev", vcs("0123456789abcdef0123", "true"), "dev-0123456789ab-modified"},
		{"go install module@version", "dev", &debug.BuildInfo{Main: debug.Module{Version: "v1.3.2"}}, "v1.3.2"},
		{"no source information", "dev", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev"},
		{"no build information", "dev", nil, "dev"},
	} {
		if got := buildVersion(tc.set, tc.info); got != tc.want {
			t.Errorf("%s: buildVersion = %q, want %q", tc.name, got, tc.want)
		}
	}
}
