package checkpoint

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRanksWriteInParallel: four ranks write their own ranges of two
// tensors (one rank nothing, as a replica does) concurrently; rank 0
// commits; the checkpoint reads back bit for bit under any range, records
// the layout and each rank's part, and nothing is visible before the
// commit.
func TestRanksWriteInParallel(t *testing.T) {
	folder := t.TempDir()
	r := rand.New(rand.NewPCG(3, 3))
	w, b := randomShards(r, 1000), randomShards(r, 10)
	// rank → its shards: w in three uneven ranges, b whole on rank 2.
	mine := [][]Shard{
		{{Name: "w", Shape: []int{10, 100}, Offset: 0, Data: w[:250]}},
		{{Name: "w", Shape: []int{10, 100}, Offset: 250, Data: w[250:900]}},
		{{Name: "w", Shape: []int{10, 100}, Offset: 900, Data: w[900:]}, {Name: "b", Shape: []int{10}, Data: b}},
		nil,
	}
	session := NewSession()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for rank := 0; rank < 4; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := Begin(folder, 7, session, 4)
			if err != nil {
				errs[rank] = err
				return
			}
			var blobs map[string][]byte
			if rank == 0 {
				blobs = map[string][]byte{TrainStateBlob: []byte(`{"step":7}`)}
			}
			if rank != 0 {
				time.Sleep(time.Duration(rank) * 5 * time.Millisecond) // rank 0 waits for the others
			}
			if errs[rank] = p.WritePart(rank, mine[rank], blobs); errs[rank] != nil || rank != 0 {
				return
			}
			if _, ok, _ := Latest(folder); ok {
				errs[rank] = errEarly
				return
			}
			errs[rank] = p.Commit(Layout{World: 4, PP: 1, DPReplicate: 1, DPShard: 4, CP: 1, TP: 1}, time.Minute)
		}()
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
	}
	rd, err := Open(StepDir(folder, 7))
	if err != nil {
		t.Fatal(err)
	}
	if err := rd.Verify(); err != nil {
		t.Fatal(err)
	}
	if !rd.Meta.Full() || rd.Meta.Layout == nil || rd.Meta.Layout.DPShard != 4 || len(rd.Meta.Ranks) != 4 {
		t.Fatalf("metadata: full %v, layout %+v, ranks %+v", rd.Meta.Full(), rd.Meta.Layout, rd.Meta.Ranks)
	}
	if p := rd.Meta.Ranks[3]; p.File != "" || p.Bytes != 0 {
		t.Errorf("rank 3 wrote nothing, its part says %+v", p)
	}
	if p := rd.Meta.Ranks[2]; p.File != DataFile(2) || p.Bytes != 4*110 || p.Chunks != 2 {
		t.Errorf("rank 2's part: %+v", p)
	}
	for _, rg := range [][2]int{{0, 1000}, {240, 260}, {899, 901}, {0, 1}} {
		got := make([]float32, rg[1]-rg[0])
		if err := rd.Read("w", rg[0], got); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if got[i] != w[rg[0]+i] {
				t.Fatalf("w range %v element %d: %v, want %v", rg, i, got[i], w[rg[0]+i])
			}
		}
	}
	got := make([]float32, 10)
	if err := rd.Read("b", 0, got); err != nil || got[9] != b[9] {
		t.Fatalf("b: %v %v", got, err)
	}
}

