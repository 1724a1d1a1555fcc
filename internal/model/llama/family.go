package llama

import (
	"fmt"
	"slices"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/parallel/tp"
)

// Family is a Llama 3 model of shape Cfg with its training settings, as
// the parallel engines see it (model.Family).
type Family struct {
	Cfg Config
	// Checkpoint is the activation checkpointing policy of every part.
	Checkpoint ActivationCheckpoint
	// LogitChunk bounds the logit columns alive at once (see Plan).
	LogitChunk int
}

var _ model.Family = Family{}

// Name implements model.Family.
func (f Family) Name() string {
	return fmt.Sprintf("llama3 (%d layers, dim %d)", f.Cfg.NLayers, f.Cfg.Dim)
}

// NumLayers implements model.Family.
func (f Family) NumLayers() int { return f.Cfg.NLayers }

// Tensors implements model.Family.
func (f Family) Tensors() []model.Tensor {
	var out []model.Tensor
	for _, p := range f.Cfg.Layout() {
		out = append(out, model.Tensor{Name: p.Name, Shape: p.Shape, Offset: p.Offset, Size: p.Size})
	}
	return out
}

// VocabSize implements model.Family.
func (f Family) VocabSize() int { return f.Cfg.VocabSize }

// MaxSeqLen implements model.Family.
func (f Family) MaxSeqLen() int { return f.Cfg.MaxSeqLen }

// FLOPsPerToken implements model.Family.
func (f Family) FLOPsPerToken(T int) float64 { return f.Cfg.FLOPsPerToken(T) }

// PassFLOPs implements model.Family (see Config.PassFLOPs).
func (f Family) PassFLOPs(T int, s model.StageSpec) (forward, input, weight float64) {
	return f.Cfg.PassFLOPs(T, f.Checkpoint, StageSpec(s))
}

// Check implements model.Family.
func (f Family) Check(T, tp, cp int) error { return CheckParallel(f.Cfg, T, tp, cp) }

// partPlan is the model plan of a part placed at pl.
func (f Family) partPlan(pl model.Placement) Plan {
	spec := StageSpec(pl.Stage)
	plan := Plan{
		TP: pl.TP, TPRank: pl.TPRank, CP: pl.CP, CPRank: pl.CPRank, Stage: &spec,
		External: true, Checkpoint: f.Checkpoint, LogitChunk: f.LogitChunk, Precision: pl.Precision, Host: pl.Host, Scratch: pl.Scratch, Split: pl.Split,
	}
	if max(pl.TP, 1)*max(pl.CP, 1) > 1 {
		plan.Comm = &tp.Comm{TP: pl.TPGroup, CP: pl.CPGroup}
	}
	return plan
}

// ScratchLen implements model.ScratchSizer.
func (f Family) ScratchLen(B, T int, pl model.Placement) (n, nh int, err error) {
	return ScratchLen(f.Cfg, B, T, f.partPlan(pl))
}

// NewPart implements model.Family: a Model of plan pl with external
// parameter buffers.
func (f Family) NewPart(be backend.Backend, B, T int, pl model.Placement) (model.Part, error) {
	m, err := New(be, f.Cfg, B, T, f.partPlan(pl))
	if err != nil {
		return nil, err
	}
	return part{m}, nil
}

// ShardLen implements model.Family.
func (f Family) ShardLen(tp int) int {
	lay := f.Cfg.ShardLayout(tp)
	return lay[len(lay)-1].LocalOffset + lay[len(lay)-1].LocalSize
}

// StageRange implements model.Family.
func (f Family) StageRange(s model.StageSpec, tp int) model.Range {
	lo, hi := StageSpec(s).ShardRange(f.Cfg, tp)
	return model.Range{Lo: lo, Hi: hi}
}

// Init implements model.Family.
func (f Family) Init(seed uint64, tp, tpRank, lo int, dst []float32) {
	initLayout(f.Cfg, f.Cfg.ShardLayout(tp), tp, tpRank, seed, dst, lo)
}

// Read implements model.Family.
func (f Family) Read(r *checkpoint.Reader, prefix string, tp, tpRank, lo int, dst []float32) error {
	return ReadLocal(r, prefix, f.Cfg.ShardLayout(tp), tp, tpRank, lo, dst)
}

