// Package checkpoint saves and loads training state as step folders:
//
//	<folder>/step-<N>/metadata.json   tensors, their chunks and checksums
//	<folder>/step-<N>/data-<R>.bin    raw little-endian chunk data of writer R
//	<folder>/step-<N>/<blob>.json     small states (train state, data loader)
//
// A tensor is stored under its logical name and full shape as one or more
// chunks, each a contiguous range of the flattened tensor. A reader asks
// for any range of any tensor and gets it from whichever chunks cover it,
// so a checkpoint written under one sharding loads under another.
//
// Saves are atomic: everything is written into a temporary folder, fsynced,
// and renamed into place, so an interrupted save (a kill, a full disk)
// leaves the previous checkpoints untouched. Every chunk and blob carries
// a CRC-32C that is verified when read. Temporary folders are named after
// the process that writes them (.tmp-step-<N>-p<pid>-<host>-<random>), and
// cleanup removes only those of processes that are gone, never another
// live run's.
//
// A checkpoint is full when it holds the training state (the blob
// [TrainStateBlob]: a run can resume from it exactly) and model-only
// otherwise; metadata.json records which under "contents".
//
// Nothing read from disk is trusted: [Open] checks every shape, count,
// offset and file name of metadata.json against sane limits and the sizes
// of the files beside it before anything is allocated, and [Scan] reports
// step folders that are incomplete or corrupt by name instead of skipping
// them silently.
package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Version is the metadata format version this package writes.
const Version = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Chunk is a contiguous range [Offset, Offset+Len) of a flattened tensor,
// stored in File at byte position Pos.
type Chunk struct {
	Offset int    `json:"offset"`
	Len    int    `json:"len"`
	File   string `json:"file"`
	Pos    int64  `json:"pos"`
	CRC32C uint32 `json:"crc32c"`
}

// TensorMeta describes one logical tensor.
type TensorMeta struct {
	DType  string  `json:"dtype"` // "float32"
	Shape  []int   `json:"shape"`
	Chunks []Chunk `json:"chunks"`
}

// BlobMeta describes one small opaque state.
type BlobMeta struct {
	File   string `json:"file"`
	Size   int64  `json:"size"`
	CRC32C uint32 `json:"crc32c"`
}

// Metadata is the content of metadata.json.
type Metadata struct {
	Version int `json:"version"`
	Step    int `json:"step"`
	// Contents is ContentsFull or ContentsModel; empty in checkpoints
	// written before it existed (see [Metadata.Full]).
	Contents string                `json:"contents,omitempty"`
	Tensors  map[string]TensorMeta `json:"tensors"`
	Blobs    map[string]BlobMeta   `json:"blobs"`
}

// TrainStateBlob is the blob that makes a checkpoint full: the training
// loop's step, optimizer step and seed. A checkpoint without it holds no
// state to resume from.
const TrainStateBlob = "train_state.json"

// The values of Metadata.Contents.
const (
	ContentsFull  = "full"  // the whole training state: a run resumes from it exactly
	ContentsModel = "model" // weights (and model description) only
)

// Full reports whether the checkpoint holds the full training state.
func (m Metadata) Full() bool {
	if m.Contents != "" {
		return m.Contents == ContentsFull
	}
	_, ok := m.Blobs[TrainStateBlob]
	return ok
}

// Kind is "full" or "model-only", for messages.
func (m Metadata) Kind() string {
	if m.Full() {
		return "full"
	}
	return "model-only"
}

// Shard is the part of a logical tensor a writer holds.
type Shard struct {
	Name   string
	Shape  []int // full logical shape
	Offset int   // element offset of Data within the flattened tensor
	Data   []float32
}

// numel is the product of the shape.
func numel(shape []int) int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return n
}

var stepDir = regexp.MustCompile(`^step-(\d+)$`)

// StepDir is the folder of a step's checkpoint.
func StepDir(folder string, step int) string {
	return filepath.Join(folder, "step-"+strconv.Itoa(step))
}

// Steps lists the steps of the complete, well-formed checkpoints in
// folder, ascending (see [Scan], which also says why the others are not
// listed).
func Steps(folder string) ([]int, error) {
	infos, _, err := Scan(folder)
	if err != nil {
		return nil, err
	}
	steps := make([]int, len(infos))
	for i, in := range infos {
		steps[i] = in.Step
	}
	return steps, nil
}

