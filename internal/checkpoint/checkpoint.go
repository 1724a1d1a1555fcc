// Package checkpoint saves and loads training state as step folders:
//
//	<folder>/step-<N>/metadata.json   tensors, their chunks and checksums, the layout
//	<folder>/step-<N>/data-<R>.bin    raw little-endian chunk data of rank R
//	<folder>/step-<N>/part-<R>.json   what rank R wrote (merged into metadata.json)
//	<folder>/step-<N>/<blob>.json     small states (train state, data loader)
//	<folder>/step-<N>/COMMITTED       the commit marker, written last
//
// A tensor is stored under its logical name and full shape as one or more
// chunks, each a contiguous range of the flattened tensor. A reader asks
// for any range of any tensor and gets it from whichever chunks cover it,
// so a checkpoint written under one sharding loads under another.
//
// Every rank of a job writes its own chunks in parallel (see [Begin]):
// each into its own data file of a temporary step folder the ranks share,
// followed by a part file listing them; rank 0 then waits for every
// rank's part, merges them into metadata.json (checking that the chunks
// tile every tensor exactly), writes the commit marker last, fsyncs and
// renames the folder into place. The handshake is on files, not on
// collectives, so that it can run on background goroutines while
// training goes on (asynchronous saves). A step folder without the
// marker is an incomplete save and is never loaded. An interrupted save
// (a kill, a full disk) leaves the previous checkpoints untouched. Every
// chunk and blob carries a CRC-32C that is verified when read. Temporary
// folders are named after the process that leads the save
// (.tmp-step-<N>-p<pid>-<host>-<random>), and cleanup removes only those
// of processes that are gone, never another live run's.
//
// A checkpoint is full when it holds the training state (the blob
// [TrainStateBlob]: a run can resume from it exactly) and model-only
// otherwise; metadata.json records which under "contents".
//
// Nothing read from disk is trusted: [Open] checks every shape, count,
// offset and file name of metadata.json (and of the part files at a
// commit) against sane limits and the sizes of the files beside it
// before anything is allocated, and [Scan] reports step folders that are
// incomplete or corrupt by name instead of skipping them silently.
// Version 1 checkpoints (one writer, no marker) still load.
package checkpoint

import (
	"cmp"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Version is the metadata format version this package writes: 2, the
// per-rank format with a commit marker. Version 1 checkpoints (written by
// one process, complete when metadata.json exists) are read too.
const Version = 2

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
	// Layout is the parallel layout the checkpoint was saved under and
	// Ranks what each rank wrote (version 2; absent in version 1).
	Layout *Layout    `json:"layout,omitempty"`
	Ranks  []RankPart `json:"ranks,omitempty"`
}

// Layout is the parallel layout a checkpoint was saved under: the world
// size and the mesh degrees (0: unknown).
type Layout struct {
	World       int `json:"world"`
	PP          int `json:"pp,omitempty"`
	DPReplicate int `json:"dp_replicate,omitempty"`
	DPShard     int `json:"dp_shard,omitempty"`
	CP          int `json:"cp,omitempty"`
	TP          int `json:"tp,omitempty"`
}

func (l Layout) String() string {
	if l.PP == 0 {
		return fmt.Sprintf("%d rank(s)", l.World)
	}
	return fmt.Sprintf("%d rank(s): pp %d × dp_replicate %d × dp_shard %d × cp %d × tp %d", l.World, l.PP, l.DPReplicate, l.DPShard, l.CP, l.TP)
}

