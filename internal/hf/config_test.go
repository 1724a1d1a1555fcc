package hf

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/model/llama"
)

// llama31_8B is Meta-Llama-3.1-8B's config.json as published.
const llama31_8B = `{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}`

// llama32_1B is Llama-3.2-1B-Instruct's config.json (tied embeddings,
// several eos ids).
const llama32_1B = `{
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "vocab_size": 128256
}`

func TestConfig8B(t *testing.T) {
	mc, err := ParseConfig([]byte(llama31_8B))
	if err != nil {
		t.Fatal(err)
	}
	got, err := mc.Llama()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := llama.Flavor("8B")
	if got != want {
		t.Errorf("8B config\n got %+v\nwant %+v", got, want)
	}
	if got.FFNHidden() != 14336 || got.NumParams() != 8030261248 {
		t.Errorf("FFNHidden %d, NumParams %d", got.FFNHidden(), got.NumParams())
	}
	if !slices.Equal(mc.BOSTokenID, TokenIDs{128000}) || !slices.Equal(mc.EOSTokenID, TokenIDs{128001}) {
		t.Errorf("token ids %v %v", mc.BOSTokenID, mc.EOSTokenID)
	}
}

func TestConfig1B(t *testing.T) {
	mc, err := ParseConfig([]byte(llama32_1B))
	if err != nil {
		t.Fatal(err)
	}
	got, err := mc.Llama()
	if err != nil {
		t.Fatal(err)
	}
	if got.FFNHidden() != 8192 || got.NKVHeads != 8 || got.Factor != 32 || got.HeadDim() != 64 {
		t.Errorf("1B config %+v (FFNHidden %d)", got, got.FFNHidden())
	}
	if !mc.TieWordEmbeddings || !slices.Equal(mc.EOSTokenID, TokenIDs{128001, 128008, 128009}) {
		t.Errorf("tie %v eos %v", mc.TieWordEmbeddings, mc.EOSTokenID)
	}
}

// TestConfigFlavorsRoundTrip writes every flavor as config.json and
// reads it back.
func TestConfigFlavorsRoundTrip(t *testing.T) {
	for _, name := range llama.Flavors() {
		cfg, _ := llama.Flavor(name)
		js, err := json.Marshal(NewModelConfig(cfg, "bfloat16", ExportOptions{}))
		if err != nil {
			t.Fatal(err)
		}
		mc, err := ParseConfig(js)
		if err != nil {
			t.Fatal(err)
		}
		got, err := mc.Llama()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got != cfg {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, cfg)
		}
	}
}

func TestExportedConfigJSON(t *testing.T) {
	cfg, _ := llama.Flavor("8B")
	bos := 128000
	js, err := json.Marshal(NewModelConfig(cfg, "bfloat16", ExportOptions{BOS: &bos, EOS: []int{128001, 128009}}))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{
		"model_type": "llama", "hidden_act": "silu", "hidden_size": 4096.0, "intermediate_size": 14336.0,
		"num_hidden_layers": 32.0, "num_attention_heads": 32.0, "num_key_value_heads": 8.0, "head_dim": 128.0,
		"vocab_size": 128256.0, "max_position_embeddings": 131072.0, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
		"tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 128000.0,
		"attention_bias": false, "mlp_bias": false,
	} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	if a, _ := m["architectures"].([]any); len(a) != 1 || a[0] != "LlamaForCausalLM" {
		t.Errorf("architectures %v", m["architectures"])
	}
	if e, _ := m["eos_token_id"].([]any); len(e) != 2 {
		t.Errorf("eos_token_id %v", m["eos_token_id"])
	}
	rs, _ := m["rope_scaling"].(map[string]any)
	if rs["rope_type"] != "llama3" || rs["factor"] != 8.0 || rs["original_max_position_embeddings"] != 8192.0 {
		t.Errorf("rope_scaling %v", rs)
	}
	// Floats carry a decimal point, as transformers' rope validation wants.
	for _, s := range []string{`"rope_theta":500000.0`, `"factor":8.0`, `"low_freq_factor":1.0`} {
		if !strings.Contains(string(js), s) {
			t.Errorf("config.json lacks %s: %s", s, js)
		}
	}
	// No scaling → null.
	cfg.Factor = 0
	js, _ = json.Marshal(NewModelConfig(cfg, "float32", ExportOptions{}))
	if !strings.Contains(string(js), `"rope_scaling":null`) || strings.Contains(string(js), "bos_token_id") {
		t.Errorf("unscaled config: %s", js)
	}
	mc, _ := ParseConfig(js)
	if got, err := mc.Llama(); err != nil || got.Factor != 0 {
		t.Errorf("unscaled round trip: %+v %v", got, err)
	}
}

