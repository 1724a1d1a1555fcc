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
	sum  float64
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
	m, err := New(be, local, B, T, opt)
	if err != nil {
		return nil, err
	}
	return &Stage{Spec: spec, Full: full, m: m}, nil
}

// Model returns the stage's local model (its Cfg has the stage's layers).
func (s *Stage) Model() *Model { return s.m }

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
func (s *Stage) Backward(lossScale float32) error {
	m, cfg, be := s.m, s.m.Cfg, s.m.be
	B, T := m.B, m.T
	BT, D, F := B*T, cfg.Dim, cfg.FFNHidden()
	H, KVH, HD := cfg.NHeads, cfg.KVHeads(), cfg.HeadDim()
	Q, KV := H*HD, KVH*HD
	d := &m.d
	dims := backend.AttentionDims{B: B, Tq: T, Tk: T, NH: H, NKV: KVH, HD: HD}
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
			linearBackward(be, d.x, dw, logits, m.final, w, BT, D, nv, false)
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
		linearBackward(be, d.hs, g.W2, d.resid, a.hs, p.W2, BT, F, D, true)
		be.Zero(d.h1)
		be.Zero(d.h3)
		be.SwiGLUBackward(d.h1, d.h3, d.hs, a.h1, a.h3, BT*F)
		linearBackward(be, d.x, g.W1, d.h1, a.ffnNorm, p.W1, BT, D, F, true)
		linearBackward(be, d.x, g.W3, d.h3, a.ffnNorm, p.W3, BT, D, F, false)
		be.RMSNormBackward(d.resid, g.FFNNorm, d.x, a.mid, p.FFNNorm, a.ffnRstd, BT, D)

		linearBackward(be, d.attn, g.Wo, d.resid, a.attn, p.Wo, BT, Q, D, true)
		be.Zero(d.q)
		be.Zero(d.k)
		be.Zero(d.v)
		be.AttentionBackward(d.q, d.k, d.v, d.attn, a.q, a.k, a.v, a.attn, a.lse, dims)
		be.Zero(d.qr)
		be.Zero(d.kr)
		be.RoPEBackward(d.qr, d.q, m.cos, m.sin, B, T, H, HD)
		be.RoPEBackward(d.kr, d.k, m.cos, m.sin, B, T, KVH, HD)
		linearBackward(be, d.x, g.Wq, d.qr, a.attnNorm, p.Wq, BT, D, Q, true)
		linearBackward(be, d.x, g.Wk, d.kr, a.attnNorm, p.Wk, BT, D, KV, false)
		linearBackward(be, d.x, g.Wv, d.v, a.attnNorm, p.Wv, BT, D, KV, false)
		be.RMSNormBackward(d.resid, g.AttnNorm, d.x, m.resid[l], p.AttnNorm, a.attnRstd, BT, D)
	}
	if s.Spec.Embedding {
		be.EmbeddingBackward(m.G.Embedding, d.resid, m.tokens, BT, D)
	}
	return nil
}
