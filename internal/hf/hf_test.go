package hf

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/hf/safetensors"
	"github.com/titan-go/titan/internal/model/llama"
)

func TestHFName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"tok_embeddings.weight", "model.embed_tokens.weight"},
		{"layers.0.attention_norm.weight", "model.layers.0.input_layernorm.weight"},
		{"layers.3.attention.wq.weight", "model.layers.3.self_attn.q_proj.weight"},
		{"layers.3.attention.wk.weight", "model.layers.3.self_attn.k_proj.weight"},
		{"layers.3.attention.wv.weight", "model.layers.3.self_attn.v_proj.weight"},
		{"layers.3.attention.wo.weight", "model.layers.3.self_attn.o_proj.weight"},
		{"layers.12.ffn_norm.weight", "model.layers.12.post_attention_layernorm.weight"},
		{"layers.12.feed_forward.w1.weight", "model.layers.12.mlp.gate_proj.weight"},
		{"layers.12.feed_forward.w2.weight", "model.layers.12.mlp.down_proj.weight"},
		{"layers.12.feed_forward.w3.weight", "model.layers.12.mlp.up_proj.weight"},
		{"norm.weight", "model.norm.weight"},
		{"output.weight", "lm_head.weight"},
	} {
		got, err := HFName(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("HFName(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"layers.x.attention.wq.weight", "layers.1.attention.wz.weight", "output", ""} {
		if _, err := HFName(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("HFName(%q): error %v, want one naming it", bad, err)
		}
	}
	cfg, _ := llama.Flavor("debug")
	seen := map[string]bool{}
	for _, p := range cfg.Layout() {
		n, err := HFName(p.Name)
		if err != nil || seen[n] {
			t.Fatalf("HFName(%q) = %q, %v (seen before: %v)", p.Name, n, err, seen[n])
		}
		seen[n] = true
	}
}

// rotate applies RoPE at position pos to each head of q in float64,
// pairing (2i, 2i+1) when interleaved (titan) or (i, i+hd/2) otherwise
// (Hugging Face's rotate-half).
func rotate(q []float64, heads, hd, pos int, freqs []float64, interleaved bool) []float64 {
	out := make([]float64, len(q))
	for h := 0; h < heads; h++ {
		for i := 0; i < hd/2; i++ {
			a, b := h*hd+2*i, h*hd+2*i+1
			if !interleaved {
				a, b = h*hd+i, h*hd+hd/2+i
			}
			c, s := math.Cos(float64(pos)*freqs[i]), math.Sin(float64(pos)*freqs[i])
			out[a] = q[a]*c - q[b]*s
			out[b] = q[a]*s + q[b]*c
		}
	}
	return out
}

func matVec(w []float32, x []float64, rows, cols int) []float64 {
	y := make([]float64, rows)
	for r := range y {
		for c := 0; c < cols; c++ {
			y[r] += float64(w[r*cols+c]) * x[c]
		}
	}
	return y
}

// TestPermuteRoPE checks the point of the permutation: per-head attention
// scores q·k computed with titan's interleaved RoPE on titan's weights
// equal those computed with rotate-half RoPE on the permuted weights.
func TestPermuteRoPE(t *testing.T) {
	const heads, hd, cols = 3, 8, 5
	cfg := llama.Config{Dim: heads * hd, NHeads: heads, RoPETheta: 10000,
		RoPEScaling: llama.RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 16}}
	freqs := cfg.RoPEFrequencies()
	r := rand.New(rand.NewPCG(1, 1))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return v
	}
	wq, wk := rnd(heads*hd*cols), rnd(heads*hd*cols)
	hq, hk := make([]float32, len(wq)), make([]float32, len(wk))
	PermuteToHF(hq, wq, heads, hd, cols)
	PermuteToHF(hk, wk, heads, hd, cols)
	// The documented row formula, element by element.
	for h := 0; h < heads; h++ {
		for j := 0; j < hd/2; j++ {
			for c := 0; c < cols; c++ {
				if hq[(h*hd+j)*cols+c] != wq[(h*hd+2*j)*cols+c] || hq[(h*hd+hd/2+j)*cols+c] != wq[(h*hd+2*j+1)*cols+c] {
					t.Fatalf("head %d row %d: permutation differs from the formula", h, j)
				}
			}
		}
	}
	back := make([]float32, len(wq))
	PermuteFromHF(back, hq, heads, hd, cols)
	if !slices.Equal(back, wq) {
		t.Fatal("PermuteFromHF(PermuteToHF(w)) != w")
	}
	x1, x2 := make([]float64, cols), make([]float64, cols)
	for i := range x1 {
		x1[i], x2[i] = r.NormFloat64(), r.NormFloat64()
	}
	for _, pos := range [][2]int{{0, 0}, {5, 2}, {13, 7}, {300, 1}} {
		qt := rotate(matVec(wq, x1, heads*hd, cols), heads, hd, pos[0], freqs, true)
		kt := rotate(matVec(wk, x2, heads*hd, cols), heads, hd, pos[1], freqs, true)
		qh := rotate(matVec(hq, x1, heads*hd, cols), heads, hd, pos[0], freqs, false)
		kh := rotate(matVec(hk, x2, heads*hd, cols), heads, hd, pos[1], freqs, false)
		for h := 0; h < heads; h++ {
			var st, sh float64
			for i := h * hd; i < (h+1)*hd; i++ {
				st += qt[i] * kt[i]
				sh += qh[i] * kh[i]
			}
			if math.Abs(st-sh) > 1e-12*(1+math.Abs(st)) {
				t.Errorf("positions %v head %d: titan score %g, Hugging Face score %g", pos, h, st, sh)
			}
		}
	}
}

