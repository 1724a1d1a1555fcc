package tokenizer

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Pre-tokenization split patterns. Each is implemented by a hand-written
// scanner (Go's regexp package has no lookahead) that reproduces the
// leftmost-first, backtracking semantics of the regular expression exactly.
const (
	// Llama3Pattern is the split pattern of Llama 3 (and of OpenAI's
	// cl100k_base): contractions, words with one optional leading
	// non-letter, numbers in groups of up to three digits, punctuation
	// runs, newline runs and whitespace runs.
	Llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

	// Qwen2Pattern is Llama3Pattern with single-digit numbers, as used by
	// Qwen2 tokenizers.
	Qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

	// GPT2Pattern is the split pattern of GPT-2, used by Hugging Face's
	// ByteLevel pre-tokenizer when use_regex is true.
	GPT2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// splitter identifies one of the supported pre-tokenization patterns.
type splitter uint8

const (
	splitLlama3 splitter = iota
	splitQwen2
	splitGPT2
)

// splitterForPattern returns the splitter implementing the regular
// expression pattern, which must be one of the known patterns verbatim.
func splitterForPattern(pattern string) (splitter, error) {
	switch pattern {
	case Llama3Pattern:
		return splitLlama3, nil
	case Qwen2Pattern:
		return splitQwen2, nil
	case GPT2Pattern:
		return splitGPT2, nil
	}
	return 0, fmt.Errorf("unsupported pre-tokenizer pattern %q (supported: the Llama 3, Qwen2 and GPT-2 patterns)", pattern)
}

// pattern returns the regular expression the splitter implements.
func (sp splitter) pattern() string {
	switch sp {
	case splitQwen2:
		return Qwen2Pattern
	case splitGPT2:
		return GPT2Pattern
	}
	return Llama3Pattern
}

// Character classes used by the split patterns. Bytes that are not valid
// UTF-8 are treated as single characters of class clsOther, like U+FFFD.
const (
	clsOther   uint8 = iota // not a letter, number or whitespace
	clsLetter               // \p{L}
	clsNumber               // \p{N}
	clsSpace                // \s other than \r and \n
	clsNewline              // \r or \n
)

// asciiClass holds the class of each ASCII byte.
var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := 0; c < utf8.RuneSelf; c++ {
		t[c] = classOfRune(rune(c))
	}
	return t
}()

// classOfRune classifies r. \s is the Unicode White_Space property (as in
// Rust's regex crate, used by tiktoken), which is what unicode.IsSpace tests.
func classOfRune(r rune) uint8 {
	switch {
	case r == '\r' || r == '\n':
		return clsNewline
	case unicode.IsSpace(r):
		return clsSpace
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	}
	return clsOther
}

// classAt returns the class and encoded length of the character at s[i].
func classAt(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && n == 1 {
		return clsOther, 1
	}
	return classOfRune(r), n
}

// isSpaceClass reports whether class c matches \s.
func isSpaceClass(c uint8) bool { return c == clsSpace || c == clsNewline }

// runEnd returns the end of the run of characters of class cls starting
// at s[i].
func runEnd(s string, i int, cls uint8) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c != cls {
			break
		}
		i += n
	}
	return i
}

// contractions are the suffixes of the first alternative of the patterns,
// in pattern order.
var contractions = [...]string{"s", "t", "re", "ve", "m", "ll", "d"}

// contractionEnd returns the end of a contraction ('s, 't, 're, 've, 'm,
// 'll, 'd) starting with the apostrophe at s[p], or -1 if there is none.
// When fold is true letters match case-insensitively under Unicode simple
// case folding (so 'S and the long s 'ſ both match 's, as in (?i:...)).
func contractionEnd(s string, p int, fold bool) int {
	for _, suf := range contractions {
		i := p + 1
		ok := true
		for k := 0; k < len(suf); k++ {
			if i >= len(s) {
				ok = false
				break
			}
			r, n := utf8.DecodeRuneInString(s[i:])
			if !runeMatches(r, rune(suf[k]), fold) {
				ok = false
				break
			}
			i += n
		}
		if ok {
			return i
		}
	}
	return -1
}

