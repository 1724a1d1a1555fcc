package llama

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// StageSpec is the part of a model that one pipeline stage computes: the
// transformer layers [FirstLayer, FirstLayer+NumLayers) of the full
// model, preceded by the token embedding when Embedding is set and
// followed by the final norm, the output projection and the loss when
// Head is set.
type StageSpec struct {
	FirstLayer, NumLayers int
	Embedding, Head       bool
}

// Range returns the elements [lo, hi) of full's flat layout that the
// stage's parameters occupy: a contiguous range, since the layout orders
// the embedding, the layers and the head.
func (s StageSpec) Range(full Config) (lo, hi int) {
	us := full.Units()
	first, last := 1+s.FirstLayer, s.FirstLayer+s.NumLayers
	if s.Embedding {
		first = 0
	}
	if s.Head {
		last = full.NLayers + 1
	}
	return us[first].Lo, us[last].Hi
}

// Stage is the model of one pipeline stage for batches of B×T tokens. Its
// input is the token batch (with the embedding) or the hidden states
// [B·T, Dim] of the previous stage; its output is the loss (with the
// head) or its hidden states for the next stage. A Stage holds the
// activations of one microbatch: a pipeline keeps one Stage per
// microbatch in flight, all bound to the same parameters and gradients.
//
// The layers compute exactly as in Model.Forward and Model.Backward, so
// a chain of stages gives the losses and gradients of the whole model.
type Stage struct {
	Spec StageSpec
	Full Config
	m    *Model // local model: Cfg.NLayers = Spec.NumLayers, external parameters
	// douts and pending are a split backward's kept output gradients and
	// its deferred weight-gradient products (see BackwardInput).
	douts   []layerDouts
	pending []func()
}

// NewStage plans and allocates a stage of the model full. Its parameters
// and gradients are bound with Bind.
func NewStage(be backend.Backend, full Config, spec StageSpec, B, T int, opt Options) (*Stage, error) {
	if spec.FirstLayer < 0 || spec.NumLayers < 0 || spec.FirstLayer+spec.NumLayers > full.NLayers {
		return nil, fmt.Errorf("llama: stage layers [%d, %d) outside the model's %d layers", spec.FirstLayer, spec.FirstLayer+spec.NumLayers, full.NLayers)
	}
	local := full
	local.NLayers = spec.NumLayers
	opt.External = true
	if !spec.Head {
		opt.LogitChunk = 1 // no logits: keep their planned buffer small
	}
	m, err := New(be, local, B, T, opt)
	if err != nil {
		return nil, err
	}
	return &Stage{Spec: spec, Full: full, m: m}, nil
}

// Model returns the stage's local model (its Cfg has the stage's layers).
func (s *Stage) Model() *Model { return s.m }

// ActivationBytes is the stage's activation memory: its model's planned
// activations and, once a split backward ran, the output gradients it
// keeps for BackwardWeight.
func (s *Stage) ActivationBytes() int64 {
	n := s.m.ActivationBytes()
	for _, o := range s.douts {
		n += int64(o.ffnOut.Len+o.h1.Len+o.h3.Len+o.attnOut.Len+o.qr.Len+o.kr.Len+o.v.Len) * 4
	}
	return n
}

// Bind lays the stage's parameter and gradient views over params and
// grads, both holding the elements Spec.Range(Full) of the flat layout.
func (s *Stage) Bind(params, grads backend.Tensor) {
	lo, _ := s.Spec.Range(s.Full)
	us := s.Full.Units()
	bind := func(local, global int) {
		u := us[global]
		s.m.BindUnit(local, params.Slice(u.Lo-lo, u.Hi-u.Lo), grads.Slice(u.Lo-lo, u.Hi-u.Lo))
	}
	if s.Spec.Embedding {
		bind(0, 0)
	}
	for l := 0; l < s.Spec.NumLayers; l++ {
		bind(1+l, 1+s.Spec.FirstLayer+l)
	}
	if s.Spec.Head {
		bind(s.Spec.NumLayers+1, s.Full.NLayers+1)
	}
}

