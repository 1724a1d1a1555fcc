package checkpoint

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpen feeds arbitrary metadata.json and shard bytes to Open, Verify
// and Read: none may panic, hang or allocate beyond the files' sizes.
// The seeds (a real checkpoint and damaged forms of it) run in the
// normal suite.
func FuzzOpen(f *testing.F) {
	seedDir := f.TempDir()
	save1(f, seedDir, 1, true)
	meta, err := os.ReadFile(filepath.Join(StepDir(seedDir, 1), "metadata.json"))
	if err != nil {
		f.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(StepDir(seedDir, 1), "data-00000.bin"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(meta, data)
	f.Add(meta, data[:7])
	f.Add([]byte(`{"version":1,"tensors":{"w":{"dtype":"float32","shape":[1099511627776],"chunks":[{"offset":0,"len":1099511627776,"file":"data-00000.bin"}]}}}`), data)
	f.Add([]byte(`{"version":1,"tensors":{"w":{"dtype":"float32","shape":[3],"chunks":[{"offset":0,"len":3,"file":"data-00000.bin","pos":-4}]}}}`), data)
	f.Add([]byte(`{"version":1,"blobs":{"x":{"file":"metadata.json","size":3}}}`), data)
	f.Add([]byte(`{}`), []byte{})
	f.Fuzz(func(t *testing.T, meta, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "metadata.json"), meta, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "data-00000.bin"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, TrainStateBlob), []byte(`{"step":1}`), 0o644)
		os.WriteFile(filepath.Join(dir, "model_config.json"), []byte(`{}`), 0o644)
		r, err := Open(dir)
		if err != nil {
			return
		}
		_ = r.Verify()
		for name, tm := range r.Meta.Tensors {
			for _, c := range tm.Chunks {
				_ = r.Read(name, c.Offset, make([]float32, c.Len))
			}
		}
		for name := range r.Meta.Blobs {
			_, _ = r.Blob(name)
		}
		_ = r.Meta.Full()
	})
}