// Latest returns the newest complete checkpoint's step, or ok=false.
func Latest(folder string) (step int, ok bool, err error) {
	steps, err := Steps(folder)
	if err != nil || len(steps) == 0 {
		return 0, false, err
	}
	return steps[len(steps)-1], true, nil
}

// Save writes the shards and blobs as the checkpoint of step in folder,
// atomically, replacing an existing checkpoint of the same step.
func Save(folder string, step int, shards []Shard, blobs map[string][]byte) error {
	if err := os.MkdirAll(folder, 0o755); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	tmp, err := os.MkdirTemp(folder, tmpPrefix(fmt.Sprintf("step-%d", step)))
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	meta := Metadata{Version: Version, Step: step, Contents: ContentsModel, Tensors: map[string]TensorMeta{}, Blobs: map[string]BlobMeta{}}
	if _, ok := blobs[TrainStateBlob]; ok {
		meta.Contents = ContentsFull
	}
	const dataFile = "data-00000.bin"
	f, err := createFile(filepath.Join(tmp, dataFile))
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	var pos int64
	buf := make([]byte, 0, 1<<20)
	for _, s := range shards {
		if s.Offset < 0 || s.Offset+len(s.Data) > numel(s.Shape) {
			f.Close()
			return fmt.Errorf("checkpoint: shard of %s at %d+%d exceeds its shape %v", s.Name, s.Offset, len(s.Data), s.Shape)
		}
		crc := uint32(0)
		for i := 0; i < len(s.Data); {
			n := min(len(s.Data)-i, cap(buf)/4)
			buf = buf[:4*n]
			for j := 0; j < n; j++ {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(s.Data[i+j]))
			}
			crc = crc32.Update(crc, castagnoli, buf)
			if _, err := f.Write(buf); err != nil {
				f.Close()
				return fmt.Errorf("checkpoint: writing %s: %w", s.Name, err)
			}
			i += n
		}
		tm := meta.Tensors[s.Name]
		if tm.Shape == nil {
			tm = TensorMeta{DType: "float32", Shape: s.Shape}
		}
		tm.Chunks = append(tm.Chunks, Chunk{Offset: s.Offset, Len: len(s.Data), File: dataFile, Pos: pos, CRC32C: crc})
		meta.Tensors[s.Name] = tm
		pos += int64(4 * len(s.Data))
	}
	if err := closeSynced(f); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	for name, b := range blobs {
		file := name
		if err := writeFileSynced(filepath.Join(tmp, file), b); err != nil {
			return fmt.Errorf("checkpoint: blob %s: %w", name, err)
		}
		meta.Blobs[name] = BlobMeta{File: file, Size: int64(len(b)), CRC32C: crc32.Checksum(b, castagnoli)}
	}
	mj, err := json.MarshalIndent(meta, "", " ")
	if err != nil {
		return err
	}
	// metadata.json last: its presence marks a complete checkpoint.
	if err := writeFileSynced(filepath.Join(tmp, "metadata.json"), mj); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := syncDir(tmp); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	final := StepDir(folder, step)
	if _, err := os.Stat(final); err == nil {
		// Move the old one aside under a name of this process's own (an
		// empty folder a directory rename may replace), then drop it.
		old, err := os.MkdirTemp(folder, tmpPrefix(fmt.Sprintf("old-step-%d", step)))
		if err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		if err := os.Rename(final, old); err != nil {
			os.Remove(old)
			return fmt.Errorf("checkpoint: %w", err)
		}
		defer os.RemoveAll(old)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	ok = true
	return syncDir(folder)
}

// Purge removes all but the newest keep checkpoints, and the temporary
// folders that processes now gone left behind. It never removes the
// newest full checkpoint (the one a run resumes from), even when keep
// newer model-only checkpoints follow it, nor a step folder [Scan]
// reports as damaged, nor a live process's temporary folder. keep <= 0
// keeps every checkpoint.
func Purge(folder string, keep int) error {
	ents, _ := os.ReadDir(folder)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") && leftover(filepath.Join(folder, e.Name())) {
			os.RemoveAll(filepath.Join(folder, e.Name()))
		}
	}
	if keep <= 0 {
		return nil
	}
	infos, _, err := Scan(folder)
	if err != nil {
		return err
	}
	newestFull := -1
	for _, in := range infos {
		if in.Meta.Full() {
			newestFull = in.Step
		}
	}
	for i := 0; i < len(infos)-keep; i++ {
		if infos[i].Step == newestFull {
			continue
		}
		if err := os.RemoveAll(infos[i].Dir); err != nil {
			return fmt.Errorf("checkpoint: purging step %d: %w", infos[i].Step, err)
		}
	}
	return nil
}

