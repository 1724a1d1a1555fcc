package train

import (
	"fmt"

	"github.com/titan-go/titan/internal/data"
	"github.com/titan-go/titan/internal/tokenizer"
)

// LoadTokenizer opens model.tokenizer_path; "" is the built-in byte-level
// tokenizer, which needs no file.
func LoadTokenizer(path string) (tokenizer.Tokenizer, error) {
	if path == "" || path == "byte" {
		return tokenizer.NewByte(), nil
	}
	t, err := tokenizer.Load(path)
	if err != nil {
		return nil, fmt.Errorf("model.tokenizer_path: %w", err)
	}
	return t, nil
}

// holdOutEvery is the share of the training corpus kept for validation
// when the recipe names no validation dataset: every 50th shard.
const holdOutEvery = 50

// OpenData opens a dataset for batches of batch rows of seqLen tokens.
// kind is "" (detected from path; the built-in Go source corpus when path
// is empty too), "text", "jsonl", "tokens" or "gosrc". With holdOut the
// corpus is split: validation selects the held-out part, otherwise the rest.
func OpenData(kind, path string, seqLen, batch int, seed uint64, tok tokenizer.Tokenizer, holdOut, validation bool) (*data.Loader, error) {
	if kind == "" && path == "" {
		kind = data.KindGoSrc
	}
	cfg := data.Config{Kind: kind, Path: path, SeqLen: seqLen, BatchSize: batch, Seed: seed, VocabSize: tok.VocabSize()}
	if holdOut {
		cfg.HoldOut, cfg.Validation = holdOutEvery, validation
	}
	return data.Open(cfg, tok)
}
