package config

import (
	"fmt"
	"os"
	"path/filepath"
)

// Save writes the resolved recipe j as TOML (j.TOML) to path, creating its
// folder: to a temporary file in the same folder first, synced to disk and
// then renamed over path, so that path holds either the old file or the
// whole new one. Load(path, nil, nil) reads back a Job equal to j.
//
// This is what job.save_config_file asks for; SavePath names the file.
func Save(j *Job, path string) (err error) {
	s, err := j.TOML()
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("config: save %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("config: save %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.WriteString(s); err != nil {
		return fmt.Errorf("config: save %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("config: save %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("config: save %s: %w", path, err)
	}
	if err = os.Chmod(f.Name(), 0o644); err != nil {
		return fmt.Errorf("config: save %s: %w", path, err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("config: save %s: %w", path, err)
	}
	// Make the rename itself durable.
	if d, derr := os.Open(dir); derr == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// SavePath is where job.save_config_file asks the resolved recipe to be
// written: <job.dump_folder>/<job.save_config_file> (an absolute
// save_config_file is used as it is), or "" when the key is empty.
func (j *Job) SavePath() string {
	name := j.Job.SaveConfigFile
	if name == "" {
		return ""
	}
	if filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(j.Job.DumpFolder, name)
}

// SaveConfigFile writes the resolved recipe where job.save_config_file asks
// (see SavePath); it does nothing when the key is empty.
func (j *Job) SaveConfigFile() error {
	p := j.SavePath()
	if p == "" {
		return nil
	}
	if err := Save(j, p); err != nil {
		return fmt.Errorf("job.save_config_file: %w", err)
	}
	return nil
}
