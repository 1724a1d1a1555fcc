package checkpoint

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
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

// CommitMarker is the file whose presence makes a version 2 step folder
// a complete checkpoint. It is written after metadata.json and holds its
// checksum.
const CommitMarker = "COMMITTED"

// DataFile and PartFile name rank's data file and part file.
func DataFile(rank int) string { return fmt.Sprintf("data-%05d.bin", rank) }
func PartFile(rank int) string { return fmt.Sprintf("part-%05d.json", rank) }

// partErrFile is the file a rank leaves instead of its part when its
// write failed, so that the commit fails at once with its error.
func partErrFile(rank int) string { return fmt.Sprintf("part-%05d.err", rank) }

var partName = regexp.MustCompile(`^part-(\d{5})\.json$`)

// NewSession returns a name for the saves of one run: the leading
// process's pid and host and a random tag, as the temporary folders of
// its saves carry it (see [Begin]). Every rank of a job must use the
// same session (rank 0's, shared once at start-up).
func NewSession() string {
	me := self()
	var b [6]byte
	rand.Read(b[:])
	return fmt.Sprintf("p%d-%s-%s", me.PID, hostTag(me.Host), hex.EncodeToString(b[:]))
}

var sessionName = regexp.MustCompile(`^p\d+-[A-Za-z0-9._]+-[0-9a-f]+$`)

// Pending is a checkpoint of one step being written by the ranks of a
// job into a temporary folder they share.
type Pending struct {
	Folder string // the checkpoint folder
	Step   int
	Dir    string // the temporary step folder
	World  int    // the ranks that write a part
}

// Begin opens (creating it if no other rank has yet) the temporary
// folder of step's checkpoint in folder for session (see [NewSession]),
// written by world ranks. Every rank calls it with the same arguments.
func Begin(folder string, step int, session string, world int) (*Pending, error) {
	if !sessionName.MatchString(session) {
		return nil, fmt.Errorf("checkpoint: bad session name %q", session)
	}
	if world < 1 {
		return nil, fmt.Errorf("checkpoint: %d writers", world)
	}
	dir := filepath.Join(folder, fmt.Sprintf(".tmp-step-%d-%s", step, session))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return &Pending{Folder: folder, Step: step, Dir: dir, World: world}, nil
}

// part is the content of a part file: what one rank wrote.
type part struct {
	Version int                   `json:"version"`
	Step    int                   `json:"step"`
	Rank    int                   `json:"rank"`
	World   int                   `json:"world"`
	Tensors map[string]TensorMeta `json:"tensors"`
	Blobs   map[string]BlobMeta   `json:"blobs"`
}

