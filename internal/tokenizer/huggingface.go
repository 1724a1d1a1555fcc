package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// File names of a Hugging Face tokenizer.
const (
	hfFileName   = "tokenizer.json"
	hfConfigName = "tokenizer_config.json"
)

// byteToRune and runeToByte are GPT-2's bytes-to-unicode mapping, which
// Hugging Face ByteLevel tokenizers use to store token bytes as printable
// characters: bytes that are printable Latin-1 map to themselves, the others
// (control characters, space, 0x7f-0xa0, 0xad) to U+0100 onwards in order
// (so space is 'Ġ' U+0120 and newline 'Ċ' U+010A).
var byteToRune, runeToByte = func() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := make(map[rune]byte, 256)
	next := rune(256)
	for c := 0; c < 256; c++ {
		r := rune(c)
		if !('!' <= c && c <= '~' || 0xa1 <= c && c <= 0xac || 0xae <= c && c <= 0xff) {
			r = next
			next++
		}
		b2r[c] = r
		r2b[r] = byte(c)
	}
	return b2r, r2b
}()

// byteLevelString maps token bytes to their ByteLevel string.
func byteLevelString(tok []byte) string {
	var sb strings.Builder
	for _, c := range tok {
		sb.WriteRune(byteToRune[c])
	}
	return sb.String()
}

// byteLevelBytes maps a ByteLevel string back to token bytes; ok is false
// if s has a character outside the mapping.
func byteLevelBytes(s string) (tok []byte, ok bool) {
	tok = make([]byte, 0, len(s))
	for _, r := range s {
		c, ok := runeToByte[r]
		if !ok {
			return nil, false
		}
		tok = append(tok, c)
	}
	return tok, true
}

// rawBytes maps a vocabulary string of a tokenizer whose vocabulary is not
// ByteLevel-mapped to token bytes: its UTF-8 encoding, except that the
// four-character text `\xHH` with HH >= 80 stands for the single byte 0xHH
// (there is no other way to write such a byte in a JSON string).
func rawBytes(s string) []byte {
	if len(s) == 4 && s[0] == '\\' && s[1] == 'x' {
		if v, err := strconv.ParseUint(s[2:], 16, 8); err == nil && v >= 0x80 {
			return []byte{byte(v)}
		}
	}
	return []byte(s)
}

// hfTokenizer is the part of tokenizer.json that LoadHuggingFace reads.
type hfTokenizer struct {
	AddedTokens  []hfAddedToken  `json:"added_tokens"`
	Normalizer   json.RawMessage `json:"normalizer"`
	PreTokenizer *hfPreTokenizer `json:"pre_tokenizer"`
	Decoder      *hfDecoder      `json:"decoder"`
	Model        struct {
		Type                    string          `json:"type"`
		Vocab                   map[string]int  `json:"vocab"`
		Merges                  json.RawMessage `json:"merges"`
		IgnoreMerges            bool            `json:"ignore_merges"`
		ContinuingSubwordPrefix string          `json:"continuing_subword_prefix"`
		EndOfWordSuffix         string          `json:"end_of_word_suffix"`
	} `json:"model"`
}

// hfAddedToken is an entry of added_tokens.
type hfAddedToken struct {
	ID      int    `json:"id"`
	Content string `json:"content"`
	Special bool   `json:"special"`
}

// hfPreTokenizer is a pre_tokenizer object (possibly a Sequence).
type hfPreTokenizer struct {
	Type           string           `json:"type"`
	AddPrefixSpace bool             `json:"add_prefix_space"`
	UseRegex       *bool            `json:"use_regex"` // default true
	Pretokenizers  []hfPreTokenizer `json:"pretokenizers"`
	Pattern        struct {
		Regex *string `json:"Regex"`
	} `json:"pattern"`
	Behavior string `json:"behavior"`
	Invert   bool   `json:"invert"`
}

// hfDecoder is a decoder object.
type hfDecoder struct {
	Type string `json:"type"`
}

// hfConfig is the part of tokenizer_config.json that LoadHuggingFace reads.
type hfConfig struct {
	BOS               json.RawMessage         `json:"bos_token"`
	EOS               json.RawMessage         `json:"eos_token"`
	AddedTokensDecode map[string]hfAddedToken `json:"added_tokens_decoder"`
}

