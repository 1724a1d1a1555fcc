package tokenizer

import (
	"container/heap"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"strings"
	"sync/atomic"
)

// BPE is a byte-level byte-pair-encoding tokenizer. Text is split into
// pieces by a pre-tokenization pattern, and each piece's UTF-8 bytes are
// merged pairwise, always merging the adjacent pair of lowest rank (the
// leftmost one on ties), until no adjacent pair can be merged.
//
// A BPE built from ranks (tiktoken files and Train) can merge any two
// adjacent tokens whose concatenation is a token, ranked by the rank (id) of
// the concatenation, exactly as tiktoken does. A BPE built from a Hugging
// Face merges list can merge only the listed pairs, ranked by their position
// in the list.
//
// A BPE is safe for concurrent use by multiple goroutines.
type BPE struct {
	name  string
	vocab [][]byte // id -> bytes of an ordinary token; nil for specials and unused ids
	// specialText maps a special token's id to its text.
	specialText map[int]string
	ids         map[string]int // ordinary token bytes -> id
	byteIDs     [256]int32     // id of each single-byte token
	merges      map[uint64]merge
	// fromRanks reports whether merges were derived from token ranks
	// (tiktoken semantics) rather than an explicit merges list.
	fromRanks bool
	// wholePiece makes a piece that is itself a token encode to that token
	// without running the merges (tiktoken; Hugging Face ignore_merges).
	wholePiece bool
	split      splitter
	specials   specialMatcher
	bos, eos   int

	cache pieceCache // piece -> ids
}

// merge is the result of merging one pair of adjacent tokens.
type merge struct {
	rank int32 // lower merges first
	id   int32 // id of the merged token
}

// pairKey packs a pair of token ids into a map key.
func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// cacheSlots is the number of slots of the piece cache, and
// maxCachedPiece the length in bytes of the longest piece it keeps.
const (
	cacheSlots     = 1 << 16
	maxCachedPiece = 256
)

// pieceCache is a lock-free direct-mapped cache from pieces to their ids.
// A piece's hash selects one slot; a new piece overwrites the slot's
// previous entry.
type pieceCache struct {
	seed  maphash.Seed
	slots []atomic.Pointer[cacheEntry]
}

// cacheEntry is one cached piece and its ids.
type cacheEntry struct {
	piece string
	ids   []int
}

// newPieceCache returns an empty cache.
func newPieceCache() pieceCache {
	return pieceCache{seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[cacheEntry], cacheSlots)}
}

// slot returns the slot of piece.
func (c *pieceCache) slot(piece string) *atomic.Pointer[cacheEntry] {
	return &c.slots[maphash.String(c.seed, piece)&(cacheSlots-1)]
}

// clear empties the cache.
func (c *pieceCache) clear() {
	for i := range c.slots {
		c.slots[i].Store(nil)
	}
}

// linearMergeMax is the piece length in bytes up to which merges use a
// simple quadratic scan; longer pieces use a heap.
const linearMergeMax = 64

// special is a special token: its id and text.
type special struct {
	id   int
	text string
}

// bpeConfig describes a BPE to build with newBPE.
type bpeConfig struct {
	name  string
	vocab [][]byte // id -> ordinary token bytes, nil where the id is special or unused
	// pairs is the explicit merges list in priority order, as pairs of
	// token ids. If nil, merges are derived from ranks: every split of a
	// token into two tokens merges, ranked by the token's id.
	pairs      [][2]int32
	specials   []special
	wholePiece bool
	split      splitter
	bos, eos   int
}

// newBPE validates cfg and builds the tokenizer's lookup tables.
// maxVocab bounds the ids of a vocabulary read from a file, checked before
// tables are allocated by them.
const maxVocab = 1 << 24