// Input is the buffer [B·T, Dim] a stage without embedding reads its
// input hidden states from; the caller fills it before Forward.
func (s *Stage) Input() backend.Tensor { return s.m.resid[0] }

// Output is the stage's output hidden states [B·T, Dim] after Forward
// (for a stage without head).
func (s *Stage) Output() backend.Tensor { return s.m.resid[s.Spec.NumLayers] }

// GradOutput is the buffer [B·T, Dim] a stage without head reads the
// gradient of the loss with respect to its output from; the caller fills
// it before Backward. It is scratch memory shared by every pass of the
// stage's model, so it must be filled right before Backward.
func (s *Stage) GradOutput() backend.Tensor { return s.m.d.resid }

// GradInput is the gradient with respect to the stage's input hidden
// states after Backward (for a stage without embedding); it is
// overwritten by the stage's next pass.
func (s *Stage) GradInput() backend.Tensor { return s.m.d.resid }

// Forward runs the stage. With the embedding it reads tokens [B·T];
// otherwise it reads Input(). With the head it computes the per-token
// cross-entropy against targets (< 0: ignored) and returns the sum of the
// losses and the number of targets; otherwise it leaves Output() set.
func (s *Stage) Forward(tokens, targets []int32) (lossSum float64, numTargets int, err error) {
	m, cfg, be := s.m, s.m.Cfg, s.m.be
	BT, D := m.B*m.T, cfg.Dim
	if s.Spec.Embedding {
		if len(tokens) != BT {
			return 0, 0, fmt.Errorf("llama: stage forward needs %d tokens, got %d", BT, len(tokens))
		}
		for i, t := range tokens {
			if t < 0 || int(t) >= cfg.VocabSize {
				return 0, 0, fmt.Errorf("llama: token %d at position %d is outside the vocabulary [0, %d)", t, i, cfg.VocabSize)
			}
		}
		be.Upload(m.tokens, tokens)
		be.EmbeddingForward(m.resid[0], m.P.Embedding, m.tokens, BT, D)
	}
	for l := range m.layers {
		shared := m.policy[l] != keepAll
		if shared {
			m.scratchLayer = -1
		}
		m.layerForward(l, true)
		if shared {
			m.scratchLayer = l
		}
	}
	m.haveTargets = false
	if !s.Spec.Head {
		return 0, 0, nil
	}
	if len(targets) != BT {
		return 0, 0, fmt.Errorf("llama: stage forward needs %d targets, got %d", BT, len(targets))
	}
	m.numTargets = 0
	for _, t := range targets {
		if int(t) >= cfg.VocabSize {
			return 0, 0, fmt.Errorf("llama: target %d is outside the vocabulary [0, %d)", t, cfg.VocabSize)
		}
		if t >= 0 {
			m.numTargets++
		}
	}
	be.RMSNormForward(m.final, m.rstd, m.resid[cfg.NLayers], m.P.Norm, BT, D, float32(cfg.NormEps))
	be.Upload(m.targets, targets)
	be.CrossEntropyReset(m.stats, BT)
	m.forEachChunk(func(logits backend.Tensor, v0, nv int) {
		be.CrossEntropyChunk(m.stats, logits, m.targets, BT, nv, v0)
	})
	m.haveTargets = true
	be.CrossEntropyLoss(m.losses, m.stats, m.targets, BT)
	be.Download(m.lossesHost, m.losses)
	var sum float64
	for _, l := range m.lossesHost {
		sum += float64(l)
	}
	return sum, m.numTargets, nil
}

// Backward accumulates the stage's parameter gradients and leaves the
// gradient with respect to its input in GradInput() (without embedding).
// With the head the gradient is that of lossScale × (sum of the per-token
// losses of the last Forward); otherwise the caller has filled
// GradOutput() with the gradient with respect to Output().
func (s *Stage) Backward(lossScale float32) error { return s.backward(lossScale, false) }

