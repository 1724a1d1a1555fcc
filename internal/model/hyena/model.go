package hyena

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/model"
)

// Options say what part of the model a Model holds and how it computes.
// The zero value is the whole model with its own parameter buffers.
type Options struct {
	// Stage, when set, restricts the model to one pipeline stage. A
	// stage with the head but not the embedding holds its own copy of
	// the embedding for the tied head (see Config.StageLayout).
	Stage *StageSpec
	// LogitChunk bounds how many vocabulary columns have logits at once
	// (the head's product is then recomputed in the backward pass); 0
	// keeps them under about 64 MiB.
	LogitChunk int
	// External makes New allocate no parameter and gradient buffers: the
	// caller binds them with Bind or, unit by unit, BindUnit.
	External bool
}

// Model is a Hyena language model, or one pipeline stage of it, sized for
// batches of B sequences of T tokens (T ≤ l_max). Its parameters and
// gradients are flat buffers in StageLayout order (Params, Grads); all
// activation memory is planned and allocated by New. Forward visits the
// units (Units) in increasing order and then, for the tied head, unit 0
// (the embedding) again after the final norm; Backward visits them in
// the reverse order: unit 0 for the head, the final norm, the layers
// downwards and unit 0 for the embedding. A sharded data-parallel
// runtime (internal/parallel/fsdp) therefore binds the embedding's unit
// twice per pass, gathering it again unless its policy kept it, and
// reduces its gradient twice (head, then lookup); the two reductions add
// into the same gradient shard.
type Model struct {
	Cfg  Config // the whole model's shape
	B, T int
	Options
	// Spec is the part of the model this Model computes.
	Spec StageSpec
	// Layout is the Model's flat buffer.
	Layout []StageParam
	// Params and Grads are the flat buffers (none with External); P and
	// G view the bound parameters and gradients.
	Params, Grads backend.Tensor
	P, G          Params
	// Hooks, when set, are called around every unit in Forward and
	// Backward (nil: none).
	Hooks model.UnitHooks

	be           backend.Backend
	lc           backend.LongConv
	units        []model.Range
	N, nl        int // tokens, local layers
	nv, chunk    int // padded vocabulary, logit chunk
	layers       []layerActs
	resid        []backend.Tensor // [N, D] each: the input of layer l, then the output
	xf, mf, rf   backend.Tensor   // final norm output [N, D], mean and rstd [N]
	logits       backend.Tensor   // [N, chunk]
	stats        backend.Tensor   // [N, 3]
	losses       backend.Tensor   // [N]
	mod          backend.Tensor   // modulation [Order-1, T, D] (Modulate)
	ids, targets backend.Tensor
	scratch
	hLoss        []float32
	numTargets   int
	lossSum      float64
	haveTargets  bool
	activationsN int
}

// layerActs are the activations of one block kept for the backward pass.
type layerActs struct {
	ln1, mean1, rstd1 backend.Tensor // LN1 output [N, D], mean and rstd [N]
	zT, zcT           backend.Tensor // in_proj output and short conv output, channel-major [B, (N+1)D, T]
	s, y              []backend.Tensor
	// s[o] is the o-th long convolution's input [B, D, T] and y[o] its
	// output with the skip term (the next v).
	g                 backend.Tensor // v ⊙ x0, token-major [N, D]: out_proj's input
	mid               backend.Tensor // residual stream after the mixer [N, D]
	ln2, mean2, rstd2 backend.Tensor
	f1, a1            backend.Tensor // fc1 output and its GELU [N, d_inner]
	fa, fs            []backend.Tensor
	// fa[i] and fs[i] are the filter MLP's i-th pre-activation and Sin
	// output [T, F].
	hT backend.Tensor // the long filters [Order-1, D, T], channel-major per convolution
}

// scratch are buffers shared by every layer's forward or backward pass.
type scratch struct {
	zN, gT       backend.Tensor // [N, (N+1)D] in_proj output; [B, D, T] v ⊙ x0
	hraw         backend.Tensor // [T, D] one convolution's filter (or its gradient) before transposing
	skipT        backend.Tensor // [Order-1, D] the skip terms per convolution
	dres, dN     backend.Tensor // [N, D]: gradient of the residual stream; of a norm's output
	dA, dF       backend.Tensor // [N, d_inner]
	dg, dgT      backend.Tensor // [N, D], [B, D, T]
	dv0, dv1, ds backend.Tensor // [B, D, T]
	dzcT, dzT    backend.Tensor // [B, (N+1)D, T]
	dzN          backend.Tensor // [N, (N+1)D]
	dhT          backend.Tensor // [Order-1, D, T]
	dskipT       backend.Tensor // [Order-1, D]
	dskip        backend.Tensor // [D(Order-1)]
	dfs, dfa     backend.Tensor // [T, F]
}