func newBPE(cfg bpeConfig) (*BPE, error) {
	size := len(cfg.vocab)
	for _, sp := range cfg.specials {
		if sp.id < 0 || sp.id >= maxVocab {
			return nil, fmt.Errorf("special token %q has id %d, outside [0, %d)", sp.text, sp.id, maxVocab)
		}
		size = max(size, sp.id+1)
	}
	if size > maxVocab {
		return nil, fmt.Errorf("vocabulary of %d ids is too large (at most %d)", size, maxVocab)
	}
	b := &BPE{
		name:        cfg.name,
		vocab:       make([][]byte, size),
		specialText: make(map[int]string, len(cfg.specials)),
		ids:         make(map[string]int, len(cfg.vocab)),
		merges:      make(map[uint64]merge),
		fromRanks:   cfg.pairs == nil,
		wholePiece:  cfg.wholePiece,
		split:       cfg.split,
		bos:         cfg.bos,
		eos:         cfg.eos,
		cache:       newPieceCache(),
	}
	if size > math.MaxInt32 {
		return nil, fmt.Errorf("vocabulary of %d ids is too large", size)
	}
	copy(b.vocab, cfg.vocab)
	for id, tok := range b.vocab {
		if tok == nil {
			continue
		}
		if len(tok) == 0 {
			return nil, fmt.Errorf("token %d is empty", id)
		}
		if prev, dup := b.ids[string(tok)]; dup {
			return nil, fmt.Errorf("tokens %d and %d have the same bytes %q", prev, id, tok)
		}
		b.ids[string(tok)] = id
	}
	for c := 0; c < 256; c++ {
		id, ok := b.ids[string([]byte{byte(c)})]
		if !ok {
			return nil, fmt.Errorf("no token for byte 0x%02x: a byte-level BPE needs all 256 single-byte tokens", c)
		}
		b.byteIDs[c] = int32(id)
	}
	for _, sp := range cfg.specials {
		if sp.id < 0 {
			return nil, fmt.Errorf("special token %q has negative id %d", sp.text, sp.id)
		}
		if sp.text == "" {
			return nil, fmt.Errorf("special token %d has empty text", sp.id)
		}
		if b.vocab[sp.id] != nil {
			return nil, fmt.Errorf("special token %q has id %d, which is already the ordinary token %q", sp.text, sp.id, b.vocab[sp.id])
		}
		if prev, dup := b.specialText[sp.id]; dup && prev != sp.text {
			return nil, fmt.Errorf("id %d is both special token %q and %q", sp.id, prev, sp.text)
		}
		b.specialText[sp.id] = sp.text
	}
	var err error
	if b.specials, err = newSpecialMatcher(cfg.specials); err != nil {
		return nil, err
	}
	if cfg.pairs == nil {
		b.deriveMerges()
	} else {
		for r, p := range cfg.pairs {
			a, c := p[0], p[1]
			ta, tc := b.token(int(a)), b.token(int(c))
			if ta == nil || tc == nil {
				return nil, fmt.Errorf("merge %d (%d, %d) refers to an id that is not an ordinary token", r, a, c)
			}
			id, ok := b.ids[string(ta)+string(tc)]
			if !ok {
				return nil, fmt.Errorf("merge %d (%q, %q): the merged token %q is not in the vocabulary", r, ta, tc, string(ta)+string(tc))
			}
			k := pairKey(a, c)
			if _, dup := b.merges[k]; !dup { // the first listing wins
				b.merges[k] = merge{rank: int32(r), id: int32(id)}
			}
		}
	}
	return b, nil
}

// deriveMerges fills b.merges with tiktoken semantics: for every token and
// every split of it into two tokens, the pair merges into the token with
// the token's id as rank.
func (b *BPE) deriveMerges() {
	for id, tok := range b.vocab {
		for k := 1; k < len(tok); k++ {
			a, ok1 := b.ids[string(tok[:k])]
			c, ok2 := b.ids[string(tok[k:])]
			if ok1 && ok2 {
				b.merges[pairKey(int32(a), int32(c))] = merge{rank: int32(id), id: int32(id)}
			}
		}
	}
}

// token returns the bytes of ordinary token id, or nil.
func (b *BPE) token(id int) []byte {
	if id < 0 || id >= len(b.vocab) {
		return nil
	}
	return b.vocab[id]
}

// Name returns the tokenizer's kind: "tiktoken" or "huggingface".
func (b *BPE) Name() string { return b.name }

// VocabSize returns the number of ids, including special tokens: one more
// than the largest id.
func (b *BPE) VocabSize() int { return len(b.vocab) }

// BOS returns the id of the beginning-of-sequence token, or -1.
func (b *BPE) BOS() int { return b.bos }

// EOS returns the id of the end-of-sequence token, or -1.
func (b *BPE) EOS() int { return b.eos }

