package tokenizer

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestByteLevelMapping(t *testing.T) {
	tests := []struct {
		b byte
		r rune
	}{
		{' ', 'Ġ'}, {'\n', 'Ċ'}, {'\t', 'ĉ'}, {0, 'Ā'}, {'!', '!'}, {'~', '~'},
		{0x7f, 'ġ'}, {0xa0, 'ł'}, {0xa1, '¡'}, {0xad, 'Ń'}, {0xff, 'ÿ'},
	}
	for _, tt := range tests {
		if got := byteToRune[tt.b]; got != tt.r {
			t.Errorf("byteToRune[%#x] = %q, want %q", tt.b, got, tt.r)
		}
	}
	seen := make(map[rune]bool)
	for c := range 256 {
		r := byteToRune[c]
		if seen[r] || runeToByte[r] != byte(c) {
			t.Fatalf("mapping is not a bijection at byte %#x", c)
		}
		seen[r] = true
	}
}

// TestTorchtitanHFTokenizer loads torchtitan's odd test tokenizer.json
// (empty merges, raw-text vocabulary, GPT-2 pre-tokenizer).
func TestTorchtitanHFTokenizer(t *testing.T) {
	hf, err := LoadHuggingFace(dataFile(t, hfTestDir))
	if err != nil {
		t.Fatal(err)
	}
	if hf.VocabSize() != 2020 || hf.BOS() != 2002 || hf.EOS() != 2003 || hf.Name() != "huggingface" {
		t.Errorf("size %d BOS %d EOS %d name %q; want 2020 2002 2003 huggingface", hf.VocabSize(), hf.BOS(), hf.EOS(), hf.Name())
	}
	for text, id := range map[string]int{"<|image|>": 1998, "<|pad|>": 2001, "[PAD]": 2019, "<tool_call>": 2011} {
		if got, ok := hf.SpecialID(text); !ok || got != id {
			t.Errorf("SpecialID(%q) = %d, %v; want %d", text, got, ok, id)
		}
	}
	if got := hf.EncodeWithSpecials("<|im_start|>hi<|im_end|>"); got[0] != 2009 || got[len(got)-1] != 2010 {
		t.Errorf("EncodeWithSpecials = %v", got)
	}
	// The first 1998 ids agree with test_tiktoken.model, so wherever the
	// GPT-2 and Llama 3 splits agree and tiktoken uses no id >= 1998,
	// the encodings must be equal.
	tk := loadTestTiktoken(t)
	compared := 0
	for _, piece := range splitLlama3.appendPieces(nil, shakespeare(t)[:200_000]) {
		if len(splitGPT2.appendPieces(nil, piece)) != 1 {
			continue
		}
		want := tk.Encode(piece)
		if slices.Max(want) >= 1998 {
			continue
		}
		if got := hf.Encode(piece); !slices.Equal(got, want) {
			t.Fatalf("Encode(%q) = %v, tiktoken %v", piece, got, want)
		}
		compared++
	}
	if compared < 10000 {
		t.Errorf("only %d pieces compared", compared)
	}
	// Bytes >= 0x80 are the vocabulary's "\xHH" entries.
	if got := hf.Encode("\x80\xff"); !slices.Equal(got, []int{128, 255}) {
		t.Errorf(`Encode("\x80\xff") = %v, want [128 255]`, got)
	}
}

// saveLoadHF writes b as tokenizer.json (with an optional config) into a
// new directory and loads it back.
func saveLoadHF(t *testing.T, b *BPE, config string) *BPE {
	t.Helper()
	dir := t.TempDir()
	var buf bytes.Buffer
	if err := b.SaveHuggingFace(&buf); err != nil {
		t.Fatal(err)
	}
	if !json.Valid(buf.Bytes()) {
		t.Fatal("SaveHuggingFace wrote invalid JSON")
	}
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), buf.Bytes(), 0o644)
	if config != "" {
		os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(config), 0o644)
	}
	hf, err := LoadHuggingFace(dir)
	if err != nil {
		t.Fatal(err)
	}
	return hf
}

