package checkpoint

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// save1 writes a one-tensor checkpoint of step, full or model-only.
func save1(t testing.TB, dir string, step int, full bool) {
	t.Helper()
	blobs := map[string][]byte{"model_config.json": []byte(`{}`)}
	if full {
		blobs[TrainStateBlob] = []byte(fmt.Sprintf(`{"step":%d}`, step))
	}
	if err := Save(dir, step, []Shard{{Name: "w", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}}}, blobs); err != nil {
		t.Fatal(err)
	}
}

// deadPID is the pid of a process of this host that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run true: %v", err)
	}
	return cmd.ProcessState.Pid()
}

func TestContentsRecorded(t *testing.T) {
	dir := t.TempDir()
	save1(t, dir, 1, true)
	save1(t, dir, 2, false)
	for step, want := range map[int]string{1: ContentsFull, 2: ContentsModel} {
		r, err := Open(StepDir(dir, step))
		if err != nil {
			t.Fatal(err)
		}
		if r.Meta.Contents != want || r.Meta.Full() != (want == ContentsFull) {
			t.Errorf("step %d: contents %q, full %v; want %q", step, r.Meta.Contents, r.Meta.Full(), want)
		}
	}
}

// TestScanReportsDamagedFolders: every damaged step folder is reported
// by name with its reason, the intact ones are listed.
func TestScanReportsDamagedFolders(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(dir string)
		want   string
	}{
		{"metadata missing", func(d string) { os.Remove(filepath.Join(d, "metadata.json")) }, "metadata.json is missing"},
		{"metadata corrupt", func(d string) { os.WriteFile(filepath.Join(d, "metadata.json"), []byte(`{"version":`), 0o644) }, "corrupt"},
		{"shard missing", func(d string) { os.Remove(filepath.Join(d, "data-00000.bin")) }, "missing shard file data-00000.bin"},
		{"shard truncated", func(d string) { os.Truncate(filepath.Join(d, "data-00000.bin"), 8) }, "truncated"},
		{"blob truncated", func(d string) { os.WriteFile(filepath.Join(d, TrainStateBlob), []byte(`{}`), 0o644) }, "truncated or corrupt"},
		{"step mismatch", func(d string) { os.Rename(d, filepath.Join(filepath.Dir(d), "step-7")) }, "says step 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			save1(t, dir, 3, true)
			save1(t, dir, 5, true)
			tc.damage(StepDir(dir, 5))
			infos, problems, err := Scan(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(infos) != 1 || infos[0].Step != 3 {
				t.Errorf("intact: %+v, want step 3 only", infos)
			}
			if len(problems) != 1 || !strings.Contains(problems[0].Error(), "step-") || !strings.Contains(problems[0].Error(), tc.want) {
				t.Fatalf("problems %v, want one naming its folder and %q", problems, tc.want)
			}
		})
	}
}

// TestPurgeKeepsNewestFull: keep_latest_k never deletes the newest full
// checkpoint, whatever model-only checkpoints follow it.
func TestPurgeKeepsNewestFull(t *testing.T) {
	dir := t.TempDir()
	save1(t, dir, 5, true)
	save1(t, dir, 10, true)
	save1(t, dir, 20, false)
	save1(t, dir, 30, false)
	if err := Purge(dir, 1); err != nil {
		t.Fatal(err)
	}
	steps, _ := Steps(dir)
	if fmt.Sprint(steps) != "[10 30]" {
		t.Fatalf("after purge keep 1: %v, want [10 30]", steps)
	}
}

// TestPurgeSparesLiveTemporaryFolders: cleanup removes the temporary
// folders of processes that are gone, never those of a live one.
func TestPurgeSparesLiveTemporaryFolders(t *testing.T) {
	dir := t.TempDir()
	save1(t, dir, 1, true)
	me := self()
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mine := mk(fmt.Sprintf(".tmp-step-2-p%d-%s-123", me.PID, hostTag(me.Host)))
	other := mk(fmt.Sprintf(".tmp-step-2-p%d-%s-456", os.Getppid(), hostTag(me.Host)))
	remote := mk(fmt.Sprintf(".tmp-step-2-p%d-%s-789", deadPID(t), "elsewhere"))
	dead := mk(fmt.Sprintf(".tmp-old-step-2-p%d-%s-42", deadPID(t), hostTag(me.Host)))
	if err := Purge(dir, 0); err != nil {
		t.Fatal(err)
	}
	for p, keep := range map[string]bool{mine: true, other: true, remote: true, dead: false} {
		_, err := os.Stat(p)
		if (err == nil) != keep {
			t.Errorf("%s: kept %v, want %v", filepath.Base(p), err == nil, keep)
		}
	}
}