// New plans and allocates the model (or the stage opt.Stage) for batches
// of B rows of T tokens on be. Parameters start at zero: call Init or
// load them.
func New(be backend.Backend, cfg Config, B, T int, opt Options) (*Model, error) {
	m, err := planModel(cfg, B, T, opt)
	if err != nil {
		return nil, err
	}
	m.be = be
	if m.lc, err = longConv(be); err != nil {
		return nil, err
	}
	if !opt.External {
		n := m.LocalSize()
		m.Params, m.Grads = be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, n)
		m.Bind(m.Params, m.Grads)
	}
	acts := be.Alloc(backend.Float32, m.activationsN)
	off := 0
	m.carve(func(n int) backend.Tensor {
		t := acts.Slice(off, n)
		off += n
		return t
	})
	if cfg.Modulate && m.nl > 0 {
		m.mod = uploadModulation(be, cfg, T)
	}
	m.ids = be.Alloc(backend.Int32, m.N)
	m.targets = be.Alloc(backend.Int32, m.N)
	m.hLoss = make([]float32, m.N)
	return m, nil
}

// planModel checks the shapes and returns a model without buffers whose
// dimensions and activation size are set.
func planModel(cfg Config, B, T int, opt Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if B <= 0 || T <= 0 {
		return nil, fmt.Errorf("hyena: batch %d and sequence length %d must be positive", B, T)
	}
	if T > cfg.LMax {
		return nil, fmt.Errorf("hyena: sequence length %d exceeds the model's l_max %d (the filters' length)", T, cfg.LMax)
	}
	spec := cfg.Whole()
	if opt.Stage != nil {
		spec = *opt.Stage
	}
	if err := cfg.checkStage(spec); err != nil {
		return nil, err
	}
	m := &Model{Cfg: cfg, B: B, T: T, Options: opt, Spec: spec, N: B * T, nl: spec.NumLayers}
	m.Layout = cfg.StageLayout(spec)
	m.units = cfg.StageUnits(spec)
	m.P, m.G = newParams(cfg, m.nl), newParams(cfg, m.nl)
	m.nv = cfg.PaddedVocab()
	m.chunk = opt.LogitChunk
	if m.chunk <= 0 {
		m.chunk = max(1, (16<<20)/m.N)
	}
	m.chunk = min(m.chunk, m.nv)
	if !spec.Head {
		m.chunk = 1
	}
	m.carve(func(n int) backend.Tensor {
		m.activationsN += n
		return backend.Tensor{}
	})
	return m, nil
}

// carve lays every activation view out in a fixed plan, taking each from
// next in turn.
func (m *Model) carve(next func(n int) backend.Tensor) {
	c := m.Cfg
	N, B, T, D := m.N, m.B, m.T, c.DModel
	C, H, F, O := c.Channels(), c.Inner(), c.FilterOrder, c.Order-1
	DT := D * T
	m.layers = make([]layerActs, m.nl)
	for l := range m.layers {
		a := &m.layers[l]
		a.ln1, a.mean1, a.rstd1 = next(N*D), next(N), next(N)
		a.zT, a.zcT = next(N*C), next(N*C)
		a.s, a.y = make([]backend.Tensor, O), make([]backend.Tensor, O)
		for o := range O {
			a.s[o], a.y[o] = next(B*DT), next(B*DT)
		}
		a.g, a.mid = next(N*D), next(N*D)
		a.ln2, a.mean2, a.rstd2 = next(N*D), next(N), next(N)
		a.f1, a.a1 = next(N*H), next(N*H)
		a.fa, a.fs = make([]backend.Tensor, c.NumInnerMLPs+1), make([]backend.Tensor, c.NumInnerMLPs+1)
		for i := range a.fa {
			a.fa[i], a.fs[i] = next(T*F), next(T*F)
		}
		a.hT = next(O * DT)
	}
	m.resid = make([]backend.Tensor, m.nl+1)
	for l := range m.resid {
		m.resid[l] = next(N * D)
	}
	s := &m.scratch
	s.dres, s.dN = next(N*D), next(N*D)
	if m.Spec.Head {
		m.xf, m.mf, m.rf = next(N*D), next(N), next(N)
		m.logits, m.stats, m.losses = next(N*m.chunk), next(N*3), next(N)
	}
	if m.nl == 0 {
		return
	}
	s.zN, s.gT, s.hraw, s.skipT = next(N*C), next(B*DT), next(T*D), next(O*D)
	s.dA, s.dF = next(N*H), next(N*H)
	s.dg, s.dgT = next(N*D), next(B*DT)
	s.dv0, s.dv1, s.ds = next(B*DT), next(B*DT), next(B*DT)
	s.dzcT, s.dzT, s.dzN = next(N*C), next(N*C), next(N*C)
	s.dhT, s.dskipT, s.dskip = next(O*DT), next(O*D), next(O*D)
	s.dfs, s.dfa = next(T*F), next(T*F)
}