// TestHFRoundTripEncodings converts rank-based tokenizers to tokenizer.json
// (explicit merges, byte-level vocabulary) and checks the Hugging Face path
// encodes exactly like the tiktoken path.
func TestHFRoundTripEncodings(t *testing.T) {
	text := shakespeare(t)
	rng := rand.New(rand.NewPCG(9, 10))
	var inputs []string
	for i := 0; i < 300_000; i += 3000 {
		inputs = append(inputs, text[i:i+3000])
	}
	for range 1000 {
		inputs = append(inputs, randomBytes(rng, 40), randomText(rng, 30))
	}
	trained, err := Train(strings.NewReader(text[:300_000]), 1000, TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range []*BPE{loadTestTiktoken(t), trained} {
		hf := saveLoadHF(t, tk, "")
		if hf.VocabSize() != tk.VocabSize() || hf.BOS() != tk.BOS() || hf.EOS() != tk.EOS() {
			t.Errorf("reloaded: size %d BOS %d EOS %d; want %d %d %d", hf.VocabSize(), hf.BOS(), hf.EOS(), tk.VocabSize(), tk.BOS(), tk.EOS())
		}
		if hf.fromRanks || len(hf.merges) != len(tk.merges) {
			t.Errorf("reloaded: fromRanks %v, %d merges; want false, %d", hf.fromRanks, len(hf.merges), len(tk.merges))
		}
		for _, in := range inputs {
			want := tk.EncodeWithSpecials(in)
			if got := hf.EncodeWithSpecials(in); !slices.Equal(got, want) {
				t.Fatalf("HF Encode(%q) = %v, tiktoken %v", clip([]byte(in)), got, want)
			}
		}
		// And back again: SaveTiktoken of the HF tokenizer is the original.
		var a, b bytes.Buffer
		tk.SaveTiktoken(&a)
		if err := hf.SaveTiktoken(&b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Error("tiktoken -> HF -> tiktoken changed the file")
		}
	}
}

// refMergesBPE encodes a piece Hugging Face style: repeatedly apply the
// listed merge of lowest index among adjacent pairs, leftmost on ties.
func refMergesBPE(vocab map[string]int, merges [][2]string, piece string) []int {
	rank := make(map[[2]string]int)
	for i, m := range merges {
		if _, ok := rank[m]; !ok {
			rank[m] = i
		}
	}
	var parts []string
	for i := 0; i < len(piece); i++ {
		parts = append(parts, piece[i:i+1])
	}
	for {
		best, bestRank := -1, 0
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := rank[[2]string{parts[i], parts[i+1]}]; ok && (best < 0 || r < bestRank) {
				best, bestRank = i, r
			}
		}
		if best < 0 {
			break
		}
		parts = append(parts[:best], append([]string{parts[best] + parts[best+1]}, parts[best+2:]...)...)
	}
	ids := make([]int, len(parts))
	for i, p := range parts {
		ids[i] = vocab[p]
	}
	return ids
}

// hfJSON builds a tokenizer.json with the 256 byte tokens, extra tokens
// (ids from 256) and the given merges, as "a b" strings or pairs.
func hfJSON(extra []string, merges [][2]string, pairs bool, ignoreMerges bool) string {
	vocab := make(map[string]int)
	for c := range 256 {
		vocab[byteLevelString([]byte{byte(c)})] = c
	}
	for i, s := range extra {
		vocab[byteLevelString([]byte(s))] = 256 + i
	}
	var ms []any
	for _, m := range merges {
		a, b := byteLevelString([]byte(m[0])), byteLevelString([]byte(m[1]))
		if pairs {
			ms = append(ms, []string{a, b})
		} else {
			ms = append(ms, a+" "+b)
		}
	}
	doc := map[string]any{
		"version":      "1.0",
		"added_tokens": []any{map[string]any{"id": 256 + len(extra), "content": "<|end_of_text|>", "special": true}},
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": Llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": ms, "ignore_merges": ignoreMerges},
	}
	out, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return string(out)
}