// CanSplit reports whether BackwardInput defers the weight gradients of
// the linear layers to BackwardWeight: only when every activation is kept
// (no activation checkpointing), since the deferred products read the
// layer inputs after later layers' backward passes ran.
func (s *Stage) CanSplit() bool {
	for _, p := range s.m.policy {
		if p != keepAll {
			return false
		}
	}
	return true
}

// BackwardInput is the first half of a split Backward, the "B" of
// zero-bubble schedules: it computes the gradient with respect to the
// stage's input and every gradient except the weight gradients of the
// linear layers (and, with a chunked vocabulary, of the output
// projection), which BackwardWeight computes. It keeps the output
// gradients of those layers until then: per layer 2·Dim + 2·FFNHidden +
// (NHeads + 2·NKVHeads)·HeadDim floats per token. When !CanSplit() it runs
// the whole Backward and BackwardWeight does nothing.
func (s *Stage) BackwardInput(lossScale float32) error {
	return s.backward(lossScale, s.CanSplit())
}

// ReserveSplit allocates the memory a split backward keeps (see
// BackwardInput) ahead of the first one, when CanSplit.
func (s *Stage) ReserveSplit() {
	if s.douts != nil || !s.CanSplit() {
		return
	}
	m, cfg, be := s.m, s.m.Cfg, s.m.be
	BT, D, F := m.B*m.T, cfg.Dim, cfg.FFNHidden()
	Q, KV := cfg.NHeads*cfg.HeadDim(), cfg.KVHeads()*cfg.HeadDim()
	s.douts = make([]layerDouts, cfg.NLayers)
	for l := range s.douts {
		s.douts[l] = layerDouts{
			ffnOut: be.Alloc(backend.Float32, BT*D), h1: be.Alloc(backend.Float32, BT*F), h3: be.Alloc(backend.Float32, BT*F),
			attnOut: be.Alloc(backend.Float32, BT*D), qr: be.Alloc(backend.Float32, BT*Q), kr: be.Alloc(backend.Float32, BT*KV), v: be.Alloc(backend.Float32, BT*KV),
		}
	}
}

// BackwardWeight is the second half of a split Backward, the "W" of
// zero-bubble schedules: it accumulates the weight gradients BackwardInput
// deferred. The sum of both halves equals Backward's gradients.
func (s *Stage) BackwardWeight() {
	for _, f := range s.pending {
		f()
	}
	s.pending = s.pending[:0]
}

// layerDouts are one layer's output gradients of the linear layers that a
// split backward keeps for BackwardWeight.
type layerDouts struct {
	ffnOut, h1, h3, attnOut, qr, kr, v backend.Tensor
}