// Backend is the backend the model runs on.
func (m *Model) Backend() backend.Backend { return m.be }

// LocalSize is the number of elements of the Model's flat buffer.
func (m *Model) LocalSize() int {
	last := m.Layout[len(m.Layout)-1]
	return last.LocalOffset + last.Size
}

// Units returns the units of the Model's flat buffer in order: the
// embedding, each layer, the final norm, those the stage holds. They tile
// the buffer.
func (m *Model) Units() []model.Range { return m.units }

// Replicated returns nil: without tensor parallelism no parameter is
// held whole by several ranks of a group.
func (m *Model) Replicated() []model.Range { return nil }

// Bind lays the parameter and gradient views over params and grads, both
// holding the Model's whole flat buffer (LocalSize elements); a tensor
// with nil Mem leaves those views as they are.
func (m *Model) Bind(params, grads backend.Tensor) {
	if params.Mem != nil {
		m.Params = params
	}
	if grads.Mem != nil {
		m.Grads = grads
	}
	for u, r := range m.units {
		p, g := backend.Tensor{}, backend.Tensor{}
		if params.Mem != nil {
			p = params.Slice(r.Lo, r.Len())
		}
		if grads.Mem != nil {
			g = grads.Slice(r.Lo, r.Len())
		}
		m.BindUnit(u, p, g)
	}
}

// BindUnit lays unit u's parameter views over params and its gradient
// views over grads, both holding the unit's elements (Units()[u]); a
// tensor with nil Mem leaves those views as they are.
func (m *Model) BindUnit(u int, params, grads backend.Tensor) {
	if params.Mem != nil {
		bindUnit(m.Cfg, m.Spec, &m.P, u, params)
	}
	if grads.Mem != nil {
		bindUnit(m.Cfg, m.Spec, &m.G, u, grads)
	}
}

// ActivationBytes is the size of the planned activation memory.
func (m *Model) ActivationBytes() int64 { return int64(m.activationsN) * 4 }

// unit indices of the embedding (and tied head), of local layer l and of
// the final norm.
func (m *Model) wteUnit() int { return 0 }
func (m *Model) layerUnit(l int) int {
	if hasWte(m.Spec) {
		return 1 + l
	}
	return l
}
func (m *Model) lnfUnit() int { return len(m.units) - 1 }

// hook runs one of the unit hooks when Hooks is set.
func (m *Model) hook(call func(model.UnitHooks, int) error, u int) error {
	if m.Hooks == nil {
		return nil
	}
	if err := call(m.Hooks, u); err != nil {
		return fmt.Errorf("hyena: unit %d: %w", u, err)
	}
	return nil
}

var (
	beforeForward  = model.UnitHooks.BeforeForward
	afterForward   = model.UnitHooks.AfterForward
	beforeBackward = model.UnitHooks.BeforeBackward
	afterBackward  = model.UnitHooks.AfterBackward
)

