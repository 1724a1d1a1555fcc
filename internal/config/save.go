package config

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/titan-go/titan/internal/atomicfile"
)

// Save writes the resolved recipe j as TOML (j.TOML) to path, creating its
// folder: to a temporary file in the same folder first, synced to disk and
// then renamed over path, so that path holds either the old file or the
// whole new one. Load(path, nil, nil) reads back a Job equal to j.
//
// This is what job.save_config_file asks for; SavePath names the file.
func Save(j *Job, path string) error {
	s, err := j.TOML()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("config: save %s: %w", path, err)
	}
	if err := atomicfile.WriteBytes(path, []byte(s)); err != nil {
		return fmt.Errorf("config: save: %w", err)
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
