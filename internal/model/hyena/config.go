// Package hyena is the Hyena language model (HazyResearch safari's
// ConvLMHeadModel with the HyenaOperator mixer) as a titan model family:
// its shapes (flavors), flat parameter layout, initialisation, and
// explicit forward and backward passes on backend operations.
//
// The model is a token embedding (no position embedding), n_layer
// pre-norm blocks
//
//	h = h + Hyena(LN1(h))
//	h = h + fc2(gelu_tanh(fc1(LN2(h))))
//
// a final LayerNorm and a head tied to the embedding. The Hyena operator
// of order N projects u to (N+1)·D channels (in_proj), runs a causal
// depthwise convolution of width short_filter_order over them, splits the
// result into x0 … x_{N-1}, v and computes, for o = 0 … N-2,
//
//	v = v ⊙ x_{N-1-o}
//	v = h_o ∗ v + bias_o ⊙ v     (causal long convolution, per channel)
//
// then out_proj(v ⊙ x0). The long filters h are implicit: per layer an
// MLP of trainable positional features z, Linear(emb_dim → filter_order)
// and Sin, then num_inner_mlps × [Linear(filter_order → filter_order) and
// Sin] (one Sin module, so one trainable frequency vector, at every
// activation), then Linear(filter_order → D·(N-1), no bias), multiplied
// by an exponential decay (a fixed buffer). The filter of a sequence of L
// tokens is the first L rows, so L ≤ l_max.
//
// Filter channels follow safari's hyena.py layout "(v o)": channel
// d·(N-1)+o is channel d of the o-th long convolution, in the filter
// MLP's last weight and in filter_fn.bias alike (for N = 2 the two are
// the same). Parameter names are safari's state-dict names without the
// "backbone." prefix, the embedding called wte (see SafariName).
//
// The model knows nothing of parallelism beyond pipeline stages; it
// computes on one backend.
package hyena

import (
	"fmt"
	"math"
	"strings"

	"github.com/titan-go/titan/configs"
	"github.com/titan-go/titan/internal/backend"
)

// Config is the shape of a Hyena language model.
type Config struct {
	DModel int `toml:"d_model"`
	NLayer int `toml:"n_layer"`
	// DInner is the MLP's hidden width (0: 4·DModel).
	DInner int `toml:"d_inner"`
	// VocabSize is the tokenizer's vocabulary; the embedding has
	// PaddedVocab() rows.
	VocabSize            int `toml:"vocab_size"`
	PadVocabSizeMultiple int `toml:"pad_vocab_size_multiple"`
	// Order is the depth N of the Hyena recurrence (at least 2).
	Order int `toml:"order"`
	// EmbDim is the width of the positional features (odd, at least 3:
	// t, then (EmbDim-1)/2 cosines and as many sines).
	EmbDim int `toml:"emb_dim"`
	// FilterOrder is the width of the implicit filter MLP.
	FilterOrder int `toml:"filter_order"`
	// ShortFilterOrder is the width of the short causal convolution.
	ShortFilterOrder int `toml:"short_filter_order"`
	// NumInnerMLPs is the number of filter_order → filter_order layers.
	NumInnerMLPs int `toml:"num_inner_mlps"`
	// LMax is the longest sequence (the filters' length).
	LMax int `toml:"l_max"`
	// W initialises the Sin activation's frequencies.
	W float64 `toml:"w"`
	// Modulate applies the exponential decay to the filters.
	Modulate bool    `toml:"modulate"`
	NormEps  float64 `toml:"layer_norm_epsilon"`
	// InitializerRange is the standard deviation of the linear layers'
	// and the embedding's initial weights.
	InitializerRange float64 `toml:"initializer_range"`
}

// defaults are the values a flavor table may omit (safari's defaults).
func defaults() Config {
	return Config{
		PadVocabSizeMultiple: 8,
		Order:                2,
		EmbDim:               3,
		FilterOrder:          64,
		ShortFilterOrder:     3,
		NumInnerMLPs:         2,
		W:                    1,
		Modulate:             true,
		NormEps:              1e-5,
		InitializerRange:     0.02,
	}
}

// The exponential modulation's constants (safari's ExponentialModulation
// defaults): channel c decays as exp(-t·|δ_c|) with δ spaced linearly
// from ln(target)/slowDecayPct to ln(target)/fastDecayPct.
const (
	fastDecayPct = 0.3
	slowDecayPct = 1.5
	decayTarget  = 1e-2
)

// Flavor returns the named shape from configs/hyena.toml.
func Flavor(name string) (Config, error) {
	return configs.Flavor("hyena", "hyena.toml", name, defaults, Config.Validate)
}