// WritePart writes rank's shards into its data file and its blobs, each
// fsynced, and then its part file (renamed into place: its presence
// means the rank is done, and the rank touches the folder no more). Nothing is shared with the other ranks but
// the folder. On an error it leaves an error file, so that the commit
// fails with it instead of waiting.
func (p *Pending) WritePart(rank int, shards []Shard, blobs map[string][]byte) (err error) {
	defer func() {
		if err != nil {
			os.WriteFile(filepath.Join(p.Dir, partErrFile(rank)), []byte(err.Error()), 0o644)
		}
	}()
	if rank < 0 || rank >= p.World {
		return fmt.Errorf("checkpoint: rank %d of %d", rank, p.World)
	}
	pt := part{Version: Version, Step: p.Step, Rank: rank, World: p.World, Tensors: map[string]TensorMeta{}, Blobs: map[string]BlobMeta{}}
	if len(shards) > 0 {
		if err := p.writeData(rank, shards, pt.Tensors); err != nil {
			return err
		}
	}
	for name, b := range blobs {
		if !plainName(name) || name == "metadata.json" || name == CommitMarker || partName.MatchString(name) {
			return fmt.Errorf("checkpoint: %q cannot name a state", name)
		}
		if err := writeFileSynced(filepath.Join(p.Dir, name), b); err != nil {
			return fmt.Errorf("checkpoint: state %s: %w", name, err)
		}
		pt.Blobs[name] = BlobMeta{File: name, Size: int64(len(b)), CRC32C: crc32.Checksum(b, castagnoli)}
	}
	raw, err := json.Marshal(pt)
	if err != nil {
		return err
	}
	tmp := filepath.Join(p.Dir, PartFile(rank)+".tmp")
	if err := writeFileSynced(tmp, raw); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	// The rename is the last thing a writer does to the folder: its part
	// file complete, the committer may rename the folder away at once
	// (syncing the folder after it raced with that: ENOENT on a rank
	// whose part had landed). The commit fsyncs the folder before its
	// rename, which makes every part's entry durable.
	if err := os.Rename(tmp, filepath.Join(p.Dir, PartFile(rank))); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// writeData writes the shards into rank's data file, recording them in
// tensors: one chunk each, except that a shard that continues the one
// written before it (the same tensor, the next elements) extends its
// chunk, so that a tensor handed over row by row (a column-sharded
// weight without tensor parallelism) is one chunk, not thousands.
func (p *Pending) writeData(rank int, shards []Shard, tensors map[string]TensorMeta) error {
	file := DataFile(rank)
	f, err := createFile(filepath.Join(p.Dir, file))
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	var pos int64
	var buf []byte // leBytes's, on a big-endian machine
	for _, s := range shards {
		if s.Offset < 0 || s.Offset+len(s.Data) > numel(s.Shape) {
			f.Close()
			return fmt.Errorf("checkpoint: shard of %s at %d+%d exceeds its shape %v", s.Name, s.Offset, len(s.Data), s.Shape)
		}
		tm := tensors[s.Name]
		if tm.Shape == nil {
			tm = TensorMeta{DType: "float32", Shape: s.Shape}
		}
		// The chunk this shard extends: the last one, when it ends
		// where the shard begins, both in the tensor and in the file.
		var last *Chunk
		if k := len(tm.Chunks) - 1; k >= 0 {
			if c := &tm.Chunks[k]; c.Offset+c.Len == s.Offset && c.Pos+4*int64(c.Len) == pos {
				last = c
			}
		}
		crc := uint32(0)
		if last != nil {
			crc = last.CRC32C // continued over the shard's bytes
		}
		for i := 0; i < len(s.Data); {
			n := min(len(s.Data)-i, writeBlock)
			if !nativeLE && buf == nil {
				buf = make([]byte, 4*writeBlock)
			}
			b := leBytes(s.Data[i:i+n], buf)
			crc = crc32.Update(crc, castagnoli, b)
			if _, err := f.Write(b); err != nil {
				f.Close()
				return fmt.Errorf("checkpoint: writing %s: %w", s.Name, err)
			}
			i += n
		}
		if last != nil {
			last.Len += len(s.Data)
			last.CRC32C = crc
		} else {
			tm.Chunks = append(tm.Chunks, Chunk{Offset: s.Offset, Len: len(s.Data), File: file, Pos: pos, CRC32C: crc})
		}
		tensors[s.Name] = tm
		pos += int64(4 * len(s.Data))
		if hook := writeHook; hook != nil {
			hook(p.Step, p.Dir, s.Name)
		}
	}
	if err := closeSynced(f); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// writeBlock is the elements writeData writes (and converts, on a
// big-endian machine) at a time.
const writeBlock = 1 << 18

// nativeLE reports whether this machine stores float32 little-endian, as
// the data files do: then the bytes of a []float32 are written and read
// as they are, without conversion.
var nativeLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// leBytes returns x as little-endian bytes: x's own memory on a
// little-endian machine, else encoded into buf (4·len(x) bytes of room).
func leBytes(x []float32, buf []byte) []byte {
	if len(x) == 0 {
		return nil
	}
	if nativeLE {
		return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
	}
	buf = buf[:4*len(x)]
	for j, v := range x {
		binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(v))
	}
	return buf
}

// fromLE decodes little-endian bytes b into dst (len(b) = 4·len(dst)).
func fromLE(dst []float32, b []byte) {
	if nativeLE && len(dst) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), b)
		return
	}
	for j := range dst {
		dst[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
	}
}

// writeHook, when set, is called after every shard written (see
// PauseEnv).
var writeHook func(step int, dir, tensor string)

// PauseEnv names the environment variable with which a test of kill -9
// during a save makes a process pause in the middle of writing a
// checkpoint: "<step>:<duration>" pauses every rank's writing of step's
// checkpoint after its first shard for duration, announcing it with a
// file "<temporary folder>.writing-<pid>" beside the folder.
const PauseEnv = "TITAN_TEST_SAVE_PAUSE"

