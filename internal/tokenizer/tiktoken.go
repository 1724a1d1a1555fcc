package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
)

// Llama 3 special tokens.
const (
	beginOfText = "<|begin_of_text|>"
	endOfText   = "<|end_of_text|>"
)

// NumLlama3Specials is the number of special tokens appended after the
// mergeable tokens of a tiktoken file, the Llama 3 way.
const NumLlama3Specials = 256

// llama3Specials returns the Llama 3 special tokens with ids starting at n:
// "<|begin_of_text|>" = n, "<|end_of_text|>" = n+1, ..., "<|eot_id|>" =
// n+9, "<|python_tag|>" = n+10, then "<|reserved_special_token_2|>" and
// so on, NumLlama3Specials in all.
func llama3Specials(n int) []special {
	names := []string{
		beginOfText,
		endOfText,
		"<|reserved_special_token_0|>",
		"<|reserved_special_token_1|>",
		"<|finetune_right_pad_id|>",
		"<|step_id|>",
		"<|start_header_id|>",
		"<|end_header_id|>",
		"<|eom_id|>",
		"<|eot_id|>",
		"<|python_tag|>",
	}
	for k := 2; len(names) < NumLlama3Specials; k++ {
		names = append(names, fmt.Sprintf("<|reserved_special_token_%d|>", k))
	}
	sp := make([]special, len(names))
	for i, name := range names {
		sp[i] = special{id: n + i, text: name}
	}
	return sp
}

// LoadTiktoken reads a tiktoken BPE file: one line per mergeable token,
// "base64(token bytes) rank", with ranks 0, 1, ..., n-1 in any order. The
// token's id is its rank. Text is pre-tokenized with Llama3Pattern, and
// NumLlama3Specials special tokens are appended after the mergeable ones
// the Llama 3 way: "<|begin_of_text|>" (BOS) = n, "<|end_of_text|>" (EOS)
// = n+1, ..., "<|eot_id|>" = n+9, "<|python_tag|>" = n+10, then
// "<|reserved_special_token_k|>".
func LoadTiktoken(path string) (*BPE, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	defer f.Close()
	b, err := readTiktoken(f, path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return b, nil
}

// readTiktoken parses a tiktoken file from r; name is used in errors.
func readTiktoken(r io.Reader, name string) (*BPE, error) {
	// The vocabulary is allocated once the file is read, from the number
	// of tokens, so that a hostile rank cannot make it huge.
	type entry struct {
		tok  []byte
		rank int
	}
	var entries []entry
	seen := make(map[string]int) // token bytes -> line
	lineOf := make(map[int]int)  // rank -> line
	maxRank := -1
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		fields := bytes.Fields(text)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: malformed line %q: want \"base64-token rank\"", name, line, clip(text))
		}
		tok, err := base64.StdEncoding.DecodeString(string(fields[0]))
		if err != nil {
			return nil, fmt.Errorf("%s:%d: bad base64 token %q: %w", name, line, clip(fields[0]), err)
		}
		if len(tok) == 0 {
			return nil, fmt.Errorf("%s:%d: empty token", name, line)
		}
		rank, err := strconv.Atoi(string(fields[1]))
		if err != nil || rank < 0 {
			return nil, fmt.Errorf("%s:%d: bad rank %q: want a non-negative integer", name, line, clip(fields[1]))
		}
		if rank >= maxVocab {
			return nil, fmt.Errorf("%s:%d: rank %d is implausibly large (at most %d)", name, line, rank, maxVocab-1)
		}
		if prev, dup := lineOf[rank]; dup {
			return nil, fmt.Errorf("%s:%d: duplicate rank %d (first on line %d)", name, line, rank, prev)
		}
		if prev, dup := seen[string(tok)]; dup {
			return nil, fmt.Errorf("%s:%d: duplicate token %q (first on line %d)", name, line, tok, prev)
		}
		lineOf[rank] = line
		seen[string(tok)] = line
		maxRank = max(maxRank, rank)
		entries = append(entries, entry{tok, rank})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s after line %d: %w", name, line, err)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%s: no tokens", name)
	}
	if maxRank >= len(entries) {
		// Ranks are distinct, so one of 0..maxRank is missing.
		vocab := make([]bool, len(entries))
		for _, e := range entries {
			if e.rank < len(vocab) {
				vocab[e.rank] = true
			}
		}
		missing := slices.Index(vocab, false)
		return nil, fmt.Errorf("%s: ranks are not contiguous: rank %d is missing but rank %d is present", name, missing, maxRank)
	}
	vocab := make([][]byte, len(entries))
	for _, e := range entries {
		vocab[e.rank] = e.tok
	}
	n := len(vocab)
	b, err := newBPE(bpeConfig{
		name:       "tiktoken",
		vocab:      vocab,
		specials:   llama3Specials(n),
		wholePiece: true,
		split:      splitLlama3,
		bos:        n,
		eos:        n + 1,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b, nil
}

// clip shortens b for an error message.
func clip(b []byte) string {
	const maxLen = 60
	if len(b) > maxLen {
		return string(b[:maxLen]) + "..."
	}
	return string(b)
}

// SaveTiktoken writes the ordinary tokens of b in tiktoken format, one
// "base64(token bytes) id" line per token in id order, which LoadTiktoken
// reads back. Special tokens are not written (LoadTiktoken re-creates the
// Llama 3 ones). The ordinary tokens must have ids 0..n-1. For a BPE loaded
// from a Hugging Face merges list the tiktoken file ranks tokens by id,
// which may merge differently than the merges list did.
func (b *BPE) SaveTiktoken(w io.Writer) error {
	bw := bufio.NewWriter(w)
	n := 0
	for n < len(b.vocab) && b.vocab[n] != nil {
		n++
	}
	for id := n; id < len(b.vocab); id++ {
		if b.vocab[id] != nil {
			return fmt.Errorf("tokenizer: cannot save as tiktoken: ordinary token %d follows non-token id %d", id, n)
		}
	}
	for id, tok := range b.vocab[:n] {
		bw.WriteString(base64.StdEncoding.EncodeToString(tok))
		bw.WriteByte(' ')
		bw.WriteString(strconv.Itoa(id))
		bw.WriteByte('\n')
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("tokenizer: writing tiktoken file: %w", err)
	}
	return nil
}