// Flavors lists the flavor names, sorted.
func Flavors() []string {
	all, _ := configs.Flavors("hyena.toml", defaults, Config.Validate)
	return configs.Names(all)
}

// Inner is the MLP's hidden width.
func (c Config) Inner() int {
	if c.DInner == 0 {
		return 4 * c.DModel
	}
	return c.DInner
}

// PaddedVocab is the vocabulary rounded up to PadVocabSizeMultiple: the
// rows of the embedding and the columns of the logits.
func (c Config) PaddedVocab() int {
	m := max(c.PadVocabSizeMultiple, 1)
	return (c.VocabSize + m - 1) / m * m
}

// Channels is the width of the in_proj output and the short convolution:
// (Order+1)·DModel.
func (c Config) Channels() int { return (c.Order + 1) * c.DModel }

// FilterChannels is the number of long-filter channels: DModel·(Order-1).
func (c Config) FilterChannels() int { return c.DModel * (c.Order - 1) }

// Validate checks that the shape is consistent.
func (c Config) Validate() error {
	switch {
	case c.DModel <= 0 || c.NLayer <= 0 || c.VocabSize <= 0 || c.LMax <= 0:
		return fmt.Errorf("d_model, n_layer, vocab_size and l_max must be positive (got %d, %d, %d, %d)", c.DModel, c.NLayer, c.VocabSize, c.LMax)
	case c.DInner < 0:
		return fmt.Errorf("d_inner %d is negative", c.DInner)
	case c.Order < 2:
		return fmt.Errorf("order %d: the Hyena recurrence needs order >= 2", c.Order)
	case c.EmbDim < 3 || c.EmbDim%2 == 0:
		return fmt.Errorf("emb_dim %d must be odd and at least 3 (time, then as many cosines as sines)", c.EmbDim)
	case c.FilterOrder <= 0 || c.ShortFilterOrder <= 0 || c.NumInnerMLPs < 0:
		return fmt.Errorf("filter_order and short_filter_order must be positive and num_inner_mlps not negative (got %d, %d, %d)", c.FilterOrder, c.ShortFilterOrder, c.NumInnerMLPs)
	case c.PadVocabSizeMultiple < 0:
		return fmt.Errorf("pad_vocab_size_multiple %d is negative", c.PadVocabSizeMultiple)
	case c.NormEps <= 0 || c.InitializerRange <= 0:
		return fmt.Errorf("layer_norm_epsilon and initializer_range must be positive")
	}
	return nil
}

// Param names one parameter tensor and its place in the whole model's
// flat buffer.
type Param struct {
	Name   string // e.g. "layers.0.mixer.in_proj.weight"
	Shape  []int  // row-major, safari's shapes; linear weights are [out, in]
	Offset int    // elements from the start of the flat buffer
	Size   int    // elements
}

// Layout lists every parameter in flat-buffer order: the embedding
// "wte.weight" [PaddedVocab, D] (tied to the head), then each layer's
// tensors contiguously (one layer is one slice of the buffer), then the
// final norm "ln_f.weight", "ln_f.bias". Layer l's tensors, prefixed
// "layers.<l>.":
//
//	norm1.weight, norm1.bias                                [D]
//	mixer.in_proj.weight [(N+1)D, D], mixer.in_proj.bias    [(N+1)D]
//	mixer.short_filter.weight [(N+1)D, 1, K], .bias         [(N+1)D]
//	mixer.filter_fn.bias                                    [D(N-1)]  (the skip term, "(v o)")
//	mixer.filter_fn.pos_emb.z                               [1, l_max, emb_dim]
//	mixer.filter_fn.implicit_filter.0.weight, .0.bias       [F, emb_dim], [F]
//	mixer.filter_fn.implicit_filter.1.freq                  [1, F]    (the shared Sin)
//	mixer.filter_fn.implicit_filter.<2i>.weight, .bias      [F, F], [F]   i = 1 … num_inner_mlps
//	mixer.filter_fn.implicit_filter.<2m+2>.weight           [D(N-1), F]   m = num_inner_mlps
//	mixer.out_proj.weight, mixer.out_proj.bias              [D, D], [D]
//	norm2.weight, norm2.bias                                [D]
//	mlp.fc1.weight, mlp.fc1.bias                            [d_inner, D], [d_inner]
//	mlp.fc2.weight, mlp.fc2.bias                            [D, d_inner], [D]
//
// The modulation's δ and the positional times t are buffers, not
// parameters.
func (c Config) Layout() []Param {
	var ps []Param
	off := 0
	add := func(name string, shape []int) {
		n := 1
		for _, s := range shape {
			n *= s
		}
		ps = append(ps, Param{Name: name, Shape: shape, Offset: off, Size: n})
		off += n
	}
	add("wte.weight", []int{c.PaddedVocab(), c.DModel})
	for l := 0; l < c.NLayer; l++ {
		for _, t := range c.layerTensors() {
			add(fmt.Sprintf("layers.%d.", l)+t.name, t.shape)
		}
	}
	add("ln_f.weight", []int{c.DModel})
	add("ln_f.bias", []int{c.DModel})
	return ps
}