func TestFFNShape(t *testing.T) {
	for _, tc := range []struct{ dim, inter int }{
		{4096, 14336}, {8192, 28672}, {16384, 53248}, // Llama 3.1 8B, 70B, 405B
		{2048, 8192}, {3072, 8192}, // Llama 3.2 1B, 3B
		{4096, 11008}, {5120, 13824}, {2048, 5632}, // Llama 2 7B, 13B, TinyLlama
		{32, 96}, {32, 50}, {32, 1000}, {256, 768}, {128, 1}, {100, 333}, {7, 3},
	} {
		mo, mult, err := FFNShape(tc.dim, tc.inter)
		if err != nil {
			t.Errorf("FFNShape(%d, %d): %v", tc.dim, tc.inter, err)
			continue
		}
		if got := (llama.Config{Dim: tc.dim, MultipleOf: mo, FFNDimMultiplier: mult}).FFNHidden(); got != tc.inter {
			t.Errorf("FFNShape(%d, %d) = %d, %g giving %d", tc.dim, tc.inter, mo, mult, got)
		}
	}
	mo, mult, _ := FFNShape(4096, 14336)
	if mo != 1024 || mult != 1.3 {
		t.Errorf("8B: multiple_of %d, ffn_dim_multiplier %g; want Meta's 1024, 1.3", mo, mult)
	}
	if _, _, err := FFNShape(32, 0); err == nil {
		t.Error("intermediate_size 0 accepted")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, edit, want string
	}{
		{"model type", `"model_type": "mistral"`, "mistral"},
		{"architecture", `"architectures": ["LlamaModel"]`, "LlamaForCausalLM"},
		{"activation", `"hidden_act": "gelu"`, "gelu"},
		{"bias", `"attention_bias": true`, "bias"},
		{"head dim", `"head_dim": 64`, "head_dim 64"},
		{"rope type", `"rope_scaling": {"rope_type": "yarn", "factor": 4.0}`, "yarn"},
		{"heads", `"num_attention_heads": 0`, "positive"},
		{"kv heads", `"num_key_value_heads": 5`, "n_kv_heads"},
		{"intermediate", `"intermediate_size": 0`, "intermediate_size"},
	} {
		// Later duplicate keys win in encoding/json.
		js := strings.TrimSuffix(llama31_8B, "}") + "," + tc.edit + "}"
		mc, err := ParseConfig([]byte(js))
		if err == nil {
			_, err = mc.Llama()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
	if _, err := ParseConfig([]byte(`{"eos_token_id": "x"}`)); err == nil {
		t.Error("string eos_token_id accepted")
	}
}

func TestRoPEParameters(t *testing.T) {
	// transformers 5 moves rope_theta and the scaling into rope_parameters.
	js := strings.NewReplacer(`"rope_scaling"`, `"rope_parameters"`, `"rope_type": "llama3"`, `"rope_type": "llama3", "rope_theta": 250000.0`).Replace(llama31_8B)
	mc, err := ParseConfig([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	got, err := mc.Llama()
	if err != nil || got.RoPETheta != 250000 || got.Factor != 8 || got.OriginalMaxPositionEmbeddings != 8192 {
		t.Errorf("rope_parameters: %+v %v", got, err)
	}
}

func TestDefaults(t *testing.T) {
	mc, err := ParseConfig([]byte(`{"model_type": "llama", "hidden_size": 64, "intermediate_size": 172,
		"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := mc.Llama()
	if err != nil {
		t.Fatal(err)
	}
	if got.NormEps != 1e-6 || got.RoPETheta != 10000 || got.MaxSeqLen != 2048 || got.Factor != 0 || got.KVHeads() != 4 || got.FFNHidden() != 172 {
		t.Errorf("defaults: %+v", got)
	}
}
