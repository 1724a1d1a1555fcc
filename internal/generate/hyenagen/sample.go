package hyenagen

import (
	"fmt"

	"github.com/titan-go/titan/internal/generate"
)

// Sample starts the Generator's B sequences with the same prompt (at
// least one token; Reset first to reuse a Generator), then samples up to
// maxNew tokens for each row b with samplers[b], passing each to
// emit(b, token) as it comes (emit may be nil). A row stops at eos (not
// emitted; eos < 0: never) and every row stops at the capacity. It
// returns the generated tokens of each row.
func (g *Generator) Sample(prompt []int32, maxNew int, samplers []*generate.Sampler, eos int, emit func(row, token int)) ([][]int, error) {
	B, V := g.opt.B, g.V()
	if len(samplers) != B {
		return nil, fmt.Errorf("hyenagen: %d samplers for %d sequences", len(samplers), B)
	}
	if len(prompt) == 0 {
		return nil, fmt.Errorf("hyenagen: Sample needs a prompt of at least one token (a BOS)")
	}
	feed := make([]int32, 0, B*len(prompt))
	for range B {
		feed = append(feed, prompt...)
	}
	logits, err := g.Prefill(feed)
	if err != nil {
		return nil, err
	}
	out := make([][]int, B)
	done := make([]bool, B)
	next := make([]int32, B)
	for n := 0; n < maxNew; n++ {
		live := 0
		for b := range B {
			if done[b] {
				next[b] = 0 // a placeholder the row's output ignores
				continue
			}
			tok := samplers[b].Sample(logits[b*V : (b+1)*V])
			if tok == eos {
				done[b] = true
				next[b] = 0
				continue
			}
			out[b] = append(out[b], tok)
			if emit != nil {
				emit(b, tok)
			}
			next[b] = int32(tok)
			live++
		}
		if live == 0 || n == maxNew-1 || g.pos >= g.opt.L {
			break
		}
		if logits, err = g.Step(next); err != nil {
			return out, err
		}
	}
	return out, nil
}
