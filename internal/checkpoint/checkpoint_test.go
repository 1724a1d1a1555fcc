package checkpoint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func randomShards(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func TestSaveLoadReshard(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 1))
	full := randomShards(r, 1000)
	// Saved as three uneven shards, as three writers of a sharded run would.
	shards := []Shard{
		{Name: "w", Shape: []int{10, 100}, Offset: 0, Data: full[:333]},
		{Name: "w", Shape: []int{10, 100}, Offset: 333, Data: full[333:700]},
		{Name: "w", Shape: []int{10, 100}, Offset: 700, Data: full[700:]},
	}
	blobs := map[string][]byte{"train_state": []byte(`{"step":5}`)}
	if err := Save(dir, 5, shards, blobs); err != nil {
		t.Fatal(err)
	}
	rd, err := Open(StepDir(dir, 5))
	if err != nil {
		t.Fatal(err)
	}
	if err := rd.Verify(); err != nil {
		t.Fatal(err)
	}
	// Read back under another sharding: four ranges crossing chunk borders.
	for _, rg := range [][2]int{{0, 1000}, {300, 400}, {699, 701}, {999, 1000}} {
		got := make([]float32, rg[1]-rg[0])
		if err := rd.Read("w", rg[0], got); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if got[i] != full[rg[0]+i] {
				t.Fatalf("range %v element %d: got %v want %v", rg, i, got[i], full[rg[0]+i])
			}
		}
	}
	b, err := rd.Blob("train_state")
	if err != nil || string(b) != `{"step":5}` {
		t.Fatalf("blob = %q, %v", b, err)
	}
	if err := rd.Read("missing", 0, make([]float32, 1)); err == nil {
		t.Error("reading an absent tensor must fail")
	}
}

func TestLatestPurge(t *testing.T) {
	dir := t.TempDir()
	for _, s := range []int{10, 2, 30, 20} {
		if err := Save(dir, s, []Shard{{Name: "x", Shape: []int{1}, Data: []float32{float32(s)}}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(dir, "step-99"), 0o755) // no metadata: incomplete
	if s, ok, _ := Latest(dir); !ok || s != 30 {
		t.Fatalf("Latest = %d, %v; want 30", s, ok)
	}
	if err := Purge(dir, 2); err != nil {
		t.Fatal(err)
	}
	steps, _ := Steps(dir)
	if fmt.Sprint(steps) != "[20 30]" {
		t.Fatalf("after purge: %v", steps)
	}
}

func TestCorruptionIsDetected(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(dir string)
		want   string
	}{
		{"tampered data", func(dir string) {
			p := filepath.Join(dir, "data-00000.bin")
			b, _ := os.ReadFile(p)
			b[17] ^= 0x40
			os.WriteFile(p, b, 0o644)
		}, "checksum mismatch"},
		{"truncated data", func(dir string) {
			os.Truncate(filepath.Join(dir, "data-00000.bin"), 100)
		}, "truncated"},
		{"tampered blob", func(dir string) {
			os.WriteFile(filepath.Join(dir, "train_state"), []byte(`{"step":6}`), 0o644)
		}, "checksum mismatch"},
		{"corrupt metadata", func(dir string) {
			os.WriteFile(filepath.Join(dir, "metadata.json"), []byte(`{"vers`), 0o644)
		}, "corrupt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			data := randomShards(rand.New(rand.NewPCG(2, 2)), 256)
			if err := Save(dir, 1, []Shard{{Name: "w", Shape: []int{256}, Data: data}}, map[string][]byte{"train_state": []byte(`{"step":1}`)}); err != nil {
				t.Fatal(err)
			}
			tc.damage(StepDir(dir, 1))
			rd, err := Open(StepDir(dir, 1))
			if err == nil {
				err = rd.Verify()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// fullDisk fails every write after limit bytes, like ENOSPC.
type fullDisk struct {
	*os.File
	left *int
}

func (f fullDisk) Write(b []byte) (int, error) {
	if len(b) > *f.left {
		return 0, errors.New("no space left on device")
	}
	*f.left -= len(b)
	return f.File.Write(b)
}

func TestDiskFullKeepsPreviousCheckpoint(t *testing.T) {
	dir := t.TempDir()
	data := randomShards(rand.New(rand.NewPCG(3, 3)), 4096)
	if err := Save(dir, 1, []Shard{{Name: "w", Shape: []int{4096}, Data: data}}, nil); err != nil {
		t.Fatal(err)
	}
	left := 5000
	old := createFile
	createFile = func(p string) (writeSyncCloser, error) {
		f, err := os.Create(p)
		return fullDisk{f, &left}, err
	}
	err := Save(dir, 2, []Shard{{Name: "w", Shape: []int{4096}, Data: data}}, nil)
	createFile = old
	if err == nil || !strings.Contains(err.Error(), "no space") {
		t.Fatalf("save on a full disk: %v", err)
	}
	if s, ok, _ := Latest(dir); !ok || s != 1 {
		t.Fatalf("latest after failed save = %d, %v; want 1", s, ok)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp") {
			t.Errorf("temporary folder %s left behind", e.Name())
		}
	}
	rd, err := Open(StepDir(dir, 1))
	if err != nil || rd.Verify() != nil {
		t.Fatalf("previous checkpoint damaged: %v", err)
	}
}

// TestKillDuringSave kills a process in the middle of writing a large
// checkpoint; the previous checkpoint must still load.
func TestKillDuringSave(t *testing.T) {
	if dir := os.Getenv("TITAN_CKPT_HELPER_DIR"); dir != "" {
		big := make([]float32, 64<<20) // 256 MiB: takes a while to write and fsync
		for {
			Save(dir, 2, []Shard{{Name: "w", Shape: []int{len(big)}, Data: big}}, nil)
		}
	}
	dir := t.TempDir()
	data := randomShards(rand.New(rand.NewPCG(4, 4)), 1024)
	if err := Save(dir, 1, []Shard{{Name: "w", Shape: []int{1024}, Data: data}}, nil); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillDuringSave$")
	cmd.Env = append(os.Environ(), "TITAN_CKPT_HELPER_DIR="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until the save is under way, then kill -9.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir(dir)
		if len(ents) > 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	cmd.Process.Kill()
	cmd.Wait()
	s, ok, err := Latest(dir)
	if err != nil || !ok {
		t.Fatalf("no checkpoint after kill: %v", err)
	}
	rd, err := Open(StepDir(dir, s))
	if err != nil {
		t.Fatal(err)
	}
	if err := rd.Verify(); err != nil {
		t.Fatalf("checkpoint of step %d does not verify after a kill: %v", s, err)
	}
	if s == 1 {
		got := make([]float32, 1024)
		if err := rd.Read("w", 0, got); err != nil || got[5] != data[5] {
			t.Fatalf("previous checkpoint changed: %v", err)
		}
	}
	if err := Purge(dir, 0); err != nil {
		t.Fatal(err)
	}
}
