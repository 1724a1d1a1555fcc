package tokenizer

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func loadTestTiktoken(tb testing.TB) *BPE {
	tb.Helper()
	b, err := LoadTiktoken(dataFile(tb, tiktokenTestFile))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestTiktokenTestModel(t *testing.T) {
	b := loadTestTiktoken(t)
	if got := b.VocabSize(); got != 2256 {
		t.Errorf("VocabSize = %d, want 2256", got)
	}
	if b.BOS() != 2000 || b.EOS() != 2001 {
		t.Errorf("BOS, EOS = %d, %d; want 2000, 2001", b.BOS(), b.EOS())
	}
	if b.Name() != "tiktoken" {
		t.Errorf("Name = %q", b.Name())
	}
	specials := []struct {
		text string
		id   int
	}{
		{"<|begin_of_text|>", 2000},
		{"<|end_of_text|>", 2001},
		{"<|reserved_special_token_0|>", 2002},
		{"<|reserved_special_token_1|>", 2003},
		{"<|finetune_right_pad_id|>", 2004},
		{"<|step_id|>", 2005},
		{"<|start_header_id|>", 2006},
		{"<|end_header_id|>", 2007},
		{"<|eom_id|>", 2008},
		{"<|eot_id|>", 2009},
		{"<|python_tag|>", 2010},
		{"<|reserved_special_token_2|>", 2011},
		{"<|reserved_special_token_246|>", 2255},
	}
	for _, sp := range specials {
		if id, ok := b.SpecialID(sp.text); !ok || id != sp.id {
			t.Errorf("SpecialID(%q) = %d, %v; want %d", sp.text, id, ok, sp.id)
		}
		if got := b.Decode([]int{sp.id}); got != sp.text {
			t.Errorf("Decode(%d) = %q, want %q", sp.id, got, sp.text)
		}
	}
}

// TestTiktokenKnownEncodings checks encodings computed by an independent
// Python implementation (the regex module's findall with the Llama 3
// pattern, then a quadratic rank-based BPE) on test_tiktoken.model.
func TestTiktokenKnownEncodings(t *testing.T) {
	b := loadTestTiktoken(t)
	tests := []struct {
		in   string
		want []int
	}{
		{"", []int{}},
		{"hello world", []int{257, 286, 111, 441, 307}},
		{"The quick brown fox jumps over the lazy dog.", []int{705, 578, 709, 688, 418, 275, 111, 120, 1195, 1497, 710, 262, 305, 964, 121, 430, 103, 46}},
		{"I'm 12345 years old!!\n\nOK", []int{73, 776, 32, 49, 50, 51, 52, 53, 1425, 615, 33, 1492, 10, 79, 75}},
		{"naïve café 日本", []int{956, 195, 175, 320, 282, 97, 102, 195, 169, 32, 230, 151, 165, 230, 156, 172}},
		{"  indented\tline\r\n", []int{32, 1077, 317, 267, 9, 1913, 13, 10}},
		{"First Citizen:\nBefore we proceed any further, hear me speak.", []int{70, 327, 322, 497, 272, 786, 278, 1037, 66, 101, 763, 363, 550, 315, 267, 448, 1949, 44, 1619, 328, 903, 457, 46}},
	}
	for _, tt := range tests {
		got := b.Encode(tt.in)
		if !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.in, got, tt.want)
		}
		if dec := b.Decode(got); dec != tt.in {
			t.Errorf("Decode(Encode(%q)) = %q", tt.in, dec)
		}
	}
}

// TestTiktokenMatchesReference compares Encode with the quadratic
// reference BPE and reference splitter on tinyshakespeare and random text.
func TestTiktokenMatchesReference(t *testing.T) {
	b := loadTestTiktoken(t)
	ranks := refRanks(t, dataFile(t, tiktokenTestFile))
	text := shakespeare(t)
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	var inputs []string
	for i := 0; i < n; i += 5000 {
		inputs = append(inputs, text[i:i+5000])
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		inputs = append(inputs, randomText(rng, 30), randomBytes(rng, 30))
	}
	// Long pieces exercise the heap merge path.
	inputs = append(inputs,
		strings.Repeat("ab", 300),
		strings.Repeat("the", 100)+"x",
		strings.Repeat("!?", 200),
		strings.Repeat(" ", 500)+"x",
		randomLetters(rng, 1000),
	)
	for _, in := range inputs {
		got := b.Encode(in)
		want := refEncode(ranks, splitLlama3, in)
		if !slices.Equal(got, want) {
			t.Fatalf("Encode(%q) = %v, reference %v", clip([]byte(in)), got, want)
		}
	}
}

// randomLetters returns n random lowercase letters.
func randomLetters(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return string(b)
}