// Forward runs the model on the tokens [B × T] and, when targets is
// non-nil and the model has the head, returns the mean cross-entropy over
// its targets >= 0 (targets < 0 are ignored). A stage without the
// embedding reads its input from Input(); one without the head leaves its
// output in Output() and returns 0.
func (m *Model) Forward(tokens, targets []int32) (float32, error) {
	cfg, be := m.Cfg, m.be
	N, D := m.N, cfg.DModel
	m.haveTargets, m.lossSum = false, 0
	if m.Spec.Embedding {
		if len(tokens) != N {
			return 0, fmt.Errorf("hyena: forward needs %d tokens, got %d", N, len(tokens))
		}
		for i, t := range tokens {
			if t < 0 || int(t) >= cfg.VocabSize {
				return 0, fmt.Errorf("hyena: token %d at position %d is outside the vocabulary [0, %d)", t, i, cfg.VocabSize)
			}
		}
		be.Upload(m.ids, tokens)
		if err := m.hook(beforeForward, m.wteUnit()); err != nil {
			return 0, err
		}
		be.EmbeddingForward(m.resid[0], m.P.Wte, m.ids, N, D)
		if err := m.hook(afterForward, m.wteUnit()); err != nil {
			return 0, err
		}
	}
	for l := range m.layers {
		u := m.layerUnit(l)
		if err := m.hook(beforeForward, u); err != nil {
			return 0, err
		}
		m.layerForward(l)
		if err := m.hook(afterForward, u); err != nil {
			return 0, err
		}
	}
	if !m.Spec.Head {
		return 0, nil
	}
	if targets != nil {
		if len(targets) != N {
			return 0, fmt.Errorf("hyena: forward needs %d targets, got %d", N, len(targets))
		}
		m.numTargets = 0
		for _, t := range targets {
			if int(t) >= cfg.VocabSize {
				return 0, fmt.Errorf("hyena: target %d is outside the vocabulary [0, %d)", t, cfg.VocabSize)
			}
			if t >= 0 {
				m.numTargets++
			}
		}
	}
	u := m.lnfUnit()
	if err := m.hook(beforeForward, u); err != nil {
		return 0, err
	}
	be.LayerNormForward(m.xf, m.mf, m.rf, m.resid[m.nl], m.P.LnFW, m.P.LnFB, N, D, float32(cfg.NormEps))
	if err := m.hook(afterForward, u); err != nil {
		return 0, err
	}
	// The tied head computes with the embedding's unit.
	if err := m.hook(beforeForward, m.wteUnit()); err != nil {
		return 0, err
	}
	if targets == nil {
		if m.chunk == m.nv {
			be.Gemm(false, true, N, m.nv, D, 1, m.xf, D, m.P.Wte, D, 0, m.logits, m.nv)
		}
		return 0, m.hook(afterForward, m.wteUnit())
	}
	be.Upload(m.targets, targets)
	be.CrossEntropyReset(m.stats, N)
	m.forEachChunk(func(logits backend.Tensor, off, nc int) {
		be.CrossEntropyChunk(m.stats, logits, m.targets, N, nc, off)
	})
	if err := m.hook(afterForward, m.wteUnit()); err != nil {
		return 0, err
	}
	m.haveTargets = true
	be.CrossEntropyLoss(m.losses, m.stats, m.targets, N)
	be.Download(m.hLoss, m.losses)
	var sum float64
	for _, l := range m.hLoss {
		sum += float64(l)
	}
	m.lossSum = sum
	if m.numTargets == 0 {
		return 0, nil
	}
	return float32(sum / float64(m.numTargets)), nil
}

// forEachChunk computes the logits of each vocabulary chunk (columns
// off … off+nc) from the final norm's output and the tied embedding, and
// calls fn on them.
func (m *Model) forEachChunk(fn func(logits backend.Tensor, off, nc int)) {
	N, D := m.N, m.Cfg.DModel
	for off := 0; off < m.nv; off += m.chunk {
		nc := min(m.chunk, m.nv-off)
		logits := m.logits.Slice(0, N*nc)
		m.be.Gemm(false, true, N, nc, D, 1, m.xf, D, m.P.Wte.Slice(off*D, nc*D), D, 0, logits, nc)
		fn(logits, off, nc)
	}
}

// NumTargets is the number of targets (>= 0) of the last Forward.
func (m *Model) NumTargets() int { return m.numTargets }

// LossSum is the sum of the per-token losses of the last Forward with
// targets (0 on a stage without the head).
func (m *Model) LossSum() float64 { return m.lossSum }

// Logits copies the logits [N, PaddedVocab] of the last Forward into dst.
// They are available only when the whole vocabulary fits one chunk, and
// before Backward (which overwrites them with their gradient).
func (m *Model) Logits(dst []float32) error {
	if !m.Spec.Head || m.chunk != m.nv {
		return fmt.Errorf("hyena: logits are chunked (%d of %d columns) or absent; set Options.LogitChunk to the padded vocabulary", m.chunk, m.nv)
	}
	m.be.Download(dst, m.logits)
	return nil
}

// ZeroGrad clears the gradient buffer (none with External).
func (m *Model) ZeroGrad() {
	if m.Grads.Mem != nil {
		m.be.Zero(m.Grads)
	}
}

// Input is the buffer [N, D] a stage without the embedding reads its
// input hidden states from; the caller fills it before Forward.
func (m *Model) Input() backend.Tensor { return m.resid[0] }

// Output is a stage's output hidden states after Forward.
func (m *Model) Output() backend.Tensor { return m.resid[m.nl] }

