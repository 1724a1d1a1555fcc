package llama

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/backend"
)

// LayerParams are the views of one transformer block's parameters (or of
// their gradients) inside a flat buffer.
type LayerParams struct {
	AttnNorm, Wq, Wk, Wv, Wo backend.Tensor
	FFNNorm, W1, W2, W3      backend.Tensor
}

// Params are the views of every parameter (or gradient) in a flat buffer.
type Params struct {
	Embedding backend.Tensor
	Layers    []LayerParams
	Norm      backend.Tensor
	Output    backend.Tensor
}

// View lays cfg's parameters over the flat buffer flat.
func View(cfg Config, flat backend.Tensor) Params {
	layout := cfg.Layout()
	t := func(i int) backend.Tensor { return flat.Slice(layout[i].Offset, layout[i].Size) }
	p := Params{Embedding: t(0), Layers: make([]LayerParams, cfg.NLayers)}
	for l := range p.Layers {
		i := 1 + 9*l
		p.Layers[l] = LayerParams{
			AttnNorm: t(i), Wq: t(i + 1), Wk: t(i + 2), Wv: t(i + 3), Wo: t(i + 4),
			FFNNorm: t(i + 5), W1: t(i + 6), W2: t(i + 7), W3: t(i + 8),
		}
	}
	n := len(layout)
	p.Norm, p.Output = t(n-2), t(n-1)
	return p
}

// layerActs are the activations of one block kept for the backward pass.
type layerActs struct {
	attnNorm, attnRstd backend.Tensor // RMSNorm output [BT, D] and 1/rms [BT]
	q, k, v            backend.Tensor // projections after RoPE [BT, NH*HD], [BT, NKV*HD]
	attn, lse          backend.Tensor // attention output [BT, NH*HD], log-sum-exp [B, NH, T]
	mid                backend.Tensor // residual stream after attention [BT, D]
	ffnNorm, ffnRstd   backend.Tensor
	h1, h3, hs         backend.Tensor // w1·x, w3·x, silu(w1·x)*(w3·x) [BT, F]
}

// Options tunes memory use; the zero value is sensible.
type Options struct {
	// LogitChunk bounds how many vocabulary columns of logits exist at
	// once (the cross-entropy is computed chunk by chunk and the output
	// projection recomputed in the backward). 0 picks a chunk that keeps
	// the logits under about 64 MiB, or the whole vocabulary if smaller.
	LogitChunk int
	// External makes New allocate no flat parameter and gradient
	// buffers: Params and Grads stay empty and the caller binds every
	// unit's parameters (and, for Backward, gradients) with BindUnit,
	// typically from Hooks. Sharded data parallelism (FSDP) uses it.
	External bool
	// Checkpoint selects the activations recomputed in the backward pass
	// instead of kept from the forward pass (zero value: none).
	Checkpoint ActivationCheckpoint
}

// Unit is one unit of the flat layout that sharded data parallelism
// gathers and reduces as a whole: elements [Lo, Hi) of the flat buffer.
// Unit 0 is the token embedding, unit 1+l transformer layer l, and the
// last unit (NLayers+1) the final norm with the output projection.
type Unit struct{ Lo, Hi int }

// Units returns the units of cfg's layout in flat-buffer order; they tile
// the buffer.
func (c Config) Units() []Unit {
	layout := c.Layout()
	us := make([]Unit, 0, c.NLayers+2)
	us = append(us, Unit{0, layout[0].Size})
	for l := 0; l < c.NLayers; l++ {
		first, last := layout[1+9*l], layout[9+9*l]
		us = append(us, Unit{first.Offset, last.Offset + last.Size})
	}
	n := len(layout)
	us = append(us, Unit{layout[n-2].Offset, layout[n-1].Offset + layout[n-1].Size})
	return us
}

