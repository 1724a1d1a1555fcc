package tokenizer

import (
	"bytes"
	"slices"
	"strings"
	"sync"
	"testing"
)

// smallCorpus is a short training text that does not depend on test data
// files.
var smallCorpus = strings.Repeat(`The cat sat on the mat. The dog sat on the log.
It's a sunny day; the birds are singing, and the children are playing in the park!
Numbers: 12345, 678, 90. Prices rose 3.5% in 2024 -- or didn't they?
    Indented line with  double  spaces.
Ünïcödé wörds ärë hërë: naïve café, 日本語のテキスト, ελληνικά.
`, 8)

var (
	trainedOnce sync.Once
	trainedBPE  *BPE
	trainedErr  error
)

// trainedSmall returns a BPE with 300 mergeable tokens trained on
// smallCorpus (shared between tests).
func trainedSmall(tb testing.TB) *BPE {
	tb.Helper()
	trainedOnce.Do(func() {
		trainedBPE, trainedErr = Train(strings.NewReader(smallCorpus), 300, TrainOptions{})
	})
	if trainedErr != nil {
		tb.Fatal(trainedErr)
	}
	return trainedBPE
}

// refTrain is a naive BPE trainer: every step recounts all pairs of all
// pieces (split by the reference matcher) and merges the most frequent,
// ties to the lowest (first bytes, second bytes).
func refTrain(text string, vocabSize int, minFreq int) []string {
	tokens := make([]string, 256)
	ids := make(map[string]bool)
	for c := range 256 {
		tokens[c] = string([]byte{byte(c)})
		ids[tokens[c]] = true
	}
	var words [][]string
	for _, p := range refSplit(splitLlama3, text) {
		var w []string
		for i := 0; i < len(p); i++ {
			w = append(w, p[i:i+1])
		}
		words = append(words, w)
	}
	for len(tokens) < vocabSize {
		counts := make(map[[2]string]int)
		for _, w := range words {
			for i := 0; i+1 < len(w); i++ {
				counts[[2]string{w[i], w[i+1]}]++
			}
		}
		var best [2]string
		bestN := 0
		for p, n := range counts {
			if n > bestN || n == bestN && (p[0] < best[0] || p[0] == best[0] && p[1] < best[1]) {
				best, bestN = p, n
			}
		}
		if bestN < minFreq {
			break
		}
		joined := best[0] + best[1]
		if !ids[joined] {
			ids[joined] = true
			tokens = append(tokens, joined)
		}
		for k, w := range words {
			var out []string
			for i := 0; i < len(w); i++ {
				if i+1 < len(w) && w[i] == best[0] && w[i+1] == best[1] {
					out = append(out, joined)
					i++
				} else {
					out = append(out, w[i])
				}
			}
			words[k] = out
		}
	}
	return tokens
}

func TestTrainMatchesReference(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		size    int
		minFreq int
	}{
		{"small corpus", smallCorpus, 300, 2},
		{"repeated letters", strings.Repeat("aaaa aaab abab baba aaaaaaaa ", 5), 280, 2},
		{"min frequency 1", "abcd abcd xyz", 270, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Train(strings.NewReader(tt.text), tt.size, TrainOptions{MinFrequency: tt.minFreq})
			if err != nil {
				t.Fatal(err)
			}
			want := refTrain(tt.text, tt.size, tt.minFreq)
			var got []string
			for _, tok := range b.vocab {
				if tok != nil {
					got = append(got, string(tok))
				}
			}
			if !slices.Equal(got, want) {
				for i := range min(len(got), len(want)) {
					if got[i] != want[i] {
						t.Fatalf("token %d = %q, reference %q", i, got[i], want[i])
					}
				}
				t.Fatalf("%d tokens, reference %d", len(got), len(want))
			}
		})
	}
}

func TestTrain(t *testing.T) {
	b := trainedSmall(t)
	if got := b.VocabSize(); got != 300+NumLlama3Specials {
		t.Errorf("VocabSize = %d, want %d", got, 300+NumLlama3Specials)
	}
	if b.BOS() != 300 || b.EOS() != 301 {
		t.Errorf("BOS, EOS = %d, %d; want 300, 301", b.BOS(), b.EOS())
	}
	ids := b.Encode(smallCorpus)
	if len(ids) >= len(smallCorpus)*3/4 {
		t.Errorf("%d tokens for %d bytes: the merges do not compress", len(ids), len(smallCorpus))
	}
	if got := b.Decode(ids); got != smallCorpus {
		t.Error("trained tokenizer does not round-trip its corpus")
	}
	// The trained tokenizer encodes like a rank-based reference BPE.
	ranks := ranksOf(b)
	for _, line := range strings.SplitAfter(smallCorpus[:len(smallCorpus)/8], "\n") {
		if got, want := b.Encode(line), refEncode(ranks, splitLlama3, line); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, reference %v", line, got, want)
		}
	}

	// Deterministic: training again gives the same file.
	b2, err := Train(strings.NewReader(smallCorpus), 300, TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var f1, f2 bytes.Buffer
	if err := b.SaveTiktoken(&f1); err != nil {
		t.Fatal(err)
	}
	if err := b2.SaveTiktoken(&f2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f1.Bytes(), f2.Bytes()) {
		t.Error("training is not deterministic")
	}

	// SaveTiktoken then LoadTiktoken gives identical encodings.
	loaded, err := readTiktoken(&f1, "trained.model")
	if err != nil {
		t.Fatal(err)
	}
	if loaded.VocabSize() != b.VocabSize() || loaded.BOS() != b.BOS() || loaded.EOS() != b.EOS() {
		t.Errorf("reloaded: size %d BOS %d EOS %d", loaded.VocabSize(), loaded.BOS(), loaded.EOS())
	}
	for _, s := range []string{smallCorpus, "unseen words: zebra quokka 98765", "<|eot_id|>x"} {
		if got, want := loaded.EncodeWithSpecials(s), b.EncodeWithSpecials(s); !slices.Equal(got, want) {
			t.Errorf("reloaded EncodeWithSpecials(%q) = %v, want %v", clip([]byte(s)), got, want)
		}
	}
}

func TestTrainEdgeCases(t *testing.T) {
	if _, err := Train(strings.NewReader("abc"), 255, TrainOptions{}); err == nil {
		t.Error("vocabulary below 256 accepted")
	}
	b, err := Train(strings.NewReader(""), 1000, TrainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b.VocabSize() != 256+NumLlama3Specials {
		t.Errorf("empty corpus: VocabSize = %d", b.VocabSize())
	}
	if got := b.Decode(b.Encode("any text")); got != "any text" {
		t.Errorf("empty-corpus tokenizer round trip = %q", got)
	}
}