func tinyModel(t *testing.T) (llama.Config, []float32) {
	t.Helper()
	cfg, err := llama.Flavor("tiny")
	if err != nil {
		t.Fatal(err)
	}
	flat := make([]float32, cfg.NumParams())
	llama.InitParams(cfg, 42, flat, 0)
	// Norm weights start at 1; make them distinct so a mix-up shows.
	for i := range flat {
		if flat[i] == 1 {
			flat[i] = 1 + float32(i%97)/128
		}
	}
	return cfg, flat
}

func TestExportImportRoundTrip(t *testing.T) {
	cfg, flat := tinyModel(t)
	bos := 1
	for _, tc := range []struct {
		name  string
		dtype string
		shard int64
		files []string
	}{
		{"float32", "float32", 0, []string{"model.safetensors"}},
		{"float32 sharded", "float32", 8000, nil},
		{"bfloat16", "bfloat16", 0, []string{"model.safetensors"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "out")
			opts := ExportOptions{BOS: &bos, EOS: []int{2, 3}, MaxShardBytes: tc.shard}
			if err := Export(dir, cfg, flat, tc.dtype, opts); err != nil {
				t.Fatal(err)
			}
			if tc.shard > 0 {
				if _, err := os.Stat(filepath.Join(dir, safetensors.IndexFile)); err != nil {
					t.Fatalf("sharded export wrote no index: %v", err)
				}
			}
			got, gflat, err := Import(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got != cfg {
				t.Errorf("config after round trip\n got %+v\nwant %+v", got, cfg)
			}
			for i, v := range flat {
				w := v
				if tc.dtype == "bfloat16" {
					w = safetensors.BF16ToFloat32(safetensors.Float32ToBF16(v))
				}
				if math.Float32bits(gflat[i]) != math.Float32bits(w) {
					t.Fatalf("param %d: got %g, want %g", i, gflat[i], w)
				}
			}
			mc, err := ReadConfig(filepath.Join(dir, ConfigFile))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(mc.BOSTokenID, TokenIDs{1}) || !slices.Equal(mc.EOSTokenID, TokenIDs{2, 3}) || mc.TorchDType != tc.dtype {
				t.Errorf("config.json ids %v %v dtype %q", mc.BOSTokenID, mc.EOSTokenID, mc.TorchDType)
			}
			gen, err := os.ReadFile(filepath.Join(dir, GenerationConfigFile))
			if err != nil || !strings.Contains(string(gen), `"bos_token_id": 1`) || !strings.Contains(string(gen), `"eos_token_id": [`) {
				t.Errorf("generation_config.json: %s %v", gen, err)
			}
		})
	}
}