// UnitHooks are called by Forward and Backward around the computation of
// each unit (see Unit): BeforeForward(u) before the first use of unit u's
// parameters in a forward pass and AfterForward(u) after the last one;
// BeforeBackward(u) before unit u's parameters and gradients are used in
// the backward pass and AfterBackward(u) once its gradients are complete
// for this pass. Forward visits units in increasing order, Backward in
// decreasing order. A hook's error aborts the pass and is returned.
//
// With activation checkpointing, a layer's forward recomputation is part
// of its backward: it runs after BeforeBackward, on the parameters bound
// then, and no forward hook is called for it. The sequence is therefore
// the same in every checkpointing mode.
type UnitHooks interface {
	BeforeForward(unit int) error
	AfterForward(unit int) error
	BeforeBackward(unit int) error
	AfterBackward(unit int) error
}

// Model is a Llama 3 model sized for batches of B sequences of T tokens.
// Its parameters and gradients are single flat buffers (Params, Grads);
// all activation memory is planned and allocated by New.
type Model struct {
	Cfg  Config
	B, T int

	be           backend.Backend
	Params       backend.Tensor // flat parameters
	Grads        backend.Tensor // flat gradients, same layout
	P, G         Params
	chunk        int
	cos, sin     backend.Tensor
	tokens       backend.Tensor
	targets      backend.Tensor
	resid        []backend.Tensor // residual stream entering each layer, and after the last
	layers       []layerActs
	final, rstd  backend.Tensor
	logits       backend.Tensor // [BT, chunk]
	stats        backend.Tensor // cross-entropy running state [BT, 3]
	losses       backend.Tensor // per-token loss [BT]
	lossesHost   []float32
	numTargets   int
	haveTargets  bool
	d            scratch
	activationsN int
	policy       []layerPolicy // per layer: what its forward keeps
	scratchLayer int           // layer whose activations the shared scratch set holds; -1: none
	recomputed   int           // layer recomputations so far (for tests)

	// Hooks, when set, are called around every unit in Forward and
	// Backward (nil: none, the single-process path).
	Hooks UnitHooks
}

// scratch are the activation gradients, reused layer after layer.
type scratch struct {
	resid, x   backend.Tensor // [BT, D]
	q, k, v    backend.Tensor // gradients w.r.t. rotated q, k and v
	qr, kr     backend.Tensor // gradients w.r.t. q, k before RoPE
	attn       backend.Tensor // [BT, NH*HD]
	h1, h3, hs backend.Tensor // [BT, F]
}

// New plans and allocates a model for batches of B×T tokens on be.
// Parameters start at zero: call Init or load them.
func New(be backend.Backend, cfg Config, B, T int, opt Options) (*Model, error) {
	m, err := plan(cfg, B, T, opt)
	if err != nil {
		return nil, err
	}
	m.be = be
	if opt.External {
		m.P = Params{Layers: make([]LayerParams, cfg.NLayers)}
		m.G = Params{Layers: make([]LayerParams, cfg.NLayers)}
	} else {
		n := int(cfg.NumParams())
		m.Params = be.Alloc(backend.Float32, n)
		m.Grads = be.Alloc(backend.Float32, n)
		m.P, m.G = View(cfg, m.Params), View(cfg, m.Grads)
	}
	acts := be.Alloc(backend.Float32, m.activationsN)
	off := 0
	m.carve(func(n int) backend.Tensor {
		t := acts.Slice(off, n)
		off += n
		return t
	})

	cos, sin := cfg.RoPETables(T)
	m.cos = be.Alloc(backend.Float32, len(cos))
	m.sin = be.Alloc(backend.Float32, len(sin))
	be.Upload(m.cos, cos)
	be.Upload(m.sin, sin)
	m.tokens = be.Alloc(backend.Int32, B*T)
	m.targets = be.Alloc(backend.Int32, B*T)
	m.lossesHost = make([]float32, B*T)
	return m, nil
}

// ActivationBytesFor is the activation memory (bytes) that New plans for
// a model of shape cfg with batches of B×T tokens and options opt,
// computed without allocating it.
func ActivationBytesFor(cfg Config, B, T int, opt Options) (int64, error) {
	m, err := plan(cfg, B, T, opt)
	if err != nil {
		return 0, err
	}
	return m.ActivationBytes(), nil
}

