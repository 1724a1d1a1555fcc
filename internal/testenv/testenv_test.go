package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that records Fatalf and Skipf instead of
// stopping the test.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                      {}
func (r *recorder) Fatalf(f string, args ...any) { r.fatal = fmt.Sprintf(f, args...) }
func (r *recorder) Skipf(f string, args ...any)  { r.skip = fmt.Sprintf(f, args...) }

func TestRequire(t *testing.T) {
	for _, tc := range []struct {
		name, ci    string
		ok          bool
		fatal, skip bool
	}{
		{"present", "true", true, false, false},
		{"missing in CI", "true", false, true, false},
		{"missing in CI=1", "1", false, true, false},
		{"missing locally", "", false, false, true},
		{"missing with CI=false", "false", false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			Require(r, "the frobnicator", tc.ok)
			if (r.fatal != "") != tc.fatal || (r.skip != "") != tc.skip {
				t.Fatalf("fatal %q, skip %q; want fatal %v, skip %v", r.fatal, r.skip, tc.fatal, tc.skip)
			}
			if msg := r.fatal + r.skip; msg != "" && !strings.Contains(msg, "the frobnicator") {
				t.Errorf("message %q does not name what is missing", msg)
			}
		})
	}
}

func TestRepoRootAndSharedData(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("RepoRoot() = %s without go.mod", root)
	}
	t.Setenv("TITAN_DATA", "")
	dir, err := SharedDataDir()
	if err != nil || dir != filepath.Join(filepath.Dir(root), "shared", "data") {
		t.Errorf("SharedDataDir() = %q, %v; want ../shared/data beside %s", dir, err, root)
	}
	// An override with a file in it and one without.
	data := t.TempDir()
	os.MkdirAll(filepath.Join(data, "set"), 0o755)
	os.WriteFile(filepath.Join(data, "set", "x.txt"), []byte("x"), 0o644)
	t.Setenv("TITAN_DATA", data)
	t.Setenv("CI", "true")
	for _, tc := range []struct {
		rel   []string
		fatal bool
	}{{[]string{"set", "x.txt"}, false}, {[]string{"set", "missing.txt"}, true}} {
		r := &recorder{TB: t}
		p := SharedData(r, tc.rel...)
		if want := filepath.Join(append([]string{data}, tc.rel...)...); p != want {
			t.Errorf("SharedData(%q) = %q, want %q", tc.rel, p, want)
		}
		if (r.fatal != "") != tc.fatal {
			t.Errorf("SharedData(%q) in CI: fatal %q, want fatal %v", tc.rel, r.fatal, tc.fatal)
		}
	}
}

func TestTool(t *testing.T) {
	t.Setenv("CI", "")
	r := &recorder{TB: t}
	if p := Tool(r, "go-no-such-tool-xyz", "install it"); p != "" || !strings.Contains(r.skip, "install it") {
		t.Errorf("missing tool: path %q, skip %q", p, r.skip)
	}
}