// TestExportLayoutOnDisk reads the exported file directly and checks
// names and the RoPE row permutation against the documented formula.
func TestExportLayoutOnDisk(t *testing.T) {
	cfg, flat := tinyModel(t)
	dir := t.TempDir()
	if err := Export(dir, cfg, flat, "float32", ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Metadata()["format"] != "pt" {
		t.Errorf("metadata %v lacks format=pt (transformers requires it)", f.Metadata())
	}
	hd := cfg.HeadDim()
	for _, p := range cfg.Layout() {
		n, _ := HFName(p.Name)
		got := make([]float32, p.Size)
		if err := f.ReadFloat32(n, got); err != nil {
			t.Fatal(err)
		}
		want := flat[p.Offset : p.Offset+p.Size]
		if isRoPE(p.Name) {
			cols := p.Shape[1]
			for r := 0; r < p.Shape[0]; r++ {
				h, j := r/hd, r%hd
				src := h*hd + 2*j // rows j < hd/2 come from even rows
				if j >= hd/2 {
					src = h*hd + 2*(j-hd/2) + 1
				}
				if !slices.Equal(got[r*cols:(r+1)*cols], want[src*cols:(src+1)*cols]) {
					t.Fatalf("%s row %d is not titan row %d", n, r, src)
				}
			}
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s differs from %s", n, p.Name)
		}
	}
}

func TestImportErrors(t *testing.T) {
	cfg, flat := tinyModel(t)
	layout := cfg.Layout()
	// write exports the model with the tensor list edited by edit.
	write := func(t *testing.T, edit func([]safetensors.Spec, [][]float32) ([]safetensors.Spec, [][]float32), tie bool) string {
		t.Helper()
		dir := t.TempDir()
		if err := Export(dir, cfg, flat, "float32", ExportOptions{}); err != nil {
			t.Fatal(err)
		}
		var specs []safetensors.Spec
		var data [][]float32
		for _, p := range layout {
			n, _ := HFName(p.Name)
			specs = append(specs, safetensors.Spec{Name: n, Shape: p.Shape})
			d := flat[p.Offset : p.Offset+p.Size]
			if isRoPE(p.Name) {
				d = make([]float32, p.Size)
				PermuteToHF(d, flat[p.Offset:p.Offset+p.Size], p.Shape[0]/cfg.HeadDim(), cfg.HeadDim(), p.Shape[1])
			}
			data = append(data, d)
		}
		specs, data = edit(specs, data)
		if _, err := safetensors.WriteDir(dir, safetensors.F32, specs, safetensors.SliceSource(data), 0, nil); err != nil {
			t.Fatal(err)
		}
		if tie {
			mc := NewModelConfig(cfg, "float32", ExportOptions{})
			mc.TieWordEmbeddings = true
			if err := writeJSON(filepath.Join(dir, ConfigFile), mc); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	drop := func(name string) func([]safetensors.Spec, [][]float32) ([]safetensors.Spec, [][]float32) {
		return func(s []safetensors.Spec, d [][]float32) ([]safetensors.Spec, [][]float32) {
			for i := range s {
				if s[i].Name == name {
					return slices.Delete(s, i, i+1), slices.Delete(d, i, i+1)
				}
			}
			return s, d
		}
	}
	add := func(name string, n int) func([]safetensors.Spec, [][]float32) ([]safetensors.Spec, [][]float32) {
		return func(s []safetensors.Spec, d [][]float32) ([]safetensors.Spec, [][]float32) {
			return append(s, safetensors.Spec{Name: name, Shape: []int{n}}), append(d, make([]float32, n))
		}
	}
	reshape := func(s []safetensors.Spec, d [][]float32) ([]safetensors.Spec, [][]float32) {
		s[1].Shape = []int{2, 16} // model.layers.0.input_layernorm.weight is [32]
		return s, d
	}
	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			dir  string
			want []string
		}{
			{"missing", write(t, drop("model.layers.1.mlp.up_proj.weight"), false), []string{"missing", "model.layers.1.mlp.up_proj.weight"}},
			{"unexpected", write(t, add("model.layers.2.mlp.up_proj.weight", 3), false), []string{"unexpected", "model.layers.2.mlp.up_proj.weight"}},
			{"shape", write(t, reshape, false), []string{"model.layers.0.input_layernorm.weight", "[2 16]", "[32]"}},
			{"no lm_head", write(t, drop("lm_head.weight"), false), []string{"missing", "lm_head.weight"}},
		} {
			_, _, err := Import(tc.dir)
			if err == nil {
				t.Errorf("%s: Import succeeded", tc.name)
				continue
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q does not mention %q", tc.name, err, w)
				}
			}
		}
	})
	t.Run("inv_freq ignored", func(t *testing.T) {
		_, got, err := Import(write(t, add("model.layers.0.self_attn.rotary_emb.inv_freq", 4), false))
		if err != nil || !slices.Equal(got, flat) {
			t.Errorf("Import with inv_freq buffers: %v", err)
		}
	})
	t.Run("tied", func(t *testing.T) {
		_, got, err := Import(write(t, drop("lm_head.weight"), true))
		if err != nil {
			t.Fatal(err)
		}
		emb, out := layout[0], layout[len(layout)-1]
		if !slices.Equal(got[out.Offset:out.Offset+out.Size], flat[emb.Offset:emb.Offset+emb.Size]) {
			t.Error("tied import: output.weight is not a copy of the embedding")
		}
		if !slices.Equal(got[:out.Offset], flat[:out.Offset]) {
			t.Error("tied import changed other parameters")
		}
	})
	t.Run("bad config", func(t *testing.T) {
		dir := t.TempDir()
		if err := Export(dir, cfg, flat, "float32", ExportOptions{}); err != nil {
			t.Fatal(err)
		}
		mc := NewModelConfig(cfg, "float32", ExportOptions{})
		mc.HiddenAct = "gelu"
		if err := writeJSON(filepath.Join(dir, ConfigFile), mc); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Import(dir); err == nil || !strings.Contains(err.Error(), "gelu") || !strings.Contains(err.Error(), ConfigFile) {
			t.Errorf("error %v, want one naming config.json and gelu", err)
		}
	})
}

