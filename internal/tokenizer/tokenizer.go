// Package tokenizer turns text into token ids and back.
//
// It provides byte-level BPE tokenizers loaded from tiktoken files (Llama 3's
// tokenizer.model) or Hugging Face tokenizer.json files, a trainer for new
// BPE vocabularies, and a byte-level fallback tokenizer. Everything is pure
// Go. Pre-tokenization uses hand-written scanners that reproduce the Llama 3
// (and Qwen2 and GPT-2) split regular expressions exactly, lookahead
// included.
//
// All tokenizers are byte-level: Decode(Encode(s)) == s for every string s,
// including ones that are not valid UTF-8.
package tokenizer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Tokenizer converts between text and token ids.
type Tokenizer interface {
	// Encode returns the ids of text, without BOS or EOS. Text that looks
	// like a special token (such as "<|begin_of_text|>") is encoded as
	// ordinary text, so untrusted input cannot inject control tokens.
	Encode(text string) []int
	// EncodeWithSpecials is like Encode, except that special tokens' text
	// is recognised and encoded as the special token's id.
	EncodeWithSpecials(text string) []int
	// Decode returns the text of ids. It is the byte-exact inverse of
	// Encode; special ids decode to their text.
	Decode(ids []int) string
	// VocabSize returns the number of ids, special tokens included.
	VocabSize() int
	// BOS returns the id of the beginning-of-sequence token, or -1.
	BOS() int
	// EOS returns the id of the end-of-sequence token, or -1.
	EOS() int
	// Name returns the tokenizer's kind: "tiktoken", "huggingface" or
	// "byte".
	Name() string
}

// Load opens the tokenizer at path, detecting its format:
//
//   - the literal "byte": the byte-level tokenizer of NewByte;
//   - a directory: its tokenizer.json (Hugging Face, with the directory's
//     tokenizer_config.json for BOS and EOS), or else its tokenizer.model
//     (tiktoken);
//   - a file whose name ends in .json, or whose content starts with '{': a
//     Hugging Face tokenizer.json;
//   - any other file: a tiktoken file.
func Load(path string) (Tokenizer, error) {
	if path == "byte" {
		return NewByte(), nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(path, hfFileName)); err == nil {
			return LoadHuggingFace(path)
		}
		tk := filepath.Join(path, "tokenizer.model")
		if _, err := os.Stat(tk); err == nil {
			return LoadTiktoken(tk)
		}
		return nil, fmt.Errorf("tokenizer: directory %s has neither %s nor tokenizer.model", path, hfFileName)
	}
	if strings.HasSuffix(path, ".json") {
		return LoadHuggingFace(path)
	}
	head, err := readHead(path, 64)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if bytes.HasPrefix(bytes.TrimLeft(head, " \t\r\n\ufeff"), []byte("{")) {
		return LoadHuggingFace(path)
	}
	return LoadTiktoken(path)
}

// readHead returns up to n bytes from the start of the file at path.
func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	k, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, err
	}
	return buf[:k], nil
}

// Byte tokenizer special tokens.
const (
	byteBOS = 256
	byteEOS = 257
)

// byteTokenizer encodes each byte as its own id.
type byteTokenizer struct {
	specials specialMatcher
}

// NewByte returns the byte-level fallback tokenizer: ids 0-255 are the
// bytes, 256 is BOS "<|begin_of_text|>" and 257 is EOS "<|end_of_text|>".
func NewByte() Tokenizer {
	m, err := newSpecialMatcher([]special{{byteBOS, beginOfText}, {byteEOS, endOfText}})
	if err != nil {
		panic(err) // constant input
	}
	return &byteTokenizer{specials: m}
}

// Encode returns the bytes of text as ids.
func (t *byteTokenizer) Encode(text string) []int {
	ids := make([]int, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = int(text[i])
	}
	return ids
}

// EncodeWithSpecials is like Encode but maps "<|begin_of_text|>" to 256
// and "<|end_of_text|>" to 257.
func (t *byteTokenizer) EncodeWithSpecials(text string) []int {
	ids := make([]int, 0, len(text))
	t.specials.split(text, func(seg string, id int) {
		if id >= 0 {
			ids = append(ids, id)
			return
		}
		for i := 0; i < len(seg); i++ {
			ids = append(ids, int(seg[i]))
		}
	})
	return ids
}

// Decode returns the bytes of ids; 256 and 257 decode to the text of BOS
// and EOS and any other id outside 0-255 to U+FFFD.
func (t *byteTokenizer) Decode(ids []int) string {
	var sb strings.Builder
	sb.Grow(len(ids))
	for _, id := range ids {
		switch {
		case id >= 0 && id < 256:
			sb.WriteByte(byte(id))
		case id == byteBOS:
			sb.WriteString(beginOfText)
		case id == byteEOS:
			sb.WriteString(endOfText)
		default:
			sb.WriteString("\uFFFD")
		}
	}
	return sb.String()
}

// VocabSize returns 258.
func (t *byteTokenizer) VocabSize() int { return 258 }

// BOS returns 256.
func (t *byteTokenizer) BOS() int { return byteBOS }

// EOS returns 257.
func (t *byteTokenizer) EOS() int { return byteEOS }

// Name returns "byte".
func (t *byteTokenizer) Name() string { return "byte" }
