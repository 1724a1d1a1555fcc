package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWrite: the new content replaces the old whole; a failing fill
// leaves the old content and no temporary file behind.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.txt")
	if err := WriteBytes(path, []byte("old")); err != nil {
		t.Fatal(err)
	}
	err := Write(path, func(w io.Writer) error {
		w.Write([]byte("half"))
		return errors.New("disk full")
	})
	if err == nil {
		t.Fatal("a failing fill: no error")
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Errorf("after a failed write: %q, want the old content", got)
	}
	if err := WriteBytes(path, []byte("new")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "new" {
		t.Errorf("after a write: %q, want %q", got, "new")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%d files in the folder, want only the target", len(entries))
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v (%v), want 0644", st.Mode().Perm(), err)
	}
}

// TestMissingFolder: writing into a folder that does not exist names the
// folder, not the temporary file.
func TestMissingFolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "absent")
	err := WriteBytes(filepath.Join(dir, "x.png"), []byte("x"))
	if err == nil || !strings.Contains(err.Error(), "its folder "+dir) || strings.Contains(err.Error(), ".tmp") {
		t.Errorf("error %v, want one naming the folder %s and no temporary file", err, dir)
	}
}