// SafariName is the name of parameter name (of Layout) in a safari
// ConvLMHeadModel state dict. The shared Sin's frequency appears there
// under every index it is used at (implicit_filter.1.freq, .3.freq, …);
// the head's weight is lm_head.weight, the same tensor as the embedding.
func SafariName(name string) string {
	if name == "wte.weight" {
		return "backbone.embeddings.word_embeddings.weight"
	}
	return "backbone." + name
}

// tensor is one tensor of a layer: its name after "layers.<l>.", its
// shape and its view in LayerParams.
type tensor struct {
	name  string
	shape []int
	field func(*LayerParams) *backend.Tensor
}

// layerTensors lists one layer's tensors in layout order.
func (c Config) layerTensors() []tensor {
	D, C, K, Cf := c.DModel, c.Channels(), c.ShortFilterOrder, c.FilterChannels()
	F, E, H := c.FilterOrder, c.EmbDim, c.Inner()
	m := c.NumInnerMLPs
	ts := []tensor{
		{"norm1.weight", []int{D}, func(p *LayerParams) *backend.Tensor { return &p.Norm1W }},
		{"norm1.bias", []int{D}, func(p *LayerParams) *backend.Tensor { return &p.Norm1B }},
		{"mixer.in_proj.weight", []int{C, D}, func(p *LayerParams) *backend.Tensor { return &p.InW }},
		{"mixer.in_proj.bias", []int{C}, func(p *LayerParams) *backend.Tensor { return &p.InB }},
		{"mixer.short_filter.weight", []int{C, 1, K}, func(p *LayerParams) *backend.Tensor { return &p.ConvW }},
		{"mixer.short_filter.bias", []int{C}, func(p *LayerParams) *backend.Tensor { return &p.ConvB }},
		{"mixer.filter_fn.bias", []int{Cf}, func(p *LayerParams) *backend.Tensor { return &p.Skip }},
		{"mixer.filter_fn.pos_emb.z", []int{1, c.LMax, E}, func(p *LayerParams) *backend.Tensor { return &p.Z }},
		{"mixer.filter_fn.implicit_filter.0.weight", []int{F, E}, func(p *LayerParams) *backend.Tensor { return &p.FilterW[0] }},
		{"mixer.filter_fn.implicit_filter.0.bias", []int{F}, func(p *LayerParams) *backend.Tensor { return &p.FilterB[0] }},
		{"mixer.filter_fn.implicit_filter.1.freq", []int{1, F}, func(p *LayerParams) *backend.Tensor { return &p.Freq }},
	}
	for i := 1; i <= m; i++ {
		i := i
		p := fmt.Sprintf("mixer.filter_fn.implicit_filter.%d.", 2*i)
		ts = append(ts,
			tensor{p + "weight", []int{F, F}, func(p *LayerParams) *backend.Tensor { return &p.FilterW[i] }},
			tensor{p + "bias", []int{F}, func(p *LayerParams) *backend.Tensor { return &p.FilterB[i] }})
	}
	ts = append(ts,
		tensor{fmt.Sprintf("mixer.filter_fn.implicit_filter.%d.weight", 2*m+2), []int{Cf, F}, func(p *LayerParams) *backend.Tensor { return &p.FilterW[m+1] }},
		tensor{"mixer.out_proj.weight", []int{D, D}, func(p *LayerParams) *backend.Tensor { return &p.OutW }},
		tensor{"mixer.out_proj.bias", []int{D}, func(p *LayerParams) *backend.Tensor { return &p.OutB }},
		tensor{"norm2.weight", []int{D}, func(p *LayerParams) *backend.Tensor { return &p.Norm2W }},
		tensor{"norm2.bias", []int{D}, func(p *LayerParams) *backend.Tensor { return &p.Norm2B }},
		tensor{"mlp.fc1.weight", []int{H, D}, func(p *LayerParams) *backend.Tensor { return &p.Fc1W }},
		tensor{"mlp.fc1.bias", []int{H}, func(p *LayerParams) *backend.Tensor { return &p.Fc1B }},
		tensor{"mlp.fc2.weight", []int{D, H}, func(p *LayerParams) *backend.Tensor { return &p.Fc2W }},
		tensor{"mlp.fc2.bias", []int{D}, func(p *LayerParams) *backend.Tensor { return &p.Fc2B }},
	)
	return ts
}

