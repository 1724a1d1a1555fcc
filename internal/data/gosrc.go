package data

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// GoSourceCorpus returns the built-in corpus that needs no download: the Go
// files of the Go distribution's own source tree, $GOROOT/src (folders named
// testdata skipped), as a text Source with one document per file (or per
// piece of about DefaultDocBytes of a larger file). It is real text present
// on every machine that builds titan. Its content, hence a saved loader
// state's validity, changes with the Go release.
//
// GOROOT is taken from the GOROOT environment variable, else from the
// toolchain this program was built with, else from `go env GOROOT`.
func GoSourceCorpus() (Source, error) {
	root, err := goRoot()
	if err != nil {
		return nil, err
	}
	src := filepath.Join(root, "src")
	files, err := listFiles(src, []string{".go"}, []string{"testdata"})
	if err != nil {
		return nil, err
	}
	s, err := newTextSource(fmt.Sprintf("gosrc %q", src), files, 0, []string{".go"})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// goRoot finds a GOROOT holding a src folder.
func goRoot() (string, error) {
	var tried []string
	ok := func(dir string) bool {
		if dir == "" {
			return false
		}
		tried = append(tried, dir)
		fi, err := os.Stat(filepath.Join(dir, "src"))
		return err == nil && fi.IsDir()
	}
	if dir := os.Getenv("GOROOT"); ok(dir) {
		return dir, nil
	}
	//lint:ignore SA1019 the build-time GOROOT is a fine guess here.
	if dir := runtime.GOROOT(); ok(dir) {
		return dir, nil
	}
	if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); ok(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("data: cannot find the Go source tree for the gosrc corpus (tried %q): set GOROOT to a Go installation, or use another dataset", tried)
}