// plan checks the shapes and returns a model without buffers whose
// logit chunk, checkpointing policy and activation size are set.
func plan(cfg Config, B, T int, opt Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if B <= 0 || T <= 0 {
		return nil, fmt.Errorf("llama: batch %d and sequence length %d must be positive", B, T)
	}
	if T > cfg.MaxSeqLen {
		return nil, fmt.Errorf("llama: sequence length %d exceeds the model's max_seq_len %d", T, cfg.MaxSeqLen)
	}
	m := &Model{Cfg: cfg, B: B, T: T, scratchLayer: -1}
	var err error
	if m.policy, err = opt.Checkpoint.policies(cfg.NLayers); err != nil {
		return nil, err
	}
	BT, V := B*T, cfg.VocabSize
	m.chunk = opt.LogitChunk
	if m.chunk <= 0 {
		m.chunk = max(1, min(V, (16<<20)/BT))
		if V*BT <= 16<<20 {
			m.chunk = V
		}
	}
	m.chunk = min(m.chunk, V)
	m.carve(func(n int) backend.Tensor {
		m.activationsN += n
		return backend.Tensor{}
	})
	return m, nil
}

// carve lays every activation view out in a fixed plan, taking each
// from next in turn.
func (m *Model) carve(next func(n int) backend.Tensor) {
	cfg := m.Cfg
	BT, D, F := m.B*m.T, cfg.Dim, cfg.FFNHidden()
	Q, KV := cfg.NHeads*cfg.HeadDim(), cfg.KVHeads()*cfg.HeadDim()
	m.planLayers(next)
	m.resid = make([]backend.Tensor, cfg.NLayers+1)
	for l := range m.resid {
		m.resid[l] = next(BT * D)
	}
	m.final, m.rstd = next(BT*D), next(BT)
	m.logits, m.stats, m.losses = next(BT*m.chunk), next(BT*3), next(BT)
	d := &m.d
	d.resid, d.x = next(BT*D), next(BT*D)
	d.q, d.k, d.v, d.attn = next(BT*Q), next(BT*KV), next(BT*KV), next(BT*Q)
	d.kr, d.qr = next(BT*KV), next(BT*Q)
	d.h1, d.h3, d.hs = next(BT*F), next(BT*F), next(BT*F)
}

// BindUnit lays unit u's parameter views over params and its gradient
// views over grads, both holding the unit's elements (Units()[u], in
// layout order). A tensor with nil Mem leaves those views as they are.
func (m *Model) BindUnit(u int, params, grads backend.Tensor) {
	bindUnit(m.Cfg, &m.P, u, params)
	bindUnit(m.Cfg, &m.G, u, grads)
}

func bindUnit(cfg Config, p *Params, u int, buf backend.Tensor) {
	if buf.Mem == nil {
		return
	}
	layout := cfg.Layout()
	base := cfg.Units()[u].Lo
	t := func(i int) backend.Tensor { return buf.Slice(layout[i].Offset-base, layout[i].Size) }
	switch {
	case u == 0:
		p.Embedding = t(0)
	case u <= cfg.NLayers:
		i := 1 + 9*(u-1)
		p.Layers[u-1] = LayerParams{
			AttnNorm: t(i), Wq: t(i + 1), Wk: t(i + 2), Wv: t(i + 3), Wo: t(i + 4),
			FFNNorm: t(i + 5), W1: t(i + 6), W2: t(i + 7), W3: t(i + 8),
		}
	default:
		n := len(layout)
		p.Norm, p.Output = t(n-2), t(n-1)
	}
}

// hook runs one of the unit hooks when Hooks is set.
func (m *Model) hook(call func(UnitHooks, int) error, u int) error {
	if m.Hooks == nil {
		return nil
	}
	if err := call(m.Hooks, u); err != nil {
		return fmt.Errorf("llama: unit %d: %w", u, err)
	}
	return nil
}