var errEarly = errorString("a checkpoint became visible before its commit")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestCommitRefusesBadParts: a rank's failure is the commit's error at
// once; a rank that never writes fails it after the timeout, naming the
// rank; ranks whose chunks overlap (two replicas writing the same range)
// or leave a gap are refused; nothing becomes visible in either case.
func TestCommitRefusesBadParts(t *testing.T) {
	sh := func(off, n int) []Shard {
		return []Shard{{Name: "w", Shape: []int{8}, Offset: off, Data: make([]float32, n)}}
	}
	for _, tc := range []struct {
		name  string
		parts [][]Shard // nil entry: the rank writes nothing at all
		fail  int       // rank whose write fails (-1: none)
		want  string
	}{
		{"rank failed", [][]Shard{sh(0, 4), sh(4, 4)}, 1, "rank 1 failed to write its part"},
		{"rank missing", [][]Shard{sh(0, 4), nil}, -1, "no part from rank(s) [1]"},
		{"overlap", [][]Shard{sh(0, 4), sh(0, 8)}, -1, "overlap"},
		{"gap", [][]Shard{sh(0, 4), sh(5, 3)}, -1, "hold 7 of its 8 elements"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			folder := t.TempDir()
			p, err := Begin(folder, 1, NewSession(), 2)
			if err != nil {
				t.Fatal(err)
			}
			for rank, s := range tc.parts {
				if s == nil {
					continue
				}
				if rank == tc.fail {
					s = []Shard{{Name: "w", Shape: []int{2}, Offset: 1, Data: make([]float32, 4)}} // exceeds its shape
					if err := p.WritePart(rank, s, nil); err == nil {
						t.Fatal("a shard past its shape was written")
					}
					continue
				}
				if err := p.WritePart(rank, s, nil); err != nil {
					t.Fatal(err)
				}
			}
			err = p.Commit(Layout{World: 2}, 200*time.Millisecond)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("commit: %v, want an error containing %q", err, tc.want)
			}
			if _, ok, _ := Latest(folder); ok {
				t.Error("a failed commit made a checkpoint visible")
			}
		})
	}
}

// TestMarkerMakesTheStep: a step folder whose commit marker is missing
// or does not match its metadata is an incomplete checkpoint, reported by
// name by Scan; a version 1 checkpoint (no marker) still loads.
func TestMarkerMakesTheStep(t *testing.T) {
	folder := t.TempDir()
	for _, s := range []int{1, 2, 3} {
		save1(t, folder, s, true)
	}
	os.Remove(filepath.Join(StepDir(folder, 2), CommitMarker))
	os.WriteFile(filepath.Join(StepDir(folder, 3), CommitMarker), []byte(`{"step":3,"metadata_crc32c":1}`), 0o644)
	infos, problems, err := Scan(folder)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Step != 1 || len(problems) != 2 {
		t.Fatalf("infos %v, problems %v", infos, problems)
	}
	if !strings.Contains(problems[0].Error(), "step-2") || !strings.Contains(problems[0].Error(), "no commit marker") {
		t.Errorf("problem %v", problems[0])
	}
	if !strings.Contains(problems[1].Error(), "step-3") || !strings.Contains(problems[1].Error(), "does not match metadata.json") {
		t.Errorf("problem %v", problems[1])
	}
	// Version 1: the same folder as the old writer left it.
	sd := StepDir(folder, 1)
	raw, _ := os.ReadFile(filepath.Join(sd, "metadata.json"))
	var m Metadata
	json.Unmarshal(raw, &m)
	m.Version, m.Layout, m.Ranks = 1, nil, nil
	raw, _ = json.Marshal(m)
	os.WriteFile(filepath.Join(sd, "metadata.json"), raw, 0o644)
	os.Remove(filepath.Join(sd, CommitMarker))
	rd, err := Open(sd)
	if err != nil {
		t.Fatalf("a version 1 checkpoint: %v", err)
	}
	if err := rd.Verify(); err != nil {
		t.Fatal(err)
	}
}

