package main

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/straggler"
	"github.com/titan-go/titan/internal/testenv"
)

// tbEvents is what internal/tensorboard/testdata/read_events.py (an
// independent reader: its own CRC-32C, its own protobuf decoder) finds in
// the event files under dir: per file its version and events.
type tbFile struct {
	File        string `json:"file"`
	FileVersion string `json:"file_version"`
	Events      []struct {
		Step   int                `json:"step"`
		Values map[string]float64 `json:"values"`
	} `json:"events"`
}

func readTB(t *testing.T, dir string) []tbFile {
	t.Helper()
	_, err := os.Stat(testenv.Python)
	testenv.Require(t, testenv.Python, err == nil)
	out, err := exec.Command(testenv.Python, "../../internal/tensorboard/testdata/read_events.py", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("read_events.py %s: %v\n%s", dir, err, out)
	}
	var files []tbFile
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		var f tbFile
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Fatalf("read_events.py: %v: %q", err, line)
		}
		files = append(files, f)
	}
	return files
}

// jsonlRecords reads a metrics JSONL file as key → value per step.
func jsonlRecords(t *testing.T, path string) map[int]map[string]float64 {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var m map[string]float64
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		out[int(m["step"])] = m
	}
	return out
}

// sameAsJSONL requires that the one event file in dir holds, at every
// step of the JSONL file, every metric under its tag, equal to the JSONL
// value rounded to float32, and nothing else.
func sameAsJSONL(t *testing.T, dir, jsonl string) {
	t.Helper()
	files := readTB(t, dir)
	if len(files) != 1 {
		t.Fatalf("%s: %d event files, want 1", dir, len(files))
	}
	f := files[0]
	if f.FileVersion != "brain.Event:2" || !strings.HasPrefix(filepath.Base(f.File), "events.out.tfevents.") {
		t.Fatalf("%s: file_version %q", f.File, f.FileVersion)
	}
	want := jsonlRecords(t, jsonl)
	if len(f.Events) != 1+len(want) {
		t.Fatalf("%s: %d events, want the version event and %d steps", f.File, len(f.Events), len(want))
	}
	compared := 0
	for _, ev := range f.Events[1:] {
		rec, ok := want[ev.Step]
		if !ok {
			t.Errorf("step %d is in TensorBoard, not in %s", ev.Step, jsonl)
			continue
		}
		n := 0
		for _, kt := range metrics.TensorBoardTags {
			w, inJSON := rec[kt.Key]
			got, inTB := ev.Values[kt.Tag]
			if inJSON != inTB {
				t.Errorf("step %d: %s in jsonl %v, %s in TensorBoard %v", ev.Step, kt.Key, inJSON, kt.Tag, inTB)
				continue
			}
			if !inJSON {
				continue
			}
			n++
			if got != float64(float32(w)) || math.IsNaN(got) {
				t.Errorf("step %d %s: TensorBoard %v, jsonl %v (float32 %v)", ev.Step, kt.Tag, got, w, float32(w))
			}
			compared++
		}
		if n != len(ev.Values) {
			t.Errorf("step %d: %d TensorBoard values, %d known tags: %v", ev.Step, len(ev.Values), n, ev.Values)
		}
		// Every JSONL key but the step is a TensorBoard tag.
		if len(rec)-1 != n {
			t.Errorf("step %d: jsonl has %d metrics, TensorBoard %d", ev.Step, len(rec)-1, n)
		}
	}
	t.Logf("%s: %d steps, %d values equal to %s", dir, len(f.Events)-1, compared, filepath.Base(jsonl))
}

// TestTensorBoardMatchesMetrics: metrics.enable_tensorboard writes one
// event file under <dump>/<save_tb_folder> with every metric of
// metrics.jsonl at every logged step (val_loss on the validation steps),
// as read back by an independent reader.
func TestTensorBoardMatchesMetrics(t *testing.T) {
	dump := t.TempDir()
	args := set(tinyRun(dump, corpus(t), 4), "checkpoint.enable=false", "metrics.enable_tensorboard=true", "metrics.save_tb_folder=tbx",
		"validation.enable=true", "validation.freq=2", "validation.steps=1", "validation.seq_len=32", "validation.local_batch_size=2")
	if out, err := titan(t, args...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := jsonlRecords(t, filepath.Join(dump, "metrics.jsonl")); len(got) != 4 || got[2]["val_loss"] == 0 {
		t.Fatalf("metrics.jsonl: %v", got)
	}
	sameAsJSONL(t, filepath.Join(dump, "tbx"), filepath.Join(dump, "metrics.jsonl"))
	if _, err := os.Stat(filepath.Join(dump, "tb")); err == nil {
		t.Error("the default folder tb was written too")
	}
}

// TestTensorBoardAllRanks: with metrics.save_for_all_ranks every rank
// writes <tb>/rank_<R>, each equal to its own metrics JSONL file; without
// it rank 0 alone writes <tb>.
func TestTensorBoardAllRanks(t *testing.T) {
	data := corpus(t)
	all := t.TempDir()
	if out, err := titan(t, append(set(tinyRun(all, data, 2), "checkpoint.enable=false", "training.local_batch_size=1",
		"metrics.enable_tensorboard=true", "metrics.save_for_all_ranks=true"), "--nproc", "2")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for rank := 0; rank < 2; rank++ {
		sameAsJSONL(t, metrics.TensorBoardDir(all, "tb", rank, true), filepath.Join(all, metrics.RankFile(rank)))
	}
	one := t.TempDir()
	if out, err := titan(t, append(set(tinyRun(one, data, 2), "checkpoint.enable=false", "training.local_batch_size=1",
		"metrics.enable_tensorboard=true"), "--nproc", "2")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if files := readTB(t, filepath.Join(one, "tb")); len(files) != 1 {
		t.Errorf("without save_for_all_ranks: %d event files, want rank 0's alone", len(files))
	}
	sameAsJSONL(t, filepath.Join(one, "tb"), filepath.Join(one, "metrics.jsonl"))
}

// TestStragglerNamed: in a 4-process run where the test hook
// TITAN_TEST_SLOW_RANK makes rank 1 sleep 150 ms of every step, rank 0's
// log names rank 1, its host and its ratio to the median within 5 steps
// (the detector needs straggler.DefaultSteps = 3 in a row).
func TestStragglerNamed(t *testing.T) {
	t.Setenv(straggler.EnvSlowRank, "1:150")
	dump := t.TempDir()
	out, err := titan(t, append(set(tinyRun(dump, corpus(t), 6), "checkpoint.enable=false", "training.local_batch_size=1"), "--nproc", "4")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	host, _ := os.Hostname()
	re := regexp.MustCompile(`straggler: rank 1 on (\S+) computed ([0-9.]+)x the median step \((\S+) vs (\S+) at step (\d+), (\d+) steps in a row\)`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no straggler line naming rank 1:\n%s", out)
	}
	ratio, _ := strconv.ParseFloat(m[2], 64)
	slow, err1 := time.ParseDuration(m[3])
	step, _ := strconv.Atoi(m[5])
	if m[1] != host || ratio <= straggler.DefaultFactor || err1 != nil || slow < 150*time.Millisecond || step > 5 || m[6] != "3" {
		t.Errorf("straggler line %q: host %s (want %s), ratio %v, compute %v (want >= 150ms), step %d (want <= 5)", m[0], m[1], host, ratio, slow, step)
	}
	t.Logf("%s", m[0])
}
