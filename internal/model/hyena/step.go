package hyena

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// Stepper runs a whole Hyena model one position at a time for B
// sequences, teacher-forced or generating: the pieces an online generator
// (lazy or Flash Inference's relaxed schedule) needs around the long
// convolutions, which it computes itself. Per position and layer l:
//
//	Pre(l, &state[l], a, u)           // LN1, in_proj, short conv step; u = s_0, the first convolution's input
//	for o := 0; o < Order-2; o++ {
//	    y = Σ_{j≤t} h_o[t-j]·u_j      // the generator's o-th convolution of layer l (no skip term)
//	    Mid(l, o, y, u)               // u = s_{o+1}, the next convolution's input
//	}
//	y = Σ_{j≤t} h_{Order-2}[t-j]·u_j
//	Post(l, y, u, a)                  // skip term, gate x0, out_proj, residual, MLP: a is layer l+1's input
//
// after a = Embed(tokens) and before Logits(a). The filters h come from
// Filters. Buffers a, u and y are [B, D]; the skip term is added by Mid
// and Post, not by the generator. Mid and Post use the gates of the last
// Pre, so a layer's calls must follow its Pre before the next Pre. The
// Stepper computes with whatever parameters p views at each call; it is
// not safe for concurrent use.
//
// This API serves the generation work and may evolve with it.
type Stepper struct {
	Cfg Config
	B   int
	P   Params // the whole model's parameters

	be             backend.Backend
	ids            backend.Tensor
	ln, mean, rstd backend.Tensor // [B, D], [B], [B]
	z, zc          backend.Tensor // in_proj and short conv outputs, chunk-major [Order+1, B, D]
	skipT          backend.Tensor // [Order-1, D] of the last Pre's layer
	g, mid, out    backend.Tensor // [B, D]
	f1, a1         backend.Tensor // [B, d_inner]
}

// LayerState is one layer's online state for B sequences: the short
// convolution's last K-1 inputs of every channel, [Order+1, B, D, K-1]
// (chunk-major). A zero state starts the sequences.
type LayerState struct{ Conv backend.Tensor }

// NewStepper prepares stepping B sequences with the whole model's
// parameters p (a Model's P, or View of a flat buffer).
func NewStepper(be backend.Backend, cfg Config, p Params, B int) (*Stepper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if B <= 0 || len(p.Layers) != cfg.NLayer {
		return nil, fmt.Errorf("hyena: stepper for %d sequences over %d of the model's %d layers", B, len(p.Layers), cfg.NLayer)
	}
	D, H, n := cfg.DModel, cfg.Inner(), cfg.Order
	a := func(k int) backend.Tensor { return be.Alloc(backend.Float32, k) }
	s := &Stepper{Cfg: cfg, B: B, P: p, be: be}
	s.ids = be.Alloc(backend.Int32, B)
	s.ln, s.mean, s.rstd = a(B*D), a(B), a(B)
	s.z, s.zc = a((n+1)*B*D), a((n+1)*B*D)
	s.skipT = a((n - 1) * D)
	s.g, s.mid, s.out = a(B*D), a(B*D), a(B*D)
	s.f1, s.a1 = a(B*H), a(B*H)
	return s, nil
}

// NewState returns a zero state for every layer.
func (s *Stepper) NewState() []LayerState {
	c := s.Cfg
	st := make([]LayerState, c.NLayer)
	for l := range st {
		st[l].Conv = s.be.Alloc(backend.Float32, (c.Order+1)*s.B*c.DModel*(c.ShortFilterOrder-1))
	}
	return st
}

// Filters writes layer l's long filters for sequences of L ≤ l_max tokens
// into h [Order-1, D, L] (row o·D+d is channel d of the o-th convolution,
// modulated: the first L taps of the l_max-long filter) and, when skip
// has Mem, the skip terms into skip [Order-1, D].
func (s *Stepper) Filters(l, L int, h, skip backend.Tensor) error {
	c, be := s.Cfg, s.be
	if l < 0 || l >= c.NLayer || L <= 0 || L > c.LMax {
		return fmt.Errorf("hyena: filters of layer %d for length %d (the model has %d layers, l_max %d)", l, L, c.NLayer, c.LMax)
	}
	D, F := c.DModel, c.FilterOrder
	f := filterBufs{T: L, hraw: be.Alloc(backend.Float32, L*D), hT: h.Slice(0, (c.Order-1)*D*L)}
	for range c.NumInnerMLPs + 1 {
		f.fa = append(f.fa, be.Alloc(backend.Float32, L*F))
		f.fs = append(f.fs, be.Alloc(backend.Float32, L*F))
	}
	if c.Modulate {
		f.mod = uploadModulation(be, c, L)
	}
	p := &s.P.Layers[l]
	computeFilter(be, c, p, f)
	if skip.Mem != nil {
		be.Transpose(skip.Slice(0, (c.Order-1)*D), p.Skip, 1, D, c.Order-1)
	}
	return nil
}

