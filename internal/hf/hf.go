// Package hf converts titan's Llama 3 models to and from Hugging Face
// checkpoints: a folder with config.json, generation_config.json and the
// weights as model.safetensors (or shards listed by
// model.safetensors.index.json), loadable by transformers'
// LlamaForCausalLM.
//
// Two conventions differ between the formats besides the names:
//
//   - RoPE. titan rotates the interleaved pairs (2i, 2i+1) of each head
//     (Meta's complex-number form); Hugging Face rotates the pairs
//     (i, i+HD/2) ("rotate half"). The rows of wq and wk are therefore
//     permuted within each head on the way out, so that Hugging Face row
//     i is titan row 2i and row HD/2+i is titan row 2i+1, and back on the
//     way in. Attention scores are unchanged because queries and keys are
//     permuted alike; wv and wo are not touched.
//   - The FFN width. Hugging Face stores intermediate_size; titan derives
//     it from MultipleOf and FFNDimMultiplier (see [FFNShape]).
//
// Tensor names map as
//
//	tok_embeddings.weight                 model.embed_tokens.weight
//	layers.i.attention_norm.weight        model.layers.i.input_layernorm.weight
//	layers.i.attention.w{q,k,v,o}.weight  model.layers.i.self_attn.{q,k,v,o}_proj.weight
//	layers.i.ffn_norm.weight              model.layers.i.post_attention_layernorm.weight
//	layers.i.feed_forward.w1.weight       model.layers.i.mlp.gate_proj.weight
//	layers.i.feed_forward.w2.weight       model.layers.i.mlp.down_proj.weight
//	layers.i.feed_forward.w3.weight       model.layers.i.mlp.up_proj.weight
//	norm.weight                           model.norm.weight
//	output.weight                         lm_head.weight
package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/titan-go/titan/internal/atomicfile"
	"github.com/titan-go/titan/internal/hf/safetensors"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/modelfile"
)

// File names inside a Hugging Face model folder.
const (
	ConfigFile           = "config.json"
	GenerationConfigFile = "generation_config.json"
)

// TokenizerFiles are the tokenizer files [CopyTokenizerFiles] copies.
var TokenizerFiles = []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"}

// layerNames maps the per-layer part of titan's names to Hugging Face's.
var layerNames = map[string]string{
	"attention_norm.weight":  "input_layernorm.weight",
	"attention.wq.weight":    "self_attn.q_proj.weight",
	"attention.wk.weight":    "self_attn.k_proj.weight",
	"attention.wv.weight":    "self_attn.v_proj.weight",
	"attention.wo.weight":    "self_attn.o_proj.weight",
	"ffn_norm.weight":        "post_attention_layernorm.weight",
	"feed_forward.w1.weight": "mlp.gate_proj.weight",
	"feed_forward.w2.weight": "mlp.down_proj.weight",
	"feed_forward.w3.weight": "mlp.up_proj.weight",
}

var globalNames = map[string]string{
	"tok_embeddings.weight": "model.embed_tokens.weight",
	"norm.weight":           "model.norm.weight",
	"output.weight":         "lm_head.weight",
}

// HFName is the Hugging Face name of titan's parameter name (a name of
// llama.Config.Layout), e.g. "layers.0.attention.wq.weight" →
// "model.layers.0.self_attn.q_proj.weight".
func HFName(name string) (string, error) {
	if n, ok := globalNames[name]; ok {
		return n, nil
	}
	if rest, ok := strings.CutPrefix(name, "layers."); ok {
		if num, suffix, ok := strings.Cut(rest, "."); ok {
			if _, err := strconv.Atoi(num); err == nil {
				if n, ok := layerNames[suffix]; ok {
					return "model.layers." + num + "." + n, nil
				}
			}
		}
	}
	return "", fmt.Errorf("hf: no Hugging Face name for parameter %q", name)
}

// isRoPE reports whether titan's parameter name is a wq or wk weight,
// whose rows are permuted between the RoPE conventions.
func isRoPE(name string) bool {
	return strings.HasSuffix(name, ".attention.wq.weight") || strings.HasSuffix(name, ".attention.wk.weight")
}

