package tokenizer

import (
	"bytes"
	"container/heap"
	"fmt"
	"io"
	"slices"
)

// TrainOptions configures Train.
type TrainOptions struct {
	// MinFrequency is the fewest occurrences a pair needs to be merged;
	// training stops early, with a smaller vocabulary, when the most
	// frequent pair is rarer. Zero means 2.
	MinFrequency int
}

// Train learns a byte-level BPE vocabulary of vocabSize mergeable tokens
// (the 256 single bytes plus vocabSize-256 merged tokens) from corpus. The
// corpus is pre-tokenized with Llama3Pattern and pairs never cross piece
// boundaries. Each step merges the most frequent adjacent pair of tokens;
// ties go to the pair whose first token has the lowest bytes (compared
// lexicographically), then whose second token does, so training is
// deterministic. A merge whose result is already a token adds no new token.
//
// The result ranks tokens in the order they were learned and, like
// LoadTiktoken, appends the NumLlama3Specials Llama 3 special tokens after
// them, so VocabSize is the number of mergeable tokens plus 256 and
// SaveTiktoken then LoadTiktoken gives the same tokenizer back.
func Train(corpus io.Reader, vocabSize int, opts TrainOptions) (*BPE, error) {
	if vocabSize < 256 {
		return nil, fmt.Errorf("tokenizer: train: vocabulary size %d is below the 256 byte tokens", vocabSize)
	}
	if vocabSize > 1<<24 {
		return nil, fmt.Errorf("tokenizer: train: vocabulary size %d is too large", vocabSize)
	}
	minFreq := int64(opts.MinFrequency)
	if minFreq <= 0 {
		minFreq = 2
	}
	data, err := io.ReadAll(corpus)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: train: reading corpus: %w", err)
	}
	t := newTrainer(string(data))
	for len(t.tokens) < vocabSize {
		a, c, count, ok := t.best()
		if !ok || count < minFreq {
			break
		}
		t.merge(a, c)
	}
	n := len(t.tokens)
	b, err := newBPE(bpeConfig{
		name:       "tiktoken",
		vocab:      t.tokens,
		specials:   llama3Specials(n),
		wholePiece: true,
		split:      splitLlama3,
		bos:        n,
		eos:        n + 1,
	})
	if err != nil {
		return nil, fmt.Errorf("tokenizer: train: %w", err)
	}
	return b, nil
}

// trainWord is a distinct pre-tokenized piece of the corpus.
type trainWord struct {
	ids  []int32
	freq int64
}

// trainer holds the state of BPE training.
type trainer struct {
	tokens [][]byte       // id -> bytes
	ids    map[string]int // bytes -> id
	words  []trainWord
	counts map[uint64]int64   // pair -> occurrences, weighted by word frequency
	where  map[uint64][]int32 // pair -> words that contained it (may be stale)
	heap   pairHeap
	stamp  []int // per word: last merge step that rewrote it
	step   int
}

// newTrainer splits text into pieces and counts their byte pairs.
func newTrainer(text string) *trainer {
	freq := make(map[string]int64)
	for p := 0; p < len(text); {
		e := splitLlama3.next(text, p)
		freq[text[p:e]]++
		p = e
	}
	pieces := make([]string, 0, len(freq))
	for s := range freq {
		pieces = append(pieces, s)
	}
	slices.Sort(pieces) // deterministic word order
	t := &trainer{
		ids:    make(map[string]int, 256),
		words:  make([]trainWord, len(pieces)),
		counts: make(map[uint64]int64),
		where:  make(map[uint64][]int32),
		stamp:  make([]int, len(pieces)),
	}
	t.heap.tokens = &t.tokens
	for c := 0; c < 256; c++ {
		t.tokens = append(t.tokens, []byte{byte(c)})
		t.ids[string([]byte{byte(c)})] = c
	}
	for w, s := range pieces {
		ids := make([]int32, len(s))
		for i := 0; i < len(s); i++ {
			ids[i] = int32(s[i])
		}
		t.words[w] = trainWord{ids: ids, freq: freq[s]}
		for i := 0; i+1 < len(ids); i++ {
			k := pairKey(ids[i], ids[i+1])
			t.counts[k] += freq[s]
			t.where[k] = append(t.where[k], int32(w))
		}
	}
	for k, n := range t.counts {
		t.heap.entries = append(t.heap.entries, pairEntry{count: n, a: int32(k >> 32), c: int32(uint32(k))})
	}
	heap.Init(&t.heap)
	return t
}

