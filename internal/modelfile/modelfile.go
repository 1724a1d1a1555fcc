// Package modelfile stores a trained model on disk as a checkpoint step
// folder that carries everything needed to use it: the model's shape
// (model_config.json), its weights (tensors "model/<parameter>") and its
// tokenizer's files. Training checkpoints are model files too, with the
// optimizer and loader states beside them.
package modelfile

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/model/hyena"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/tokenizer"
)

// ConfigBlob is the name of the blob holding the model's description.
const ConfigBlob = "model_config.json"

// tokenizerPrefix prefixes the blobs holding the tokenizer's files.
const tokenizerPrefix = "tokenizer."

// Description is the content of model_config.json: the family and its
// shape (Config for llama3, Hyena for hyena).
type Description struct {
	Name   string        `json:"name"`   // "llama3" or "hyena"
	Flavor string        `json:"flavor"` // flavor the model was built from, or "" (imported)
	Config llama.Config  `json:"config"`
	Hyena  *hyena.Config `json:"hyena_config,omitempty"`
}

// Describe is the description of a model family's model.
func Describe(fam model.Family, flavor string) (Description, error) {
	switch f := fam.(type) {
	case llama.Family:
		return Description{Name: "llama3", Flavor: flavor, Config: f.Cfg}, nil
	case hyena.Family:
		c := f.Cfg
		return Description{Name: "hyena", Flavor: flavor, Hyena: &c}, nil
	}
	return Description{}, fmt.Errorf("modelfile: no description for %s", fam.Name())
}

// Family is the described model's family.
func (d Description) Family() (model.Family, error) {
	switch d.Name {
	case "llama3", "":
		if err := d.Config.Validate(); err != nil {
			return nil, err
		}
		return llama.Family{Cfg: d.Config}, nil
	case "hyena":
		if d.Hyena == nil {
			return nil, fmt.Errorf("modelfile: a hyena model without hyena_config")
		}
		if err := d.Hyena.Validate(); err != nil {
			return nil, err
		}
		return hyena.Family{Cfg: *d.Hyena}, nil
	}
	return nil, fmt.Errorf("modelfile: unknown model family %q", d.Name)
}

// fits checks the description's counts against the checkpoint it came
// with before anything is laid out from them: a model of n layers has at
// least n tensors, so a hostile n_layers cannot make Family().Tensors()
// allocate without bound.
func (d Description) fits(r *checkpoint.Reader) error {
	layers, key := d.Config.NLayers, "config.n_layers"
	if d.Hyena != nil {
		layers, key = d.Hyena.NLayer, "hyena_config.n_layer"
	}
	if layers < 0 || layers > len(r.Meta.Tensors) {
		return fmt.Errorf("%s %d does not fit the %d tensors of the checkpoint", key, layers, len(r.Meta.Tensors))
	}
	return nil
}

// tokenizerFiles are the files of a tokenizer folder worth carrying.
var tokenizerFiles = []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"}

// TokenizerBlobs reads the files of the tokenizer at path as blobs ("" or
// "byte", the built-in byte tokenizer, has none). A single tiktoken file
// is stored as tokenizer.model whatever its name.
func TokenizerBlobs(path string) (map[string][]byte, error) {
	blobs := map[string][]byte{}
	if path == "" || path == "byte" {
		return blobs, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if fi.IsDir() {
		for _, name := range tokenizerFiles {
			b, err := os.ReadFile(filepath.Join(path, name))
			if err == nil {
				blobs[tokenizerPrefix+name] = b
			}
		}
		return blobs, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	name := "tokenizer.model"
	if strings.HasSuffix(path, ".json") {
		name = "tokenizer.json"
		if cfg, err := os.ReadFile(filepath.Join(filepath.Dir(path), "tokenizer_config.json")); err == nil {
			blobs[tokenizerPrefix+"tokenizer_config.json"] = cfg
		}
	}
	blobs[tokenizerPrefix+name] = b
	return blobs, nil
}

// Blobs returns the blobs every model file carries: the description and
// the tokenizer's files.
func Blobs(d Description, tokenizerPath string) (map[string][]byte, error) {
	blobs, err := TokenizerBlobs(tokenizerPath)
	if err != nil {
		return nil, err
	}
	raw, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		return nil, err
	}
	blobs[ConfigBlob] = raw
	return blobs, nil
}

// Shards names the parameters of a flat buffer "model/<parameter>".
func Shards(tensors []model.Tensor, flat []float32) []checkpoint.Shard {
	return PrefixedShards("model/", tensors, flat)
}

// PrefixedShards names the slices of a flat buffer prefix+<parameter>.
func PrefixedShards(prefix string, tensors []model.Tensor, flat []float32) []checkpoint.Shard {
	var out []checkpoint.Shard
	for _, p := range tensors {
		out = append(out, checkpoint.Shard{Name: prefix + p.Name, Shape: p.Shape, Data: flat[p.Offset : p.Offset+p.Size]})
	}
	return out
}

// ReadPrefixed reads prefix+<parameter> tensors into the flat buffer.
func ReadPrefixed(r *checkpoint.Reader, prefix string, tensors []model.Tensor, flat []float32) error {
	for _, p := range tensors {
		t, ok := r.Meta.Tensors[prefix+p.Name]
		if !ok {
			return fmt.Errorf("checkpoint %s lacks %s%s", r.Dir, prefix, p.Name)
		}
		if !slices.Equal(t.Shape, p.Shape) {
			return fmt.Errorf("checkpoint %s: %s%s has shape %v, the model wants %v", r.Dir, prefix, p.Name, t.Shape, p.Shape)
		}
		if err := r.Read(prefix+p.Name, 0, flat[p.Offset:p.Offset+p.Size]); err != nil {
			return err
		}
	}
	return nil
}

// Save writes a model-only checkpoint of step into folder.
func Save(folder string, step int, d Description, params []float32, tokenizerPath string) error {
	blobs, err := Blobs(d, tokenizerPath)
	if err != nil {
		return err
	}
	fam, err := d.Family()
	if err != nil {
		return err
	}
	return checkpoint.Save(folder, step, Shards(fam.Tensors(), params), blobs)
}

// Model is a model read back from disk.
type Model struct {
	Desc      Description
	Params    []float32
	Tokenizer tokenizer.Tokenizer
	Dir       string
}

// Resolve accepts either a step folder or a checkpoint folder holding
// step-<N> folders (then the newest is used) and returns the step folder.
func Resolve(dir string) (string, error) {
	if _, err := os.Stat(filepath.Join(dir, "metadata.json")); err == nil {
		return dir, nil
	}
	step, ok, err := checkpoint.Latest(dir)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("%s holds no checkpoint (no metadata.json, no step-N folders)", dir)
	}
	return checkpoint.StepDir(dir, step), nil
}

