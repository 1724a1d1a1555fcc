// Package mesh lays the ranks of a job out on a device mesh with named
// dimensions, outermost first: pp, dp_replicate, dp_shard, cp, tp (the
// order torchtitan uses, so that tensor parallel peers are neighbouring
// ranks, on the same host first). It computes each rank's coordinates and
// the ranks of the sub-group along any dimension or product of dimensions.
package mesh

import (
	"fmt"
	"strings"
)

// Dims are the mesh's dimension names, outermost first.
var Dims = []string{"pp", "dp_replicate", "dp_shard", "cp", "tp"}

// Degrees are the sizes of the mesh dimensions.
type Degrees struct {
	PP, DPReplicate, DPShard, CP, TP int
}

func (d Degrees) sizes() []int { return []int{d.PP, d.DPReplicate, d.DPShard, d.CP, d.TP} }

// Mesh is the layout of WorldSize ranks.
type Mesh struct {
	Degrees
	WorldSize int
}

// New builds the mesh for worldSize ranks. DPShard may be -1: it then takes
// the ranks left over by the other dimensions, as torchtitan's
// data_parallel_shard_degree = -1 does.
func New(worldSize int, d Degrees) (*Mesh, error) {
	if worldSize < 1 {
		return nil, fmt.Errorf("mesh: world size %d must be positive", worldSize)
	}
	names := []string{"pipeline_parallel_degree", "data_parallel_replicate_degree", "data_parallel_shard_degree", "context_parallel_degree", "tensor_parallel_degree"}
	sizes := d.sizes()
	others := 1
	for i, s := range sizes {
		if i == 2 && s == -1 {
			continue
		}
		if s < 1 {
			return nil, fmt.Errorf("mesh: parallelism.%s = %d must be >= 1", names[i], s)
		}
		if i != 2 {
			others *= s
		}
	}
	if d.DPShard == -1 {
		if worldSize%others != 0 {
			return nil, fmt.Errorf("mesh: %d workers cannot be split over pp %d × dp_replicate %d × cp %d × tp %d = %d (data_parallel_shard_degree = -1 needs a whole quotient: --nproc a multiple of %d)", worldSize, d.PP, d.DPReplicate, d.CP, d.TP, others, others)
		}
		d.DPShard = worldSize / others
	}
	if p := others * d.DPShard; p != worldSize {
		return nil, fmt.Errorf("mesh: pp %d × dp_replicate %d × dp_shard %d × cp %d × tp %d = %d, but the job has %d workers; the product must equal the world size (titan train --nproc %d on one host)", d.PP, d.DPReplicate, d.DPShard, d.CP, d.TP, p, worldSize, p)
	}
	return &Mesh{Degrees: d, WorldSize: worldSize}, nil
}

// Coords returns rank's coordinate along each dimension, in Dims order.
func (m *Mesh) Coords(rank int) []int {
	sizes := m.sizes()
	c := make([]int, len(sizes))
	for i := len(sizes) - 1; i >= 0; i-- {
		c[i] = rank % sizes[i]
		rank /= sizes[i]
	}
	return c
}

// Rank is the inverse of Coords.
func (m *Mesh) Rank(coords []int) int {
	r := 0
	for i, s := range m.sizes() {
		r = r*s + coords[i]
	}
	return r
}

// dimIndex resolves a dimension name.
func dimIndex(name string) (int, error) {
	for i, d := range Dims {
		if d == name {
			return i, nil
		}
	}
	return 0, fmt.Errorf("mesh: unknown dimension %q (have %s)", name, strings.Join(Dims, ", "))
}

// Group returns the ranks that share rank's coordinates on every
// dimension except the given ones, ordered by their coordinates along
// the given dimensions (the first one outermost). Several dimensions form
// a flattened group, e.g. Group(r, "dp_replicate", "dp_shard") is the
// data-parallel group and Group(r, "dp_shard", "cp") the group FSDP
// shards over when context parallel is on.
func (m *Mesh) Group(rank int, dims ...string) ([]int, error) {
	idx := make([]int, len(dims))
	for i, d := range dims {
		j, err := dimIndex(d)
		if err != nil {
			return nil, err
		}
		idx[i] = j
	}
	sizes := m.sizes()
	base := m.Coords(rank)
	n := 1
	for _, j := range idx {
		n *= sizes[j]
	}
	out := make([]int, 0, n)
	c := append([]int(nil), base...)
	var walk func(k int)
	walk = func(k int) {
		if k == len(idx) {
			out = append(out, m.Rank(c))
			return
		}
		for v := 0; v < sizes[idx[k]]; v++ {
			c[idx[k]] = v
			walk(k + 1)
		}
	}
	walk(0)
	return out, nil
}

// Groups returns every distinct group along dims (each rank in exactly one).
func (m *Mesh) Groups(dims ...string) ([][]int, error) {
	seen := make([]bool, m.WorldSize)
	var out [][]int
	for r := 0; r < m.WorldSize; r++ {
		if seen[r] {
			continue
		}
		g, err := m.Group(r, dims...)
		if err != nil {
			return nil, err
		}
		for _, x := range g {
			seen[x] = true
		}
		out = append(out, g)
	}
	return out, nil
}

// String describes the layout, e.g. "pp 1 × dp_replicate 1 × dp_shard 4 × cp 1 × tp 2".
func (m *Mesh) String() string {
	parts := make([]string, len(Dims))
	for i, s := range m.sizes() {
		parts[i] = fmt.Sprintf("%s %d", Dims[i], s)
	}
	return strings.Join(parts, " × ")
}