// TestLock: a second holder is refused with the first's host and pid; a
// lock of a process gone from this host is stale and taken over; a lock
// of another host is respected; Release removes the file.
func TestLock(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	me := self()
	_, err = Acquire(dir)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("pid %d on host %s", me.PID, me.Host)) {
		t.Fatalf("second acquire: %v, want a refusal naming the holder", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, LockFile)); !os.IsNotExist(err) {
		t.Fatalf("lock file after release: %v", err)
	}
	for _, tc := range []struct {
		name   string
		holder Owner
		want   string // "" : taken over
	}{
		{"dead pid on this host", Owner{Host: me.Host, PID: deadPID(t)}, ""},
		{"live pid on this host", Owner{Host: me.Host, PID: os.Getppid()}, fmt.Sprintf("pid %d on host %s", os.Getppid(), me.Host)},
		{"other host", Owner{Host: "node-7", PID: 4242}, "pid 4242 on host node-7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := json.Marshal(tc.holder)
			if err := os.WriteFile(filepath.Join(dir, LockFile), b, 0o644); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(filepath.Join(dir, LockFile))
			l, err := Acquire(dir)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("stale lock not taken over: %v", err)
				}
				l.Release()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a refusal naming %q", err, tc.want)
			}
		})
	}
}

// TestOpenRejectsHostileMetadata: every count, shape, offset and file
// name is checked against limits and the files' sizes before anything is
// allocated, with an error naming what is wrong.
func TestOpenRejectsHostileMetadata(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(m *Metadata)
		want string
	}{
		{"huge shape", func(m *Metadata) { tm := m.Tensors["w"]; tm.Shape = []int{1 << 30, 1 << 30}; m.Tensors["w"] = tm }, "more than"},
		{"overflowing shape", func(m *Metadata) {
			tm := m.Tensors["w"]
			tm.Shape = []int{1 << 40, 1 << 40, 1 << 40}
			m.Tensors["w"] = tm
		}, "more than"},
		{"negative dim", func(m *Metadata) { tm := m.Tensors["w"]; tm.Shape = []int{-2, -3}; m.Tensors["w"] = tm }, "negative dimension"},
		{"too many dims", func(m *Metadata) { tm := m.Tensors["w"]; tm.Shape = make([]int, 20); m.Tensors["w"] = tm }, "dimensions"},
		{"dtype", func(m *Metadata) { tm := m.Tensors["w"]; tm.DType = "int8"; m.Tensors["w"] = tm }, `dtype "int8"`},
		{"chunk past file", func(m *Metadata) {
			tm := m.Tensors["w"]
			tm.Shape = []int{1 << 20}
			tm.Chunks[0].Len = 1 << 20
			m.Tensors["w"] = tm
		}, "truncated"},
		{"negative pos", func(m *Metadata) { m.Tensors["w"].Chunks[0].Pos = -8 }, "truncated"},
		{"chunks short of the shape", func(m *Metadata) { tm := m.Tensors["w"]; tm.Shape = []int{4, 3}; m.Tensors["w"] = tm }, "hold 6 of its 12 elements"},
		{"chunk outside shape", func(m *Metadata) { m.Tensors["w"].Chunks[0].Offset = 5 }, "outside its shape"},
		{"overlapping chunks", func(m *Metadata) {
			tm := m.Tensors["w"]
			tm.Chunks = append(tm.Chunks, Chunk{Offset: 2, Len: 2, File: tm.Chunks[0].File})
			m.Tensors["w"] = tm
		}, "overlap"},
		{"path traversal", func(m *Metadata) { m.Tensors["w"].Chunks[0].File = "../../etc/passwd" }, "not a plain file name"},
		{"blob size", func(m *Metadata) { b := m.Blobs[TrainStateBlob]; b.Size = 1 << 40; m.Blobs[TrainStateBlob] = b }, "metadata says"},
		{"contents", func(m *Metadata) { m.Contents = "everything" }, "contents"},
		{"negative step", func(m *Metadata) { m.Step = -1 }, "negative step"},
		{"version", func(m *Metadata) { m.Version = 9 }, "format version 9"},
		{"huge world", func(m *Metadata) { m.Layout = &Layout{World: 1 << 40} }, "a layout of"},
		{"degree past world", func(m *Metadata) { m.Layout = &Layout{World: 2, TP: 4} }, "degree outside"},
		{"part of a rank past world", func(m *Metadata) { m.Ranks[0].Rank = 7 }, "bad part"},
		{"part file traversal", func(m *Metadata) { m.Ranks[0].File = "../x" }, "bad part"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			save1(t, dir, 1, true)
			sd := StepDir(dir, 1)
			raw, _ := os.ReadFile(filepath.Join(sd, "metadata.json"))
			var m Metadata
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			tc.edit(&m)
			raw, _ = json.Marshal(m)
			os.WriteFile(filepath.Join(sd, "metadata.json"), raw, 0o644)
			if err := Reseal(sd); err != nil {
				t.Fatal(err)
			}
			_, err := Open(sd)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
