package tokenizer

import (
	"strings"
	"testing"
)

// benchmarkEncode encodes tinyshakespeare with tok; when cold, the piece
// cache is cleared before every pass.
func benchmarkEncode(b *testing.B, tok *BPE, cold bool) {
	text := shakespeare(b)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	var n int
	for b.Loop() {
		if cold {
			tok.cache.clear()
		}
		n = len(tok.Encode(text))
	}
	b.ReportMetric(float64(len(text))/float64(n), "bytes/token")
}

// BenchmarkEncodeTiktoken measures encoding speed (MB/s) of
// test_tiktoken.model on tinyshakespeare, from an empty piece cache.
func BenchmarkEncodeTiktoken(b *testing.B) { benchmarkEncode(b, loadTestTiktoken(b), true) }

// BenchmarkEncodeTiktokenWarm is BenchmarkEncodeTiktoken with the piece
// cache filled by earlier passes.
func BenchmarkEncodeTiktokenWarm(b *testing.B) { benchmarkEncode(b, loadTestTiktoken(b), false) }

// BenchmarkDecodeTiktoken measures decoding speed in MB of text per second.
func BenchmarkDecodeTiktoken(b *testing.B) {
	tok := loadTestTiktoken(b)
	text := shakespeare(b)
	ids := tok.Encode(text)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Decode(ids)
	}
}

// BenchmarkSplitLlama3 measures the pre-tokenizer alone.
func BenchmarkSplitLlama3(b *testing.B) {
	text := shakespeare(b)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		for p := 0; p < len(text); {
			p = splitLlama3.next(text, p)
		}
	}
}

// BenchmarkTrain measures training a 4096-token vocabulary on
// tinyshakespeare (MB/s of corpus).
func BenchmarkTrain(b *testing.B) {
	text := shakespeare(b)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := Train(strings.NewReader(text), 4096, TrainOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeTrained4k measures encoding tinyshakespeare with a
// 4096-token vocabulary trained on it, from an empty piece cache.
func BenchmarkEncodeTrained4k(b *testing.B) {
	tok, err := Train(strings.NewReader(shakespeare(b)), 4096, TrainOptions{})
	if err != nil {
		b.Fatal(err)
	}
	benchmarkEncode(b, tok, true)
}
