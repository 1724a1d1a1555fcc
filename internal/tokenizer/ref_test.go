package tokenizer

// Independent reference implementations used by the tests: a backtracking
// regular-expression matcher for the split patterns (written from the
// regex semantics, sharing no code with pretokenize.go), a quadratic BPE,
// and test data helpers.

import (
	"bufio"
	"encoding/base64"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/titan-go/titan/internal/testenv"
)

// dataFile returns the path of a file of the shared data folder
// (../shared/data beside the repository, or $TITAN_DATA), skipping the test
// if it is absent (failing it in CI).
func dataFile(tb testing.TB, rel string) string {
	tb.Helper()
	return testenv.SharedData(tb, strings.Split(rel, "/")...)
}

// haveDataFile reports whether a shared data file exists, for tests that
// use it when present.
func haveDataFile(rel string) bool {
	_, ok := testenv.FindSharedData(strings.Split(rel, "/")...)
	return ok
}

const (
	tiktokenTestFile = "tokenizers/torchtitan_test/test_tiktoken.model"
	hfTestDir        = "tokenizers/torchtitan_test"
	shakespeareFile  = "tinyshakespeare/input.txt"
)

// shakespeare returns tinyshakespeare, or skips.
func shakespeare(tb testing.TB) string {
	tb.Helper()
	data, err := os.ReadFile(dataFile(tb, shakespeareFile))
	if err != nil {
		tb.Fatal(err)
	}
	return string(data)
}

// ---- reference regular-expression matcher ----

// refChar is one character of the input: a rune, or an invalid byte
// (r == utf8.RuneError, size 1), which matches only negated classes.
type refChar struct {
	r       rune
	invalid bool
	size    int
}

func refChars(s string) []refChar {
	var cs []refChar
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		cs = append(cs, refChar{r: r, invalid: r == utf8.RuneError && n == 1, size: n})
		i += n
	}
	return cs
}

// reNode matches at position i of in, calling k with each possible end in
// priority order until k returns true (continuation-passing backtracking).
type reNode func(in []refChar, i int, k func(int) bool) bool

// Character predicates, straight from the Unicode definitions.
func isL(c refChar) bool  { return !c.invalid && unicode.In(c.r, unicode.L) }
func isN(c refChar) bool  { return !c.invalid && unicode.In(c.r, unicode.N) }
func isWS(c refChar) bool { return !c.invalid && unicode.In(c.r, unicode.White_Space) }
func isNL(c refChar) bool { return !c.invalid && (c.r == '\r' || c.r == '\n') }

func reClass(pred func(refChar) bool) reNode {
	return func(in []refChar, i int, k func(int) bool) bool {
		return i < len(in) && pred(in[i]) && k(i+1)
	}
}

func reLit(r rune, fold bool) reNode {
	return reClass(func(c refChar) bool {
		if c.invalid {
			return false
		}
		if fold {
			return strings.EqualFold(string(c.r), string(r))
		}
		return c.r == r
	})
}

func reStr(s string, fold bool) reNode {
	var ns []reNode
	for _, r := range s {
		ns = append(ns, reLit(r, fold))
	}
	return reSeq(ns...)
}

func reSeq(ns ...reNode) reNode {
	return func(in []refChar, i int, k func(int) bool) bool {
		var step func(j, at int) bool
		step = func(j, at int) bool {
			if j == len(ns) {
				return k(at)
			}
			return ns[j](in, at, func(e int) bool { return step(j+1, e) })
		}
		return step(0, i)
	}
}

func reAlt(ns ...reNode) reNode {
	return func(in []refChar, i int, k func(int) bool) bool {
		for _, n := range ns {
			if n(in, i, k) {
				return true
			}
		}
		return false
	}
}

// reRep is a greedy repetition of n, min to max times (max < 0: no limit).
func reRep(n reNode, lo, hi int) reNode {
	return func(in []refChar, i int, k func(int) bool) bool {
		var try func(count, at int) bool
		try = func(count, at int) bool {
			if hi < 0 || count < hi {
				if n(in, at, func(e int) bool { return e > at && try(count+1, e) }) {
					return true
				}
			}
			return count >= lo && k(at)
		}
		return try(0, i)
	}
}

// reNotAheadNonSpace is (?!\S).
func reNotAheadNonSpace() reNode {
	return func(in []refChar, i int, k func(int) bool) bool {
		if i < len(in) && !isWS(in[i]) {
			return false
		}
		return k(i)
	}
}

func not(preds ...func(refChar) bool) func(refChar) bool {
	return func(c refChar) bool {
		for _, p := range preds {
			if p(c) {
				return false
			}
		}
		return true
	}
}