// Embed writes the embeddings of one token per sequence into a [B, D].
func (s *Stepper) Embed(tokens []int32, a backend.Tensor) error {
	if len(tokens) != s.B {
		return fmt.Errorf("hyena: step needs %d tokens, got %d", s.B, len(tokens))
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= s.Cfg.VocabSize {
			return fmt.Errorf("hyena: token %d of sequence %d is outside the vocabulary [0, %d)", t, i, s.Cfg.VocabSize)
		}
	}
	s.be.Upload(s.ids, tokens)
	s.be.EmbeddingForward(a, s.P.Wte, s.ids, s.B, s.Cfg.DModel)
	return nil
}

// zcChunk is chunk i (x_i, or v for i = Order) of the last Pre, [B, D].
func (s *Stepper) zcChunk(i int) backend.Tensor {
	BD := s.B * s.Cfg.DModel
	return s.zc.Slice(i*BD, BD)
}

// Pre runs layer l's part before its first long convolution for the
// current position: LayerNorm, in_proj and one step of the short
// convolution (advancing st), keeping the gates x0 … x_{Order-1}; it
// writes the first convolution's input s_0 = v ⊙ x_{Order-1} into u.
func (s *Stepper) Pre(l int, st *LayerState, a, u backend.Tensor) {
	c, be := s.Cfg, s.be
	B, D, K, n := s.B, c.DModel, c.ShortFilterOrder, c.Order
	p := &s.P.Layers[l]
	be.LayerNormForward(s.ln, s.mean, s.rstd, a, p.Norm1W, p.Norm1B, B, D, float32(c.NormEps))
	BD := B * D
	for i := 0; i <= n; i++ {
		zi := s.z.Slice(i*BD, BD)
		linearBias(be, zi, s.ln, p.InW.Slice(i*D*D, D*D), p.InB.Slice(i*D, D), B, D, D)
		be.ShortConvStep(s.zcChunk(i), st.Conv.Slice(i*BD*(K-1), BD*(K-1)), zi, p.ConvW.Slice(i*D*K, D*K), p.ConvB.Slice(i*D, D), B, D, K)
	}
	be.Transpose(s.skipT, p.Skip, 1, D, n-1)
	be.Mul(u, s.zcChunk(n), s.zcChunk(n-1))
}

// Mid runs layer l's part between its o-th and (o+1)-th long
// convolutions (o < Order-2): given the o-th convolution's output y at
// this position (without the skip term) and its input u, it overwrites u
// with the next convolution's input (y + skip_o ⊙ u) ⊙ x_{Order-2-o};
// y is overwritten.
func (s *Stepper) Mid(l, o int, y, u backend.Tensor) {
	D := s.Cfg.DModel
	s.be.ChannelScaleAdd(y, y, u, s.skipT.Slice(o*D, D), s.B, D, 1)
	s.be.Mul(u, y, s.zcChunk(s.Cfg.Order-2-o))
}

// Post completes layer l for the current position: given the last long
// convolution's output y (without the skip term) and its input u, it
// computes v = y + skip ⊙ u, the mixer's output out_proj(v ⊙ x0) added to
// a, then the MLP block, leaving layer l+1's input in a. y is
// overwritten.
func (s *Stepper) Post(l int, y, u, a backend.Tensor) {
	c, be := s.Cfg, s.be
	B, D, H := s.B, c.DModel, c.Inner()
	p := &s.P.Layers[l]
	be.ChannelScaleAdd(y, y, u, s.skipT.Slice((c.Order-2)*D, D), B, D, 1)
	be.Mul(s.g, y, s.zcChunk(0))
	linearBias(be, s.mid, s.g, p.OutW, p.OutB, B, D, D)
	be.Add(s.mid, s.mid, a)
	be.LayerNormForward(s.ln, s.mean, s.rstd, s.mid, p.Norm2W, p.Norm2B, B, D, float32(c.NormEps))
	linearBias(be, s.f1, s.ln, p.Fc1W, p.Fc1B, B, D, H)
	be.GELUTanhForward(s.a1, s.f1, B*H)
	linearBias(be, s.out, s.a1, p.Fc2W, p.Fc2B, B, H, D)
	be.Add(a, s.out, s.mid)
}

// Logits writes the logits [B, PaddedVocab] of the last layer's output a:
// the final LayerNorm and the head tied to the embedding.
func (s *Stepper) Logits(a, logits backend.Tensor) {
	c, be := s.Cfg, s.be
	B, D, V := s.B, c.DModel, c.PaddedVocab()
	be.LayerNormForward(s.ln, s.mean, s.rstd, a, s.P.LnFW, s.P.LnFB, B, D, float32(c.NormEps))
	be.Gemm(false, true, B, V, D, 1, s.ln, D, s.P.Wte, D, 0, logits, V)
}
