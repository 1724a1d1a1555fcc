package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"

	"github.com/titan-go/titan/internal/atomicfile"
)

// Spec names a tensor to write and gives its shape.
type Spec struct {
	Name  string
	Shape []int
}

// NumElements is the product of the shape (1 for a scalar).
func (s Spec) NumElements() int {
	n := 1
	for _, d := range s.Shape {
		n *= d
	}
	return n
}

// Source yields the values of tensor i of the list being written, as
// row-major float32 of exactly that tensor's size. The writer is done with
// the slice when the next call is made, so a Source may reuse one buffer.
type Source func(i int) ([]float32, error)

// SliceSource serves tensors from memory: tensor i is data[i].
func SliceSource(data [][]float32) Source {
	return func(i int) ([]float32, error) { return data[i], nil }
}

// WriteFile writes the tensors to one safetensors file at path, encoded as
// F32 or BF16 (round to nearest even), in the order given. The data goes
// to a temporary file in the same folder which is synced and then renamed
// over path, so readers never see a partial file.
func WriteFile(path string, dtype DType, specs []Spec, src Source, metadata map[string]string) error {
	if dtype != F32 && dtype != BF16 {
		return fmt.Errorf("safetensors: writing %s: unsupported dtype %q (want F32 or BF16)", path, dtype)
	}
	hdr, err := header(specs, dtype, metadata)
	if err != nil {
		return fmt.Errorf("safetensors: writing %s: %w", path, err)
	}
	return writeAtomic(path, func(f io.Writer) error {
		var lenBuf [8]byte
		binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hdr)))
		if _, err := f.Write(lenBuf[:]); err != nil {
			return err
		}
		if _, err := f.Write(hdr); err != nil {
			return err
		}
		buf := make([]byte, chunkBytes)
		for i, s := range specs {
			data, err := src(i)
			if err != nil {
				return fmt.Errorf("tensor %q: %w", s.Name, err)
			}
			if len(data) != s.NumElements() {
				return fmt.Errorf("tensor %q: source gave %d values for shape %v", s.Name, len(data), s.Shape)
			}
			if err := encode(f, buf, dtype, data); err != nil {
				return fmt.Errorf("tensor %q: %w", s.Name, err)
			}
		}
		return nil
	})
}

// header builds the JSON header, padded with spaces to a multiple of 8
// bytes so that the data section is aligned.
func header(specs []Spec, dtype DType, metadata map[string]string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	if len(metadata) > 0 {
		m, err := json.Marshal(metadata)
		if err != nil {
			return nil, err
		}
		b.WriteString(`"__metadata__":`)
		b.Write(m)
	}
	seen := make(map[string]bool, len(specs))
	var off int64
	for _, s := range specs {
		if s.Name == "" || s.Name == "__metadata__" || seen[s.Name] {
			return nil, fmt.Errorf("invalid or duplicate tensor name %q", s.Name)
		}
		seen[s.Name] = true
		n := int64(dtype.Size())
		for _, d := range s.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: negative dimension in shape %v", s.Name, s.Shape)
			}
			n *= int64(d)
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(s.Name)
		shape, _ := json.Marshal(append([]int{}, s.Shape...))
		fmt.Fprintf(&b, `%s:{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}`, name, dtype, shape, off, off+n)
		off += n
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return b.Bytes(), nil
}

// encode writes data in dtype through the staging buffer buf.
func encode(f io.Writer, buf []byte, dtype DType, data []float32) error {
	es := dtype.Size()
	per := len(buf) / es
	for lo := 0; lo < len(data); lo += per {
		chunk := data[lo:min(lo+per, len(data))]
		out := buf[:len(chunk)*es]
		if dtype == F32 {
			for i, v := range chunk {
				binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
			}
		} else {
			for i, v := range chunk {
				binary.LittleEndian.PutUint16(out[2*i:], Float32ToBF16(v))
			}
		}
		if _, err := f.Write(out); err != nil {
			return err
		}
	}
	return nil
}