// Reader reads a saved checkpoint.
type Reader struct {
	Dir  string
	Meta Metadata
}

// Open reads and checks the metadata of the checkpoint in dir.
func Open(dir string) (*Reader, error) {
	mp := filepath.Join(dir, "metadata.json")
	if st, err := os.Stat(mp); err == nil && st.Size() > MaxMetadataBytes {
		return nil, fmt.Errorf("checkpoint: %s is %d bytes, more than the %d a metadata file may have", mp, st.Size(), MaxMetadataBytes)
	}
	raw, err := os.ReadFile(mp)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s is not a checkpoint: %w", dir, err)
	}
	r := &Reader{Dir: dir}
	if err := json.Unmarshal(raw, &r.Meta); err != nil {
		return nil, fmt.Errorf("checkpoint: %s/metadata.json is corrupt: %w", dir, err)
	}
	if err := r.Meta.validate(dir); err != nil {
		return nil, err
	}
	return r, nil
}

// Has reports whether the checkpoint holds tensor name.
func (r *Reader) Has(name string) bool { _, ok := r.Meta.Tensors[name]; return ok }

// Read fills dst with elements [offset, offset+len(dst)) of tensor name,
// verifying the checksum of every chunk it touches.
func (r *Reader) Read(name string, offset int, dst []float32) error {
	t, ok := r.Meta.Tensors[name]
	if !ok {
		return fmt.Errorf("checkpoint: %s holds no tensor %q", r.Dir, name)
	}
	end := offset + len(dst)
	if offset < 0 || end > numel(t.Shape) {
		return fmt.Errorf("checkpoint: range [%d, %d) outside %s of shape %v", offset, end, name, t.Shape)
	}
	covered := 0
	for _, c := range t.Chunks {
		lo, hi := max(offset, c.Offset), min(end, c.Offset+c.Len)
		if lo >= hi {
			continue
		}
		data, err := r.chunk(name, c)
		if err != nil {
			return err
		}
		copy(dst[lo-offset:hi-offset], data[lo-c.Offset:hi-c.Offset])
		covered += hi - lo
	}
	if covered != len(dst) {
		return fmt.Errorf("checkpoint: %s: chunks of %s cover %d of the %d elements asked for", r.Dir, name, covered, len(dst))
	}
	return nil
}

func (r *Reader) chunk(name string, c Chunk) ([]float32, error) {
	path := filepath.Join(r.Dir, c.File)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 4*c.Len)
	if _, err := f.ReadAt(buf, c.Pos); err != nil {
		return nil, fmt.Errorf("checkpoint: %s is truncated (reading %s at byte %d): %w", path, name, c.Pos, err)
	}
	if got := crc32.Checksum(buf, castagnoli); got != c.CRC32C {
		return nil, fmt.Errorf("checkpoint: checksum mismatch in %s for %s (crc32c %08x, metadata says %08x): the file is corrupt", path, name, got, c.CRC32C)
	}
	out := make([]float32, c.Len)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return out, nil
}

// Blob returns the named small state, verified.
func (r *Reader) Blob(name string) ([]byte, error) {
	b, ok := r.Meta.Blobs[name]
	if !ok {
		return nil, fmt.Errorf("checkpoint: %s holds no %q state", r.Dir, name)
	}
	path := filepath.Join(r.Dir, b.File)
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if int64(len(raw)) != b.Size || crc32.Checksum(raw, castagnoli) != b.CRC32C {
		return nil, fmt.Errorf("checkpoint: checksum mismatch in %s: the file is corrupt", path)
	}
	return raw, nil
}

// Verify reads every chunk and blob and checks its checksum.
func (r *Reader) Verify() error {
	for name, t := range r.Meta.Tensors {
		for _, c := range t.Chunks {
			if _, err := r.chunk(name, c); err != nil {
				return err
			}
		}
	}
	for name := range r.Meta.Blobs {
		if _, err := r.Blob(name); err != nil {
			return err
		}
	}
	return nil
}

// createFile is os.Create; tests replace it to simulate a full disk.
var createFile = func(path string) (writeSyncCloser, error) { return os.Create(path) }

type writeSyncCloser interface {
	io.WriteCloser
	Sync() error
}

func closeSynced(f writeSyncCloser) error {
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeFileSynced(path string, b []byte) error {
	f, err := createFile(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return closeSynced(f)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
