package hyena

import (
	"fmt"
	"math"
	"strings"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/randstream"
)

// LayerParams are the views of one block's parameters (or of their
// gradients) inside a flat buffer, in Layout order.
type LayerParams struct {
	Norm1W, Norm1B backend.Tensor
	InW, InB       backend.Tensor // in_proj [(N+1)D, D], [(N+1)D]
	ConvW, ConvB   backend.Tensor // short_filter [(N+1)D, K], [(N+1)D]
	Skip           backend.Tensor // filter_fn.bias [D(N-1)], "(v o)"
	Z              backend.Tensor // positional features [l_max, emb_dim]
	// FilterW are the filter MLP's weights: [0] emb_dim → F, [1 … m]
	// F → F, [m+1] F → D(N-1) (m = NumInnerMLPs); FilterB the biases of
	// the first m+1.
	FilterW, FilterB []backend.Tensor
	Freq             backend.Tensor // the shared Sin's frequencies [F]
	OutW, OutB       backend.Tensor // out_proj [D, D], [D]
	Norm2W, Norm2B   backend.Tensor
	Fc1W, Fc1B       backend.Tensor // [d_inner, D], [d_inner]
	Fc2W, Fc2B       backend.Tensor // [D, d_inner], [D]
}

// Params are the views of every parameter (or gradient) of a flat
// buffer: the embedding (which the tied head also reads), the layers and
// the final norm.
type Params struct {
	Wte        backend.Tensor
	Layers     []LayerParams
	LnFW, LnFB backend.Tensor
}

// newParams returns views for n layers of c, unbound.
func newParams(c Config, n int) Params {
	p := Params{Layers: make([]LayerParams, n)}
	for l := range p.Layers {
		p.Layers[l].FilterW = make([]backend.Tensor, c.NumInnerMLPs+2)
		p.Layers[l].FilterB = make([]backend.Tensor, c.NumInnerMLPs+1)
	}
	return p
}

// StageSpec is the part of a model that one pipeline stage computes (see
// model.StageSpec).
type StageSpec = model.StageSpec

// Whole is the stage spec of the whole model.
func (c Config) Whole() StageSpec {
	return StageSpec{FirstLayer: 0, NumLayers: c.NLayer, Embedding: true, Head: true}
}

// checkStage reports why s is not a stage of c.
func (c Config) checkStage(s StageSpec) error {
	if s.FirstLayer < 0 || s.NumLayers < 0 || s.FirstLayer+s.NumLayers > c.NLayer {
		return fmt.Errorf("hyena: stage layers [%d, %d) outside the model's %d layers", s.FirstLayer, s.FirstLayer+s.NumLayers, c.NLayer)
	}
	if s.NumLayers == 0 && !s.Embedding && !s.Head {
		return fmt.Errorf("hyena: an empty stage")
	}
	return nil
}

// StageParam is one parameter of a stage's flat buffer.
type StageParam struct {
	Param // the parameter in the whole model's Layout
	// LocalOffset places it in the stage's flat buffer.
	LocalOffset int
	// Tied marks the embedding held by a stage with the head but not the
	// embedding: its own copy of "wte.weight", which the tied head reads
	// and whose gradient is the head's share of the embedding's (see
	// StageLayout).
	Tied bool
}

// hasWte reports whether stage s holds the embedding's tensor: as the
// input embedding or for the tied head.
func hasWte(s StageSpec) bool { return s.Embedding || s.Head }

// StageLayout returns the parameters of stage s's flat buffer in order:
// the embedding when the stage has the embedding or the head, its
// layers, the final norm when it has the head. The whole model's buffer
// (c.Whole()) is Layout. A stage with the head but not the embedding
// starts with its own copy of the embedding (Tied): the pipeline must
// keep it equal to the first stage's and add the two gradients (the
// model's gradient of "wte.weight" is their sum); such a stage's buffer
// is not a range of the whole model's.
func (c Config) StageLayout(s StageSpec) []StageParam {
	all := c.Layout()
	per := len(c.layerTensors())
	var out []StageParam
	off := 0
	add := func(p Param, tied bool) {
		out = append(out, StageParam{Param: p, LocalOffset: off, Tied: tied})
		off += p.Size
	}
	if hasWte(s) {
		add(all[0], !s.Embedding)
	}
	for i := 1 + s.FirstLayer*per; i < 1+(s.FirstLayer+s.NumLayers)*per; i++ {
		add(all[i], false)
	}
	if s.Head {
		add(all[len(all)-2], false)
		add(all[len(all)-1], false)
	}
	return out
}

// StageUnits returns the units of stage s's flat buffer in order (they
// tile it): the embedding, each layer, the final norm, those the stage
// holds. The tied head computes with the embedding's unit (unit 0).
func (c Config) StageUnits(s StageSpec) []model.Range {
	lay := c.StageLayout(s)
	per := len(c.layerTensors())
	var us []model.Range
	for i := 0; i < len(lay); {
		n := per
		switch lay[i].Name {
		case "wte.weight":
			n = 1
		case "ln_f.weight":
			n = 2
		}
		us = append(us, model.Range{Lo: lay[i].LocalOffset, Hi: lay[i+n-1].LocalOffset + lay[i+n-1].Size})
		i += n
	}
	return us
}