// RankPart is what one rank wrote of a checkpoint: its data file (""
// when it wrote no tensor data), the bytes and chunks in it.
type RankPart struct {
	Rank   int    `json:"rank"`
	File   string `json:"file,omitempty"`
	Bytes  int64  `json:"bytes"`
	Chunks int    `json:"chunks"`
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
// atomically, replacing an existing checkpoint of the same step: the
// per-rank protocol of [Begin], [Pending.WritePart] and [Pending.Commit]
// with one writer.
func Save(folder string, step int, shards []Shard, blobs map[string][]byte) error {
	p, err := Begin(folder, step, NewSession(), 1)
	if err != nil {
		return err
	}
	if err := p.WritePart(0, shards, blobs); err != nil {
		p.Abort()
		return err
	}
	if err := p.Commit(Layout{World: 1}, time.Minute); err != nil {
		p.Abort()
		return err
	}
	return nil
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

// Reader reads a saved checkpoint. Its methods may be called from
// several goroutines.
type Reader struct {
	Dir  string
	Meta Metadata

	// mem holds the whole tensors of a reader over memory (see
	// [MemReader]); nil for a folder.
	mem map[string][]float32
	mu  sync.Mutex
	// verified are the chunks whose checksum has been checked: reads
	// of them fetch only the bytes asked for.
	verified map[chunkKey]bool
	// files are the data files opened so far (see Close).
	files map[string]*os.File
}

// file returns the open data file path.
func (r *Reader) file(path string) (*os.File, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.files[path]; ok {
		return f, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if r.files == nil {
		r.files = map[string]*os.File{}
	}
	r.files[path] = f
	return f, nil
}

// Close closes the data files the reader opened; it may still be used
// (files are opened again).
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, f := range r.files {
		f.Close()
		delete(r.files, p)
	}
	return nil
}

type chunkKey struct {
	name string
	i    int
}

// Open reads and checks the metadata of the checkpoint in dir: a version
// 2 checkpoint must carry its commit marker (it is otherwise an
// incomplete save), and every count, shape, offset and file name must
// agree with sane limits and the files' sizes.
func Open(dir string) (*Reader, error) {
	mp := filepath.Join(dir, "metadata.json")
	if st, err := os.Stat(mp); err == nil && st.Size() > MaxMetadataBytes {
		return nil, fmt.Errorf("checkpoint: %s is %d bytes, more than the %d a metadata file may have", mp, st.Size(), MaxMetadataBytes)
	}
	raw, err := os.ReadFile(mp)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s is not a checkpoint: %w", dir, err)
	}
	r := &Reader{Dir: dir, verified: map[chunkKey]bool{}}
	if err := json.Unmarshal(raw, &r.Meta); err != nil {
		return nil, fmt.Errorf("checkpoint: %s/metadata.json is corrupt: %w", dir, err)
	}
	if r.Meta.Version >= 2 {
		if err := checkMarker(dir, raw, r.Meta.Step); err != nil {
			return nil, err
		}
	}
	if err := r.Meta.validate(dir); err != nil {
		return nil, err
	}
	r.Meta.sortChunks()
	return r, nil
}

// MemReader is a Reader over whole tensors in memory (such as weights
// imported from another format), so that whatever loads a checkpoint's
// ranges loads them too. Its Dir is what messages call it.
func MemReader(name string, shards []Shard) (*Reader, error) {
	r := &Reader{Dir: name, mem: map[string][]float32{}, verified: map[chunkKey]bool{},
		Meta: Metadata{Version: Version, Contents: ContentsModel, Tensors: map[string]TensorMeta{}, Blobs: map[string]BlobMeta{}}}
	for _, s := range shards {
		if s.Offset != 0 || len(s.Data) != numel(s.Shape) {
			return nil, fmt.Errorf("checkpoint: %s: %s is not a whole tensor", name, s.Name)
		}
		r.mem[s.Name] = s.Data
		r.Meta.Tensors[s.Name] = TensorMeta{DType: "float32", Shape: s.Shape, Chunks: []Chunk{{Len: len(s.Data)}}}
	}
	return r, nil
}

// sortChunks orders every tensor's chunks by offset (validate has checked
// that they do not overlap).
func (m *Metadata) sortChunks() {
	for _, t := range m.Tensors {
		if !slices.IsSortedFunc(t.Chunks, byOffset) {
			slices.SortFunc(t.Chunks, byOffset)
		}
	}
}

// byOffset orders chunks by their offset in the tensor.
func byOffset(a, b Chunk) int { return cmp.Compare(a.Offset, b.Offset) }

// Has reports whether the checkpoint holds tensor name.
func (r *Reader) Has(name string) bool { _, ok := r.Meta.Tensors[name]; return ok }

// Read fills dst with elements [offset, offset+len(dst)) of tensor name,
// verifying the checksum of every chunk it touches (once: a chunk
// already verified is read only where asked).
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
	// The first chunk that ends after offset (chunks are sorted).
	i := sort.Search(len(t.Chunks), func(i int) bool { return t.Chunks[i].Offset+t.Chunks[i].Len > offset })
	for ; i < len(t.Chunks) && t.Chunks[i].Offset < end; i++ {
		c := t.Chunks[i]
		lo, hi := max(offset, c.Offset), min(end, c.Offset+c.Len)
		if lo >= hi {
			continue
		}
		if err := r.readChunk(name, i, c, lo-c.Offset, dst[lo-offset:hi-offset]); err != nil {
			return err
		}
		covered += hi - lo
	}
	if covered != len(dst) {
		return fmt.Errorf("checkpoint: %s: chunks of %s cover %d of the %d elements asked for", r.Dir, name, covered, len(dst))
	}
	return nil
}