// runeMatches reports whether r equals the lower-case ASCII letter c,
// optionally under Unicode simple case folding.
func runeMatches(r, c rune, fold bool) bool {
	if r == c {
		return true
	}
	if !fold {
		return false
	}
	for f := unicode.SimpleFold(c); f != c; f = unicode.SimpleFold(f) {
		if r == f {
			return true
		}
	}
	return false
}

// next returns the end of the piece that starts at s[p] (p < len(s)).
func (sp splitter) next(s string, p int) int {
	if sp == splitGPT2 {
		return nextGPT2(s, p)
	}
	maxDigits := 3
	if sp == splitQwen2 {
		maxDigits = 1
	}
	return nextLlama3(s, p, maxDigits)
}

// nextLlama3 implements Llama3Pattern (maxDigits 3) and Qwen2Pattern
// (maxDigits 1) at position p.
func nextLlama3(s string, p, maxDigits int) int {
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if s[p] == '\'' {
		if e := contractionEnd(s, p, true); e >= 0 {
			return e
		}
	}
	c0, n0 := classAt(s, p)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c0 == clsLetter {
		return runEnd(s, p+n0, clsLetter)
	}
	if (c0 == clsOther || c0 == clsSpace) && p+n0 < len(s) {
		if c1, n1 := classAt(s, p+n0); c1 == clsLetter {
			return runEnd(s, p+n0+n1, clsLetter)
		}
	}
	// \p{N}{1,maxDigits}
	if c0 == clsNumber {
		e := p + n0
		for k := 1; k < maxDigits && e < len(s); k++ {
			c, n := classAt(s, e)
			if c != clsNumber {
				break
			}
			e += n
		}
		return e
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	q := p
	if s[p] == ' ' {
		q = p + 1
	}
	if q < len(s) {
		if c, _ := classAt(s, q); c == clsOther {
			e := runEnd(s, q, clsOther)
			for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
				e++
			}
			return e
		}
	}
	// Only whitespace remains possible: c0 is clsSpace or clsNewline.
	return whitespaceEnd(s, p, true)
}

// whitespaceEnd handles the whitespace alternatives at s[p], which must be
// a whitespace character:
//
//	\s*[\r\n]+  (only when newlines is true)
//	\s+(?!\S)
//	\s+
//
// For \s*[\r\n]+ the greedy \s* backtracks to the last \r or \n of the
// whitespace run, so the match ends just after it. For \s+(?!\S) the match
// is the whole run at the end of the input, and otherwise the run minus its
// last character, which is left to prefix the following word.
func whitespaceEnd(s string, p int, newlines bool) int {
	e, lastNL, lastStart := p, -1, p
	for e < len(s) {
		c, n := classAt(s, e)
		if !isSpaceClass(c) {
			break
		}
		if c == clsNewline {
			lastNL = e + n
		}
		lastStart = e
		e += n
	}
	if newlines && lastNL >= 0 {
		return lastNL
	}
	if e == len(s) || lastStart == p {
		return e
	}
	return lastStart
}

// nextGPT2 implements GPT2Pattern at position p.
func nextGPT2(s string, p int) int {
	// 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
	if s[p] == '\'' {
		if e := contractionEnd(s, p, false); e >= 0 {
			return e
		}
	}
	// ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space
	// followed by a run of one class other than whitespace.
	q := p
	if s[p] == ' ' && p+1 < len(s) {
		q = p + 1
	}
	if c, _ := classAt(s, q); !isSpaceClass(c) {
		return runEnd(s, q, c)
	}
	// \s+(?!\S) | \s+
	return whitespaceEnd(s, p, false)
}

// appendPieces appends the pre-tokenization pieces of s to dst. The pieces
// are non-empty and concatenate to s.
func (sp splitter) appendPieces(dst []string, s string) []string {
	for p := 0; p < len(s); {
		e := sp.next(s, p)
		dst = append(dst, s[p:e])
		p = e
	}
	return dst
}