// ignored reports whether a checkpoint tensor carries no parameters
// (transformers once saved RoPE's inverse frequencies as buffers).
func ignored(hfName string) bool { return strings.HasSuffix(hfName, ".rotary_emb.inv_freq") }

// PermuteToHF writes into dst the rows of src, a [heads·hd, cols] wq or
// wk weight in titan's interleaved RoPE order, in Hugging Face's
// rotate-half order: within head h, dst row h·hd+j is src row h·hd+2j and
// dst row h·hd+hd/2+j is src row h·hd+2j+1, for j < hd/2.
func PermuteToHF(dst, src []float32, heads, hd, cols int) {
	half := hd / 2
	for h := 0; h < heads; h++ {
		base := h * hd
		for j := 0; j < half; j++ {
			copy(dst[(base+j)*cols:(base+j+1)*cols], src[(base+2*j)*cols:])
			copy(dst[(base+half+j)*cols:(base+half+j+1)*cols], src[(base+2*j+1)*cols:])
		}
	}
}

// PermuteFromHF is the inverse of [PermuteToHF].
func PermuteFromHF(dst, src []float32, heads, hd, cols int) {
	half := hd / 2
	for h := 0; h < heads; h++ {
		base := h * hd
		for j := 0; j < half; j++ {
			copy(dst[(base+2*j)*cols:(base+2*j+1)*cols], src[(base+j)*cols:])
			copy(dst[(base+2*j+1)*cols:(base+2*j+2)*cols], src[(base+half+j)*cols:])
		}
	}
}

