package checkpoint

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Limits on what a metadata.json may describe. They are far above any
// real model's and far below what would exhaust memory, so that a corrupt
// or hostile file is refused before anything is allocated from it.
const (
	// MaxMetadataBytes bounds metadata.json itself.
	MaxMetadataBytes = 256 << 20
	// MaxRank bounds the number of dimensions of a tensor.
	MaxRank = 8
	// MaxElements bounds the elements of one tensor (2^40, 4 TiB of float32).
	MaxElements = 1 << 40
	// MaxRanks bounds the ranks of a saved layout.
	MaxRanks = 1 << 20
)

// validate checks every count, shape, offset and file name of m against
// sane limits and against the sizes of the files in dir, so that reading
// what it describes never allocates more than the files hold.
func (m *Metadata) validate(dir string) error {
	mp := filepath.Join(dir, "metadata.json")
	if m.Version != 1 && m.Version != Version {
		return fmt.Errorf("checkpoint: %s has format version %d, this titan reads 1 to %d", dir, m.Version, Version)
	}
	if l := m.Layout; l != nil {
		if l.World < 1 || l.World > MaxRanks || len(m.Ranks) > l.World {
			return fmt.Errorf("checkpoint: %s: a layout of %d ranks with %d parts (at most %d ranks)", mp, l.World, len(m.Ranks), MaxRanks)
		}
		for _, d := range []int{l.PP, l.DPReplicate, l.DPShard, l.CP, l.TP} {
			if d < 0 || d > l.World {
				return fmt.Errorf("checkpoint: %s: layout %+v has a degree outside [0, %d]", mp, *l, l.World)
			}
		}
	}
	for _, rp := range m.Ranks {
		if rp.Rank < 0 || m.Layout == nil || rp.Rank >= m.Layout.World || (rp.File != "" && !plainName(rp.File)) {
			return fmt.Errorf("checkpoint: %s: bad part %+v", mp, rp)
		}
	}
	if m.Step < 0 {
		return fmt.Errorf("checkpoint: %s: negative step %d", mp, m.Step)
	}
	switch m.Contents {
	case "", ContentsFull, ContentsModel:
	default:
		return fmt.Errorf("checkpoint: %s: contents %q is not %q or %q", mp, m.Contents, ContentsFull, ContentsModel)
	}
	sizes := map[string]int64{}
	// fileSize is the size of file, which holds a tensor's chunk (or a
	// state, blob) named name.
	fileSize := func(name string, blob bool, file string) (int64, error) {
		if n, ok := sizes[file]; ok {
			return n, nil
		}
		what := func() string { // built only for an error: once per chunk is garbage
			if blob {
				return "state " + strconv.Quote(name)
			}
			return "tensor " + strconv.Quote(name)
		}
		if !plainName(file) {
			return 0, fmt.Errorf("checkpoint: %s: %s names file %q, which is not a plain file name of the step folder", mp, what(), file)
		}
		st, err := os.Stat(filepath.Join(dir, file))
		if errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("checkpoint: %s: missing shard file %s (of %s)", dir, file, what())
		}
		if err != nil {
			return 0, fmt.Errorf("checkpoint: %s: %w", dir, err)
		}
		if !st.Mode().IsRegular() {
			return 0, fmt.Errorf("checkpoint: %s: %s (of %s) is not a regular file", dir, file, what())
		}
		sizes[file] = st.Size()
		return st.Size(), nil
	}
	for name, t := range m.Tensors {
		if t.DType != "float32" {
			return fmt.Errorf("checkpoint: %s: tensor %q has dtype %q; titan stores float32", mp, name, t.DType)
		}
		n, err := checkedNumel(t.Shape)
		if err != nil {
			return fmt.Errorf("checkpoint: %s: tensor %q: %w", mp, name, err)
		}
		for _, c := range t.Chunks {
			if c.Offset < 0 || c.Len < 0 || c.Offset > n || c.Len > n-c.Offset {
				return fmt.Errorf("checkpoint: %s: chunk %d+%d of %s lies outside its shape %v", dir, c.Offset, c.Len, name, t.Shape)
			}
			size, err := fileSize(name, false, c.File)
			if err != nil {
				return err
			}
			if c.Pos < 0 || c.Pos > size || int64(c.Len)*4 > size-c.Pos {
				return fmt.Errorf("checkpoint: %s: %s is truncated: chunk of %s at byte %d needs %d bytes, the file has %d", dir, c.File, name, c.Pos, int64(c.Len)*4, size)
			}
		}
		// Checked in offset order: on a sorted copy when they are out of
		// order, so that m keeps the order they were written in.
		chunks := t.Chunks
		if !slices.IsSortedFunc(chunks, byOffset) {
			chunks = slices.SortedFunc(slices.Values(chunks), byOffset)
		}
		covered := 0
		for i, c := range chunks {
			if a := chunks[max(i-1, 0)]; i > 0 && c.Offset < a.Offset+a.Len {
				return fmt.Errorf("checkpoint: %s: chunks %d+%d and %d+%d of %s overlap", mp, a.Offset, a.Len, c.Offset, c.Len, name)
			}
			covered += c.Len
		}
		// Every element is stored, so a tensor is never larger than the
		// files that hold it.
		if covered != n {
			return fmt.Errorf("checkpoint: %s: the chunks of %s hold %d of its %d elements (shape %v)", mp, name, covered, n, t.Shape)
		}
	}
	for name, b := range m.Blobs {
		size, err := fileSize(name, true, b.File)
		if err != nil {
			return err
		}
		if b.Size != size {
			return fmt.Errorf("checkpoint: %s: state %q is %d bytes in %s, metadata says %d (truncated or corrupt)", dir, name, size, b.File, b.Size)
		}
	}
	return nil
}