func writeHF(t *testing.T, tokJSON, config string) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tokJSON), 0o644)
	if config != "" {
		os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(config), 0o644)
	}
	return dir
}

// TestHFMergesSemantics checks that explicit merges apply by list order and
// only to listed pairs, against the reference.
func TestHFMergesSemantics(t *testing.T) {
	extra := []string{"bc", "abc", "ab", " a", " ab", "cc", "ccc", "cccc"}
	merges := [][2]string{{"b", "c"}, {"a", "bc"}, {"c", "c"}, {"cc", "cc"}, {"a", "b"}, {" ", "a"}, {" a", "b"}}
	vocab := make(map[string]int)
	for c := range 256 {
		vocab[string([]byte{byte(c)})] = c
	}
	for i, s := range extra {
		vocab[s] = 256 + i
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for _, pairs := range []bool{false, true} {
		b, err := LoadHuggingFace(writeHF(t, hfJSON(extra, merges, pairs, false), ""))
		if err != nil {
			t.Fatal(err)
		}
		if b.EOS() != 256+len(extra) || b.BOS() != -1 {
			t.Errorf("BOS, EOS = %d, %d; want -1, %d", b.BOS(), b.EOS(), 256+len(extra))
		}
		// "ccc" is a token, but no listed merge makes it; without
		// ignore_merges the piece is merged, not looked up.
		if got := b.Encode("ccc"); !slices.Equal(got, []int{vocab["cc"], vocab["c"]}) {
			t.Errorf("Encode(ccc) = %v", got)
		}
		for range 2000 {
			var sb strings.Builder
			for k := rng.IntN(12); k > 0; k-- {
				sb.WriteString([]string{"a", "b", "c", " ", "x"}[rng.IntN(5)])
			}
			s := sb.String()
			var want []int
			for _, p := range refSplit(splitLlama3, s) {
				want = append(want, refMergesBPE(vocab, merges, p)...)
			}
			if got := b.Encode(s); !slices.Equal(got, want) {
				t.Fatalf("pairs=%v: Encode(%q) = %v, reference %v", pairs, s, got, want)
			}
		}
	}
	// With ignore_merges a piece that is a token is that token.
	b, err := LoadHuggingFace(writeHF(t, hfJSON(extra, merges, false, true), ""))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Encode("ccc"); !slices.Equal(got, []int{vocab["ccc"]}) {
		t.Errorf("ignore_merges: Encode(ccc) = %v", got)
	}
}

func TestHFConfigBOSEOS(t *testing.T) {
	tok := hfJSON([]string{"ab"}, [][2]string{{"a", "b"}}, false, false)
	tests := []struct {
		config   string
		bos, eos int
		err      string
	}{
		{``, -1, 257, ""},
		{`{"bos_token": "ab", "eos_token": "<|end_of_text|>"}`, 256, 257, ""},
		{`{"bos_token": {"content": "a", "__type": "AddedToken"}, "eos_token": null}`, 'a', 257, ""},
		{`{"added_tokens_decoder": {"300": {"content": "<s>", "special": true}}}`, 300, 257, ""},
		{`{"bos_token": "<missing>"}`, 0, 0, `bos_token "<missing>" is not a token`},
		{`{"bos_token": 7}`, 0, 0, "bos_token"},
		{`{not json`, 0, 0, "tokenizer_config.json"},
		{`{"added_tokens_decoder": {"x": {"content": "<s>"}}}`, 0, 0, `key "x"`},
		{`{"added_tokens_decoder": {"256": {"content": "<s>"}}}`, 0, 0, "id 256"},
	}
	for _, tt := range tests {
		b, err := LoadHuggingFace(writeHF(t, tok, tt.config))
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("config %s: error %v, want %q", tt.config, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("config %s: %v", tt.config, err)
			continue
		}
		if b.BOS() != tt.bos || b.EOS() != tt.eos {
			t.Errorf("config %s: BOS, EOS = %d, %d; want %d, %d", tt.config, b.BOS(), b.EOS(), tt.bos, tt.eos)
		}
	}
}

func TestLoadHuggingFaceErrors(t *testing.T) {
	good := hfJSON([]string{"ab"}, [][2]string{{"a", "b"}}, false, false)
	edit := func(f func(m map[string]any)) string {
		var m map[string]any
		json.Unmarshal([]byte(good), &m)
		f(m)
		out, _ := json.Marshal(m)
		return string(out)
	}
	model := func(m map[string]any) map[string]any { return m["model"].(map[string]any) }
	tests := []struct {
		name string
		json string
		want string
	}{
		{"bad JSON", `{"model": `, "parsing JSON"},
		{"WordPiece", edit(func(m map[string]any) { model(m)["type"] = "WordPiece" }), `model type "WordPiece"`},
		{"normalizer", edit(func(m map[string]any) { m["normalizer"] = map[string]any{"type": "NFC"} }), "normalizer"},
		{"no pre-tokenizer", edit(func(m map[string]any) { m["pre_tokenizer"] = nil }), "pre_tokenizer is null"},
		{"unknown pattern", strings.Replace(good, `\\p{N}{1,3}`, `\\d+`, 1), "unsupported pre-tokenizer pattern"},
		{"prefix space", edit(func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true}
		}), "add_prefix_space"},
		{"Metaspace", edit(func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Metaspace"} }), `pre_tokenizer "Metaspace"`},
		{"decoder", edit(func(m map[string]any) { m["decoder"] = map[string]any{"type": "WordPiece"} }), "decoder"},
		{"merge of unknown token", edit(func(m map[string]any) { model(m)["merges"] = []any{"a zz"} }), "not in the vocab"},
		{"merge result missing", edit(func(m map[string]any) { model(m)["merges"] = []any{"a c"} }), `merged token "ac"`},
		{"malformed merge", edit(func(m map[string]any) { model(m)["merges"] = []any{"abc"} }), "merge 0"},
		{"duplicate id", edit(func(m map[string]any) { model(m)["vocab"].(map[string]any)["zz"] = 5 }), "same id 5"},
		{"missing byte", edit(func(m map[string]any) { delete(model(m)["vocab"].(map[string]any), "Ġ") }), "byte 0x20"},
		{"suffix", edit(func(m map[string]any) { model(m)["end_of_word_suffix"] = "</w>" }), "end_of_word_suffix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeHF(t, tt.json, "")
			_, err := LoadHuggingFace(dir)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to mention %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), filepath.Join(dir, "tokenizer.json")) {
				t.Errorf("error %v does not name the file", err)
			}
		})
	}
	if _, err := LoadHuggingFace(filepath.Join(t.TempDir(), "none.json")); err == nil {
		t.Error("missing file: no error")
	}
}

func TestHFQwen2AndGPT2Patterns(t *testing.T) {
	good := hfJSON([]string{"ab"}, [][2]string{{"a", "b"}}, false, false)
	qwen := strings.Replace(good, `\\p{N}{1,3}`, `\\p{N}`, 1)
	b, err := LoadHuggingFace(writeHF(t, qwen, ""))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Encode("123"); len(got) != 3 || b.split != splitQwen2 {
		t.Errorf("Qwen2 split: Encode(123) = %v", got)
	}
	var m map[string]any
	json.Unmarshal([]byte(good), &m)
	m["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false}
	out, _ := json.Marshal(m)
	b, err = LoadHuggingFace(writeHF(t, string(out), ""))
	if err != nil {
		t.Fatal(err)
	}
	if b.split != splitGPT2 {
		t.Errorf("ByteLevel with regex: splitter %d, want GPT-2", b.split)
	}
	// GPT-2 split tokenizers save and reload as such.
	if re := saveLoadHF(t, b, ""); re.split != splitGPT2 {
		t.Errorf("reloaded splitter %d, want GPT-2", re.split)
	}
}