func init() {
	v := os.Getenv(PauseEnv)
	at, dur, ok := strings.Cut(v, ":")
	step, err1 := strconv.Atoi(at)
	d, err2 := time.ParseDuration(dur)
	if !ok || err1 != nil || err2 != nil {
		return
	}
	var once sync.Once
	writeHook = func(s int, dir, tensor string) {
		if s != step {
			return
		}
		once.Do(func() {
			os.WriteFile(fmt.Sprintf("%s.writing-%d", dir, os.Getpid()), []byte(tensor), 0o644)
			time.Sleep(d)
		})
	}
}

// Abort removes the temporary folder (rank 0, after a failed save).
func (p *Pending) Abort() { os.RemoveAll(p.Dir) }

// Commit, on rank 0, waits up to timeout for every rank's part file,
// merges them into metadata.json (every chunk checked against its data
// file, every tensor tiled exactly once by the ranks' chunks), writes the
// commit marker, fsyncs, and renames the folder into place as step's
// checkpoint, replacing an older one of the same step. A rank that
// failed is reported with its error; one that never writes its part
// fails the commit after timeout. layout records how the job was laid
// out.
func (p *Pending) Commit(layout Layout, timeout time.Duration) error {
	parts, err := p.waitParts(timeout)
	if err != nil {
		return err
	}
	meta := Metadata{Version: Version, Step: p.Step, Contents: ContentsModel, Tensors: map[string]TensorMeta{}, Blobs: map[string]BlobMeta{}, Layout: &layout}
	if layout.World != p.World {
		return fmt.Errorf("checkpoint: a layout of %d ranks for %d writers", layout.World, p.World)
	}
	for _, pt := range parts {
		rp := RankPart{Rank: pt.Rank}
		file := DataFile(pt.Rank)
		for name, t := range pt.Tensors {
			m, ok := meta.Tensors[name]
			if !ok {
				m = TensorMeta{DType: t.DType, Shape: t.Shape}
			} else if m.DType != t.DType || !slices.Equal(m.Shape, t.Shape) {
				return fmt.Errorf("checkpoint: %s: rank %d wrote %s as %s %v, another rank as %s %v", p.Dir, pt.Rank, name, t.DType, t.Shape, m.DType, m.Shape)
			}
			for _, c := range t.Chunks {
				if c.File != file {
					return fmt.Errorf("checkpoint: %s: the part of rank %d names file %q", p.Dir, pt.Rank, c.File)
				}
				rp.File = c.File
				rp.Bytes += 4 * int64(c.Len)
				rp.Chunks++
			}
			if m.Chunks == nil {
				m.Chunks = t.Chunks // the part's own list: nothing else uses it
			} else {
				m.Chunks = append(m.Chunks, t.Chunks...)
			}
			meta.Tensors[name] = m
		}
		for name, b := range pt.Blobs {
			if _, dup := meta.Blobs[name]; dup {
				return fmt.Errorf("checkpoint: %s: state %s written by two ranks", p.Dir, name)
			}
			meta.Blobs[name] = b
		}
		meta.Ranks = append(meta.Ranks, rp)
	}
	if _, ok := meta.Blobs[TrainStateBlob]; ok {
		meta.Contents = ContentsFull
	}
	// The same checks as a reader's: the ranks' chunks tile every tensor.
	if err := meta.validate(p.Dir); err != nil {
		return fmt.Errorf("checkpoint: the ranks' parts do not make a checkpoint: %w", err)
	}
	mj, err := json.MarshalIndent(meta, "", " ")
	if err != nil {
		return err
	}
	if err := writeFileSynced(filepath.Join(p.Dir, "metadata.json"), mj); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	mk, _ := json.Marshal(marker{Step: p.Step, MetadataCRC32C: crc32.Checksum(mj, castagnoli)})
	if err := writeFileSynced(filepath.Join(p.Dir, CommitMarker), mk); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := syncDir(p.Dir); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	final := StepDir(p.Folder, p.Step)
	if _, err := os.Stat(final); err == nil {
		// Move the old one aside into a folder of this process's own
		// (cleanup knows whose it is), then drop it.
		old, err := os.MkdirTemp(p.Folder, tmpPrefix(fmt.Sprintf("old-step-%d", p.Step)))
		if err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		if err := os.Rename(final, filepath.Join(old, "step")); err != nil {
			os.Remove(old)
			return fmt.Errorf("checkpoint: %w", err)
		}
		defer os.RemoveAll(old)
	}
	if err := os.Rename(p.Dir, final); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return syncDir(p.Folder)
}