// Load reads the model in dir (see Resolve), verifying checksums.
func Load(dir string) (*Model, error) {
	dir, err := Resolve(dir)
	if err != nil {
		return nil, err
	}
	r, err := checkpoint.Open(dir)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	raw, err := r.Blob(ConfigBlob)
	if err != nil {
		return nil, err
	}
	m := &Model{Dir: dir}
	if err := json.Unmarshal(raw, &m.Desc); err != nil {
		return nil, fmt.Errorf("%s/%s: %w", dir, ConfigBlob, err)
	}
	if err := m.Desc.fits(r); err != nil {
		return nil, fmt.Errorf("%s/%s: %w", dir, ConfigBlob, err)
	}
	fam, err := m.Desc.Family()
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", dir, ConfigBlob, err)
	}
	ts := fam.Tensors()
	// Every tensor the model needs is in the checkpoint with its shape
	// (whose chunks Open checked against the files) before the buffer is
	// allocated, so it is never larger than the files.
	for _, p := range ts {
		t, ok := r.Meta.Tensors["model/"+p.Name]
		if !ok {
			return nil, fmt.Errorf("checkpoint %s lacks model/%s", r.Dir, p.Name)
		}
		if !slices.Equal(t.Shape, p.Shape) {
			return nil, fmt.Errorf("checkpoint %s: model/%s has shape %v, %s describes %v", r.Dir, p.Name, t.Shape, ConfigBlob, p.Shape)
		}
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("%s/%s describes a model without tensors", dir, ConfigBlob)
	}
	m.Params = make([]float32, ts[len(ts)-1].Offset+ts[len(ts)-1].Size)
	if err := ReadPrefixed(r, "model/", ts, m.Params); err != nil {
		return nil, err
	}
	m.Tokenizer, err = loadTokenizer(r)
	if err != nil {
		return nil, err
	}
	if m.Tokenizer.VocabSize() > fam.VocabSize() {
		return nil, fmt.Errorf("%s: tokenizer has %d tokens, more than the model's vocab_size %d", dir, m.Tokenizer.VocabSize(), fam.VocabSize())
	}
	return m, nil
}

// loadTokenizer rebuilds the tokenizer from its blobs (byte-level when
// the checkpoint has none).
func loadTokenizer(r *checkpoint.Reader) (tokenizer.Tokenizer, error) {
	var names []string
	for name := range r.Meta.Blobs {
		if strings.HasPrefix(name, tokenizerPrefix) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return tokenizer.NewByte(), nil
	}
	tmp, err := os.MkdirTemp("", "titan-tokenizer-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for _, name := range names {
		b, err := r.Blob(name)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(tmp, strings.TrimPrefix(name, tokenizerPrefix)), b, 0o644); err != nil {
			return nil, err
		}
	}
	t, err := tokenizer.Load(tmp)
	if err != nil {
		return nil, fmt.Errorf("%s: tokenizer: %w", r.Dir, err)
	}
	return t, nil
}

// CopyTokenizerFiles writes the tokenizer blobs of the model file in dir
// into out (for a Hugging Face export). It writes nothing for the byte
// tokenizer.
func CopyTokenizerFiles(dir, out string) error {
	dir, err := Resolve(dir)
	if err != nil {
		return err
	}
	r, err := checkpoint.Open(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	for name := range r.Meta.Blobs {
		if !strings.HasPrefix(name, tokenizerPrefix) {
			continue
		}
		b, err := r.Blob(name)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, strings.TrimPrefix(name, tokenizerPrefix)), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