// LoadHuggingFace reads a Hugging Face tokenizer.json describing a BPE
// model with ByteLevel pre-tokenization; path is the file or a directory
// containing it. The pre-tokenizer must be ByteLevel (GPT2Pattern splits)
// or a Split on Llama3Pattern or Qwen2Pattern followed by ByteLevel without
// regex; the normalizer must be null.
//
// Vocabulary strings are mapped to bytes with GPT-2's bytes-to-unicode
// table. A vocabulary that is not in that alphabet (such as torchtitan's
// test tokenizer) is read as raw UTF-8 text instead, with `\xHH` standing
// for a byte 0xHH >= 0x80.
//
// The merges list ("a b" strings or ["a", "b"] pairs) ranks the pairs in
// order. If it is empty the tokens are merged tiktoken-style with their ids
// as ranks (Hugging Face itself would not merge at all).
//
// All added tokens, from added_tokens and from the added_tokens_decoder of
// the tokenizer_config.json next to the file, are special: Encode never
// produces them and EncodeWithSpecials matches their text. BOS and EOS are
// the config's bos_token and eos_token when it has them, else well-known
// names such as "<|begin_of_text|>" and "<|end_of_text|>", "<s>" and
// "</s>".
func LoadHuggingFace(path string) (*BPE, error) {
	file, dir := path, filepath.Dir(path)
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		file, dir = filepath.Join(path, hfFileName), path
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	cfgPath := filepath.Join(dir, hfConfigName)
	cfgData, err := os.ReadFile(cfgPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var cfg hfConfig
	if cfgData != nil {
		if err := json.Unmarshal(cfgData, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer: parsing %s: %w", cfgPath, err)
		}
	}
	b, err := parseHuggingFace(data, &cfg)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", file, err)
	}
	return b, nil
}

// parseHuggingFace builds a BPE from tokenizer.json data and its config.
func parseHuggingFace(data []byte, cfg *hfConfig) (*BPE, error) {
	var hf hfTokenizer
	if err := json.Unmarshal(data, &hf); err != nil {
		return nil, fmt.Errorf("parsing JSON: %w", err)
	}
	m := &hf.Model
	if m.Type != "BPE" && !(m.Type == "" && m.Vocab != nil) {
		return nil, fmt.Errorf("model type %q is not supported (want BPE)", m.Type)
	}
	if m.ContinuingSubwordPrefix != "" || m.EndOfWordSuffix != "" {
		return nil, errors.New("BPE models with continuing_subword_prefix or end_of_word_suffix are not supported")
	}
	if len(m.Vocab) == 0 {
		return nil, errors.New("model has no vocab")
	}
	if n := bytes.TrimSpace(hf.Normalizer); len(n) > 0 && string(n) != "null" {
		return nil, fmt.Errorf("normalizer %s is not supported (want null)", clip(n))
	}
	split, err := hfSplitter(hf.PreTokenizer)
	if err != nil {
		return nil, err
	}
	if hf.Decoder != nil && hf.Decoder.Type != "ByteLevel" {
		return nil, fmt.Errorf("decoder %q is not supported (want ByteLevel)", hf.Decoder.Type)
	}

	// Added tokens, keyed by id.
	added := make(map[int]string)
	addAdded := func(id int, content, where string) error {
		if content == "" {
			return fmt.Errorf("%s: added token %d has empty content", where, id)
		}
		if prev, ok := added[id]; ok && prev != content {
			return fmt.Errorf("%s: id %d is both added token %q and %q", where, id, prev, content)
		}
		added[id] = content
		return nil
	}
	for _, t := range hf.AddedTokens {
		if err := addAdded(t.ID, t.Content, "added_tokens"); err != nil {
			return nil, err
		}
	}
	for key, t := range cfg.AddedTokensDecode {
		id, err := strconv.Atoi(key)
		if err != nil {
			return nil, fmt.Errorf("%s: added_tokens_decoder key %q is not an id", hfConfigName, key)
		}
		if err := addAdded(id, t.Content, hfConfigName+" added_tokens_decoder"); err != nil {
			return nil, err
		}
	}

	// Ordinary vocabulary: every vocab entry that is not an added token.
	byteLevel := true
	size := 0
	for s, id := range m.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("vocab entry %q has negative id %d", s, id)
		}
		size = max(size, id+1)
		if content, ok := added[id]; ok {
			if content != s {
				return nil, fmt.Errorf("id %d is vocab entry %q and added token %q", id, s, content)
			}
			continue
		}
		if _, ok := byteLevelBytes(s); !ok {
			byteLevel = false
		}
	}
	for id := range added {
		if id < 0 || id >= maxVocab {
			return nil, fmt.Errorf("added token %q has id %d, outside [0, %d)", added[id], id, maxVocab)
		}
		size = max(size, id+1)
	}
	// Ids may have gaps, but the tables below take memory by the largest
	// id: it must be in proportion to the number of tokens.
	if n := len(m.Vocab) + len(added); size >= maxVocab || size > 2*n+1024 {
		return nil, fmt.Errorf("vocab id %d is implausibly large for %d tokens", size-1, n)
	}
	vocab := make([][]byte, size)
	names := make([]string, size)
	for s, id := range m.Vocab {
		if _, ok := added[id]; ok {
			continue
		}
		if names[id] != "" || vocab[id] != nil {
			a, c := min(s, names[id]), max(s, names[id])
			return nil, fmt.Errorf("vocab entries %q and %q have the same id %d", a, c, id)
		}
		names[id] = s
		if byteLevel {
			vocab[id], _ = byteLevelBytes(s)
		} else {
			vocab[id] = rawBytes(s)
		}
	}

	// Merges.
	var pairs [][2]int32
	mergeList, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	for i, mg := range mergeList {
		a, ok1 := m.Vocab[mg[0]]
		c, ok2 := m.Vocab[mg[1]]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("merge %d (%q, %q) has a token that is not in the vocab", i, mg[0], mg[1])
		}
		pairs = append(pairs, [2]int32{int32(a), int32(c)})
	}
	if len(pairs) == 0 {
		pairs = nil // derive merges from ranks
	}

	specials := make([]special, 0, len(added))
	for id, text := range added {
		specials = append(specials, special{id: id, text: text})
	}
	slices.SortFunc(specials, func(x, y special) int { return x.id - y.id })
	cfgBPE := bpeConfig{
		name:       "huggingface",
		vocab:      vocab,
		pairs:      pairs,
		specials:   specials,
		wholePiece: m.IgnoreMerges || pairs == nil,
		split:      split,
	}
	lookup := func(text string) (int, bool) {
		for _, sp := range specials {
			if sp.text == text {
				return sp.id, true
			}
		}
		id, ok := m.Vocab[text]
		return id, ok
	}
	if cfgBPE.bos, err = hfSpecialID(cfg.BOS, "bos_token", lookup, []string{beginOfText, "<s>", "<bos>", "<|startoftext|>"}); err != nil {
		return nil, err
	}
	if cfgBPE.eos, err = hfSpecialID(cfg.EOS, "eos_token", lookup, []string{endOfText, "</s>", "<eos>", "<|endoftext|>"}); err != nil {
		return nil, err
	}
	return newBPE(cfgBPE)
}