// marker is the content of the commit marker.
type marker struct {
	Step           int    `json:"step"`
	MetadataCRC32C uint32 `json:"metadata_crc32c"`
}

// checkMarker checks dir's commit marker against its metadata.json (raw).
func checkMarker(dir string, raw []byte, step int) error {
	p := filepath.Join(dir, CommitMarker)
	if st, err := os.Stat(p); err == nil && st.Size() > 1<<10 {
		return fmt.Errorf("checkpoint: %s is %d bytes, not a commit marker", p, st.Size())
	}
	mk, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("checkpoint: %s has no commit marker %s: its save did not finish (an incomplete checkpoint)", dir, CommitMarker)
	}
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	var m marker
	if err := json.Unmarshal(mk, &m); err != nil {
		return fmt.Errorf("checkpoint: %s is corrupt: %w", p, err)
	}
	if got := crc32.Checksum(raw, castagnoli); m.MetadataCRC32C != got || m.Step != step {
		return fmt.Errorf("checkpoint: %s does not match metadata.json (step %d, crc32c %08x; metadata.json: step %d, crc32c %08x): the metadata is corrupt", p, m.Step, m.MetadataCRC32C, step, got)
	}
	return nil
}

// waitParts waits for the part files of every rank and reads them,
// sorted by rank.
func (p *Pending) waitParts(timeout time.Duration) ([]part, error) {
	deadline := time.Now().Add(timeout)
	parts := make([]part, p.World)
	have := make([]bool, p.World)
	left := p.World
	delay := time.Millisecond
	for {
		for r := 0; r < p.World; r++ {
			if have[r] {
				continue
			}
			if msg, err := os.ReadFile(filepath.Join(p.Dir, partErrFile(r))); err == nil {
				return nil, fmt.Errorf("checkpoint: rank %d failed to write its part of step %d: %s", r, p.Step, truncate(string(msg), 500))
			}
			pt, err := readPart(filepath.Join(p.Dir, PartFile(r)))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if pt.Version != Version || pt.Step != p.Step || pt.Rank != r || pt.World != p.World {
				return nil, fmt.Errorf("checkpoint: %s is the part of version %d, step %d, rank %d of %d; want version %d, step %d, rank %d of %d", PartFile(r), pt.Version, pt.Step, pt.Rank, pt.World, Version, p.Step, r, p.World)
			}
			parts[r], have[r] = pt, true
			left--
		}
		if left == 0 {
			return parts, nil
		}
		if time.Now().After(deadline) {
			var missing []string
			for r, ok := range have {
				if !ok {
					missing = append(missing, strconv.Itoa(r))
				}
			}
			sort.Strings(missing)
			return nil, fmt.Errorf("checkpoint: step %d: no part from rank(s) %v after %v (a rank died or is stuck before its save, or the checkpoint folder is not shared between the ranks' hosts)", p.Step, missing, timeout)
		}
		time.Sleep(delay)
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// readPart reads and parses a part file, bounded in size.
func readPart(path string) (part, error) {
	var pt part
	st, err := os.Stat(path)
	if err != nil {
		return pt, err
	}
	if st.Size() > MaxMetadataBytes {
		return pt, fmt.Errorf("checkpoint: %s is %d bytes, more than the %d a part file may have", path, st.Size(), MaxMetadataBytes)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return pt, err
	}
	if err := json.Unmarshal(raw, &pt); err != nil {
		return pt, fmt.Errorf("checkpoint: %s is corrupt: %w", path, err)
	}
	return pt, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Reseal rewrites the commit marker of the step folder dir to match its
// metadata.json as it is now, for tests and tools that edit the metadata
// on purpose (a hostile file can do the same: the marker guards against
// torn or partial saves, not against forgery; [Open] validates the
// metadata either way).
func Reseal(dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, "metadata.json"))
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	var m struct{ Step int }
	json.Unmarshal(raw, &m)
	mk, _ := json.Marshal(marker{Step: m.Step, MetadataCRC32C: crc32.Checksum(raw, castagnoli)})
	return os.WriteFile(filepath.Join(dir, CommitMarker), mk, 0o644)
}
