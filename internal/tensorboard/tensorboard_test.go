package tensorboard

import (
	"encoding/json"
	"hash/crc32"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/testenv"
)

// readerEvent is one Event as testdata/read_events.py decodes it.
type readerEvent struct {
	Step     int64              `json:"step"`
	WallTime *float64           `json:"wall_time"`
	Values   map[string]float64 `json:"values"`
}

type readerFile struct {
	File        string        `json:"file"`
	FileVersion string        `json:"file_version"`
	Events      []readerEvent `json:"events"`
}

// readEvents runs the independent Python reader over dir.
func readEvents(t *testing.T, dir string) []readerFile {
	t.Helper()
	_, err := os.Stat(testenv.Python)
	testenv.Require(t, testenv.Python, err == nil)
	out, err := exec.Command(testenv.Python, "testdata/read_events.py", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("read_events.py: %v\n%s", err, out)
	}
	var files []readerFile
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var f readerFile
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Fatalf("read_events.py output %q: %v", line, err)
		}
		files = append(files, f)
	}
	return files
}

// TestMaskedCRCKnownAnswer: CRC-32C of "123456789" is 0xe3069283 (the
// standard check value); the mask is TFRecord's.
func TestMaskedCRCKnownAnswer(t *testing.T) {
	c := crc32.Checksum([]byte("123456789"), castagnoli)
	if c != 0xe3069283 {
		t.Fatalf("crc32c = %#x", c)
	}
	want := ((c >> 15) | (c << 17)) + 0xa282ead8
	if got := MaskedCRC([]byte("123456789")); got != want {
		t.Errorf("masked = %#x, want %#x", got, want)
	}
}

// TestWriterReadBack: the Python reader (its own CRC-32C and protobuf
// decoder) finds the file version first, then each step with every tag
// bit for bit, including values float32 cannot hold exactly.
func TestWriterReadBack(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(w.Path()), "events.out.tfevents.") {
		t.Errorf("file name %s", w.Path())
	}
	wall := time.Unix(1_700_000_000, 250_000_000)
	steps := []struct {
		step int64
		vals []Scalar
	}{
		{1, []Scalar{{"loss", 8.125}, {"lr", float32(1.0 / 3)}}},
		{2, []Scalar{{"loss", -0.1}, {"mfu(%)", math.MaxFloat32}, {"tiny", math.SmallestNonzeroFloat32}}},
		{300000, []Scalar{{"x/y(z)", 0}}},
	}
	for _, s := range steps {
		if err := w.Add(s.step, wall, s.vals); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files := readEvents(t, dir)
	if len(files) != 1 {
		t.Fatalf("%d files", len(files))
	}
	f := files[0]
	if f.FileVersion != FileVersion || len(f.Events) != 1+len(steps) {
		t.Fatalf("file_version %q, %d events", f.FileVersion, len(f.Events))
	}
	for i, s := range steps {
		ev := f.Events[i+1]
		if ev.Step != s.step || ev.WallTime == nil || *ev.WallTime != WallTime(wall) || len(ev.Values) != len(s.vals) {
			t.Errorf("event %d: step %d, %d values, wall_time %v", i+1, ev.Step, len(ev.Values), ev.WallTime)
			continue
		}
		for _, v := range s.vals {
			if got, ok := ev.Values[v.Tag]; !ok || float32(got) != v.Value || got != float64(v.Value) {
				t.Errorf("step %d %s = %v, want %v", s.step, v.Tag, got, v.Value)
			}
		}
	}
}

// TestReaderRejectsCorruption: one flipped byte fails the reader's CRC
// check, so the read-back tests cannot pass on a reader that checks
// nothing.
func TestReaderRejectsCorruption(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(1, time.Now(), []Scalar{{"loss", 1}}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	raw, _ := os.ReadFile(w.Path())
	raw[len(raw)-6] ^= 1
	os.WriteFile(w.Path(), raw, 0o644)
	_, err = os.Stat(testenv.Python)
	testenv.Require(t, testenv.Python, err == nil)
	out, err := exec.Command(testenv.Python, "testdata/read_events.py", dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "bad data CRC") {
		t.Errorf("corrupted file read: %v\n%s", err, out)
	}
}
