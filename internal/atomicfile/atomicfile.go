// Package atomicfile writes files so that a reader sees the old content
// or the new, never a part: the new content goes to a temporary file next
// to the target, is synced, and is renamed over it; the folder is synced
// so the rename survives a crash.
package atomicfile

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write fills a temporary file next to path with fill and renames it
// over path once synced (mode 0644). On error path is untouched and the
// temporary file is removed.
func Write(path string, fill func(w io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		if st, serr := os.Stat(dir); serr != nil {
			return fmt.Errorf("writing %s: its folder %s: %w", path, dir, serr)
		} else if !st.IsDir() {
			return fmt.Errorf("writing %s: %s is not a folder", path, dir)
		}
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := fill(f); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	// A folder sync makes the rename durable; some file systems refuse
	// it, which loses nothing written.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// WriteBytes is Write of data.
func WriteBytes(path string, data []byte) error {
	return Write(path, func(w io.Writer) error {
		_, err := io.Copy(w, bytes.NewReader(data))
		return err
	})
}