// refPattern builds the reference matcher for one of the split patterns.
func refPattern(sp splitter) reNode {
	contr := func(fold bool) reNode {
		var alts []reNode
		for _, s := range []string{"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"} {
			alts = append(alts, reStr(s, fold))
		}
		return reAlt(alts...)
	}
	space := reLit(' ', false)
	if sp == splitGPT2 {
		return reAlt(
			contr(false),
			reSeq(reRep(space, 0, 1), reRep(reClass(isL), 1, -1)),
			reSeq(reRep(space, 0, 1), reRep(reClass(isN), 1, -1)),
			reSeq(reRep(space, 0, 1), reRep(reClass(not(isWS, isL, isN)), 1, -1)),
			reSeq(reRep(reClass(isWS), 1, -1), reNotAheadNonSpace()),
			reRep(reClass(isWS), 1, -1),
		)
	}
	digits := 3
	if sp == splitQwen2 {
		digits = 1
	}
	return reAlt(
		contr(true),
		reSeq(reRep(reClass(not(isNL, isL, isN)), 0, 1), reRep(reClass(isL), 1, -1)),
		reRep(reClass(isN), 1, digits),
		reSeq(reRep(space, 0, 1), reRep(reClass(not(isWS, isL, isN)), 1, -1), reRep(reClass(isNL), 0, -1)),
		reSeq(reRep(reClass(isWS), 0, -1), reRep(reClass(isNL), 1, -1)),
		reSeq(reRep(reClass(isWS), 1, -1), reNotAheadNonSpace()),
		reRep(reClass(isWS), 1, -1),
	)
}

// refSplit returns the non-overlapping leftmost-first matches of the
// pattern in s, like Python's re.findall; characters no alternative
// matches are skipped (none are, for these patterns).
func refSplit(sp splitter, s string) []string {
	re := refPattern(sp)
	in := refChars(s)
	off := make([]int, len(in)+1)
	for i, c := range in {
		off[i+1] = off[i] + c.size
	}
	var out []string
	for i := 0; i < len(in); {
		end := -1
		re(in, i, func(e int) bool {
			if e > i {
				end = e
				return true
			}
			return false
		})
		if end < 0 {
			i++
			continue
		}
		out = append(out, s[off[i]:off[end]])
		i = end
	}
	return out
}

// ---- reference BPE ----

// refRanks reads a tiktoken file with code independent of tiktoken.go.
func refRanks(tb testing.TB, path string) map[string]int {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	ranks := make(map[string]int)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		tok, rank, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			tb.Fatalf("bad line %q", sc.Text())
		}
		b, err := base64.StdEncoding.DecodeString(tok)
		if err != nil {
			tb.Fatal(err)
		}
		r, err := strconv.Atoi(rank)
		if err != nil {
			tb.Fatal(err)
		}
		ranks[string(b)] = r
	}
	return ranks
}

// refBPE encodes one piece tiktoken-style, quadratically: a piece that is
// a token is that token; otherwise repeatedly merge the leftmost adjacent
// pair whose concatenation has the lowest rank.
func refBPE(ranks map[string]int, piece string) []int {
	if r, ok := ranks[piece]; ok {
		return []int{r}
	}
	var parts []string
	for i := 0; i < len(piece); i++ {
		parts = append(parts, piece[i:i+1])
	}
	for {
		best, bestRank := -1, 0
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := ranks[parts[i]+parts[i+1]]; ok && (best < 0 || r < bestRank) {
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
		ids[i] = ranks[p]
	}
	return ids
}

// refEncode encodes s with the reference splitter and refBPE.
func refEncode(ranks map[string]int, sp splitter, s string) []int {
	var ids []int
	for _, p := range refSplit(sp, s) {
		ids = append(ids, refBPE(ranks, p)...)
	}
	return ids
}

// ranksOf returns the ordinary tokens of b as a rank map (id = rank).
func ranksOf(b *BPE) map[string]int {
	m := make(map[string]int)
	for id, tok := range b.vocab {
		if tok != nil {
			m[string(tok)] = id
		}
	}
	return m
}

// ---- random inputs ----

// refAlphabet mixes the character classes the split patterns distinguish.
var refAlphabet = []string{
	"a", "b", "Z", "s", "S", "t", "T", "r", "e", "v", "m", "l", "L", "d", "D",
	"é", "日", "ſ", "K", "'", "'", " ", " ", " ", "\t", "\n", "\r", "\r\n",
	"1", "2", "0", "٣", "²", "Ⅻ", ".", "!", "$", "(", "-", "\u00a0", "\u3000",
	"\u2028", "\x80", "\xff", "\xe6\x97", "😀", "\x1c", "\u200b",
}

// randomText returns a random string of up to n alphabet items.
func randomText(rng *rand.Rand, n int) string {
	var sb strings.Builder
	for k := rng.IntN(n + 1); k > 0; k-- {
		sb.WriteString(refAlphabet[rng.IntN(len(refAlphabet))])
	}
	return sb.String()
}

// randomBytes returns up to n random bytes.
func randomBytes(rng *rand.Rand, n int) string {
	b := make([]byte, rng.IntN(n+1))
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	return string(b)
}