// TestReadAfterVerifyReadsRanges: once verified, ranges of a chunk are
// read on their own and still right; a corrupt chunk is caught by the
// first read that touches it.
func TestReadAfterVerifyReadsRanges(t *testing.T) {
	folder := t.TempDir()
	r := rand.New(rand.NewPCG(5, 5))
	w := randomShards(r, 4096)
	if err := Save(folder, 1, []Shard{{Name: "w", Shape: []int{4096}, Data: w}}, nil); err != nil {
		t.Fatal(err)
	}
	rd, err := Open(StepDir(folder, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := rd.Verify(); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 3)
	if err := rd.Read("w", 4000, got); err != nil || got[0] != w[4000] || got[2] != w[4002] {
		t.Fatalf("range after verify: %v %v", got, err)
	}
	// Flip a byte: a fresh reader's first read of the chunk fails.
	df := filepath.Join(StepDir(folder, 1), DataFile(0))
	raw, _ := os.ReadFile(df)
	raw[100] ^= 1
	os.WriteFile(df, raw, 0o644)
	rd2, err := Open(StepDir(folder, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := rd2.Read("w", 4000, got); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("corrupt chunk read: %v", err)
	}
}

// TestSaveReplacesTheSameStep: saving a step again replaces its
// checkpoint with the new one (and leaves no folder aside).
func TestSaveReplacesTheSameStep(t *testing.T) {
	folder := t.TempDir()
	for i := 1; i <= 3; i++ {
		if err := Save(folder, 5, []Shard{{Name: "w", Shape: []int{1}, Data: []float32{float32(i)}}}, nil); err != nil {
			t.Fatalf("save %d: %v", i, err)
		}
	}
	rd, err := Open(StepDir(folder, 5))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 1)
	if err := rd.Read("w", 0, got); err != nil || got[0] != 3 {
		t.Fatalf("step 5 holds %v (%v), want the last save's 3", got, err)
	}
	if ents, _ := os.ReadDir(folder); len(ents) != 1 {
		t.Errorf("folder holds %d entries, want only step-5", len(ents))
	}
}

// TestContiguousShardsOneChunk checks that shards continuing the one
// written before them (the same tensor, the next elements) are stored as
// one chunk whose checksum covers them all, and that shards that do not
// (out of order, interleaved with another tensor) keep chunks of their
// own; every element reads back either way.
func TestContiguousShardsOneChunk(t *testing.T) {
	dir := t.TempDir()
	data := make([]float32, 40)
	for i := range data {
		data[i] = float32(i)
	}
	shape := []int{4, 5}
	shards := []Shard{
		// a: rows 0, 1, 2 in order: one chunk; then row 0 of b, then
		// a's last row, which no longer follows a's chunk in the file.
		{Name: "a", Shape: shape, Offset: 0, Data: data[0:5]},
		{Name: "a", Shape: shape, Offset: 5, Data: data[5:10]},
		{Name: "a", Shape: shape, Offset: 10, Data: data[10:15]},
		{Name: "b", Shape: shape, Offset: 0, Data: data[20:25]},
		{Name: "a", Shape: shape, Offset: 15, Data: data[15:20]},
		// b: rows 3 and 2, backwards: two chunks; then row 1.
		{Name: "b", Shape: shape, Offset: 15, Data: data[35:40]},
		{Name: "b", Shape: shape, Offset: 10, Data: data[30:35]},
		{Name: "b", Shape: shape, Offset: 5, Data: data[25:30]},
	}
	if err := Save(dir, 1, shards, nil); err != nil {
		t.Fatal(err)
	}
	rd, err := Open(StepDir(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if err := rd.Verify(); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][][2]int{"a": {{0, 15}, {15, 5}}, "b": {{0, 5}, {5, 5}, {10, 5}, {15, 5}}} {
		var got [][2]int
		for _, c := range rd.Meta.Tensors[name].Chunks {
			got = append(got, [2]int{c.Offset, c.Len})
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("chunks of %s (offset, len): %v, want %v", name, got, want)
		}
	}
	for name, off := range map[string]int{"a": 0, "b": 20} {
		got := make([]float32, 20)
		if err := rd.Read(name, 0, got); err != nil {
			t.Fatal(err)
		}
		for i, v := range got {
			if v != data[off+i] {
				t.Fatalf("%s[%d] = %v, want %v", name, i, v, data[off+i])
			}
		}
	}
}
