// Package testenv decides what a test does when something it needs from
// outside the repository (a tool, a Python module, a shared data file) is
// missing: on a developer's machine the test is skipped with the reason;
// in CI (environment CI=true, as GitHub Actions, GitLab CI and most others
// set it) it fails with the reason, so that a misconfigured CI runner
// cannot pass by skipping.
package testenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// InCI reports whether the tests run in CI: the environment variable CI
// is a true boolean ("true", "1", …).
func InCI() bool {
	ci, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && ci
}

// Require fails the test in CI and skips it elsewhere when ok is false;
// what names the missing requirement and why it is missing, e.g.
// "srun (exec: \"srun\": executable file not found in $PATH)".
func Require(tb testing.TB, what string, ok bool) {
	tb.Helper()
	if ok {
		return
	}
	if InCI() {
		tb.Fatalf("%s is missing; CI=true requires it (unset CI to skip this test instead)", what)
		return
	}
	tb.Skipf("%s is missing; skipping (with CI=true this test fails)", what)
}

// RepoRoot returns the folder holding go.mod, found by walking up from
// the working directory (a test's is its package folder).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("testenv: no go.mod above the working directory")
		}
		dir = up
	}
}

// SharedDataDir returns the shared data folder: $TITAN_DATA when set,
// else ../shared/data beside the repository root (the folder holding
// go.mod), which is where the project's data sets and tokenizers live.
func SharedDataDir() (string, error) {
	if d := os.Getenv("TITAN_DATA"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(root), "shared", "data"), nil
}

// FindSharedData returns the path of <shared data>/<rel...> and whether it
// exists, for tests that use a file when present and do without it
// otherwise.
func FindSharedData(rel ...string) (string, bool) {
	dir, err := SharedDataDir()
	if err != nil {
		return "", false
	}
	p := filepath.Join(append([]string{dir}, rel...)...)
	_, err = os.Stat(p)
	return p, err == nil
}

// SharedData returns the path of <shared data>/<rel...> (see
// SharedDataDir), failing the test in CI and skipping it elsewhere when
// it is absent.
func SharedData(tb testing.TB, rel ...string) string {
	tb.Helper()
	p, ok := FindSharedData(rel...)
	if p == "" {
		p = filepath.Join(append([]string{"../shared/data"}, rel...)...)
	}
	Require(tb, "shared test data "+p, ok)
	return p
}

// Python is the interpreter the interop tests run.
const Python = "/usr/bin/python3"

var torch struct {
	once sync.Once
	err  error
	out  []byte
}

// Torch returns Python after checking that it can `import torch` (checked
// once per test binary), failing the test in CI and skipping it elsewhere
// when it cannot.
func Torch(tb testing.TB) string {
	tb.Helper()
	torch.once.Do(func() {
		torch.out, torch.err = exec.Command(Python, "-c", "import torch").CombinedOutput()
	})
	why := ""
	if torch.err != nil {
		why = " (" + torch.err.Error() + ": " + lastLine(torch.out) + ")"
	}
	Require(tb, "PyTorch for "+Python+why, torch.err == nil)
	return Python
}

// PythonModule fails the test in CI and skips it elsewhere unless Python
// can find module (without importing it).
func PythonModule(tb testing.TB, module string) {
	tb.Helper()
	probe := "import importlib.util as u, sys; sys.exit(u.find_spec(sys.argv[1]) is None)"
	err := exec.Command(Python, "-c", probe, module).Run()
	why := ""
	if err != nil {
		why = " (" + err.Error() + ")"
	}
	Require(tb, "Python module "+module+" for "+Python+why, err == nil)
}

// Tool returns the path of the executable name on $PATH, failing the test
// in CI and skipping it elsewhere when there is none; hint says how to
// get it.
func Tool(tb testing.TB, name, hint string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	why := ""
	if err != nil {
		why = " (" + err.Error() + "; " + hint + ")"
	}
	Require(tb, name+why, err == nil)
	return p
}

// lastLine returns the last non-empty line of out, trimmed.
func lastLine(out []byte) string {
	s := string(out)
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			return s[i+1:]
		}
	}
	return s
}