// writeAtomic is atomicfile.Write with safetensors' errors.
func writeAtomic(path string, fill func(w io.Writer) error) error {
	if err := atomicfile.Write(path, fill); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// Names of the files in a checkpoint folder, as Hugging Face spells them.
const (
	SingleFile = "model.safetensors"
	IndexFile  = "model.safetensors.index.json"
)

var shardName = regexp.MustCompile(`^model-[0-9]{5}-of-[0-9]{5}\.safetensors$`)

// index is the JSON of model.safetensors.index.json.
type index struct {
	Metadata  map[string]any    `json:"metadata,omitempty"`
	WeightMap map[string]string `json:"weight_map"`
}

// WriteDir writes the tensors into the folder dir (created if needed) as
// a Hugging Face checkpoint. When maxShardBytes is positive and the
// encoded tensors exceed it, they are split in order into shards
// model-0000i-of-0000n.safetensors of at most maxShardBytes each (a larger
// tensor gets a shard of its own) and model.safetensors.index.json maps
// each tensor to its shard; otherwise everything goes to model.safetensors.
// It returns the names of the files written, the index last.
//
// Files of a previous export that would shadow or clutter the new one are
// removed: model.safetensors when writing shards, and the index and any
// model-*-of-*.safetensors not just written.
func WriteDir(dir string, dtype DType, specs []Spec, src Source, maxShardBytes int64, metadata map[string]string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	es := int64(dtype.Size())
	var groups [][]int
	var total, cur int64
	for i, s := range specs {
		n := int64(s.NumElements()) * es
		if len(groups) == 0 || (maxShardBytes > 0 && cur > 0 && cur+n > maxShardBytes) {
			groups = append(groups, nil)
			cur = 0
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], i)
		cur += n
		total += n
	}
	if len(groups) <= 1 {
		path := filepath.Join(dir, SingleFile)
		if err := WriteFile(path, dtype, specs, src, metadata); err != nil {
			return nil, err
		}
		if err := removeStale(dir, nil, true); err != nil {
			return nil, err
		}
		return []string{SingleFile}, nil
	}
	idx := index{Metadata: map[string]any{"total_size": total}, WeightMap: map[string]string{}}
	var files []string
	for g, members := range groups {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", g+1, len(groups))
		sub := make([]Spec, len(members))
		for j, i := range members {
			sub[j] = specs[i]
			idx.WeightMap[specs[i].Name] = name
		}
		first := members[0]
		if err := WriteFile(filepath.Join(dir, name), dtype, sub, func(j int) ([]float32, error) { return src(first + j) }, metadata); err != nil {
			return nil, err
		}
		files = append(files, name)
	}
	js, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	ipath := filepath.Join(dir, IndexFile)
	if err := writeAtomic(ipath, func(f io.Writer) error { _, err := f.Write(append(js, '\n')); return err }); err != nil {
		return nil, err
	}
	files = append(files, IndexFile)
	if err := removeStale(dir, files, false); err != nil {
		return nil, err
	}
	return files, nil
}

// removeStale deletes checkpoint files in dir that are not in keep.
func removeStale(dir string, keep []string, single bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	kept := map[string]bool{}
	for _, k := range keep {
		kept[k] = true
	}
	for _, e := range entries {
		n := e.Name()
		stale := shardName.MatchString(n) && !kept[n]
		if single {
			stale = stale || n == IndexFile
		} else {
			stale = stale || n == SingleFile
		}
		if stale {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("safetensors: removing stale %w", err)
			}
		}
	}
	return nil
}

// Checkpoint is a folder of one or more safetensors files read as one
// set of tensors.
type Checkpoint struct {
	dir   string
	files []*File
	where map[string]*File
}

// OpenDir opens the Hugging Face checkpoint in dir: model.safetensors when
// present (as transformers prefers it), else the shards listed by
// model.safetensors.index.json. With an index, its weight_map is the set
// of tensors: each must exist in the named shard, and tensors of a shard
// that the index does not list are an error too.
func OpenDir(dir string) (*Checkpoint, error) {
	single := filepath.Join(dir, SingleFile)
	if _, err := os.Stat(single); err == nil {
		f, err := Open(single)
		if err != nil {
			return nil, err
		}
		c := &Checkpoint{dir: dir, files: []*File{f}, where: map[string]*File{}}
		for n := range f.tensors {
			c.where[n] = f
		}
		return c, nil
	}
	ipath := filepath.Join(dir, IndexFile)
	raw, err := os.ReadFile(ipath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("safetensors: %s has neither %s nor %s", dir, SingleFile, IndexFile)
	}
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	var idx index
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", ipath, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("safetensors: %s: empty or missing weight_map", ipath)
	}
	c := &Checkpoint{dir: dir, where: map[string]*File{}}
	byFile := map[string]*File{}
	names := make([]string, 0, len(idx.WeightMap))
	for n := range idx.WeightMap {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fname := idx.WeightMap[n]
		if !filepath.IsLocal(fname) {
			c.Close()
			return nil, fmt.Errorf("safetensors: %s: tensor %q maps to %q, which is not a file inside %s", ipath, n, fname, dir)
		}
		f := byFile[fname]
		if f == nil {
			f, err = Open(filepath.Join(dir, fname))
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("%w (shard listed in %s)", err, ipath)
			}
			byFile[fname] = f
			c.files = append(c.files, f)
		}
		if _, ok := f.tensors[n]; !ok {
			c.Close()
			return nil, fmt.Errorf("safetensors: %s lists tensor %q in %s, which lacks it", ipath, n, f.path)
		}
		c.where[n] = f
	}
	for _, f := range c.files {
		for _, n := range f.Names() {
			if c.where[n] != f {
				c.Close()
				return nil, fmt.Errorf("safetensors: tensor %q in %s is not mapped to that file by %s", n, f.path, ipath)
			}
		}
	}
	return c, nil
}

// Names lists every tensor of the checkpoint, sorted.
func (c *Checkpoint) Names() []string {
	names := make([]string, 0, len(c.where))
	for n := range c.where {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Info describes the named tensor.
func (c *Checkpoint) Info(name string) (TensorInfo, bool) {
	f, ok := c.where[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Info(name)
}

// File is the path of the file that holds the named tensor.
func (c *Checkpoint) File(name string) string {
	if f, ok := c.where[name]; ok {
		return f.path
	}
	return ""
}

// ReadFloat32 converts the named tensor into dst (see [File.ReadFloat32]).
func (c *Checkpoint) ReadFloat32(name string, dst []float32) error {
	f, ok := c.where[name]
	if !ok {
		return fmt.Errorf("safetensors: checkpoint %s has no tensor %q", c.dir, name)
	}
	return f.ReadFloat32(name, dst)
}

// Close closes every file of the checkpoint.
func (c *Checkpoint) Close() error {
	var first error
	for _, f := range c.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	c.files = nil
	return first
}