// GradOutput is the buffer [N, D] a stage without the head reads the
// gradient with respect to Output() from; the caller fills it right
// before Backward.
func (m *Model) GradOutput() backend.Tensor { return m.dres }

// GradInput is the gradient with respect to the stage's input hidden
// states after Backward; the next pass overwrites it.
func (m *Model) GradInput() backend.Tensor { return m.dres }

// CanSplit reports false: BackwardInput runs the whole backward pass.
func (m *Model) CanSplit() bool { return false }

// ReserveSplit does nothing (see CanSplit).
func (m *Model) ReserveSplit(int) {}

// BackwardInput runs Backward (see CanSplit).
func (m *Model) BackwardInput(lossScale float32) error { return m.Backward(lossScale) }

// BackwardWeight does nothing (see CanSplit).
func (m *Model) BackwardWeight() error { return nil }

// Backward accumulates into the gradients the gradient of lossScale ×
// (sum of the per-token losses of the last Forward); lossScale =
// 1/NumTargets() gives the gradient of the mean loss. A stage without the
// head back-propagates the gradient the caller left in GradOutput().
func (m *Model) Backward(lossScale float32) error {
	be, N, D := m.be, m.N, m.Cfg.DModel
	if m.Spec.Head {
		if !m.haveTargets {
			return fmt.Errorf("hyena: backward needs a forward pass with targets")
		}
		if err := m.hook(beforeBackward, m.wteUnit()); err != nil {
			return err
		}
		// The tied head, chunk by chunk: dN = dL/dxf.
		be.Zero(m.dN)
		single := m.chunk == m.nv
		for off := 0; off < m.nv; off += m.chunk {
			nc := min(m.chunk, m.nv-off)
			logits := m.logits.Slice(0, N*nc)
			w := m.P.Wte.Slice(off*D, nc*D)
			if !single {
				be.Gemm(false, true, N, nc, D, 1, m.xf, D, w, D, 0, logits, nc)
			}
			be.CrossEntropyChunkBackward(logits, m.stats, m.targets, N, nc, off, lossScale)
			be.Gemm(false, false, N, D, nc, 1, logits, nc, w, D, 1, m.dN, D)
			be.Gemm(true, false, nc, D, N, 1, logits, nc, m.xf, D, 1, m.G.Wte.Slice(off*D, nc*D), D)
		}
		m.haveTargets = false // the logits now hold their gradient
		if err := m.hook(afterBackward, m.wteUnit()); err != nil {
			return err
		}
		u := m.lnfUnit()
		if err := m.hook(beforeBackward, u); err != nil {
			return err
		}
		be.Zero(m.dres)
		be.LayerNormBackward(m.dres, m.G.LnFW, m.G.LnFB, m.dN, m.resid[m.nl], m.P.LnFW, m.mf, m.rf, N, D)
		if err := m.hook(afterBackward, u); err != nil {
			return err
		}
	}
	for l := m.nl - 1; l >= 0; l-- {
		u := m.layerUnit(l)
		if err := m.hook(beforeBackward, u); err != nil {
			return err
		}
		m.layerBackward(l)
		if err := m.hook(afterBackward, u); err != nil {
			return err
		}
	}
	if !m.Spec.Embedding {
		return nil
	}
	if err := m.hook(beforeBackward, m.wteUnit()); err != nil {
		return err
	}
	be.EmbeddingBackward(m.G.Wte, m.dres, m.ids, N, D)
	return m.hook(afterBackward, m.wteUnit())
}

// Init fills the Model's parameters (without External) with exactly the
// values a whole-model initialisation gives them (see InitParams); a
// head stage's copy of the embedding gets the embedding's values.
func (m *Model) Init(seed uint64) {
	if m.Params.Mem == nil {
		return
	}
	host := make([]float32, m.Params.Len)
	for _, p := range m.Layout {
		InitParams(m.Cfg, seed, host[p.LocalOffset:p.LocalOffset+p.Size], p.Offset)
	}
	m.be.Upload(m.Params, host)
}

// uploadModulation returns the modulation of the first T positions,
// [Order-1, T, D] (see Config.Modulation), on be.
func uploadModulation(be backend.Backend, cfg Config, T int) backend.Tensor {
	full := cfg.Modulation() // [Order-1, l_max, D]
	D, O := cfg.DModel, cfg.Order-1
	host := make([]float32, O*T*D)
	for o := 0; o < O; o++ {
		copy(host[o*T*D:(o+1)*T*D], full[o*cfg.LMax*D:])
	}
	t := be.Alloc(backend.Float32, len(host))
	be.Upload(t, host)
	return t
}
