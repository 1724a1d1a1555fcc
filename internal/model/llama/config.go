// Package llama is the Llama 3 decoder-only transformer: its shapes
// (flavors), parameter layout, initialisation, and explicit forward and
// backward passes over flat parameter, gradient and activation buffers.
//
// The model knows nothing of parallelism; it computes on one backend.
package llama

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/configs"
)

// RoPEScaling is Llama 3.1's frequency scaling for long contexts.
type RoPEScaling struct {
	Factor                        float64 `toml:"rope_scaling_factor"`
	LowFreqFactor                 float64 `toml:"rope_low_freq_factor"`
	HighFreqFactor                float64 `toml:"rope_high_freq_factor"`
	OriginalMaxPositionEmbeddings int     `toml:"rope_original_max_position_embeddings"`
}

// Config is the shape of a Llama 3 model.
type Config struct {
	Dim              int     `toml:"dim"`
	NLayers          int     `toml:"n_layers"`
	NHeads           int     `toml:"n_heads"`
	NKVHeads         int     `toml:"n_kv_heads"` // 0: same as NHeads
	VocabSize        int     `toml:"vocab_size"`
	MultipleOf       int     `toml:"multiple_of"`
	FFNDimMultiplier float64 `toml:"ffn_dim_multiplier"` // 0: none
	NormEps          float64 `toml:"norm_eps"`
	RoPETheta        float64 `toml:"rope_theta"`
	MaxSeqLen        int     `toml:"max_seq_len"`
	RoPEScaling
}

// defaults are the values a flavor table may omit.
func defaults() Config {
	return Config{
		MultipleOf: 256,
		NormEps:    1e-5,
		RoPETheta:  500000,
		MaxSeqLen:  131072,
		RoPEScaling: RoPEScaling{
			Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4,
			OriginalMaxPositionEmbeddings: 8192,
		},
	}
}

// Flavor returns the named shape from configs/llama3.toml.
func Flavor(name string) (Config, error) {
	return configs.Flavor("llama3", "llama3.toml", name, defaults, Config.Validate)
}

// Covering is c with max_seq_len raised to the longest of seqLens where
// that exceeds it, as torchtitan sets a Llama 3 model's max_seq_len from
// training.seq_len: a flavor's max_seq_len is the least context its
// model takes, not a ceiling on what a recipe may train (RoPE's tables
// are built for each sequence length, Config.RoPETables). A model trained
// longer records that length in its model_config.json, which bounds
// generation.
func (c Config) Covering(seqLens ...int) Config {
	for _, t := range seqLens {
		c.MaxSeqLen = max(c.MaxSeqLen, t)
	}
	return c
}

// Flavors lists the flavor names, sorted.
func Flavors() []string {
	all, _ := configs.Flavors("llama3.toml", defaults, Config.Validate)
	return configs.Names(all)
}

// KVHeads is the number of key/value heads.
func (c Config) KVHeads() int {
	if c.NKVHeads == 0 {
		return c.NHeads
	}
	return c.NKVHeads
}

// HeadDim is the width of one attention head.
func (c Config) HeadDim() int { return c.Dim / c.NHeads }

// FFNHidden is the SwiGLU hidden width, by Llama's rounding rule.
func (c Config) FFNHidden() int {
	h := int(2 * 4 * c.Dim / 3)
	if c.FFNDimMultiplier != 0 {
		h = int(c.FFNDimMultiplier * float64(h))
	}
	return c.MultipleOf * ((h + c.MultipleOf - 1) / c.MultipleOf)
}

// Validate checks that the shape is consistent.
func (c Config) Validate() error {
	switch {
	case c.Dim <= 0 || c.NLayers <= 0 || c.NHeads <= 0 || c.VocabSize <= 0:
		return fmt.Errorf("dim, n_layers, n_heads and vocab_size must be positive (got %d, %d, %d, %d)", c.Dim, c.NLayers, c.NHeads, c.VocabSize)
	case c.Dim%c.NHeads != 0:
		return fmt.Errorf("dim %d is not divisible by n_heads %d", c.Dim, c.NHeads)
	case c.HeadDim()%2 != 0:
		return fmt.Errorf("head dim %d must be even for RoPE", c.HeadDim())
	case c.NKVHeads < 0 || c.NHeads%c.KVHeads() != 0:
		return fmt.Errorf("n_heads %d is not a multiple of n_kv_heads %d", c.NHeads, c.KVHeads())
	case c.MultipleOf <= 0:
		return fmt.Errorf("multiple_of must be positive (got %d)", c.MultipleOf)
	case c.NormEps <= 0 || c.RoPETheta <= 0 || c.MaxSeqLen <= 0:
		return fmt.Errorf("norm_eps, rope_theta and max_seq_len must be positive")
	case c.Factor != 0 && (c.LowFreqFactor <= 0 || c.HighFreqFactor <= c.LowFreqFactor || c.OriginalMaxPositionEmbeddings <= 0):
		return fmt.Errorf("rope scaling needs 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0")
	}
	return nil
}

// Param names one parameter tensor and its place in the flat buffer.
type Param struct {
	Name   string // torchtitan's fully qualified name, e.g. "layers.0.attention.wq.weight"
	Shape  []int  // row-major; linear weights are [out, in]
	Offset int    // elements from the start of the flat buffer
	Size   int    // elements
}