// SpecialID returns the id of the special token with the given text.
func (b *BPE) SpecialID(text string) (int, bool) {
	id, ok := b.specials.ids[text]
	return id, ok
}

// Encode returns the token ids of text, with no BOS or EOS added. Text that
// looks like a special token is encoded as ordinary text.
func (b *BPE) Encode(text string) []int {
	return b.appendEncode(make([]int, 0, len(text)/3+1), text)
}

// EncodeWithSpecials is like Encode, except that occurrences of special
// tokens' text become those tokens' ids. Where several special tokens match
// at the same position the longest wins.
func (b *BPE) EncodeWithSpecials(text string) []int {
	ids := make([]int, 0, len(text)/3+1)
	b.specials.split(text, func(seg string, id int) {
		if id >= 0 {
			ids = append(ids, id)
		} else {
			ids = b.appendEncode(ids, seg)
		}
	})
	return ids
}

// appendEncode appends the ids of text, all of it ordinary, to dst.
func (b *BPE) appendEncode(dst []int, text string) []int {
	for p := 0; p < len(text); {
		e := b.split.next(text, p)
		dst = b.appendPiece(dst, text[p:e])
		p = e
	}
	return dst
}

// appendPiece appends the ids of one pre-tokenized piece to dst.
func (b *BPE) appendPiece(dst []int, piece string) []int {
	if len(piece) == 1 {
		return append(dst, int(b.byteIDs[piece[0]]))
	}
	if b.wholePiece {
		if id, ok := b.ids[piece]; ok {
			return append(dst, id)
		}
	}
	slot := b.cache.slot(piece)
	if e := slot.Load(); e != nil && e.piece == piece {
		return append(dst, e.ids...)
	}
	start := len(dst)
	if len(piece) <= linearMergeMax {
		dst = b.mergeLinear(dst, piece)
	} else {
		dst = b.mergeHeap(dst, piece)
	}
	if len(piece) <= maxCachedPiece {
		slot.Store(&cacheEntry{piece: strings.Clone(piece), ids: slices.Clone(dst[start:])})
	}
	return dst
}

// mergeLinear runs the merges on piece by repeatedly scanning all adjacent
// pairs, and appends the resulting ids to dst.
func (b *BPE) mergeLinear(dst []int, piece string) []int {
	var buf [linearMergeMax]int32
	var ranks [linearMergeMax]merge
	parts := buf[:len(piece)]
	for i := range parts {
		parts[i] = b.byteIDs[piece[i]]
	}
	none := merge{rank: math.MaxInt32, id: -1}
	rank := func(i int) merge { // merge of parts[i] and parts[i+1]
		if i+1 < len(parts) {
			if m, ok := b.merges[pairKey(parts[i], parts[i+1])]; ok {
				return m
			}
		}
		return none
	}
	for i := range parts {
		ranks[i] = rank(i)
	}
	for len(parts) > 1 {
		best := -1
		bestRank := int32(math.MaxInt32)
		for i := 0; i+1 < len(parts); i++ {
			if ranks[i].rank < bestRank {
				best, bestRank = i, ranks[i].rank
			}
		}
		if best < 0 {
			break
		}
		parts[best] = ranks[best].id
		n := copy(parts[best+1:], parts[best+2:])
		copy(ranks[best+1:], ranks[best+2:len(parts)])
		parts = parts[:best+1+n]
		ranks[best] = rank(best)
		if best > 0 {
			ranks[best-1] = rank(best - 1)
		}
	}
	for _, id := range parts {
		dst = append(dst, int(id))
	}
	return dst
}

// mergeNode is one token of a piece being merged by mergeHeap: a node of a
// doubly linked list in piece order.
type mergeNode struct {
	id         int32
	prev, next int32 // neighbour indices, -1 at the ends
	dead       bool  // absorbed into its left neighbour
}

// mergeCand is a candidate merge of node left with its right neighbour.
type mergeCand struct {
	rank  int32
	left  int32
	right int32
}

// candHeap orders candidates by rank, then by position (leftmost first).
type candHeap []mergeCand