// hfSplitter returns the splitter for a supported pre_tokenizer.
func hfSplitter(p *hfPreTokenizer) (splitter, error) {
	if p == nil {
		return 0, errors.New("pre_tokenizer is null; want ByteLevel")
	}
	useRegex := p.UseRegex == nil || *p.UseRegex
	switch p.Type {
	case "ByteLevel":
		if p.AddPrefixSpace {
			return 0, errors.New("ByteLevel pre_tokenizer with add_prefix_space is not supported")
		}
		if !useRegex {
			return 0, errors.New("ByteLevel pre_tokenizer without regex needs a preceding Split")
		}
		return splitGPT2, nil
	case "Sequence":
		seq := p.Pretokenizers
		if len(seq) == 1 {
			return hfSplitter(&seq[0])
		}
		if len(seq) == 2 && seq[0].Type == "Split" && seq[1].Type == "ByteLevel" {
			s, bl := seq[0], seq[1]
			if s.Pattern.Regex == nil {
				return 0, errors.New("Split pre_tokenizer without a Regex pattern is not supported")
			}
			if s.Behavior != "Isolated" || s.Invert {
				return 0, fmt.Errorf("Split pre_tokenizer with behavior %q, invert %v is not supported (want Isolated, false)", s.Behavior, s.Invert)
			}
			if bl.AddPrefixSpace || bl.UseRegex == nil || *bl.UseRegex {
				return 0, errors.New("ByteLevel after Split must have use_regex false and add_prefix_space false")
			}
			return splitterForPattern(*s.Pattern.Regex)
		}
	}
	return 0, fmt.Errorf("pre_tokenizer %q is not supported (want ByteLevel, or Sequence of Split and ByteLevel)", p.Type)
}

// parseMerges reads a merges list of "a b" strings or ["a", "b"] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("merges: %w", err)
	}
	out := make([][2]string, len(items))
	for i, it := range items {
		var s string
		if err := json.Unmarshal(it, &s); err == nil {
			a, c, ok := strings.Cut(s, " ")
			if !ok || a == "" || c == "" || strings.Contains(c, " ") {
				return nil, fmt.Errorf("merge %d %q: want two tokens separated by one space", i, s)
			}
			out[i] = [2]string{a, c}
			continue
		}
		var p []string
		if err := json.Unmarshal(it, &p); err != nil || len(p) != 2 {
			return nil, fmt.Errorf("merge %d %s: want \"a b\" or [\"a\", \"b\"]", i, clip(it))
		}
		out[i] = [2]string{p[0], p[1]}
	}
	return out, nil
}