// Units returns the units of the whole model's flat buffer.
func (c Config) Units() []model.Range { return c.StageUnits(c.Whole()) }

// StageRange returns the elements of the whole model's flat buffer that
// stage s's parameters occupy, a contiguous range. For a stage with the
// head but not the embedding it is the range of its layers and the final
// norm, without the copy of the embedding its own buffer starts with.
func (c Config) StageRange(s StageSpec) model.Range {
	lay := c.StageLayout(s)
	lo, hi := -1, 0
	for _, p := range lay {
		if p.Tied {
			continue
		}
		if lo < 0 {
			lo = p.Offset
		}
		hi = p.Offset + p.Size
	}
	return model.Range{Lo: max(lo, 0), Hi: hi}
}

// bindUnit lays the views of unit u of stage s (local layers 0 …
// NumLayers-1) over buf, which holds the unit's elements, into p.
func bindUnit(c Config, s StageSpec, p *Params, u int, buf backend.Tensor) {
	if hasWte(s) {
		if u == 0 {
			p.Wte = buf.Slice(0, buf.Len)
			return
		}
		u--
	}
	if u == s.NumLayers {
		D := c.DModel
		p.LnFW, p.LnFB = buf.Slice(0, D), buf.Slice(D, D)
		return
	}
	lp := &p.Layers[u]
	off := 0
	for _, t := range c.layerTensors() {
		n := 1
		for _, d := range t.shape {
			n *= d
		}
		*t.field(lp) = buf.Slice(off, n)
		off += n
	}
}

// InitParams writes the initial values of the whole model's flat-buffer
// elements [offset, offset+len(dst)) into dst, the way safari initialises
// the model: the embedding and every linear weight N(0, r²) with r =
// InitializerRange, out_proj and fc2 weights N(0, r²/(2·n_layer)), linear
// biases 0, LayerNorm weights 1 and biases 0; the short convolution
// U(-1/√K, 1/√K) (PyTorch's Conv1d default); the skip term
// filter_fn.bias N(0, 1); the positional features as PositionalFeatures
// and the Sin frequencies W. Every value depends only on the seed, the
// parameter's name and the element's index, so any shard of the model
// initialises on its own and equals the same slice of a whole-model
// initialisation.
func InitParams(cfg Config, seed uint64, dst []float32, offset int) {
	end := offset + len(dst)
	var z []float32
	for _, p := range cfg.Layout() {
		lo, hi := max(offset, p.Offset), min(end, p.Offset+p.Size)
		if lo >= hi {
			continue
		}
		out := dst[lo-offset : hi-offset]
		first := lo - p.Offset
		key := randstream.Key(p.Name, seed)
		kind := p.Name
		if strings.HasPrefix(kind, "layers.") {
			kind = kind[strings.Index(kind[len("layers."):], ".")+len("layers.")+1:]
		}
		r := cfg.InitializerRange
		fill := func(v float32) {
			for i := range out {
				out[i] = v
			}
		}
		normal := func(std float64) {
			for i := range out {
				out[i] = float32(std * randstream.Gaussian(key, uint64(first+i)))
			}
		}
		switch {
		case kind == "mixer.filter_fn.pos_emb.z":
			if z == nil {
				z = cfg.PositionalFeatures()
			}
			copy(out, z[first:])
		case kind == "mixer.filter_fn.implicit_filter.1.freq":
			fill(float32(cfg.W))
		case kind == "mixer.filter_fn.bias":
			normal(1)
		case strings.HasPrefix(kind, "mixer.short_filter."):
			bound := 1 / math.Sqrt(float64(cfg.ShortFilterOrder))
			for i := range out {
				out[i] = float32(bound * (2*randstream.Uniform(key, uint64(first+i)) - 1))
			}
		case strings.HasSuffix(kind, "norm1.weight"), strings.HasSuffix(kind, "norm2.weight"), kind == "ln_f.weight":
			fill(1)
		case strings.HasSuffix(kind, ".bias"):
			fill(0)
		case kind == "mixer.out_proj.weight", kind == "mlp.fc2.weight":
			normal(r / math.Sqrt(2*float64(cfg.NLayer)))
		default: // the embedding and the other linear weights
			normal(r)
		}
	}
}

// View lays the whole model's parameter (or gradient) views over its
// flat buffer flat (Layout order).
func View(cfg Config, flat backend.Tensor) Params {
	p := newParams(cfg, cfg.NLayer)
	for u, r := range cfg.Units() {
		bindUnit(cfg, cfg.Whole(), &p, u, flat.Slice(r.Lo, r.Len()))
	}
	return p
}