func (s *Stage) backward(lossScale float32, split bool) error {
	m, cfg, be := s.m, s.m.Cfg, s.m.be
	B, T := m.B, m.T
	BT, D, F := B*T, cfg.Dim, cfg.FFNHidden()
	H, KVH, HD := cfg.NHeads, cfg.KVHeads(), cfg.HeadDim()
	Q, KV := H*HD, KVH*HD
	d := &m.d
	dims := backend.AttentionDims{B: B, Tq: T, Tk: T, NH: H, NKV: KVH, HD: HD}
	if len(s.pending) != 0 {
		return fmt.Errorf("llama: stage backward before the weight gradients of the previous one")
	}
	if split {
		s.ReserveSplit()
	}
	// lin is linearBackward, its weight product deferred when defer is set.
	lin := func(dinp, dw, dout, inp, w backend.Tensor, N, in, outDim int, overwrite, deferW bool) {
		beta := float32(1)
		if overwrite {
			beta = 0
		}
		be.Gemm(false, false, N, in, outDim, 1, dout, outDim, w, in, beta, dinp, in)
		wg := func() { be.Gemm(true, false, outDim, in, N, 1, dout, outDim, inp, in, 1, dw, in) }
		if deferW {
			s.pending = append(s.pending, wg)
		} else {
			wg()
		}
	}
	if s.Spec.Head {
		if !m.haveTargets {
			return fmt.Errorf("llama: stage backward needs a forward pass with targets")
		}
		be.Zero(d.x)
		single := m.chunk == cfg.VocabSize
		for v0 := 0; v0 < cfg.VocabSize; v0 += m.chunk {
			nv := min(m.chunk, cfg.VocabSize-v0)
			logits := m.logits.Slice(0, BT*nv)
			w, dw := m.P.Output.Slice(v0*D, nv*D), m.G.Output.Slice(v0*D, nv*D)
			if !single {
				linear(be, logits, m.final, w, BT, D, nv, false)
			}
			be.CrossEntropyChunkBackward(logits, m.stats, m.targets, BT, nv, v0, lossScale)
			// The logits gradient outlives this loop only with one chunk.
			lin(d.x, dw, logits, m.final, w, BT, D, nv, false, split && single)
		}
		if single {
			m.haveTargets = false
		}
		be.Zero(d.resid)
		be.RMSNormBackward(d.resid, m.G.Norm, d.x, m.resid[cfg.NLayers], m.P.Norm, m.rstd, BT, D)
	}
	for l := cfg.NLayers - 1; l >= 0; l-- {
		m.restore(l)
		a, p, g := &m.layers[l], &m.P.Layers[l], &m.G.Layers[l]
		ffnOut, dh1, dh3, dqr, dkr, dv := d.resid, d.h1, d.h3, d.qr, d.kr, d.v
		var o *layerDouts
		if split {
			o = &s.douts[l]
			be.Copy(o.ffnOut, d.resid)
			ffnOut, dh1, dh3, dqr, dkr, dv = o.ffnOut, o.h1, o.h3, o.qr, o.kr, o.v
		}
		lin(d.hs, g.W2, ffnOut, a.hs, p.W2, BT, F, D, true, split)
		be.Zero(dh1)
		be.Zero(dh3)
		be.SwiGLUBackward(dh1, dh3, d.hs, a.h1, a.h3, BT*F)
		lin(d.x, g.W1, dh1, a.ffnNorm, p.W1, BT, D, F, true, split)
		lin(d.x, g.W3, dh3, a.ffnNorm, p.W3, BT, D, F, false, split)
		be.RMSNormBackward(d.resid, g.FFNNorm, d.x, a.mid, p.FFNNorm, a.ffnRstd, BT, D)

		attnOut := d.resid
		if split {
			be.Copy(o.attnOut, d.resid)
			attnOut = o.attnOut
		}
		lin(d.attn, g.Wo, attnOut, a.attn, p.Wo, BT, Q, D, true, split)
		be.Zero(d.q)
		be.Zero(d.k)
		be.Zero(dv)
		be.AttentionBackward(d.q, d.k, dv, d.attn, a.q, a.k, a.v, a.attn, a.lse, dims)
		be.Zero(dqr)
		be.Zero(dkr)
		be.RoPEBackward(dqr, d.q, m.cos, m.sin, B, T, H, HD)
		be.RoPEBackward(dkr, d.k, m.cos, m.sin, B, T, KVH, HD)
		lin(d.x, g.Wq, dqr, a.attnNorm, p.Wq, BT, D, Q, true, split)
		lin(d.x, g.Wk, dkr, a.attnNorm, p.Wk, BT, D, KV, false, split)
		lin(d.x, g.Wv, dv, a.attnNorm, p.Wv, BT, D, KV, false, split)
		be.RMSNormBackward(d.resid, g.AttnNorm, d.x, m.resid[l], p.AttnNorm, a.attnRstd, BT, D)
	}
	if s.Spec.Embedding {
		be.EmbeddingBackward(m.G.Embedding, d.resid, m.tokens, BT, D)
	}
	return nil
}