// readChunk fills dst with elements [at, at+len(dst)) of chunk i (c) of
// tensor name, checking the chunk's checksum first if no read has yet.
func (r *Reader) readChunk(name string, i int, c Chunk, at int, dst []float32) error {
	if r.mem != nil {
		copy(dst, r.mem[name][c.Offset+at:])
		return nil
	}
	path := filepath.Join(r.Dir, c.File)
	f, err := r.file(path)
	if err != nil {
		return err
	}
	key := chunkKey{name, i}
	r.mu.Lock()
	ok := r.verified[key]
	r.mu.Unlock()
	if !ok {
		if err := verifyChunk(f, path, name, c); err != nil {
			return err
		}
		r.mu.Lock()
		r.verified[key] = true
		r.mu.Unlock()
	}
	if len(dst) == 0 {
		return nil
	}
	pos := c.Pos + 4*int64(at)
	var b []byte
	if nativeLE {
		b = unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)) // straight into dst
	} else {
		b = make([]byte, 4*len(dst))
	}
	if _, err := f.ReadAt(b, pos); err != nil {
		return fmt.Errorf("checkpoint: %s is truncated (reading %s at byte %d): %w", path, name, pos, err)
	}
	if !nativeLE {
		fromLE(dst, b)
	}
	return nil
}

// verifyChunk checks chunk c's checksum, reading it in blocks.
func verifyChunk(f *os.File, path, name string, c Chunk) error {
	buf := make([]byte, min(4*int64(c.Len), 4<<20))
	crc := uint32(0)
	for off, end := c.Pos, c.Pos+4*int64(c.Len); off < end; {
		n := min(int64(len(buf)), end-off)
		if _, err := f.ReadAt(buf[:n], off); err != nil {
			return fmt.Errorf("checkpoint: %s is truncated (reading %s at byte %d): %w", path, name, off, err)
		}
		crc = crc32.Update(crc, castagnoli, buf[:n])
		off += n
	}
	if crc != c.CRC32C {
		return fmt.Errorf("checkpoint: checksum mismatch in %s for %s (crc32c %08x, metadata says %08x): the file is corrupt", path, name, crc, c.CRC32C)
	}
	return nil
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
	if r.mem != nil {
		return nil
	}
	for name, t := range r.Meta.Tensors {
		for i, c := range t.Chunks {
			if c.Len == 0 {
				continue
			}
			if err := r.readChunk(name, i, c, 0, nil); err != nil {
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
