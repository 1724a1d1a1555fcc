package checkpoint

import (
	"os"
	"path/filepath"
	"testing"
	"time"
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
		if len(data)%2 == 0 {
			// A matching marker, so that the metadata's checks are reached
			// (an odd length leaves the marker out: an incomplete save).
			Reseal(dir)
		}
		r, err := Open(dir)
		if err != nil {
			return
		}
		defer r.Close()
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

// FuzzCommit feeds arbitrary part files, data files and markers to a
// commit and to Open of what it commits: the commit may refuse, never
// panic, hang or allocate beyond the files; what it accepts opens and
// verifies; an arbitrary marker beside valid metadata is refused unless
// it matches. The seeds run in the normal suite.
func FuzzCommit(f *testing.F) {
	seed := f.TempDir()
	p, err := Begin(seed, 3, NewSession(), 1)
	if err != nil {
		f.Fatal(err)
	}
	if err := p.WritePart(0, []Shard{{Name: "w", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}}}, map[string][]byte{TrainStateBlob: []byte(`{"step":3}`)}); err != nil {
		f.Fatal(err)
	}
	part, _ := os.ReadFile(filepath.Join(p.Dir, PartFile(0)))
	data, _ := os.ReadFile(filepath.Join(p.Dir, DataFile(0)))
	f.Add(part, data, []byte(`{"step":3,"metadata_crc32c":0}`))
	f.Add(part, data[:5], []byte(`{}`))
	f.Add([]byte(`{"version":2,"step":3,"rank":0,"world":1,"tensors":{"w":{"dtype":"float32","shape":[4],"chunks":[{"offset":0,"len":4,"file":"data-00000.bin"},{"offset":0,"len":4,"file":"data-00000.bin"}]}}}`), data, []byte(`x`))
	f.Add([]byte(`{"version":2,"step":3,"rank":0,"world":1,"tensors":{"w":{"dtype":"float32","shape":[4],"chunks":[{"offset":0,"len":4,"file":"../data-00000.bin"}]}}}`), data, []byte(``))
	f.Add([]byte(`{"version":2,"step":3,"rank":5,"world":1}`), data, []byte(``))
	f.Add([]byte(`{"version":2,"step":3,"rank":0,"world":1,"blobs":{"metadata.json":{"file":"metadata.json","size":2}}}`), data, []byte(``))
	f.Fuzz(func(t *testing.T, part, data, mark []byte) {
		folder := t.TempDir()
		p, err := Begin(folder, 3, NewSession(), 1)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(p.Dir, DataFile(0)), data, 0o644)
		os.WriteFile(filepath.Join(p.Dir, TrainStateBlob), []byte(`{"step":3}`), 0o644)
		os.WriteFile(filepath.Join(p.Dir, PartFile(0)), part, 0o644)
		if err := p.Commit(Layout{World: 1}, 10*time.Millisecond); err == nil {
			r, err := Open(StepDir(folder, 3))
			if err != nil {
				t.Fatalf("a committed checkpoint does not open: %v", err)
			}
			_ = r.Verify()
			// A forged marker is refused unless it matches.
			os.WriteFile(filepath.Join(StepDir(folder, 3), CommitMarker), mark, 0o644)
			if r, err := Open(StepDir(folder, 3)); err == nil {
				_ = r.Verify()
			}
		}
	})
}