// best returns the pair to merge next, or ok false if there is none.
func (t *trainer) best() (a, c int32, count int64, ok bool) {
	for t.heap.Len() > 0 {
		e := t.heap.entries[0]
		if t.counts[pairKey(e.a, e.c)] == e.count && e.count > 0 {
			return e.a, e.c, e.count, true
		}
		heap.Pop(&t.heap) // stale
	}
	return 0, 0, 0, false
}

// merge replaces every occurrence of the pair (a, c) in the words by the
// merged token, adding it to the vocabulary if it is new.
func (t *trainer) merge(a, c int32) {
	t.step++
	key := pairKey(a, c)
	joined := string(t.tokens[a]) + string(t.tokens[c])
	id, ok := t.ids[joined]
	if !ok {
		id = len(t.tokens)
		t.tokens = append(t.tokens, []byte(joined))
		t.ids[joined] = id
	}
	nid := int32(id)
	touched := make(map[uint64]bool)
	for _, w := range t.where[key] {
		if t.stamp[w] == t.step {
			continue
		}
		t.stamp[w] = t.step
		word := &t.words[w]
		old := word.ids
		if !containsPair(old, a, c) {
			continue
		}
		for i := 0; i+1 < len(old); i++ {
			k := pairKey(old[i], old[i+1])
			t.counts[k] -= word.freq
			touched[k] = true
		}
		merged := make([]int32, 0, len(old)-1)
		for i := 0; i < len(old); i++ {
			if i+1 < len(old) && old[i] == a && old[i+1] == c {
				merged = append(merged, nid)
				i++
			} else {
				merged = append(merged, old[i])
			}
		}
		word.ids = merged
		for i := 0; i+1 < len(merged); i++ {
			k := pairKey(merged[i], merged[i+1])
			t.counts[k] += word.freq
			touched[k] = true
			if merged[i] == nid || merged[i+1] == nid {
				t.where[k] = append(t.where[k], w)
			}
		}
	}
	delete(t.where, key)
	for k := range touched {
		n := t.counts[k]
		if n <= 0 {
			delete(t.counts, k)
			continue
		}
		heap.Push(&t.heap, pairEntry{count: n, a: int32(k >> 32), c: int32(uint32(k))})
	}
}

// containsPair reports whether ids has a followed by c.
func containsPair(ids []int32, a, c int32) bool {
	for i := 0; i+1 < len(ids); i++ {
		if ids[i] == a && ids[i+1] == c {
			return true
		}
	}
	return false
}

// pairEntry is a pair of tokens and its count when it was pushed.
type pairEntry struct {
	count int64
	a, c  int32
}

// pairHeap orders pairs by count, highest first, then by the bytes of the
// first token and then of the second token, lowest first.
type pairHeap struct {
	entries []pairEntry
	tokens  *[][]byte
}

func (h *pairHeap) Len() int { return len(h.entries) }
func (h *pairHeap) Less(i, j int) bool {
	x, y := h.entries[i], h.entries[j]
	if x.count != y.count {
		return x.count > y.count
	}
	toks := *h.tokens
	if d := bytes.Compare(toks[x.a], toks[y.a]); d != 0 {
		return d < 0
	}
	return bytes.Compare(toks[x.c], toks[y.c]) < 0
}
func (h *pairHeap) Swap(i, j int) { h.entries[i], h.entries[j] = h.entries[j], h.entries[i] }
func (h *pairHeap) Push(x any)    { h.entries = append(h.entries, x.(pairEntry)) }
func (h *pairHeap) Pop() any {
	x := h.entries[len(h.entries)-1]
	h.entries = h.entries[:len(h.entries)-1]
	return x
}
