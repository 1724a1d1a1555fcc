package llama

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// Inference runs the model one sequence at a time with a key/value cache,
// for generation: each call processes new tokens at the next positions
// and returns the logits of the last one.
type Inference struct {
	m      *Model // parameters only
	maxT   int
	pos    int
	kc, vc []backend.Tensor // per layer [maxT, NKV*HD]
	cos    backend.Tensor
	sin    backend.Tensor

	x, xn, q, attn, lse backend.Tensor
	h1, h3, tokens      backend.Tensor
	logits              backend.Tensor
	host                []float32
}

// NewInference prepares generation of up to maxT positions with the
// parameters of m (which may have been built for any batch shape).
func NewInference(m *Model, maxT int) (*Inference, error) {
	cfg, be := m.Cfg, m.be
	if maxT <= 0 || maxT > cfg.MaxSeqLen {
		return nil, fmt.Errorf("llama: generation length %d outside (0, max_seq_len %d]", maxT, cfg.MaxSeqLen)
	}
	D, F, V := cfg.Dim, cfg.FFNHidden(), cfg.VocabSize
	Q, KV := cfg.NHeads*cfg.HeadDim(), cfg.KVHeads()*cfg.HeadDim()
	in := &Inference{m: m, maxT: maxT}
	for l := 0; l < cfg.NLayers; l++ {
		in.kc = append(in.kc, be.Alloc(backend.Float32, maxT*KV))
		in.vc = append(in.vc, be.Alloc(backend.Float32, maxT*KV))
	}
	cos, sin := cfg.RoPETables(maxT)
	in.cos, in.sin = be.Alloc(backend.Float32, len(cos)), be.Alloc(backend.Float32, len(sin))
	be.Upload(in.cos, cos)
	be.Upload(in.sin, sin)
	in.x, in.xn = be.Alloc(backend.Float32, maxT*D), be.Alloc(backend.Float32, maxT*D)
	in.q, in.attn = be.Alloc(backend.Float32, maxT*Q), be.Alloc(backend.Float32, maxT*Q)
	in.lse = be.Alloc(backend.Float32, maxT*cfg.NHeads)
	in.h1, in.h3 = be.Alloc(backend.Float32, maxT*F), be.Alloc(backend.Float32, maxT*F)
	in.tokens = be.Alloc(backend.Int32, maxT)
	in.logits = be.Alloc(backend.Float32, V)
	in.host = make([]float32, V)
	return in, nil
}

// Pos is the number of positions processed so far.
func (in *Inference) Pos() int { return in.pos }

// Reset forgets the cached positions.
func (in *Inference) Reset() { in.pos = 0 }

// Next processes tokens at positions Pos()..Pos()+len(tokens)-1 and
// returns the logits [V] predicting the following token. The slice is
// reused by the next call.
func (in *Inference) Next(tokens []int32) ([]float32, error) {
	m, cfg, be := in.m, in.m.Cfg, in.m.be
	n := len(tokens)
	if n == 0 || in.pos+n > in.maxT {
		return nil, fmt.Errorf("llama: %d new tokens at position %d exceed the generation length %d", n, in.pos, in.maxT)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= cfg.VocabSize {
			return nil, fmt.Errorf("llama: token %d is outside the vocabulary [0, %d)", t, cfg.VocabSize)
		}
	}
	D, F, H, KVH, HD := cfg.Dim, cfg.FFNHidden(), cfg.NHeads, cfg.KVHeads(), cfg.HeadDim()
	Q, KV := H*HD, KVH*HD
	p0, h := in.pos, HD/2
	cos, sin := in.cos.Slice(p0*h, n*h), in.sin.Slice(p0*h, n*h)
	x, xn := in.x.Slice(0, n*D), in.xn.Slice(0, n*D)
	q, attn := in.q.Slice(0, n*Q), in.attn.Slice(0, n*Q)
	h1, h3 := in.h1.Slice(0, n*F), in.h3.Slice(0, n*F)
	tok := in.tokens.Slice(0, n)
	be.Upload(tok, tokens)
	be.EmbeddingForward(x, m.P.Embedding, tok, n, D)
	eps := float32(cfg.NormEps)
	rstd := in.lse.Slice(0, n) // scratch: RMSNorm's rstd is not needed later
	dims := backend.AttentionDims{B: 1, Tq: n, Tk: p0 + n, NH: H, NKV: KVH, HD: HD, QPos: p0}
	for l, p := range m.P.Layers {
		k, v := in.kc[l].Slice(p0*KV, n*KV), in.vc[l].Slice(p0*KV, n*KV)
		be.RMSNormForward(xn, rstd, x, p.AttnNorm, n, D, eps)
		linear(be, q, xn, p.Wq, n, D, Q, false)
		linear(be, k, xn, p.Wk, n, D, KV, false)
		linear(be, v, xn, p.Wv, n, D, KV, false)
		be.RoPEForward(q, q, cos, sin, 1, n, H, HD)
		be.RoPEForward(k, k, cos, sin, 1, n, KVH, HD)
		be.AttentionForward(attn, in.lse.Slice(0, n*H), q, in.kc[l].Slice(0, (p0+n)*KV), in.vc[l].Slice(0, (p0+n)*KV), dims)
		linear(be, x, attn, p.Wo, n, Q, D, true)
		be.RMSNormForward(xn, rstd, x, p.FFNNorm, n, D, eps)
		linear(be, h1, xn, p.W1, n, D, F, false)
		linear(be, h3, xn, p.W3, n, D, F, false)
		be.SwiGLUForward(h1, h1, h3, n*F)
		linear(be, x, h1, p.W2, n, F, D, true)
	}
	last := x.Slice((n-1)*D, D)
	be.RMSNormForward(xn.Slice(0, D), rstd.Slice(0, 1), last, m.P.Norm, 1, D, eps)
	linear(be, in.logits, xn.Slice(0, D), m.P.Output, 1, D, cfg.VocabSize, false)
	be.Download(in.host, in.logits)
	in.pos += n
	return in.host, nil
}
