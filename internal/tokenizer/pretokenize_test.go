package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The expected splits below were derived by hand from the patterns and
// cross-checked with Python's regex module (regex.findall), except the
// invalid-UTF-8 cases, which Python strings cannot hold.
var llama3SplitTests = []struct {
	name string
	in   string
	want []string
}{
	{"empty", "", nil},
	{"words", "Hello world", []string{"Hello", " world"}},
	{"contraction m", "I'm here", []string{"I", "'m", " here"}},
	{"contraction t", "don't", []string{"don", "'t"}},
	{"contraction upper S", "HE'S", []string{"HE", "'S"}},
	{"contraction upper LL", "they'LL go", []string{"they", "'LL", " go"}},
	{"contraction mixed Re", "We'Re", []string{"We", "'Re"}},
	{"contraction long s folds to s", "it'ſ", []string{"it", "'ſ"}},
	{"contraction without lookahead", "'sam", []string{"'s", "am"}},
	{"contraction then apostrophe", "'ve'", []string{"'ve", "'"}},
	{"lone apostrophe", "'", []string{"'"}},
	{"digits by three", "12345", []string{"123", "45"}},
	{"letters then digits", "abc1234567", []string{"abc", "123", "456", "7"}},
	{"unicode digits", "٣٤٥٦", []string{"٣٤٥", "٦"}},
	{"superscript is a number", "e=mc²", []string{"e", "=mc", "²"}},
	{"letter-number roman", "ⅫⅫ", []string{"ⅫⅫ"}},
	{"currency then number", "$100", []string{"$", "100"}},
	{"space before number stands alone", " 42", []string{" ", "42"}},
	{"digits separated by space", "1 2", []string{"1", " ", "2"}},
	{"punctuation prefixes a word", "foo.bar", []string{"foo", ".bar"}},
	{"parentheses", "(x)", []string{"(x", ")"}},
	{"space and punctuation run", " !!", []string{" !!"}},
	{"punctuation run takes trailing newlines", "hi!!!\n\nthere", []string{"hi", "!!!\n\n", "there"}},
	{"punctuation run takes CRLFs", "...\r\n\r\nNext", []string{"...\r\n\r\n", "Next"}},
	{"spaces leave the last one to the word", "x   y", []string{"x", "  ", " y"}},
	{"mixed whitespace before word", "a  \t b", []string{"a", "  \t", " b"}},
	{"tab run", "\t\tfoo", []string{"\t", "\tfoo"}},
	{"trailing spaces", "end   ", []string{"end", "   "}},
	{"only spaces", "  ", []string{"  "}},
	{"whitespace through last newline", "x  \n\ny", []string{"x", "  \n\n", "y"}},
	{"spaces after newline", "  \n  x", []string{"  \n", " ", " x"}},
	{"newline then trailing spaces", "x\n\n  ", []string{"x", "\n\n", "  "}},
	{"spaces then newline", "Hi  \n", []string{"Hi", "  \n"}},
	{"space newline", " \n", []string{" \n"}},
	{"trailing newline", "x\n", []string{"x", "\n"}},
	{"newlines at end", "hello\n\n\n", []string{"hello", "\n\n\n"}},
	{"CRLF", "a\r\nb", []string{"a", "\r\n", "b"}},
	{"CR and LF with spaces", "a \r\n \r b", []string{"a", " \r\n \r", " b"}},
	{"accented words", "naïve café", []string{"naïve", " café"}},
	{"CJK letters", "日本語のテキスト", []string{"日本語のテキスト"}},
	{"NBSP prefixes a word", "a\u00a0b", []string{"a", "\u00a0b"}},
	{"ideographic space prefixes a word", "x\u3000y", []string{"x", "\u3000y"}},
	{"invalid byte prefixes a word", "\x80abc", []string{"\x80abc"}},
	{"invalid bytes are punctuation", "a\xff\xfe b", []string{"a", "\xff\xfe", " b"}},
	{"truncated UTF-8", "x\xe6\x97", []string{"x", "\xe6\x97"}},
}

func TestSplitLlama3(t *testing.T) {
	for _, tt := range llama3SplitTests {
		t.Run(tt.name, func(t *testing.T) {
			got := splitLlama3.appendPieces(nil, tt.in)
			if !slices.Equal(got, tt.want) {
				t.Errorf("split(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if ref := refSplit(splitLlama3, tt.in); !slices.Equal(ref, tt.want) {
				t.Errorf("reference split(%q) = %q, want %q", tt.in, ref, tt.want)
			}
		})
	}
}

func TestSplitGPT2AndQwen2(t *testing.T) {
	tests := []struct {
		sp   splitter
		in   string
		want []string
	}{
		{splitGPT2, "Hello world", []string{"Hello", " world"}},
		{splitGPT2, "I'm", []string{"I", "'m"}},
		{splitGPT2, "HE'S", []string{"HE", "'", "S"}}, // case-sensitive
		{splitGPT2, "12345 678", []string{"12345", " 678"}},
		{splitGPT2, "x   y", []string{"x", "  ", " y"}},
		{splitGPT2, "hi!!!\n\nthere", []string{"hi", "!!!", "\n", "\n", "there"}},
		{splitGPT2, "a\tb", []string{"a", "\t", "b"}},
		{splitGPT2, "end  ", []string{"end", "  "}},
		{splitGPT2, " ", []string{" "}},
		{splitGPT2, "  ?", []string{" ", " ?"}},
		{splitGPT2, "foo.bar", []string{"foo", ".", "bar"}},
		{splitQwen2, "abc123", []string{"abc", "1", "2", "3"}},
		{splitQwen2, "It'S 42!\n", []string{"It", "'S", " ", "4", "2", "!\n"}},
	}
	for _, tt := range tests {
		got := tt.sp.appendPieces(nil, tt.in)
		if !slices.Equal(got, tt.want) {
			t.Errorf("splitter %d: split(%q) = %q, want %q", tt.sp, tt.in, got, tt.want)
		}
	}
}

// TestSplitMatchesReference compares the hand-written scanners with the
// backtracking reference matcher on random strings over an alphabet that
// exercises every character class.
func TestSplitMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	n := 20000
	if testing.Short() {
		n = 2000
	}
	for _, sp := range []splitter{splitLlama3, splitQwen2, splitGPT2} {
		for i := 0; i < n; i++ {
			s := randomText(rng, 16)
			got := sp.appendPieces(nil, s)
			want := refSplit(sp, s)
			if !slices.Equal(got, want) {
				t.Fatalf("splitter %d: split(%q) = %q, reference %q", sp, s, got, want)
			}
		}
	}
}

func TestSplitShakespeareMatchesReference(t *testing.T) {
	text := shakespeare(t)[:100_000]
	got := splitLlama3.appendPieces(nil, text)
	want := refSplit(splitLlama3, text)
	if !slices.Equal(got, want) {
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Fatalf("piece %d = %q, reference %q", i, got[i], want[i])
			}
		}
		t.Fatalf("%d pieces, reference %d", len(got), len(want))
	}
	if strings.Join(got, "") != text {
		t.Fatal("pieces do not concatenate to the text")
	}
}

func TestSplitterForPattern(t *testing.T) {
	for _, sp := range []splitter{splitLlama3, splitQwen2, splitGPT2} {
		got, err := splitterForPattern(sp.pattern())
		if err != nil || got != sp {
			t.Errorf("splitterForPattern(%q) = %d, %v; want %d", sp.pattern(), got, err, sp)
		}
	}
	if _, err := splitterForPattern(`\w+`); err == nil {
		t.Error("unknown pattern accepted")
	}
}
