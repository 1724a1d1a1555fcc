// Package version says which titan this is, for `titan version` and for
// the run store, which records it with every run.
//
// A release build sets it with the linker:
//
//	go build -ldflags "-X github.com/titan-go/titan/internal/version.Version=v0.3.0" ./cmd/titan
//
// (make build does so with `git describe --always --dirty`). Without it,
// String falls back to the module version of the build info (set by
// `go install github.com/titan-go/titan/cmd/titan@v0.3.0`), then to the VCS
// revision the go command stamped, then to "devel".
package version

import "runtime/debug"

// Version is set at link time (-X); empty in a plain go build.
var Version string

// String is titan's version: Version when set, else the build info's
// module version, else "devel+<revision>[-dirty]" from the VCS stamp,
// else "devel".
func String() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
			if len(rev) > 12 {
				rev = rev[:12]
			}
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev != "" {
		return "devel+" + rev + dirty
	}
	return "devel"
}