// hfSpecialID resolves a bos_token or eos_token config value (a string, an
// object with "content", or null) to an id. With no value it tries the
// well-known names, returning -1 if none is present.
func hfSpecialID(raw json.RawMessage, field string, lookup func(string) (int, bool), wellKnown []string) (int, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && string(raw) != "null" {
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			var obj struct {
				Content string `json:"content"`
			}
			if err := json.Unmarshal(raw, &obj); err != nil {
				return -1, fmt.Errorf("%s %s: %s: want a string or {\"content\": ...}", hfConfigName, field, clip(raw))
			}
			text = obj.Content
		}
		id, ok := lookup(text)
		if !ok {
			return -1, fmt.Errorf("%s %s %q is not a token", hfConfigName, field, text)
		}
		return id, nil
	}
	for _, name := range wellKnown {
		if id, ok := lookup(name); ok {
			return id, nil
		}
	}
	return -1, nil
}

// SaveHuggingFace writes b as a Hugging Face tokenizer.json (BPE model,
// ByteLevel vocabulary, Split+ByteLevel or ByteLevel pre-tokenizer) that
// LoadHuggingFace reads back to a tokenizer with the same ids. Special
// tokens become added_tokens; BOS and EOS are not stored in tokenizer.json
// and are found again by their well-known names.
//
// For a BPE built from ranks, the merges list has every split of every token
// into two tokens, ordered by the merged token's rank, and ignore_merges is
// set, so the Hugging Face BPE merges as the tiktoken one does (except in
// the rare case where two overlapping adjacent pairs that merge into the same
// token compete; tiktoken merges the leftmost, Hugging Face the pair listed
// first).
func (b *BPE) SaveHuggingFace(w io.Writer) error {
	if !validUTF8(b.specialText) {
		return errors.New("tokenizer: cannot save as tokenizer.json: a special token is not valid UTF-8")
	}
	bw := bufio.NewWriter(w)
	q := func(s string) string { // JSON string literal
		out, err := json.Marshal(s)
		if err != nil {
			panic(err) // strings always marshal
		}
		return string(out)
	}
	bw.WriteString("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [")
	specialIDs := make([]int, 0, len(b.specialText))
	for id := range b.specialText {
		specialIDs = append(specialIDs, id)
	}
	slices.Sort(specialIDs)
	for i, id := range specialIDs {
		if i > 0 {
			bw.WriteString(",")
		}
		fmt.Fprintf(bw, "\n    {\"id\": %d, \"content\": %s, \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}", id, q(b.specialText[id]))
	}
	bw.WriteString("\n  ],\n  \"normalizer\": null,\n")
	if b.split == splitGPT2 {
		bw.WriteString(`  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},` + "\n")
	} else {
		fmt.Fprintf(bw, `  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": %s}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},`+"\n", q(b.split.pattern()))
	}
	bw.WriteString("  \"post_processor\": null,\n")
	bw.WriteString(`  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},` + "\n")
	fmt.Fprintf(bw, "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": %v,\n    \"vocab\": {", b.wholePiece)
	first := true
	for id, tok := range b.vocab {
		if tok == nil {
			continue
		}
		if !first {
			bw.WriteString(",")
		}
		first = false
		fmt.Fprintf(bw, "\n      %s: %d", q(byteLevelString(tok)), id)
	}
	bw.WriteString("\n    },\n    \"merges\": [")
	type rankedPair struct {
		m    merge
		a, c int32
	}
	pairs := make([]rankedPair, 0, len(b.merges))
	for k, m := range b.merges {
		pairs = append(pairs, rankedPair{m, int32(k >> 32), int32(uint32(k))})
	}
	slices.SortFunc(pairs, func(x, y rankedPair) int {
		if x.m.rank != y.m.rank {
			return int(x.m.rank) - int(y.m.rank)
		}
		if x.a != y.a {
			return int(x.a) - int(y.a)
		}
		return int(x.c) - int(y.c)
	})
	for i, p := range pairs {
		if i > 0 {
			bw.WriteString(",")
		}
		fmt.Fprintf(bw, "\n      %s", q(byteLevelString(b.vocab[p.a])+" "+byteLevelString(b.vocab[p.c])))
	}
	bw.WriteString("\n    ]\n  }\n}\n")
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("tokenizer: writing tokenizer.json: %w", err)
	}
	return nil
}

// validUTF8 reports whether every special token text is valid UTF-8; JSON
// cannot carry other strings faithfully.
func validUTF8(texts map[int]string) bool {
	for _, t := range texts {
		if !utf8.ValidString(t) {
			return false
		}
	}
	return true
}