// Write implements model.Family.
func (f Family) Write(tp, tpRank, lo int, src []float32, put func(name string, shape []int, offset int, data []float32)) {
	WriteLocal(f.Cfg.ShardLayout(tp), tp, tpRank, lo, src, put)
}

// WriteLocal is the inverse of ReadLocal: it puts every run of src, the
// elements [lo, lo+len(src)) of a rank's flat buffer laid out as lay, as
// a range of its whole tensor; replicated parameters only on tp rank 0.
func WriteLocal(lay []ShardParam, tp, tpRank, lo int, src []float32, put func(name string, shape []int, offset int, data []float32)) {
	hi := lo + len(src)
	for _, p := range lay {
		a, b := max(lo, p.LocalOffset), min(hi, p.LocalOffset+p.LocalSize)
		if a >= b {
			continue
		}
		data := src[a-lo : b-lo]
		at := a - p.LocalOffset // within the rank's shard of p
		switch p.Kind {
		case Replicated:
			if tpRank == 0 {
				put(p.Name, p.Shape, at, data)
			}
		case RowBlock:
			put(p.Name, p.Shape, tpRank*p.LocalSize+at, data)
		case ColBlock:
			// Row i of the shard holds columns [tpRank·w, (tpRank+1)·w)
			// of row i of the whole tensor.
			in := p.Shape[1]
			w := in / tp
			for len(data) > 0 {
				i, c := at/w, at%w
				n := min(w-c, len(data))
				put(p.Name, p.Shape, i*in+tpRank*w+c, data[:n])
				data, at = data[n:], at+n
			}
		}
	}
}

// Unshard implements model.Family.
func (f Family) Unshard(locals [][]float32) []float32 { return UnshardFlat(f.Cfg, locals) }

// Rows implements model.Family: each row's head and tail chunks.
func (f Family) Rows(x []int32, T, cp, cpRank int) []int32 { return CPSlice(x, T, cp, cpRank) }

// part is a Model as a model.Part.
type part struct{ *Model }

func (p part) SetHooks(h model.UnitHooks) { p.Hooks = h }

func (p part) Forward(tokens, targets []int32) error {
	_, err := p.Model.Forward(tokens, targets)
	return err
}

// ReadLocal fills dst with the elements [lo, lo+len(dst)) of a rank's
// flat buffer laid out as lay (Config.LocalLayout: a tensor-parallel
// shard of some layers, tp rank tpRank of tp) from the whole tensors
// prefix+<parameter> of checkpoint r, reading only what the range needs.
// Whatever layout wrote the checkpoint, any layout reads it this way.
func ReadLocal(r *checkpoint.Reader, prefix string, lay []ShardParam, tp, tpRank, lo int, dst []float32) error {
	hi := lo + len(dst)
	for _, p := range lay {
		a, b := max(lo, p.LocalOffset), min(hi, p.LocalOffset+p.LocalSize)
		if a >= b {
			continue
		}
		name := prefix + p.Name
		t, ok := r.Meta.Tensors[name]
		if !ok {
			return fmt.Errorf("checkpoint %s lacks %s", r.Dir, name)
		}
		if !slices.Equal(t.Shape, p.Shape) {
			return fmt.Errorf("checkpoint %s: %s has shape %v, the model wants %v", r.Dir, name, t.Shape, p.Shape)
		}
		read := func(off int, d []float32) error { return r.Read(name, off, d) }
		out := dst[a-lo : b-lo]
		if p.Kind == Replicated || p.Kind == RowBlock {
			// The shard is contiguous in the tensor: read the part in range.
			base := 0
			if p.Kind == RowBlock {
				base = tpRank * p.LocalSize
			}
			if err := read(base+a-p.LocalOffset, out); err != nil {
				return err
			}
			continue
		}
		shard := make([]float32, p.LocalSize)
		if err := ReadShard(p, tp, tpRank, shard, read); err != nil {
			return err
		}
		copy(out, shard[a-p.LocalOffset:])
	}
	return nil
}