var (
	beforeForward  = UnitHooks.BeforeForward
	afterForward   = UnitHooks.AfterForward
	beforeBackward = UnitHooks.BeforeBackward
	afterBackward  = UnitHooks.AfterBackward
)

// ActivationBytes is the size of the planned activation memory: every
// layer's kept activations, the shared scratch set of the recomputed ones
// (see ActivationCheckpoint), the residual streams, the logits chunk and
// the activation gradients.
func (m *Model) ActivationBytes() int64 { return int64(m.activationsN) * 4 }

// linear computes out[N, out] = inp[N, in] · w[out, in]^T (+ out when accumulate).
func linear(be backend.Backend, out, inp, w backend.Tensor, N, in, outDim int, accumulate bool) {
	beta := float32(0)
	if accumulate {
		beta = 1
	}
	be.Gemm(false, true, N, outDim, in, 1, inp, in, w, in, beta, out, outDim)
}

// linearBackward accumulates dinp += dout·w and dw += dout^T·inp; dinp is
// overwritten instead when overwrite is set.
func linearBackward(be backend.Backend, dinp, dw, dout, inp, w backend.Tensor, N, in, outDim int, overwrite bool) {
	beta := float32(1)
	if overwrite {
		beta = 0
	}
	be.Gemm(false, false, N, in, outDim, 1, dout, outDim, w, in, beta, dinp, in)
	be.Gemm(true, false, outDim, in, N, 1, dout, outDim, inp, in, 1, dw, in)
}

// Forward runs the model on tokens [B*T] and, when targets is non-nil,
// returns the mean cross-entropy over the targets that are >= 0 (targets
// < 0 are ignored). Activations are kept for Backward, except those that
// Options.Checkpoint has it recompute.
func (m *Model) Forward(tokens, targets []int32) (float32, error) {
	cfg, be := m.Cfg, m.be
	BT, D := m.B*m.T, cfg.Dim
	if len(tokens) != BT || (targets != nil && len(targets) != BT) {
		return 0, fmt.Errorf("llama: forward needs %d tokens and targets, got %d and %d", BT, len(tokens), len(targets))
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= cfg.VocabSize {
			return 0, fmt.Errorf("llama: token %d at position %d is outside the vocabulary [0, %d)", t, i, cfg.VocabSize)
		}
	}
	be.Upload(m.tokens, tokens)
	if err := m.hook(beforeForward, 0); err != nil {
		return 0, err
	}
	be.EmbeddingForward(m.resid[0], m.P.Embedding, m.tokens, BT, D)
	if err := m.hook(afterForward, 0); err != nil {
		return 0, err
	}
	for l := range m.layers {
		if err := m.hook(beforeForward, 1+l); err != nil {
			return 0, err
		}
		shared := m.policy[l] != keepAll
		if shared {
			m.scratchLayer = -1
		}
		m.layerForward(l, true)
		if shared {
			m.scratchLayer = l
		}
		if err := m.hook(afterForward, 1+l); err != nil {
			return 0, err
		}
	}
	last := cfg.NLayers + 1
	m.haveTargets = false
	if targets != nil {
		m.numTargets = 0
		for _, t := range targets {
			if int(t) >= cfg.VocabSize {
				return 0, fmt.Errorf("llama: target %d is outside the vocabulary [0, %d)", t, cfg.VocabSize)
			}
			if t >= 0 {
				m.numTargets++
			}
		}
	}
	if err := m.hook(beforeForward, last); err != nil {
		return 0, err
	}
	be.RMSNormForward(m.final, m.rstd, m.resid[cfg.NLayers], m.P.Norm, BT, D, float32(cfg.NormEps))
	if targets == nil {
		if m.chunk == cfg.VocabSize {
			linear(be, m.logits, m.final, m.P.Output, BT, D, m.chunk, false)
		}
		return 0, m.hook(afterForward, last)
	}
	be.Upload(m.targets, targets)
	be.CrossEntropyReset(m.stats, BT)
	m.forEachChunk(func(logits backend.Tensor, v0, nv int) {
		be.CrossEntropyChunk(m.stats, logits, m.targets, BT, nv, v0)
	})
	if err := m.hook(afterForward, last); err != nil {
		return 0, err
	}
	m.haveTargets = true
	be.CrossEntropyLoss(m.losses, m.stats, m.targets, BT)
	be.Download(m.lossesHost, m.losses)
	var sum float64
	for _, l := range m.lossesHost {
		sum += float64(l)
	}
	if m.numTargets == 0 {
		return 0, nil
	}
	return float32(sum / float64(m.numTargets)), nil
}

