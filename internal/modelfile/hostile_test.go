package modelfile

import (
	"encoding/json"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/model/llama"
)

// TestLoadRefusesHostileDescription: a model_config.json (checksummed
// alike, so it passes the blob check) whose sizes do not fit the
// checkpoint's tensors is an error naming the key or tensor, before the
// parameters are allocated.
func TestLoadRefusesHostileDescription(t *testing.T) {
	cfg := llama.Config{Dim: 16, NLayers: 1, NHeads: 2, VocabSize: 32, MultipleOf: 16, NormEps: 1e-5, RoPETheta: 10000, MaxSeqLen: 64}
	params := make([]float32, cfg.NumParams())
	for _, tc := range []struct {
		name string
		edit func(c *llama.Config)
		want string
	}{
		{"n_layers 1e9", func(c *llama.Config) { c.NLayers = 1_000_000_000 }, "config.n_layers 1000000000 does not fit"},
		{"vocab 1e12", func(c *llama.Config) { c.VocabSize = 1_000_000_000_000 }, "model/tok_embeddings.weight has shape [32 16]"},
		{"dim 1e6", func(c *llama.Config) { c.Dim, c.NHeads = 1_000_000, 2 }, "has shape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := Save(dir, 1, Description{Name: "llama3", Config: cfg}, params, ""); err != nil {
				t.Fatal(err)
			}
			sd := checkpoint.StepDir(dir, 1)
			bad := cfg
			tc.edit(&bad)
			raw, _ := json.Marshal(Description{Name: "llama3", Config: bad})
			os.WriteFile(filepath.Join(sd, ConfigBlob), raw, 0o644)
			mp := filepath.Join(sd, "metadata.json")
			mraw, _ := os.ReadFile(mp)
			var m checkpoint.Metadata
			json.Unmarshal(mraw, &m)
			m.Blobs[ConfigBlob] = checkpoint.BlobMeta{File: ConfigBlob, Size: int64(len(raw)), CRC32C: crc32.Checksum(raw, crc32.MakeTable(crc32.Castagnoli))}
			mraw, _ = json.Marshal(m)
			os.WriteFile(mp, mraw, 0o644)
			if err := checkpoint.Reseal(sd); err != nil { // as a forger would
				t.Fatal(err)
			}
			_, err := Load(sd)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