// checkedNumel is the product of shape, refusing negative dimensions,
// more than MaxRank of them and products over MaxElements.
func checkedNumel(shape []int) (int, error) {
	if len(shape) > MaxRank {
		return 0, fmt.Errorf("shape %v has %d dimensions, more than %d", shape, len(shape), MaxRank)
	}
	n := 1
	for _, s := range shape {
		if s < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		if s != 0 && n > MaxElements/s {
			return 0, fmt.Errorf("shape %v has more than %d elements", shape, int64(MaxElements))
		}
		n *= s
	}
	return n, nil
}

// plainName reports whether file names a file directly inside the step
// folder (no separators, not "." or "..").
func plainName(file string) bool {
	return file != "" && file != "." && file != ".." && !strings.ContainsAny(file, `/\`) && filepath.Base(file) == file
}

// Info describes one well-formed step folder.
type Info struct {
	Step int
	Dir  string
	Meta Metadata
}

// Problem is a step folder that cannot be loaded, and why.
type Problem struct {
	Step int
	Dir  string
	Err  error
}

// Error names the folder and the reason.
func (p Problem) Error() string { return fmt.Sprintf("%s: %v", p.Dir, p.Err) }

// Scan lists the step folders of folder, ascending: the well-formed ones
// (metadata.json present, parsed and consistent with its files, see
// [Open]) as infos, and every other step-<N> folder as a problem naming
// the folder and the reason (metadata.json missing, corrupt, a missing
// or truncated shard). Checksums are not read here; [Reader.Verify] does.
// A folder that does not exist holds nothing.
func Scan(folder string) ([]Info, []Problem, error) {
	ents, err := os.ReadDir(folder)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: listing %s: %w", folder, err)
	}
	var infos []Info
	var problems []Problem
	for _, e := range ents {
		m := stepDir.FindStringSubmatch(e.Name())
		if m == nil || !e.IsDir() {
			continue
		}
		n, err := strconv.Atoi(m[1])
		if err != nil || n > math.MaxInt32 {
			continue
		}
		dir := filepath.Join(folder, e.Name())
		if _, err := os.Stat(filepath.Join(dir, "metadata.json")); errors.Is(err, os.ErrNotExist) {
			problems = append(problems, Problem{n, dir, errors.New("metadata.json is missing (an incomplete or damaged checkpoint)")})
			continue
		}
		r, err := Open(dir)
		if err != nil {
			problems = append(problems, Problem{n, dir, err})
			continue
		}
		if r.Meta.Step != n {
			problems = append(problems, Problem{n, dir, fmt.Errorf("metadata.json says step %d", r.Meta.Step)})
			continue
		}
		infos = append(infos, Info{Step: n, Dir: dir, Meta: r.Meta})
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Step < infos[j].Step })
	sort.Slice(problems, func(i, j int) bool { return problems[i].Step < problems[j].Step })
	return infos, problems, nil
}
