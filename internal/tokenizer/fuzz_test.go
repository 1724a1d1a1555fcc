package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// FuzzRoundTrip checks, for arbitrary input bytes, that the splitters
// partition the input like the reference matcher, and that every tokenizer
// round-trips the input and encodes it like the reference BPE.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{
		"", " ", "hello world", "I'M 12345 years\r\n\r\n  old!!", "naïve café 日本語",
		"\x80\xff\xfe", "x\xe6\x97", "<|begin_of_text|>hi<|eot_id|>", "a   \t\n b",
		"'s'S'ſ", "٣٤٥٦ Ⅻ²", "\u00a0\u3000\u2028",
	} {
		f.Add(s)
	}
	toks := []Tokenizer{NewByte(), trainedSmall(f)}
	var tkRanks map[string]int
	if haveDataFile(tiktokenTestFile) {
		tk := loadTestTiktoken(f)
		toks = append(toks, tk)
		tkRanks = ranksOf(tk)
	}
	trainedRanks := ranksOf(trainedSmall(f))
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 256 {
			s = s[:256] // keep the reference matcher fast
		}
		for _, sp := range []splitter{splitLlama3, splitQwen2, splitGPT2} {
			got := sp.appendPieces(nil, s)
			if want := refSplit(sp, s); !slices.Equal(got, want) {
				t.Fatalf("splitter %d: split(%q) = %q, reference %q", sp, s, got, want)
			}
			if strings.Join(got, "") != s {
				t.Fatalf("splitter %d: pieces of %q do not concatenate to it", sp, s)
			}
		}
		for _, tok := range toks {
			if got := tok.Decode(tok.Encode(s)); got != s {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", tok.Name(), s, got)
			}
			if got := tok.Decode(tok.EncodeWithSpecials(s)); got != s {
				t.Fatalf("%s: Decode(EncodeWithSpecials(%q)) = %q", tok.Name(), s, got)
			}
		}
		if got, want := trainedSmall(t).Encode(s), refEncode(trainedRanks, splitLlama3, s); !slices.Equal(got, want) {
			t.Fatalf("trained: Encode(%q) = %v, reference %v", s, got, want)
		}
		if tkRanks != nil {
			if got, want := toks[2].Encode(s), refEncode(tkRanks, splitLlama3, s); !slices.Equal(got, want) {
				t.Fatalf("tiktoken: Encode(%q) = %v, reference %v", s, got, want)
			}
		}
	})
}
