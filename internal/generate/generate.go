// Package generate samples text from a trained model with a key/value
// cache, streaming tokens as they come.
package generate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"unicode/utf8"

	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/tokenizer"
)

// Sampler turns logits into a token.
type Sampler struct {
	Temperature float64 // 0: greedy
	TopK        int     // 0: no limit
	TopP        float64 // 0 or 1: no nucleus cut
	rng         *rand.Rand
}

// NewSampler returns a sampler seeded with seed.
func NewSampler(temperature float64, topK int, topP float64, seed uint64) (*Sampler, error) {
	switch {
	case temperature < 0:
		return nil, fmt.Errorf("temperature %g must be >= 0", temperature)
	case topK < 0:
		return nil, fmt.Errorf("top-k %d must be >= 0", topK)
	case topP < 0 || topP > 1:
		return nil, fmt.Errorf("top-p %g must be in [0, 1]", topP)
	}
	return &Sampler{Temperature: temperature, TopK: topK, TopP: topP, rng: rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))}, nil
}

// Sample draws a token id from logits.
func (s *Sampler) Sample(logits []float32) int {
	if s.Temperature == 0 {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		return best
	}
	idx := make([]int, len(logits))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
	if s.TopK > 0 && s.TopK < len(idx) {
		idx = idx[:s.TopK]
	}
	probs := make([]float64, len(idx))
	mx := float64(logits[idx[0]])
	var sum float64
	for i, id := range idx {
		probs[i] = math.Exp((float64(logits[id]) - mx) / s.Temperature)
		sum += probs[i]
	}
	if s.TopP > 0 && s.TopP < 1 {
		var cum float64
		for i := range probs {
			cum += probs[i] / sum
			if cum >= s.TopP {
				idx, probs = idx[:i+1], probs[:i+1]
				break
			}
		}
		sum = 0
		for _, p := range probs {
			sum += p
		}
	}
	u := s.rng.Float64() * sum
	for i, p := range probs {
		u -= p
		if u <= 0 {
			return idx[i]
		}
	}
	return idx[len(idx)-1]
}

// Run feeds the prompt (BOS first when the tokenizer has one), then
// samples up to maxNew tokens, stopping at EOS. emit receives the text as
// it becomes printable (never a partial UTF-8 sequence, except at the end).
// It returns the generated token ids.
func Run(in *llama.Inference, tok tokenizer.Tokenizer, prompt string, maxNew int, s *Sampler, emit func(string)) ([]int, error) {
	ids := tok.Encode(prompt)
	if tok.BOS() >= 0 {
		ids = append([]int{tok.BOS()}, ids...)
	}
	feed := make([]int32, len(ids))
	for i, id := range ids {
		feed[i] = int32(id)
	}
	ts := NewTextStream(tok, emit)
	for len(ts.IDs()) < maxNew {
		logits, err := in.Next(feed)
		if err != nil {
			return ts.IDs(), err
		}
		next := s.Sample(logits)
		if next == tok.EOS() {
			break
		}
		ts.Add(next)
		feed = []int32{int32(next)}
	}
	ts.Flush()
	return ts.IDs(), nil
}

// TextStream turns generated token ids into text as it becomes
// printable: emit receives each new piece, never a partial UTF-8
// sequence except at Flush.
type TextStream struct {
	tok     tokenizer.Tokenizer
	emit    func(string)
	ids     []int
	printed int
}

// NewTextStream returns a stream decoding with tok into emit.
func NewTextStream(tok tokenizer.Tokenizer, emit func(string)) *TextStream {
	return &TextStream{tok: tok, emit: emit}
}

// Add appends a token and emits the text that became printable.
func (t *TextStream) Add(id int) {
	t.ids = append(t.ids, id)
	text := t.tok.Decode(t.ids)
	end := len(text)
	for end > t.printed && !utf8.ValidString(text[t.printed:end]) && len(text)-end < utf8.UTFMax {
		end--
	}
	if end > t.printed && utf8.ValidString(text[t.printed:end]) {
		t.emit(text[t.printed:end])
		t.printed = end
	}
}

// Flush emits whatever text is left, valid UTF-8 or not.
func (t *TextStream) Flush() {
	if text := t.tok.Decode(t.ids); len(text) > t.printed {
		t.emit(text[t.printed:])
		t.printed = len(text)
	}
}

// IDs returns the tokens added so far.
func (t *TextStream) IDs() []int { return t.ids }
