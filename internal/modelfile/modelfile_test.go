package modelfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/model/llama"
)

// TestSaveLoadCarriesTokenizer: a model file holds the config, the exact
// weights and the tokenizer, and loads back whole.
func TestSaveLoadCarriesTokenizer(t *testing.T) {
	tok := "../../../shared/data/tokenizers/torchtitan_test/test_tiktoken.model"
	if _, err := os.Stat(tok); err != nil {
		t.Skipf("test tokenizer not available: %v", err)
	}
	cfg, _ := llama.Flavor("tiny_bench") // vocab 2000 < the tokenizer's 2256: refused on load
	cfg.VocabSize = 2304
	params := make([]float32, cfg.NumParams())
	llama.InitParams(cfg, 11, params, 0)
	dir := t.TempDir()
	if err := Save(dir, 7, Description{Name: "llama3", Config: cfg}, params, tok); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir) // the folder of step folders: the newest is used
	if err != nil {
		t.Fatal(err)
	}
	if m.Desc.Config != cfg || filepath.Base(m.Dir) != "step-7" {
		t.Fatalf("loaded %+v from %s", m.Desc.Config, m.Dir)
	}
	for i := range params {
		if m.Params[i] != params[i] {
			t.Fatalf("parameter %d: %v, saved %v", i, m.Params[i], params[i])
		}
	}
	if m.Tokenizer.Name() != "tiktoken" || m.Tokenizer.VocabSize() != 2256 {
		t.Fatalf("tokenizer %s with %d tokens", m.Tokenizer.Name(), m.Tokenizer.VocabSize())
	}
	if got := m.Tokenizer.Decode(m.Tokenizer.Encode("hello world")); got != "hello world" {
		t.Fatalf("round trip gave %q", got)
	}
	out := t.TempDir()
	if err := CopyTokenizerFiles(dir, out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "tokenizer.model")); err != nil {
		t.Fatalf("tokenizer not copied: %v", err)
	}

	// A model whose vocabulary is smaller than its tokenizer's is refused.
	small := cfg
	small.VocabSize = 2000
	sp := make([]float32, small.NumParams())
	sdir := t.TempDir()
	if err := Save(sdir, 1, Description{Name: "llama3", Config: small}, sp, tok); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(sdir); err == nil || !strings.Contains(err.Error(), "vocab_size") {
		t.Fatalf("want a vocabulary error, got %v", err)
	}
	if _, err := Load(t.TempDir()); err == nil {
		t.Fatal("an empty folder must not load")
	}
}