// Import reads the Hugging Face Llama checkpoint in dir (config.json plus
// model.safetensors or an index and its shards) and returns its shape and
// its parameters as one flat float32 buffer in llama.Config.Layout order.
// F32, BF16, F16 and F64 weights are converted to float32.
//
// Every size and count of config.json is checked against [Limits] and
// every tensor's shape against the model before the parameters are
// allocated; a tensor holding NaN or Inf is an error naming it.
//
// Every parameter must be present with its exact shape; a missing
// tensor, or one that is not a Llama parameter, is an error naming it
// (RoPE inv_freq buffers are skipped). With tie_word_embeddings the
// checkpoint's lm_head.weight, if any, is ignored and output.weight is a
// copy of the embedding: titan's Llama 3 keeps the two untied, so they
// train apart from then on, and a later [Export] writes both.
func Import(dir string) (llama.Config, []float32, error) {
	mc, err := ReadConfig(filepath.Join(dir, ConfigFile))
	if err != nil {
		return llama.Config{}, nil, err
	}
	cfg, err := mc.Llama()
	if err != nil {
		return llama.Config{}, nil, fmt.Errorf("hf: %s: %w", filepath.Join(dir, ConfigFile), err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return llama.Config{}, nil, fmt.Errorf("hf: %w", err)
	}
	defer ck.Close()

	layout := cfg.Layout()
	hfNames := make([]string, len(layout))
	want := make(map[string]bool, len(layout))
	for i, p := range layout {
		if hfNames[i], err = HFName(p.Name); err != nil {
			return llama.Config{}, nil, err
		}
		want[hfNames[i]] = true
	}
	tied := mc.TieWordEmbeddings
	var unknown, missing []string
	for _, n := range ck.Names() {
		if !want[n] && !ignored(n) {
			unknown = append(unknown, n)
		}
	}
	for i, p := range layout {
		if _, ok := ck.Info(hfNames[i]); !ok && !(tied && p.Name == "output.weight") {
			missing = append(missing, hfNames[i])
		}
	}
	if len(unknown) > 0 || len(missing) > 0 {
		var parts []string
		if len(missing) > 0 {
			parts = append(parts, "missing "+list(missing))
		}
		if len(unknown) > 0 {
			parts = append(parts, "unexpected "+list(unknown))
		}
		return llama.Config{}, nil, fmt.Errorf("hf: checkpoint %s does not match its config (%d layers, dim %d): %s", dir, cfg.NLayers, cfg.Dim, strings.Join(parts, "; "))
	}

	// Every shape is checked before anything is allocated: the header
	// entries were checked against the files' sizes, so the parameters
	// then take no more memory than the files hold.
	for i, p := range layout {
		if tied && p.Name == "output.weight" {
			continue
		}
		name := hfNames[i]
		info, _ := ck.Info(name)
		if !equalShape(info.Shape, p.Shape) {
			return llama.Config{}, nil, fmt.Errorf("hf: %s: tensor %q has shape %v, want %v", ck.File(name), name, info.Shape, p.Shape)
		}
	}
	flat := make([]float32, cfg.NumParams())
	var scratch []float32
	for i, p := range layout {
		dst := flat[p.Offset : p.Offset+p.Size]
		if tied && p.Name == "output.weight" {
			emb := layout[0]
			copy(dst, flat[emb.Offset:emb.Offset+emb.Size])
			continue
		}
		name := hfNames[i]
		if !isRoPE(p.Name) {
			if err := ck.ReadFloat32(name, dst); err != nil {
				return llama.Config{}, nil, fmt.Errorf("hf: %w", err)
			}
			if err := checkFinite(ck.File(name), name, dst); err != nil {
				return llama.Config{}, nil, err
			}
			continue
		}
		if cap(scratch) < p.Size {
			scratch = make([]float32, p.Size)
		}
		s := scratch[:p.Size]
		if err := ck.ReadFloat32(name, s); err != nil {
			return llama.Config{}, nil, fmt.Errorf("hf: %w", err)
		}
		if err := checkFinite(ck.File(name), name, s); err != nil {
			return llama.Config{}, nil, err
		}
		PermuteFromHF(dst, s, p.Shape[0]/cfg.HeadDim(), cfg.HeadDim(), p.Shape[1])
	}
	return cfg, flat, nil
}

// checkFinite refuses a tensor holding NaN or ±Inf, naming it, the
// first bad element and how many there are.
func checkFinite(file, name string, v []float32) error {
	first, bad := -1, 0
	for i, x := range v {
		if x-x != 0 { // NaN or ±Inf
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	if bad == 0 {
		return nil
	}
	return fmt.Errorf("hf: %s: tensor %q holds %d NaN or Inf values (the first, element %d, is %v): the weights are corrupt", file, name, bad, first, v[first])
}

// list formats names for an error message, eliding all but the first few.
func list(names []string) string {
	sort.Strings(names)
	const show = 8
	if len(names) > show {
		return fmt.Sprintf("%q and %d more", names[:show], len(names)-show)
	}
	return fmt.Sprintf("%q", names)
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ExportOptions are the optional parts of an [Export].
type ExportOptions struct {
	// BOS is the tokenizer's begin-of-sequence id; nil leaves it out.
	BOS *int
	// EOS lists the end-of-sequence ids (Llama 3 instruct models stop on
	// several); empty leaves them out.
	EOS []int
	// MaxShardBytes splits the weights into shards of at most this many
	// bytes plus an index file when they are larger; 0 writes one
	// model.safetensors. transformers' save_pretrained uses 5 GB.
	MaxShardBytes int64
}

// Export writes the model of shape cfg with flat parameters (in
// llama.Config.Layout order) into dir, created if needed, as a Hugging
// Face LlamaForCausalLM checkpoint: the weights in dtype ("float32" or
// "bfloat16", rounded to nearest even) as model.safetensors or shards plus
// model.safetensors.index.json, then config.json and
// generation_config.json. Each file is written to a temporary name, synced
// and renamed, so config.json only appears once the weights are complete.
func Export(dir string, cfg llama.Config, flat []float32, dtype string, opts ExportOptions) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("hf: export to %s: %w", dir, err)
	}
	if n := cfg.NumParams(); int64(len(flat)) != n {
		return fmt.Errorf("hf: export to %s: %d parameters given, the model has %d", dir, len(flat), n)
	}
	var st safetensors.DType
	switch dtype {
	case "float32":
		st = safetensors.F32
	case "bfloat16":
		st = safetensors.BF16
	default:
		return fmt.Errorf("hf: export to %s: dtype %q is not \"float32\" or \"bfloat16\"", dir, dtype)
	}
	if opts.MaxShardBytes < 0 {
		return fmt.Errorf("hf: export to %s: negative MaxShardBytes %d", dir, opts.MaxShardBytes)
	}
	layout := cfg.Layout()
	specs := make([]safetensors.Spec, len(layout))
	for i, p := range layout {
		n, err := HFName(p.Name)
		if err != nil {
			return err
		}
		specs[i] = safetensors.Spec{Name: n, Shape: p.Shape}
	}
	var scratch []float32
	src := func(i int) ([]float32, error) {
		p := layout[i]
		data := flat[p.Offset : p.Offset+p.Size]
		if !isRoPE(p.Name) {
			return data, nil
		}
		if cap(scratch) < p.Size {
			scratch = make([]float32, p.Size)
		}
		s := scratch[:p.Size]
		PermuteToHF(s, data, p.Shape[0]/cfg.HeadDim(), cfg.HeadDim(), p.Shape[1])
		return s, nil
	}
	if _, err := safetensors.WriteDir(dir, st, specs, src, opts.MaxShardBytes, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("hf: export: %w", err)
	}
	mc := NewModelConfig(cfg, dtype, opts)
	if err := writeJSON(filepath.Join(dir, ConfigFile), mc); err != nil {
		return err
	}
	gen := struct {
		BOS TokenIDs `json:"bos_token_id,omitempty"`
		EOS TokenIDs `json:"eos_token_id,omitempty"`
	}{mc.BOSTokenID, mc.EOSTokenID}
	return writeJSON(filepath.Join(dir, GenerationConfigFile), gen)
}

// writeJSON writes v as indented JSON to path through a synced temporary
// file and a rename.
func writeJSON(path string, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("hf: encoding %s: %w", path, err)
	}
	return writeFileAtomic(path, func(w io.Writer) error {
		_, err := w.Write(append(js, '\n'))
		return err
	})
}

// writeFileAtomic is atomicfile.Write with hf's errors.
func writeFileAtomic(path string, fill func(w io.Writer) error) error {
	if err := atomicfile.Write(path, fill); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	return nil
}

// CopyTokenizerFiles copies the tokenizer files of a Hugging Face model
// folder (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
// tokenizer.model) from src to dst, creating dst if needed. Files src
// lacks are skipped; src itself must be a folder.
func CopyTokenizerFiles(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("hf: tokenizer source: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("hf: tokenizer source %s is not a folder", src)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	for _, name := range TokenizerFiles {
		in, err := os.Open(filepath.Join(src, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("hf: %w", err)
		}
		err = writeFileAtomic(filepath.Join(dst, name), func(w io.Writer) error {
			_, err := io.Copy(w, in)
			return err
		})
		in.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// ExportModel writes the llama model m (read back from a titan
// checkpoint) into out as a Hugging Face folder in dtype, with its
// tokenizer's files and token ids, as titan checkpoint export and
// checkpoint.last_save_in_hf do; maxShard bounds the safetensors files
// (0: one).
func ExportModel(m *modelfile.Model, out, dtype string, maxShard int64) error {
	if m.Desc.Name == "hyena" {
		return fmt.Errorf("%s holds a hyena model: Hugging Face export is not supported for hyena yet", m.Dir)
	}
	opts := ExportOptions{MaxShardBytes: maxShard}
	if b := m.Tokenizer.BOS(); b >= 0 {
		opts.BOS = &b
	}
	if e := m.Tokenizer.EOS(); e >= 0 {
		opts.EOS = []int{e}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := Export(out, m.Desc.Config, m.Params, dtype, opts); err != nil {
		return err
	}
	return modelfile.CopyTokenizerFiles(m.Dir, out)
}
