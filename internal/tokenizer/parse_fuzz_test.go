package tokenizer

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/testenv"
)

// fuzzText is what parsed tokenizers must round-trip.
const fuzzText = "Hello, world! naïve 123 \xff\x00 <|eot_id|>"

// checkParsed checks a tokenizer parsed from hostile bytes: it encodes and
// decodes text faithfully, and what it saves it reads back to the same
// vocabulary.
func checkParsed(t *testing.T, b *BPE) {
	t.Helper()
	for _, ids := range [][]int{b.Encode(fuzzText), b.EncodeWithSpecials(fuzzText)} {
		if got := b.Decode(ids); got != fuzzText {
			t.Fatalf("Decode(Encode(%q)) = %q", fuzzText, got)
		}
		for _, id := range ids {
			if id < 0 || id >= b.VocabSize() {
				t.Fatalf("Encode gave id %d outside the vocabulary of %d", id, b.VocabSize())
			}
		}
	}
}

// tiktokenSeed writes the ordinary tokens of b as a tiktoken file.
func tiktokenSeed(tb testing.TB, b *BPE) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if err := b.SaveTiktoken(&buf); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzReadTiktoken parses arbitrary bytes as a tiktoken file: no panic, no
// allocation out of proportion to the input (a hostile rank must not size
// the vocabulary), and a file that parses round-trips text and its own
// saved form.
func FuzzReadTiktoken(f *testing.F) {
	small := tiktokenSeed(f, trainedSmall(f))
	f.Add(small)
	var bytesOnly bytes.Buffer
	for c := range 256 {
		fmt.Fprintf(&bytesOnly, "%s %d\n", base64.StdEncoding.EncodeToString([]byte{byte(c)}), c)
	}
	f.Add(bytesOnly.Bytes())
	f.Add(append(bytes.Clone(bytesOnly.Bytes()), "aGk= 16777215\n"...))
	f.Add(append(bytes.Clone(bytesOnly.Bytes()), "aGk= 999999999999999999999\n"...))
	f.Add(append(bytes.Clone(bytesOnly.Bytes()), "aGk= 300\n"...))
	f.Add([]byte("QQ== 0\nQQ== 1\n"))
	f.Add([]byte("not base64! 0\n"))
	f.Add([]byte(""))
	if p, ok := testenv.FindSharedData(strings.Split(tiktokenTestFile, "/")...); ok {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := readTiktoken(bytes.NewReader(data), "fuzz.model")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.model") && !strings.HasPrefix(err.Error(), "reading fuzz.model") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if b.VocabSize() > len(data)+1024 {
			t.Fatalf("a file of %d bytes made a vocabulary of %d ids", len(data), b.VocabSize())
		}
		checkParsed(t, b)
		again, err := readTiktoken(bytes.NewReader(tiktokenSeed(t, b)), "saved.model")
		if err != nil {
			t.Fatalf("reading back the saved file: %v", err)
		}
		if !slices.EqualFunc(b.vocab, again.vocab, bytes.Equal) {
			t.Fatal("the saved file reads back to another vocabulary")
		}
	})
}

// FuzzParseHuggingFace parses arbitrary tokenizer.json and
// tokenizer_config.json bytes: no panic, no allocation out of proportion
// to the input (hostile ids must not size the tables), and a tokenizer
// that parses round-trips text.
func FuzzParseHuggingFace(f *testing.F) {
	var buf bytes.Buffer
	if err := trainedSmall(f).SaveHuggingFace(&buf); err != nil {
		f.Fatal(err)
	}
	small := buf.Bytes()
	f.Add(small, []byte(""))
	f.Add(small, []byte(`{"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}}`))
	f.Add(small, []byte(`{"added_tokens_decoder": {"16777000": {"content": "<x>"}}}`))
	f.Add(small, []byte(`{"added_tokens_decoder": {"2147483647": {"content": "<x>"}}}`))
	f.Add(small, []byte(`{"added_tokens_decoder": {"-5": {"content": "<x>"}}}`))
	f.Add(bytes.Replace(small, []byte(`"added_tokens": [`), []byte(`"added_tokens": [{"id": 2000000000, "content": "<big>"},`), 1), []byte(""))
	f.Add([]byte(`{"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 16777215}}}`), []byte(""))
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": ["a b"]}}`), []byte(""))
	f.Add([]byte(`{"model": {"type": "WordPiece"}}`), []byte(""))
	f.Add([]byte(`null`), []byte(`null`))
	f.Fuzz(func(t *testing.T, data, cfgData []byte) {
		var cfg hfConfig
		if len(cfgData) > 0 && json.Unmarshal(cfgData, &cfg) != nil {
			return // LoadHuggingFace refuses the config first
		}
		b, err := parseHuggingFace(data, &cfg)
		if err != nil {
			return
		}
		if b.VocabSize() > 2*(len(data)+len(cfgData))+2048 {
			t.Fatalf("files of %d bytes made a vocabulary of %d ids", len(data)+len(cfgData), b.VocabSize())
		}
		checkParsed(t, b)
	})
}

// TestHostileIDs: ids that would size the tables are refused before any
// table is allocated, with an error naming the id.
func TestHostileIDs(t *testing.T) {
	var bytesOnly bytes.Buffer
	for c := range 256 {
		fmt.Fprintf(&bytesOnly, "%s %d\n", base64.StdEncoding.EncodeToString([]byte{byte(c)}), c)
	}
	var hf bytes.Buffer
	if err := trainedSmall(t).SaveHuggingFace(&hf); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		read func() error
		msg  string
	}{
		{"tiktoken rank 2^24-1", func() error {
			_, err := readTiktoken(strings.NewReader(bytesOnly.String()+"aGk= 16777215\n"), "t.model")
			return err
		}, "rank 256 is missing but rank 16777215 is present"},
		{"tiktoken rank 2^24", func() error {
			_, err := readTiktoken(strings.NewReader(bytesOnly.String()+"aGk= 16777216\n"), "t.model")
			return err
		}, "t.model:257: rank 16777216 is implausibly large"},
		{"tokenizer.json vocab id", func() error {
			_, err := parseHuggingFace([]byte(`{"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 16777215}}}`), &hfConfig{})
			return err
		}, "vocab id 16777215 is implausibly large for 1 tokens"},
		{"tokenizer.json added token id", func() error {
			data := bytes.Replace(hf.Bytes(), []byte(`"added_tokens": [`), []byte(`"added_tokens": [{"id": 2000000000, "content": "<big>"},`), 1)
			_, err := parseHuggingFace(data, &hfConfig{})
			return err
		}, `added token "<big>" has id 2000000000, outside [0, 16777216)`},
		{"tokenizer_config.json added token id", func() error {
			cfg := hfConfig{AddedTokensDecode: map[string]hfAddedToken{"16777000": {Content: "<x>"}}}
			_, err := parseHuggingFace(hf.Bytes(), &cfg)
			return err
		}, "vocab id 16777000 is implausibly large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.read(); err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want one containing %q", err, tc.msg)
			}
		})
	}
}