func (h candHeap) Len() int { return len(h) }
func (h candHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].left < h[j].left
}
func (h candHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *candHeap) Push(x any)   { *h = append(*h, x.(mergeCand)) }
func (h *candHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// mergeHeap runs the merges on piece with a priority queue of candidate
// pairs, in O(n log n), and appends the resulting ids to dst. It merges in
// the same order as mergeLinear.
func (b *BPE) mergeHeap(dst []int, piece string) []int {
	nodes := make([]mergeNode, len(piece))
	for i := range nodes {
		nodes[i] = mergeNode{id: b.byteIDs[piece[i]], prev: int32(i - 1), next: int32(i + 1)}
	}
	nodes[len(nodes)-1].next = -1
	h := make(candHeap, 0, len(piece))
	// push adds the candidate merge of node left with its right neighbour.
	push := func(left int32) {
		if left < 0 || nodes[left].next < 0 {
			return
		}
		right := nodes[left].next
		if m, ok := b.merges[pairKey(nodes[left].id, nodes[right].id)]; ok {
			h = append(h, mergeCand{rank: m.rank, left: left, right: right})
		}
	}
	for i := range nodes {
		push(int32(i))
	}
	heap.Init(&h)
	for h.Len() > 0 {
		c := heap.Pop(&h).(mergeCand)
		l, r := &nodes[c.left], &nodes[c.right]
		if l.dead || r.dead || l.next != c.right {
			continue // stale: a neighbour was merged since
		}
		m, ok := b.merges[pairKey(l.id, r.id)]
		if !ok || m.rank != c.rank {
			continue // stale: the right token changed since
		}
		l.id = m.id
		r.dead = true
		l.next = r.next
		if r.next >= 0 {
			nodes[r.next].prev = c.left
		}
		// Re-add the two pairs that changed; push appends, so restore
		// the heap order for each.
		for _, left := range [2]int32{l.prev, c.left} {
			n := h.Len()
			push(left)
			if h.Len() > n {
				heap.Fix(&h, n)
			}
		}
	}
	for i := int32(0); i >= 0; i = nodes[i].next {
		dst = append(dst, int(nodes[i].id))
	}
	return dst
}

// Decode returns the text of ids: the concatenated bytes of ordinary
// tokens, and the text of special tokens. It is the byte-exact inverse of
// Encode. An id that is not a token decodes to U+FFFD.
func (b *BPE) Decode(ids []int) string {
	var sb strings.Builder
	sb.Grow(3 * len(ids))
	for _, id := range ids {
		if tok := b.token(id); tok != nil {
			sb.Write(tok)
		} else if text, ok := b.specialText[id]; ok {
			sb.WriteString(text)
		} else {
			sb.WriteString("\uFFFD")
		}
	}
	return sb.String()
}

// specialMatcher finds special tokens' text in a string.
type specialMatcher struct {
	ids   map[string]int // text -> id
	lens  []int          // distinct text lengths, longest first
	first [256]bool      // first bytes of the texts
}

// newSpecialMatcher indexes specials; texts must be distinct.
func newSpecialMatcher(specials []special) (specialMatcher, error) {
	m := specialMatcher{ids: make(map[string]int, len(specials))}
	for _, sp := range specials {
		if prev, dup := m.ids[sp.text]; dup && prev != sp.id {
			return m, fmt.Errorf("special token %q has two ids, %d and %d", sp.text, prev, sp.id)
		}
		m.ids[sp.text] = sp.id
		m.first[sp.text[0]] = true
		if !slices.Contains(m.lens, len(sp.text)) {
			m.lens = append(m.lens, len(sp.text))
		}
	}
	slices.Sort(m.lens)
	slices.Reverse(m.lens)
	return m, nil
}

// split calls fn for each ordinary segment of text (with id -1) and each
// special token occurrence (with its id), in order. At each position the
// longest special token matches; ordinary segments are never empty.
func (m *specialMatcher) split(text string, fn func(seg string, id int)) {
	start := 0
	for i := 0; i < len(text); i++ {
		if !m.first[text[i]] {
			continue
		}
		for _, n := range m.lens {
			if i+n > len(text) {
				continue
			}
			if id, ok := m.ids[text[i:i+n]]; ok {
				if start < i {
					fn(text[start:i], -1)
				}
				fn(text[i:i+n], id)
				start = i + n
				i += n - 1
				break
			}
		}
	}
	if start < len(text) {
		fn(text[start:], -1)
	}
}
