package hf

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/testenv"
)

const (
	python     = "/usr/bin/python3"
	goldenPath = "../model/llama/testdata/llama_tiny_reference.bin"
)

// golden is the part of the TITANREF file the interop test needs.
type golden struct {
	Config struct {
		Dim         int     `json:"dim"`
		NLayers     int     `json:"n_layers"`
		NHeads      int     `json:"n_heads"`
		NKVHeads    int     `json:"n_kv_heads"`
		VocabSize   int     `json:"vocab_size"`
		FFNHidden   int     `json:"ffn_hidden"`
		NormEps     float64 `json:"norm_eps"`
		RoPETheta   float64 `json:"rope_theta"`
		RoPEScaling struct {
			Factor                        float64 `json:"factor"`
			LowFreqFactor                 float64 `json:"low_freq_factor"`
			HighFreqFactor                float64 `json:"high_freq_factor"`
			OriginalMaxPositionEmbeddings int     `json:"original_max_position_embeddings"`
		} `json:"rope_scaling"`
		Batch  int `json:"batch"`
		SeqLen int `json:"seq_len"`
	}
	f32 map[string][]float32
	i32 map[string][]int32
}

// loadGolden parses the TITANREF format (see the llama testdata README).
func loadGolden(t *testing.T) *golden {
	t.Helper()
	r := testenv.ReadRef(t, goldenPath)
	g := &golden{f32: r.F32, i32: r.I32}
	if err := json.Unmarshal(r.Config, &g.Config); err != nil {
		t.Fatalf("%s: config: %v", goldenPath, err)
	}
	return g
}

// TestPyTorchHFLogits exports the golden tiny model (whose logits were
// computed by a PyTorch model in titan's interleaved-RoPE convention) and
// has testdata/hf_logits.py, an independent Llama in Hugging Face's
// rotate-half convention that parses the export by hand, compute logits
// on the golden tokens. They must match the golden logits to 1e-5
// (normwise relative) for a float32 export; a sharded bfloat16 export must
// come within the error of rounding the weights to bfloat16.
func TestPyTorchHFLogits(t *testing.T) {
	testenv.Torch(t)
	testenv.PythonModule(t, "numpy")
	g := loadGolden(t)
	cfg, err := llama.Flavor("tiny")
	if err != nil {
		t.Fatal(err)
	}
	gc := g.Config
	if cfg.Dim != gc.Dim || cfg.NLayers != gc.NLayers || cfg.NHeads != gc.NHeads || cfg.KVHeads() != gc.NKVHeads ||
		cfg.VocabSize != gc.VocabSize || cfg.FFNHidden() != gc.FFNHidden || cfg.NormEps != gc.NormEps ||
		cfg.RoPETheta != gc.RoPETheta || cfg.Factor != gc.RoPEScaling.Factor || cfg.LowFreqFactor != gc.RoPEScaling.LowFreqFactor ||
		cfg.HighFreqFactor != gc.RoPEScaling.HighFreqFactor || cfg.OriginalMaxPositionEmbeddings != gc.RoPEScaling.OriginalMaxPositionEmbeddings {
		t.Fatalf("golden model shape %+v differs from the tiny flavor %+v", gc, cfg)
	}
	flat := make([]float32, cfg.NumParams())
	for _, p := range cfg.Layout() {
		v := g.f32["params/"+p.Name]
		if len(v) != p.Size {
			t.Fatalf("golden file lacks params/%s with %d elements", p.Name, p.Size)
		}
		copy(flat[p.Offset:], v)
	}
	B, T, V := gc.Batch, gc.SeqLen, gc.VocabSize
	want := g.f32["logits"]
	toks := g.i32["tokens"]
	if len(want) != B*T*V || len(toks) != B*T {
		t.Fatalf("golden logits/tokens have %d/%d elements, want %d/%d", len(want), len(toks), B*T*V, B*T)
	}
	rows := make([][]int32, B)
	for b := range rows {
		rows[b] = toks[b*T : (b+1)*T]
	}
	tmp := t.TempDir()
	tokPath := filepath.Join(tmp, "tokens.json")
	js, _ := json.Marshal(rows)
	if err := os.WriteFile(tokPath, js, 0o644); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name  string
		dtype string
		shard int64
		tol   float64
	}{
		{"float32", "float32", 0, 1e-5},
		// bf16 weights: relative rounding 2^-9 per weight; the logits move
		// by ~1e-2 at most. A misread file would be off by O(1).
		{"bfloat16-sharded", "bfloat16", 4000, 3e-2},
	}
	// One Python run (importing torch dominates its time) for all exports.
	args := []string{"testdata/hf_logits.py", "--tokens", tokPath}
	for _, tc := range cases {
		dir := filepath.Join(tmp, tc.name)
		bos := 0
		if err := Export(dir, cfg, flat, tc.dtype, ExportOptions{BOS: &bos, EOS: []int{1}, MaxShardBytes: tc.shard}); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--model", dir, "--out", filepath.Join(tmp, tc.name+".logits"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, python, args...).CombinedOutput(); err != nil {
		t.Fatalf("hf_logits.py: %v\n%s", err, out)
	}
	for _, tc := range cases {
		raw, err := os.ReadFile(filepath.Join(tmp, tc.name+".logits"))
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) != 4*B*T*V {
			t.Fatalf("%s: hf_logits.py wrote %d bytes, want %d", tc.name, len(raw), 4*B*T*V)
		}
		var diff, scale float64
		for i, w := range want {
			got := float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
			diff = math.Max(diff, math.Abs(got-float64(w)))
			scale = math.Max(scale, math.Abs(float64(w)))
		}
		rel := diff / scale
		t.Logf("%s export: Hugging Face-convention logits vs golden: max |diff| %.3g, normwise relative %.3g", tc.name, diff, rel)
		if rel > tc.tol || math.IsNaN(rel) {
			t.Errorf("%s: relative logits error %.3g exceeds %g", tc.name, rel, tc.tol)
		}
	}
}
