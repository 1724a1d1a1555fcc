package hf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"

	"github.com/titan-go/titan/internal/model/llama"
)

// ModelConfig is the config.json of a Hugging Face LlamaForCausalLM
// checkpoint: the fields titan reads and writes. Unknown keys are ignored
// on reading.
type ModelConfig struct {
	Architectures         []string `json:"architectures,omitempty"`
	ModelType             string   `json:"model_type"`
	HiddenSize            int      `json:"hidden_size"`
	IntermediateSize      int      `json:"intermediate_size"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	NumKeyValueHeads      int      `json:"num_key_value_heads,omitempty"` // 0: same as NumAttentionHeads
	HeadDim               int      `json:"head_dim,omitempty"`            // 0: HiddenSize / NumAttentionHeads
	VocabSize             int      `json:"vocab_size"`
	HiddenAct             string   `json:"hidden_act"`
	MaxPositionEmbeddings int      `json:"max_position_embeddings"`
	RMSNormEps            Float    `json:"rms_norm_eps"`
	RoPETheta             Float    `json:"rope_theta"`
	// RoPEScaling is nil for plain RoPE.
	RoPEScaling *RoPEScalingConfig `json:"rope_scaling"`
	// RoPEParameters is the newer (transformers 5) home of rope_theta and
	// the scaling; it takes precedence over the two fields above on reading
	// and is never written.
	RoPEParameters    *RoPEScalingConfig `json:"rope_parameters,omitempty"`
	AttentionBias     bool               `json:"attention_bias"`
	AttentionDropout  Float              `json:"attention_dropout"`
	MLPBias           bool               `json:"mlp_bias"`
	InitializerRange  Float              `json:"initializer_range"`
	PretrainingTP     int                `json:"pretraining_tp"`
	TieWordEmbeddings bool               `json:"tie_word_embeddings"`
	TorchDType        string             `json:"torch_dtype,omitempty"`
	DType             string             `json:"dtype,omitempty"` // newer spelling of torch_dtype; read only
	UseCache          bool               `json:"use_cache"`
	BOSTokenID        TokenIDs           `json:"bos_token_id,omitempty"`
	EOSTokenID        TokenIDs           `json:"eos_token_id,omitempty"`
}

// RoPEScalingConfig is config.json's rope_scaling object. titan supports
// rope_type "llama3" (Llama 3.1's frequency scaling) and "default" (none).
type RoPEScalingConfig struct {
	RoPEType                      string `json:"rope_type,omitempty"`
	Type                          string `json:"type,omitempty"` // older spelling of rope_type; read only
	Factor                        Float  `json:"factor,omitempty"`
	LowFreqFactor                 Float  `json:"low_freq_factor,omitempty"`
	HighFreqFactor                Float  `json:"high_freq_factor,omitempty"`
	OriginalMaxPositionEmbeddings int    `json:"original_max_position_embeddings,omitempty"`
	RoPETheta                     Float  `json:"rope_theta,omitempty"` // only in rope_parameters
}

// Float is a float64 that always marshals with a decimal point or an
// exponent (500000.0, not 500000), as Python's json writes floats, so
// transformers' type checks see floats.
type Float float64

// MarshalJSON implements [json.Marshaler].
func (f Float) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(float64(f))
	if err != nil {
		return nil, err
	}
	if !bytes.ContainsAny(b, ".eE") {
		b = append(b, ".0"...)
	}
	return b, nil
}

// TokenIDs is a token id field that config.json spells either as one
// integer or as a list (Llama 3 instruct models stop on several ids).
type TokenIDs []int

// MarshalJSON writes one id as a bare integer and several as a list.
func (t TokenIDs) MarshalJSON() ([]byte, error) {
	if len(t) == 1 {
		return json.Marshal(t[0])
	}
	return json.Marshal([]int(t))
}

// UnmarshalJSON accepts null, an integer or a list of integers.
func (t *TokenIDs) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*t = nil
		return nil
	case len(b) > 0 && b[0] == '[':
		var ids []int
		if err := json.Unmarshal(b, &ids); err != nil {
			return err
		}
		*t = ids
		return nil
	}
	var id int
	if err := json.Unmarshal(b, &id); err != nil {
		return err
	}
	*t = TokenIDs{id}
	return nil
}

// defaultModelConfig holds transformers' LlamaConfig defaults for the keys
// a config.json may leave out.
func defaultModelConfig() ModelConfig {
	return ModelConfig{
		HiddenAct:             "silu",
		MaxPositionEmbeddings: 2048,
		RMSNormEps:            1e-6,
		RoPETheta:             10000,
		InitializerRange:      0.02,
		PretrainingTP:         1,
		UseCache:              true,
	}
}

// ParseConfig decodes a config.json, filling the keys it omits with
// transformers' LlamaConfig defaults.
func ParseConfig(data []byte) (ModelConfig, error) {
	mc := defaultModelConfig()
	if err := json.Unmarshal(data, &mc); err != nil {
		return ModelConfig{}, err
	}
	return mc, nil
}

// maxConfigBytes bounds a config.json (real ones are about a kilobyte).
const maxConfigBytes = 16 << 20

// ReadConfig reads and decodes the config.json at path.
func ReadConfig(path string) (ModelConfig, error) {
	if st, err := os.Stat(path); err == nil && st.Size() > maxConfigBytes {
		return ModelConfig{}, fmt.Errorf("hf: %s is %d bytes, more than the %d a config.json may have", path, st.Size(), maxConfigBytes)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return ModelConfig{}, fmt.Errorf("hf: %w", err)
	}
	mc, err := ParseConfig(raw)
	if err != nil {
		return ModelConfig{}, fmt.Errorf("hf: %s: %w", path, err)
	}
	return mc, nil
}

// Llama converts the Hugging Face config into titan's model shape. It
// rejects what titan's Llama 3 cannot express: another model_type or
// activation, biases, a head_dim other than hidden_size/num_attention_heads,
// and RoPE scaling other than "llama3". tie_word_embeddings is not part of
// llama.Config; [Import] handles it.
//
// intermediate_size becomes MultipleOf and FFNDimMultiplier by
// [FFNShape].
func (mc ModelConfig) Llama() (llama.Config, error) {
	if err := mc.CheckLimits(); err != nil {
		return llama.Config{}, err
	}
	switch {
	case mc.ModelType != "llama":
		return llama.Config{}, fmt.Errorf("model_type %q is not \"llama\"", mc.ModelType)
	case len(mc.Architectures) > 0 && !slices.Contains(mc.Architectures, "LlamaForCausalLM"):
		return llama.Config{}, fmt.Errorf("architectures %v lack LlamaForCausalLM", mc.Architectures)
	case mc.HiddenAct != "silu":
		return llama.Config{}, fmt.Errorf("hidden_act %q is not supported (titan's Llama uses silu)", mc.HiddenAct)
	case mc.AttentionBias || mc.MLPBias:
		return llama.Config{}, fmt.Errorf("attention_bias and mlp_bias are not supported")
	case mc.NumAttentionHeads <= 0 || mc.HiddenSize <= 0:
		return llama.Config{}, fmt.Errorf("hidden_size %d and num_attention_heads %d must be positive", mc.HiddenSize, mc.NumAttentionHeads)
	case mc.HeadDim != 0 && mc.HeadDim*mc.NumAttentionHeads != mc.HiddenSize:
		return llama.Config{}, fmt.Errorf("head_dim %d × num_attention_heads %d ≠ hidden_size %d is not supported", mc.HeadDim, mc.NumAttentionHeads, mc.HiddenSize)
	}
	cfg := llama.Config{
		Dim:       mc.HiddenSize,
		NLayers:   mc.NumHiddenLayers,
		NHeads:    mc.NumAttentionHeads,
		VocabSize: mc.VocabSize,
		NormEps:   float64(mc.RMSNormEps),
		RoPETheta: float64(mc.RoPETheta),
		MaxSeqLen: mc.MaxPositionEmbeddings,
	}
	if mc.NumKeyValueHeads != 0 && mc.NumKeyValueHeads != mc.NumAttentionHeads {
		cfg.NKVHeads = mc.NumKeyValueHeads
	}
	scaling := mc.RoPEScaling
	if p := mc.RoPEParameters; p != nil {
		scaling = p
		if p.RoPETheta != 0 {
			cfg.RoPETheta = float64(p.RoPETheta)
		}
	}
	if scaling != nil {
		kind := scaling.RoPEType
		if kind == "" {
			kind = scaling.Type
		}
		switch kind {
		case "default":
		case "llama3":
			cfg.RoPEScaling = llama.RoPEScaling{
				Factor:                        float64(scaling.Factor),
				LowFreqFactor:                 float64(scaling.LowFreqFactor),
				HighFreqFactor:                float64(scaling.HighFreqFactor),
				OriginalMaxPositionEmbeddings: scaling.OriginalMaxPositionEmbeddings,
			}
			if cfg.Factor <= 0 {
				return llama.Config{}, fmt.Errorf("rope_scaling factor %g must be positive", cfg.Factor)
			}
		default:
			return llama.Config{}, fmt.Errorf("rope_scaling type %q is not supported (want \"llama3\" or none)", kind)
		}
	}
	var err error
	cfg.MultipleOf, cfg.FFNDimMultiplier, err = FFNShape(mc.HiddenSize, mc.IntermediateSize)
	if err != nil {
		return llama.Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return llama.Config{}, err
	}
	return cfg, nil
}

// Limits on the sizes a config.json may give. They are generous (several
// times the largest published Llama's) and keep a corrupt or hostile file
// from making titan allocate without bound before the weights' files are
// even looked at; [Import] then checks every tensor's shape against the
// safetensors files before allocating the parameters.
var Limits = struct {
	VocabSize, HiddenSize, IntermediateSize, Layers, Heads, MaxPositions int
}{
	VocabSize:        1 << 22, // 4M tokens (Llama 3: 128256)
	HiddenSize:       1 << 16, // Llama 3.1 405B: 16384
	IntermediateSize: 1 << 19, // Llama 3.1 405B: 53248
	Layers:           1 << 10, // Llama 3.1 405B: 126
	Heads:            1 << 12,
	MaxPositions:     1 << 24, // 16M tokens
}

// CheckLimits checks every size and count of the config against [Limits]
// (and for being non-negative), with an error naming the field.
func (mc ModelConfig) CheckLimits() error {
	for _, f := range []struct {
		name     string
		v, limit int
	}{
		{"vocab_size", mc.VocabSize, Limits.VocabSize},
		{"hidden_size", mc.HiddenSize, Limits.HiddenSize},
		{"intermediate_size", mc.IntermediateSize, Limits.IntermediateSize},
		{"num_hidden_layers", mc.NumHiddenLayers, Limits.Layers},
		{"num_attention_heads", mc.NumAttentionHeads, Limits.Heads},
		{"num_key_value_heads", mc.NumKeyValueHeads, Limits.Heads},
		{"head_dim", mc.HeadDim, Limits.HiddenSize},
		{"max_position_embeddings", mc.MaxPositionEmbeddings, Limits.MaxPositions},
		{"pretraining_tp", mc.PretrainingTP, Limits.Heads},
	} {
		if f.v < 0 || f.v > f.limit {
			return fmt.Errorf("%s %d is out of range [0, %d]", f.name, f.v, f.limit)
		}
	}
	for _, sc := range []*RoPEScalingConfig{mc.RoPEScaling, mc.RoPEParameters} {
		if sc != nil && (sc.OriginalMaxPositionEmbeddings < 0 || sc.OriginalMaxPositionEmbeddings > Limits.MaxPositions) {
			return fmt.Errorf("rope_scaling original_max_position_embeddings %d is out of range [0, %d]", sc.OriginalMaxPositionEmbeddings, Limits.MaxPositions)
		}
	}
	for _, f := range []struct {
		name string
		v    Float
	}{{"rms_norm_eps", mc.RMSNormEps}, {"rope_theta", mc.RoPETheta}} {
		if math.IsNaN(float64(f.v)) || math.IsInf(float64(f.v), 0) {
			return fmt.Errorf("%s is %v", f.name, float64(f.v))
		}
	}
	return nil
}

// publishedFFN are the (FFNDimMultiplier, MultipleOf) pairs of Meta's
// Llama 3.x params.json files besides those of titan's flavors.
var publishedFFN = []struct {
	mult float64
	mo   int
}{
	{0, 256},    // the default rule
	{1.3, 1024}, // Llama 3 8B
	{1.3, 4096}, // Llama 3 70B
	{1.2, 4096}, // Llama 3.1 405B
	{1.5, 256},  // Llama 3.2 1B
	{1.0, 256},  // Llama 3.2 3B
}

// FFNShape picks the MultipleOf and FFNDimMultiplier under which a model
// of width dim has SwiGLU hidden width intermediate, that is for which
// llama.Config.FFNHidden() == intermediate. titan's Llama derives that
// width from the two by Meta's rounding rule; Hugging Face stores the
// width itself, so several pairs fit and FFNShape takes, in order:
//
//  1. the pair of a flavor of configs/llama3.toml with the same dim (so an
//     imported Llama 3.1 8B config equals the flavor "8B");
//  2. a pair of Meta's published Llama 3.x models (table above);
//  3. MultipleOf = intermediate and no multiplier, when int(8·dim/3) ≤
//     intermediate (rounding up to one multiple gives intermediate);
//  4. MultipleOf = intermediate and the multiplier intermediate/int(8·dim/3),
//     nudged up by ulps until int(multiplier·int(8·dim/3)) == intermediate.
//
// The result always reproduces intermediate exactly.
func FFNShape(dim, intermediate int) (multipleOf int, multiplier float64, err error) {
	if dim <= 0 || intermediate <= 0 {
		return 0, 0, fmt.Errorf("hidden_size %d and intermediate_size %d must be positive", dim, intermediate)
	}
	fits := func(mo int, mult float64) bool {
		return llama.Config{Dim: dim, MultipleOf: mo, FFNDimMultiplier: mult}.FFNHidden() == intermediate
	}
	for _, name := range llama.Flavors() {
		f, err := llama.Flavor(name)
		if err == nil && f.Dim == dim && fits(f.MultipleOf, f.FFNDimMultiplier) {
			return f.MultipleOf, f.FFNDimMultiplier, nil
		}
	}
	for _, p := range publishedFFN {
		if fits(p.mo, p.mult) {
			return p.mo, p.mult, nil
		}
	}
	h := 2 * 4 * dim / 3
	if h <= intermediate && fits(intermediate, 0) {
		return intermediate, 0, nil
	}
	if h > 0 {
		m := float64(intermediate) / float64(h)
		for i := 0; i < 4 && int(m*float64(h)) < intermediate; i++ {
			m = math.Nextafter(m, math.Inf(1))
		}
		if fits(intermediate, m) {
			return intermediate, m, nil
		}
	}
	return 0, 0, fmt.Errorf("no multiple_of/ffn_dim_multiplier gives intermediate_size %d for hidden_size %d", intermediate, dim)
}

// NewModelConfig describes cfg as a Hugging Face LlamaForCausalLM
// config.json with weights stored as torchDType ("float32" or
// "bfloat16"), and the token ids of opts.
func NewModelConfig(cfg llama.Config, torchDType string, opts ExportOptions) ModelConfig {
	mc := defaultModelConfig()
	mc.Architectures = []string{"LlamaForCausalLM"}
	mc.ModelType = "llama"
	mc.HiddenSize = cfg.Dim
	mc.IntermediateSize = cfg.FFNHidden()
	mc.NumHiddenLayers = cfg.NLayers
	mc.NumAttentionHeads = cfg.NHeads
	mc.NumKeyValueHeads = cfg.KVHeads()
	mc.HeadDim = cfg.HeadDim()
	mc.VocabSize = cfg.VocabSize
	mc.MaxPositionEmbeddings = cfg.MaxSeqLen
	mc.RMSNormEps = Float(cfg.NormEps)
	mc.RoPETheta = Float(cfg.RoPETheta)
	if cfg.Factor != 0 {
		mc.RoPEScaling = &RoPEScalingConfig{
			RoPEType:                      "llama3",
			Factor:                        Float(cfg.Factor),
			LowFreqFactor:                 Float(cfg.LowFreqFactor),
			HighFreqFactor:                Float(cfg.HighFreqFactor),
			OriginalMaxPositionEmbeddings: cfg.OriginalMaxPositionEmbeddings,
		}
	}
	mc.TorchDType = torchDType
	if opts.BOS != nil {
		mc.BOSTokenID = TokenIDs{*opts.BOS}
	}
	mc.EOSTokenID = TokenIDs(opts.EOS)
	return mc
}