// TestMergeHeapMatchesLinear checks the two merge implementations agree on
// pieces of every length around the switch-over.
func TestMergeHeapMatchesLinear(t *testing.T) {
	b := loadTestTiktoken(t)
	rng := rand.New(rand.NewPCG(5, 6))
	text := shakespeare(t)
	for range 3000 {
		n := 2 + rng.IntN(linearMergeMax-1)
		var piece string
		if rng.IntN(2) == 0 {
			start := rng.IntN(len(text) - n)
			piece = text[start : start+n]
		} else {
			piece = randomBytes(rng, n)
			if len(piece) < 2 {
				continue
			}
		}
		lin := b.mergeLinear(nil, piece)
		hp := b.mergeHeap(nil, piece)
		if !slices.Equal(lin, hp) {
			t.Fatalf("piece %q: linear %v, heap %v", piece, lin, hp)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	tiktok := loadTestTiktoken(t)
	hf, err := LoadHuggingFace(dataFile(t, hfTestDir))
	if err != nil {
		t.Fatal(err)
	}
	trained := trainedSmall(t)
	text := shakespeare(t)
	rng := rand.New(rand.NewPCG(7, 8))
	inputs := []string{"", " ", "\n", "a", "\x00", "\xff", "<|begin_of_text|>", "x<|end_of_text|>y<|eot_id|>", text}
	for range 500 {
		inputs = append(inputs, randomBytes(rng, 64), randomText(rng, 40))
	}
	for _, tok := range []Tokenizer{tiktok, hf, trained, NewByte()} {
		for _, in := range inputs {
			ids := tok.Encode(in)
			if got := tok.Decode(ids); got != in {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", tok.Name(), clip([]byte(in)), clip([]byte(got)))
			}
			for _, id := range ids {
				if id < 0 || id >= tok.VocabSize() {
					t.Fatalf("%s: id %d out of range [0, %d)", tok.Name(), id, tok.VocabSize())
				}
			}
			if got := tok.Decode(tok.EncodeWithSpecials(in)); got != in {
				t.Fatalf("%s: Decode(EncodeWithSpecials(%q)) = %q", tok.Name(), clip([]byte(in)), clip([]byte(got)))
			}
		}
	}
}

// TestSpecialText checks that Encode treats special tokens' text as plain
// text and EncodeWithSpecials maps each occurrence to one id.
func TestSpecialText(t *testing.T) {
	toks := []Tokenizer{NewByte(), trainedSmall(t)}
	if haveDataFile(tiktokenTestFile) {
		toks = append(toks, loadTestTiktoken(t))
	}
	for _, tok := range toks {
		bos, eos := tok.BOS(), tok.EOS()
		text := "<|begin_of_text|>Hi there<|end_of_text|><|end_of_text|>"
		plain := tok.Encode(text)
		if slices.Contains(plain, bos) || slices.Contains(plain, eos) {
			t.Errorf("%s: Encode produced a special id: %v", tok.Name(), plain)
		}
		got := tok.EncodeWithSpecials(text)
		want := slices.Concat([]int{bos}, tok.Encode("Hi there"), []int{eos, eos})
		if !slices.Equal(got, want) {
			t.Errorf("%s: EncodeWithSpecials(%q) = %v, want %v", tok.Name(), text, got, want)
		}
		// Partial special text is ordinary.
		partial := "<|begin_of_text|"
		if got, want := tok.EncodeWithSpecials(partial), tok.Encode(partial); !slices.Equal(got, want) {
			t.Errorf("%s: EncodeWithSpecials(%q) = %v, want %v", tok.Name(), partial, got, want)
		}
	}
}

func TestByteTokenizer(t *testing.T) {
	tok := NewByte()
	if tok.VocabSize() != 258 || tok.BOS() != 256 || tok.EOS() != 257 || tok.Name() != "byte" {
		t.Fatalf("byte tokenizer: size %d, BOS %d, EOS %d, name %q", tok.VocabSize(), tok.BOS(), tok.EOS(), tok.Name())
	}
	if got := tok.Encode("a\xff"); !slices.Equal(got, []int{97, 255}) {
		t.Errorf("Encode = %v", got)
	}
	if got := tok.Decode([]int{104, 105, 256, 257, 999}); got != "hi<|begin_of_text|><|end_of_text|>\uFFFD" {
		t.Errorf("Decode = %q", got)
	}
}

func TestDecodeInvalidID(t *testing.T) {
	b := loadTestTiktoken(t)
	if got := b.Decode([]int{-1, 104, 99999}); got != "\uFFFDh\uFFFD" {
		t.Errorf("Decode = %q", got)
	}
}

// tiktokenFile writes a tiktoken file of the 256 byte tokens plus extra
// lines and returns its path.
func tiktokenFile(t *testing.T, extra string) string {
	t.Helper()
	var sb strings.Builder
	for c := 0; c < 256; c++ {
		fmt.Fprintf(&sb, "%s %d\n", base64.StdEncoding.EncodeToString([]byte{byte(c)}), c)
	}
	sb.WriteString(extra)
	p := filepath.Join(t.TempDir(), "tok.model")
	if err := os.WriteFile(p, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadTiktokenErrors(t *testing.T) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	tests := []struct {
		name  string
		extra string
		want  []string // substrings of the error
	}{
		{"malformed line", b64("ab") + "\n", []string{"tok.model:257", "malformed"}},
		{"three fields", b64("ab") + " 256 7\n", []string{"tok.model:257", "malformed"}},
		{"bad base64", "!!! 256\n", []string{"tok.model:257", "base64"}},
		{"bad rank", b64("ab") + " x\n", []string{"tok.model:257", "rank"}},
		{"negative rank", b64("ab") + " -1\n", []string{"tok.model:257", "rank"}},
		{"duplicate rank", b64("ab") + " 255\n", []string{"tok.model:257", "duplicate rank 255", "line 256"}},
		{"duplicate token", b64("a") + " 256\n", []string{"tok.model:257", "duplicate token"}},
		{"gap", b64("ab") + " 257\n", []string{"not contiguous", "rank 256 is missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadTiktoken(tiktokenFile(t, tt.extra))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if _, err := LoadTiktoken(filepath.Join(t.TempDir(), "missing.model")); err == nil || !strings.Contains(err.Error(), "missing.model") {
		t.Errorf("missing file: error %v", err)
	}
	// A file without every single byte cannot encode arbitrary text.
	p := filepath.Join(t.TempDir(), "few.model")
	os.WriteFile(p, []byte(b64("a")+" 0\n"+b64("b")+" 1\n"), 0o644)
	if _, err := LoadTiktoken(p); err == nil || !strings.Contains(err.Error(), "byte 0x00") {
		t.Errorf("missing bytes: error %v", err)
	}
	// Blank lines are allowed.
	if _, err := LoadTiktoken(tiktokenFile(t, "\n"+b64("ab")+" 256\n\n")); err != nil {
		t.Errorf("blank lines: %v", err)
	}
}

func TestSaveTiktokenRoundTrip(t *testing.T) {
	b := loadTestTiktoken(t)
	var buf bytes.Buffer
	if err := b.SaveTiktoken(&buf); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(dataFile(t, tiktokenTestFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), orig) {
		t.Error("SaveTiktoken output differs from the file it was loaded from")
	}
}

func TestLoadDetectsFormat(t *testing.T) {
	tk := dataFile(t, tiktokenTestFile)
	hfDir := dataFile(t, hfTestDir)
	dirWithModel := t.TempDir()
	data, _ := os.ReadFile(tk)
	os.WriteFile(filepath.Join(dirWithModel, "tokenizer.model"), data, 0o644)
	tests := []struct {
		path string
		name string
		size int
	}{
		{"byte", "byte", 258},
		{tk, "tiktoken", 2256},
		{dirWithModel, "tiktoken", 2256},
		{hfDir, "huggingface", 2020},
		{filepath.Join(hfDir, "tokenizer.json"), "huggingface", 2020},
	}
	for _, tt := range tests {
		tok, err := Load(tt.path)
		if err != nil {
			t.Errorf("Load(%s): %v", tt.path, err)
			continue
		}
		if tok.Name() != tt.name || tok.VocabSize() != tt.size {
			t.Errorf("Load(%s) = %s with %d ids, want %s with %d", tt.path, tok.Name(), tok.VocabSize(), tt.name, tt.size)
		}
	}
	// JSON content without a .json name is still detected.
	hfData, _ := os.ReadFile(filepath.Join(hfDir, "tokenizer.json"))
	p := filepath.Join(t.TempDir(), "tok")
	os.WriteFile(p, hfData, 0o644)
	if tok, err := Load(p); err != nil || tok.Name() != "huggingface" {
		t.Errorf("Load(JSON without extension) = %v, %v", tok, err)
	}
	for _, bad := range []string{filepath.Join(t.TempDir(), "nope"), t.TempDir()} {
		if _, err := Load(bad); err == nil {
			t.Errorf("Load(%s): no error", bad)
		}
	}
}

// TestConcurrentEncode encodes from several goroutines at once (run with
// -race) and compares with sequential results.
func TestConcurrentEncode(t *testing.T) {
	b := loadTestTiktoken(t)
	text := shakespeare(t)[:200_000]
	var chunks []string
	for i := 0; i < len(text); i += 10_000 {
		chunks = append(chunks, text[i:i+10_000])
	}
	want := make([][]int, len(chunks))
	seq := loadTestTiktoken(t)
	for i, c := range chunks {
		want[i] = seq.Encode(c)
	}
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for k := range chunks {
				i := (k + 5*g) % len(chunks)
				if got := b.Encode(chunks[i]); !slices.Equal(got, want[i]) {
					errs <- fmt.Errorf("goroutine %d: chunk %d differs", g, i)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
