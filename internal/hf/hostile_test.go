package hf

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportRefusesHostileConfig: sizes and counts of config.json far
// beyond any model, or beyond what the weights' files hold, are errors
// naming the field, before anything is allocated. (On main vocab_size
// 10^12 panicked with "makeslice: len out of range" and
// num_hidden_layers 10^9 allocated until killed.)
func TestImportRefusesHostileConfig(t *testing.T) {
	cfg, flat := tinyModel(t)
	src := t.TempDir()
	if err := Export(src, cfg, flat, "float32", ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(filepath.Join(src, ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, key, value, want string
	}{
		{"vocab 1e12", "vocab_size", "1000000000000", "vocab_size 1000000000000 is out of range"},
		{"vocab as float", "vocab_size", "1e12", "vocab_size"},
		{"layers 1e9", "num_hidden_layers", "1000000000", "num_hidden_layers 1000000000 is out of range"},
		{"negative layers", "num_hidden_layers", "-4", "num_hidden_layers -4"},
		{"hidden 1e9", "hidden_size", "1000000000", "hidden_size 1000000000 is out of range"},
		{"intermediate 1e15", "intermediate_size", "1000000000000000", "intermediate_size"},
		{"heads", "num_attention_heads", "99999999", "num_attention_heads"},
		{"positions", "max_position_embeddings", "1000000000000", "max_position_embeddings"},
		// Within the limits but not what the file holds: a shape error,
		// before the parameters are allocated.
		{"vocab beyond the file", "vocab_size", "4000000", "model.embed_tokens.weight"},
		{"layers beyond the file", "num_hidden_layers", "1000", "missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range []string{"model.safetensors", GenerationConfigFile} {
				b, _ := os.ReadFile(filepath.Join(src, f))
				os.WriteFile(filepath.Join(dir, f), b, 0o644)
			}
			cj := setKey(t, string(good), tc.key, tc.value)
			os.WriteFile(filepath.Join(dir, ConfigFile), []byte(cj), 0o644)
			_, _, err := Import(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// setKey replaces the value of "key" in a config.json.
func setKey(t *testing.T, js, key, value string) string {
	t.Helper()
	i := strings.Index(js, `"`+key+`": `)
	if i < 0 {
		t.Fatalf("no %s in %s", key, js)
	}
	j := i + len(key) + 4
	k := j + strings.IndexAny(js[j:], ",\n}")
	return js[:j] + value + js[k:]
}

// TestImportRefusesNonFiniteWeights: NaN or Inf in a weight is an error
// naming the tensor.
func TestImportRefusesNonFiniteWeights(t *testing.T) {
	cfg, flat := tinyModel(t)
	layout := cfg.Layout()
	for _, tc := range []struct {
		name  string
		param int // index into the layout
		value float32
		want  string
	}{
		{"NaN in the embedding", 0, float32(math.NaN()), `"model.embed_tokens.weight" holds 1 NaN or Inf`},
		{"Inf in wq", 1, float32(math.Inf(1)), `self_attn.q_proj.weight" holds 1 NaN or Inf`},
		{"-Inf in the norm", len(layout) - 2, float32(math.Inf(-1)), `"model.norm.weight" holds 1 NaN or Inf`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := append([]float32(nil), flat...)
			p := layout[tc.param]
			if tc.param == 1 {
				for _, q := range layout {
					if strings.HasSuffix(q.Name, "attention.wq.weight") {
						p = q
						break
					}
				}
			}
			bad[p.Offset+p.Size/2] = tc.value
			dir := t.TempDir()
			if err := Export(dir, cfg, bad, "float32", ExportOptions{}); err != nil {
				t.Fatal(err)
			}
			_, _, err := Import(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
