package hyena

import (
	"fmt"
	"slices"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/model"
)

// Family is a Hyena model of shape Cfg as the parallel engines see it
// (model.Family): data parallelism (DDP, FSDP, HSDP) and pipeline stages,
// without tensor or context parallelism. A pipeline stage with the head
// but not the embedding holds a copy of the embedding the head is tied
// to (model.Copier).
type Family struct {
	Cfg Config
	// LogitChunk bounds the logit columns alive at once (see Options).
	LogitChunk int
}

var _ model.Family = Family{}

// Name implements model.Family.
func (f Family) Name() string {
	return fmt.Sprintf("hyena (%d layers, d_model %d, order %d)", f.Cfg.NLayer, f.Cfg.DModel, f.Cfg.Order)
}

// NumLayers implements model.Family.
func (f Family) NumLayers() int { return f.Cfg.NLayer }

// Copies implements model.Copier: a stage with the head but not the
// embedding starts with its own copy of the embedding "wte.weight", which
// the tied head reads; the engine keeps it equal to the first stage's.
func (f Family) Copies(s model.StageSpec, tp int) []model.Copy {
	if !s.Head || s.Embedding {
		return nil
	}
	wte := f.Cfg.Layout()[0]
	r := model.Range{Lo: wte.Offset, Hi: wte.Offset + wte.Size}
	return []model.Copy{{Local: model.Range{Lo: 0, Hi: wte.Size}, Source: r}}
}

// Tensors implements model.Family.
func (f Family) Tensors() []model.Tensor {
	var out []model.Tensor
	for _, p := range f.Cfg.Layout() {
		out = append(out, model.Tensor{Name: p.Name, Shape: p.Shape, Offset: p.Offset, Size: p.Size})
	}
	return out
}

// VocabSize implements model.Family: the tokenizer's vocabulary (the
// embedding is padded beyond it).
func (f Family) VocabSize() int { return f.Cfg.VocabSize }

// MaxSeqLen implements model.Family: the filters' length.
func (f Family) MaxSeqLen() int { return f.Cfg.LMax }

// FLOPsPerToken implements model.Family.
func (f Family) FLOPsPerToken(T int) float64 { return f.Cfg.FLOPsPerToken(T) }

// PassFLOPs implements model.Family: the forward of the stage's layers
// and head (Config.FLOPsPerToken's terms, a third of each), and the
// whole backward (twice the forward) as the input gradient, since the
// model's backward does not split (Model.CanSplit).
func (f Family) PassFLOPs(T int, s model.StageSpec) (forward, input, weight float64) {
	c := f.Cfg
	D, H, V := float64(c.DModel), float64(c.Inner()), float64(c.PaddedVocab())
	layer := 2*(D*float64(c.Channels())+D*D+2*D*H) + float64(c.FilterChannels())*float64(T)
	forward = float64(s.NumLayers) * layer
	if s.Head {
		forward += 2 * V * D
	}
	return forward, 2 * forward, 0
}

// Check implements model.Family.
func (f Family) Check(T, tp, cp int) error {
	if tp < 1 || cp < 1 {
		return fmt.Errorf("parallelism: tensor_parallel_degree %d and context_parallel_degree %d must be positive", tp, cp)
	}
	if tp > 1 {
		return fmt.Errorf("parallelism.tensor_parallel_degree %d: tensor parallelism is not supported for hyena yet", tp)
	}
	if cp > 1 {
		return fmt.Errorf("parallelism.context_parallel_degree %d: context parallelism is not supported for hyena yet", cp)
	}
	if T > f.Cfg.LMax {
		return fmt.Errorf("sequence length %d exceeds the hyena model's l_max %d (the length of its filters)", T, f.Cfg.LMax)
	}
	return nil
}

// NewPart implements model.Family: a Model of stage pl.Stage with
// external parameter buffers. It refuses tensor and context parallelism.
// A stage with the head but without the embedding holds a copy of the
// embedding (see Copies).
func (f Family) NewPart(be backend.Backend, B, T int, pl model.Placement) (model.Part, error) {
	if err := f.Check(T, max(pl.TP, 1), max(pl.CP, 1)); err != nil {
		return nil, err
	}
	if pl.Precision.BF16() {
		return nil, fmt.Errorf("training.mixed_precision_param \"bfloat16\": not supported for hyena models yet (set it to \"float32\")")
	}
	if pl.Precision.Float8 != nil {
		return nil, fmt.Errorf("model.converters [\"float8\"]: not supported for hyena models (remove it)")
	}
	spec := pl.Stage
	m, err := New(be, f.Cfg, B, T, Options{Stage: &spec, External: true, LogitChunk: f.LogitChunk})
	if err != nil {
		return nil, err
	}
	return part{m}, nil
}

// ShardLen implements model.Family: the whole model's flat buffer (tp is
// 1).
func (f Family) ShardLen(tp int) int { return int(f.Cfg.NumParams()) }

// StageRange implements model.Family (see Config.StageRange).
func (f Family) StageRange(s model.StageSpec, tp int) model.Range { return f.Cfg.StageRange(s) }

// Init implements model.Family.
func (f Family) Init(seed uint64, tp, tpRank, lo int, dst []float32) {
	InitParams(f.Cfg, seed, dst, lo)
}

// Read implements model.Family: the elements [lo, lo+len(dst)) of the
// whole model's flat buffer from the tensors prefix+<parameter> of r.
func (f Family) Read(r *checkpoint.Reader, prefix string, tp, tpRank, lo int, dst []float32) error {
	hi := lo + len(dst)
	for _, p := range f.Cfg.Layout() {
		a, b := max(lo, p.Offset), min(hi, p.Offset+p.Size)
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
		if err := r.Read(name, a-p.Offset, dst[a-lo:b-lo]); err != nil {
			return err
		}
	}
	return nil
}

// Write implements model.Family: the runs of src in the whole model's
// flat buffer (tp is 1).
func (f Family) Write(tp, tpRank, lo int, src []float32, put func(name string, shape []int, offset int, data []float32)) {
	hi := lo + len(src)
	for _, p := range f.Cfg.Layout() {
		a, b := max(lo, p.Offset), min(hi, p.Offset+p.Size)
		if a < b {
			put(p.Name, p.Shape, a-p.Offset, src[a-lo:b-lo])
		}
	}
}

// Unshard implements model.Family: without tensor parallelism the one
// rank's buffer is the whole.
func (f Family) Unshard(locals [][]float32) []float32 { return locals[0] }

// Rows implements model.Family: without context parallelism a rank holds
// the whole rows.
func (f Family) Rows(x []int32, T, cp, cpRank int) []int32 { return x }

// part is a Model as a model.Part.
type part struct{ *Model }

func (p part) SetHooks(h model.UnitHooks) { p.Hooks = h }

func (p part) Forward(tokens, targets []int32) error {
	_, err := p.Model.Forward(tokens, targets)
	return err
}