func TestExportErrors(t *testing.T) {
	cfg, flat := tinyModel(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		cfg   llama.Config
		flat  []float32
		dtype string
		want  string
	}{
		{"short", cfg, flat[1:], "float32", "parameters given"},
		{"dtype", cfg, flat, "float16", "float16"},
		{"config", llama.Config{}, nil, "float32", "positive"},
	} {
		if err := Export(dir, tc.cfg, tc.flat, tc.dtype, ExportOptions{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
	if es, _ := os.ReadDir(dir); len(es) != 0 {
		t.Errorf("failed exports left %d files", len(es))
	}
}

func TestCopyTokenizerFiles(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "new")
	files := map[string]string{"tokenizer.json": `{"model": {}}`, "special_tokens_map.json": `{}`, "vocab.txt": "x"}
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(src, n), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := CopyTokenizerFiles(src, dst); err != nil {
		t.Fatal(err)
	}
	es, _ := os.ReadDir(dst)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"special_tokens_map.json", "tokenizer.json"}) {
		t.Errorf("copied %v", names)
	}
	for _, n := range names {
		b, _ := os.ReadFile(filepath.Join(dst, n))
		if string(b) != files[n] {
			t.Errorf("%s: copied %q, want %q", n, b, files[n])
		}
	}
	if err := CopyTokenizerFiles(filepath.Join(src, "nope"), dst); err == nil {
		t.Error("missing source folder accepted")
	}
}