// layerSize is the number of elements of one layer.
func (c Config) layerSize() int {
	n := 0
	for _, t := range c.layerTensors() {
		k := 1
		for _, s := range t.shape {
			k *= s
		}
		n += k
	}
	return n
}

// NumParams is the total number of parameters (the tied head counted
// once).
func (c Config) NumParams() int64 {
	return int64(c.PaddedVocab()*c.DModel) + int64(c.NLayer)*int64(c.layerSize()) + 2*int64(c.DModel)
}

// FLOPsPerToken estimates the training cost of one token at context
// length seqLen: 6 FLOPs per multiply-add of the dense layers (in_proj,
// out_proj, the MLP and the tied head) and, per long convolution, 6 per
// channel and per earlier position averaged over the sequence (3·seqLen
// per channel: the direct causal convolution's multiply-adds, forward and
// backward, without FFT savings). The implicit filter's MLP, computed
// once per sequence, is left out.
func (c Config) FLOPsPerToken(seqLen int) float64 {
	D, H, V := float64(c.DModel), float64(c.Inner()), float64(c.PaddedVocab())
	dense := float64(c.NLayer)*(D*float64(c.Channels())+D*D+2*D*H) + V*D
	conv := float64(c.NLayer) * float64(c.FilterChannels()) * 3 * float64(seqLen)
	return 6*dense + conv
}

// PositionalFeatures returns the initial positional features z
// [l_max, emb_dim] (safari's PositionalEmbedding): row k is
// [t_k, cos(f_j·w_k) …, -sin(f_j·w_k) …] with t_k = k/(l_max-1),
// w_k = 2πk/l_max and f = linspace(1e-4, bands-1, bands), bands =
// (emb_dim-1)/2. Computed in float64, rounded once.
func (c Config) PositionalFeatures() []float32 {
	L, E := c.LMax, c.EmbDim
	bands := (E - 1) / 2
	z := make([]float32, L*E)
	for k := 0; k < L; k++ {
		row := z[k*E : (k+1)*E]
		row[0] = float32(times(L, k))
		w := 2 * math.Pi * float64(k) / float64(L)
		for j := 0; j < bands; j++ {
			f := linspace(1e-4, float64(bands-1), bands, j)
			row[1+j] = float32(math.Cos(f * w))
			row[1+bands+j] = float32(-math.Sin(f * w))
		}
	}
	return z
}

// times is t_k = k/(L-1), the filter's normalised time (0 for L = 1).
func times(L, k int) float64 {
	if L == 1 {
		return 0
	}
	return float64(k) / float64(L-1)
}

// linspace is element j of n values spaced evenly from lo to hi.
func linspace(lo, hi float64, n, j int) float64 {
	if n == 1 {
		return lo
	}
	return lo + (hi-lo)*float64(j)/float64(n-1)
}

// Deltas returns the modulation's decay rates δ_c for the
// FilterChannels() channels (a buffer: fixed, not trained).
func (c Config) Deltas() []float64 {
	n := c.FilterChannels()
	lo, hi := math.Log(decayTarget)/slowDecayPct, math.Log(decayTarget)/fastDecayPct
	d := make([]float64, n)
	for i := range d {
		d[i] = linspace(lo, hi, n, i)
	}
	return d
}

// Modulation returns the decay exp(-t_k·|δ_c|) the filters are
// multiplied by, laid out [Order-1][l_max][D]: element (o, k, d) belongs
// to channel d·(Order-1)+o at position k (all ones without Modulate).
func (c Config) Modulation() []float32 {
	D, L, O := c.DModel, c.LMax, c.Order-1
	out := make([]float32, O*L*D)
	delta := c.Deltas()
	for o := 0; o < O; o++ {
		for k := 0; k < L; k++ {
			for d := 0; d < D; d++ {
				v := 1.0
				if c.Modulate {
					v = math.Exp(-times(L, k) * math.Abs(delta[d*O+o]))
				}
				out[(o*L+k)*D+d] = float32(v)
			}
		}
	}
	return out
}

// String summarises the shape.
func (c Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "hyena d_model %d, %d layers, order %d, d_inner %d, vocab %d (padded %d), l_max %d", c.DModel, c.NLayer, c.Order, c.Inner(), c.VocabSize, c.PaddedVocab(), c.LMax)
	return b.String()
}