// forEachChunk computes the logits of each vocabulary chunk into m.logits
// and calls fn on them. With a single chunk the logits are computed once
// and reused.
func (m *Model) forEachChunk(fn func(logits backend.Tensor, v0, nv int)) {
	BT, D, V := m.B*m.T, m.Cfg.Dim, m.Cfg.VocabSize
	for v0 := 0; v0 < V; v0 += m.chunk {
		nv := min(m.chunk, V-v0)
		logits := m.logits.Slice(0, BT*nv)
		linear(m.be, logits, m.final, m.P.Output.Slice(v0*D, nv*D), BT, D, nv, false)
		fn(logits, v0, nv)
	}
}

// NumTargets is the number of targets (>= 0) of the last Forward.
func (m *Model) NumTargets() int { return m.numTargets }

// Logits copies the logits [B*T, V] of the last Forward into dst. It is
// available only when the whole vocabulary fits one chunk.
func (m *Model) Logits(dst []float32) error {
	if m.chunk != m.Cfg.VocabSize {
		return fmt.Errorf("llama: logits are chunked (%d of %d columns); set Options.LogitChunk to the vocabulary size", m.chunk, m.Cfg.VocabSize)
	}
	m.be.Download(dst, m.logits)
	return nil
}

// ZeroGrad clears the gradient buffer (none with Options.External).
func (m *Model) ZeroGrad() {
	if m.Grads.Mem != nil {
		m.be.Zero(m.Grads)
	}
}

// Backward accumulates into Grads the gradient of lossScale × (sum of the
// per-token losses of the last Forward). lossScale = 1/NumTargets() gives
// the gradient of the mean loss; gradient accumulation over microbatches
// passes 1/(targets in the whole global batch).
func (m *Model) Backward(lossScale float32) error {
	if !m.haveTargets {
		return fmt.Errorf("llama: backward needs a forward pass with targets")
	}
	cfg, be := m.Cfg, m.be
	B, T := m.B, m.T
	BT, D, F := B*T, cfg.Dim, cfg.FFNHidden()
	H, KVH, HD := cfg.NHeads, cfg.KVHeads(), cfg.HeadDim()
	Q, KV := H*HD, KVH*HD
	d := &m.d
	dims := backend.AttentionDims{B: B, Tq: T, Tk: T, NH: H, NKV: KVH, HD: HD}

	last := cfg.NLayers + 1
	if err := m.hook(beforeBackward, last); err != nil {
		return err
	}
	// Output projection and loss, chunk by chunk: d.x = dL/d(final norm output).
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
		// The logits buffer now holds gradients; the forward's logits are gone.
		m.haveTargets = false
	}
	be.Zero(d.resid)
	be.RMSNormBackward(d.resid, m.G.Norm, d.x, m.resid[cfg.NLayers], m.P.Norm, m.rstd, BT, D)
	if err := m.hook(afterBackward, last); err != nil {
		return err
	}

	for l := cfg.NLayers - 1; l >= 0; l-- {
		if err := m.hook(beforeBackward, 1+l); err != nil {
			return err
		}
		m.restore(l)
		a, p, g := &m.layers[l], &m.P.Layers[l], &m.G.Layers[l]
		// Feed-forward: resid[l+1] = mid + w2(silu(w1 x) * w3 x), x = norm(mid).
		linearBackward(be, d.hs, g.W2, d.resid, a.hs, p.W2, BT, F, D, true)
		be.Zero(d.h1)
		be.Zero(d.h3)
		be.SwiGLUBackward(d.h1, d.h3, d.hs, a.h1, a.h3, BT*F)
		linearBackward(be, d.x, g.W1, d.h1, a.ffnNorm, p.W1, BT, D, F, true)
		linearBackward(be, d.x, g.W3, d.h3, a.ffnNorm, p.W3, BT, D, F, false)
		be.RMSNormBackward(d.resid, g.FFNNorm, d.x, a.mid, p.FFNNorm, a.ffnRstd, BT, D)

		// Attention: mid = resid[l] + wo(attn(rope(wq x), rope(wk x), wv x)), x = norm(resid[l]).
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
		if err := m.hook(afterBackward, 1+l); err != nil {
			return err
		}
	}
	if err := m.hook(beforeBackward, 0); err != nil {
		return err
	}
	be.EmbeddingBackward(m.G.Embedding, d.resid, m.tokens, BT, D)
	return m.hook(afterBackward, 0)
}