// Layout lists every parameter in flat-buffer order: the embedding, then
// each layer's tensors contiguously (so one layer is one slice of the
// buffer), then the final norm and the output projection.
func (c Config) Layout() []Param {
	D, F, V := c.Dim, c.FFNHidden(), c.VocabSize
	q, kv := c.NHeads*c.HeadDim(), c.KVHeads()*c.HeadDim()
	var ps []Param
	off := 0
	add := func(name string, shape ...int) {
		n := 1
		for _, s := range shape {
			n *= s
		}
		ps = append(ps, Param{Name: name, Shape: shape, Offset: off, Size: n})
		off += n
	}
	add("tok_embeddings.weight", V, D)
	for l := 0; l < c.NLayers; l++ {
		p := fmt.Sprintf("layers.%d.", l)
		add(p+"attention_norm.weight", D)
		add(p+"attention.wq.weight", q, D)
		add(p+"attention.wk.weight", kv, D)
		add(p+"attention.wv.weight", kv, D)
		add(p+"attention.wo.weight", D, q)
		add(p+"ffn_norm.weight", D)
		add(p+"feed_forward.w1.weight", F, D)
		add(p+"feed_forward.w2.weight", D, F)
		add(p+"feed_forward.w3.weight", F, D)
	}
	add("norm.weight", D)
	add("output.weight", V, D)
	return ps
}

// NumParams is the total number of parameters.
func (c Config) NumParams() int64 {
	D, F, V := int64(c.Dim), int64(c.FFNHidden()), int64(c.VocabSize)
	q, kv := int64(c.NHeads*c.HeadDim()), int64(c.KVHeads()*c.HeadDim())
	perLayer := 2*D + q*D + 2*kv*D + D*q + 3*F*D
	return V*D + int64(c.NLayers)*perLayer + D + V*D
}

// FLOPsPerToken is torchtitan's training cost estimate for one token at
// context length seqLen: 6 FLOPs per non-embedding parameter plus
// 12·layers·dim·seqLen for attention (no causal discount, no recompute).
func (c Config) FLOPsPerToken(seqLen int) float64 {
	nonEmb := c.NumParams() - int64(c.VocabSize*c.Dim)
	return 6*float64(nonEmb) + 12*float64(c.NLayers)*float64(c.Dim)*float64(seqLen)
}

// PassFLOPs is the FLOPs per token of stage s's forward, of its input
// gradient and of its weight gradient on sequences of T tokens under the
// checkpointing policy ac. Each layer's products cost as much again in
// their input gradient and in their weight gradient; causal attention's
// forward costs 2·T·heads·HeadDim and its backward twice that, in the
// input gradient, which also reruns what the layer's policy recomputes
// (the whole layer under full or every-k checkpointing, wk, wo and w3
// under the per-operation policy; ActivationCheckpoint counts the k-th
// layers within the stage, as the model does). A stage with the head
// adds its product, 2·vocab·dim, to each pass. The embedding and the
// element-wise work are left out.
func (c Config) PassFLOPs(T int, ac ActivationCheckpoint, s StageSpec) (forward, input, weight float64) {
	D, F, V := float64(c.Dim), float64(c.FFNHidden()), float64(c.VocabSize)
	Q, KV := float64(c.NHeads*c.HeadDim()), float64(c.KVHeads()*c.HeadDim())
	products := 2 * (Q*D + 2*KV*D + D*Q + 3*F*D)
	attn := 2 * float64(T) * Q
	policy, err := ac.policies(s.NumLayers)
	if err != nil {
		policy = make([]layerPolicy, s.NumLayers) // refused where the model is built
	}
	for _, p := range policy {
		forward += products + attn
		input += products + 2*attn
		weight += products
		switch p {
		case recomputeLayer:
			input += products + attn
		case recomputeOps:
			input += 2 * (KV*D + D*Q + F*D)
		}
	}
	if s.Head {
		head := 2 * V * D
		forward, input, weight = forward+head, input+head, weight+head
	}
	return forward, input, weight
}

// RoPEFrequencies returns the rotation frequency of each of the HeadDim/2
// pairs, with Llama 3.1 scaling when Factor is set.
func (c Config) RoPEFrequencies() []float64 {
	hd := c.HeadDim()
	freqs := make([]float64, hd/2)
	for i := range freqs {
		f := 1 / math.Pow(c.RoPETheta, float64(2*i)/float64(hd))
		if c.Factor != 0 {
			orig := float64(c.OriginalMaxPositionEmbeddings)
			lowWave, highWave := orig/c.LowFreqFactor, orig/c.HighFreqFactor
			wave := 2 * math.Pi / f
			switch {
			case wave < highWave:
			case wave > lowWave:
				f /= c.Factor
			default:
				smooth := (orig/wave - c.LowFreqFactor) / (c.HighFreqFactor - c.LowFreqFactor)
				f = (1-smooth)*f/c.Factor + smooth*f
			}
		}
		freqs[i] = f
	}
	return freqs
}

// RoPETables returns cos and sin of t·freq_i for positions [0, T), as
// [T, HeadDim/2] row-major float32 tables.
func (c Config) RoPETables(T int) (cos, sin []float32) {
	freqs := c.RoPEFrequencies()
	h := len(freqs)
	cos, sin = make([]float32, T*h), make([]float32, T*h)
	for t := 0; t < T; t++ {
		for i, f := range freqs {
			a := float64(t) * f
			cos[t*h+i] = float32(math.Cos(a))
			sin[t*h+i] = float32(math.Sin(a))
		}
	}
	return cos, sin
}