// Init fills the parameters the way torchtitan initialises Llama 3:
// embedding N(0, 1); norms 1; wq, wk, wv, w1 truncated N(0, 0.02); wo, w2,
// w3 truncated N(0, 0.02/sqrt(2(layer+1))) (depth-scaled); output
// truncated N(0, dim^-1/2) cut at ±3σ. Every value depends only on the
// seed, the parameter's name and the element's index, so any shard of
// the model can be initialised on its own and equals the same slice of
// a whole-model initialisation.
func (m *Model) Init(seed uint64) {
	if m.Params.Mem == nil {
		return // External: the caller initialises its buffers
	}
	host := make([]float32, m.Params.Len)
	InitParams(m.Cfg, seed, host, 0)
	m.be.Upload(m.Params, host)
}

// InitParams writes the initial values of the flat-buffer elements
// [offset, offset+len(dst)) into dst.
func InitParams(cfg Config, seed uint64, dst []float32, offset int) {
	end := offset + len(dst)
	for _, p := range cfg.Layout() {
		lo, hi := max(offset, p.Offset), min(end, p.Offset+p.Size)
		if lo >= hi {
			continue
		}
		out := dst[lo-offset : hi-offset]
		first := lo - p.Offset
		key := hashString(p.Name) ^ seed*0x9e3779b97f4a7c15
		std, cut := 0.02, 2.0
		var layer int
		kind := p.Name
		if _, err := fmt.Sscanf(p.Name, "layers.%d.", &layer); err == nil {
			kind = p.Name[len(fmt.Sprintf("layers.%d.", layer)):]
		}
		switch kind {
		case "tok_embeddings.weight":
			std, cut = 1, math.Inf(1)
		case "norm.weight", "attention_norm.weight", "ffn_norm.weight":
			for i := range out {
				out[i] = 1
			}
			continue
		case "output.weight":
			std = 1 / math.Sqrt(float64(cfg.Dim))
			cut = 3 * std
		case "attention.wo.weight", "feed_forward.w2.weight", "feed_forward.w3.weight":
			std = 0.02 / math.Sqrt(2*float64(layer+1))
		}
		for i := range out {
			out[i] = float32(truncNormal(key, uint64(first+i), std, cut))
		}
	}
}

// truncNormal is element idx of a stream of N(0, std²) values truncated
// to [-cut, cut] by resampling; a counter-based generator, so any element
// can be computed alone.
func truncNormal(key, idx uint64, std, cut float64) float64 {
	for attempt := uint64(0); ; attempt++ {
		h := splitmix(key ^ splitmix(idx*4+attempt))
		u1 := (float64(h>>11) + 0.5) / (1 << 53)
		u2 := float64(splitmix(h)>>11) / (1 << 53)
		z := std * math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
		if math.Abs(z) <= cut {
			return z
		}
	}
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func hashString(s string) uint64 {
	h := uint64(1469598103934665603)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
