package llama

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/numeric"
	"github.com/titan-go/titan/internal/randstream"
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

// UnitHooks are the unit hooks Forward and Backward call (see
// model.UnitHooks). With activation checkpointing, a layer's forward
// recomputation is part of its backward: it runs after BeforeBackward, on
// the parameters bound then, and no forward hook is called for it, so the
// sequence is the same in every checkpointing mode. A split backward
// (BackwardInput, then BackwardWeight) calls BeforeBackward/AfterBackward
// around each unit in BackwardInput, with the unit's weight gradients
// still missing, and again around the deferred weight-gradient products
// of each unit in BackwardWeight; every gradient element is written in
// exactly one of the two passes, so summing both passes' gradients gives
// Backward's bit for bit.
type UnitHooks = model.UnitHooks

// Model is one rank's part of a Llama 3 model (see Plan) sized for
// batches of B sequences of T tokens. Its parameters and gradients are
// flat buffers in LocalLayout order (Params, Grads); all activation
// memory is planned by New, which allocates what the model keeps between
// a forward and its backward and takes the rest, its scratch, from
// Plan.Scratch (shared with the rank's other activation sets) or
// allocates it too.
type Model struct {
	Cfg Config // the whole model's shape
	// B and T are the rows and the full sequence length of a batch; this
	// rank holds T/CP tokens of each row.
	B, T int
	Plan
	// Spec is the part of the model this rank computes (the whole model
	// without a pipeline stage).
	Spec StageSpec
	// Layout is this rank's flat buffer: its parameters, tp-sharded,
	// of the layers of Spec.
	Layout []ShardParam
	// Params and Grads are the flat buffers (none with External); P and
	// G view the bound parameters and gradients.
	Params, Grads backend.Tensor
	P, G          Params
	// Hooks, when set, are called around every unit in Forward and
	// Backward (nil: none, the single-process path).
	Hooks UnitHooks

	be     backend.Backend
	units  []Unit
	first  []int // index in Layout of each unit's first tensor
	layers []layerActs
	policy []layerPolicy // per layer: what its forward keeps

	nLayers          int
	hd, nh, nkv      int // head size, local heads
	nq, nkvd, f      int // local widths
	nv, v0, chunk    int // local vocabulary, its first id, logit chunk
	cchunk, N, n     int // cp chunk, local tokens, sequence-parallel rows
	cos, sin         backend.Tensor
	ids, targets     backend.Tensor
	foreign          []bool // token not in this rank's vocabulary shard
	resid            []backend.Tensor
	final, rstd      backend.Tensor // [n, D], [n]
	xfin             backend.Tensor // final norm output, all rows [N, D]
	logits, stats    backend.Tensor
	losses           backend.Tensor
	full, seq, dres  backend.Tensor // scratch [N, D], [n, D], [n, D]
	dq, dk, dv       backend.Tensor
	dqr, dkr, dat    backend.Tensor
	dh1, dh3, dhs    backend.Tensor
	proj             backend.Tensor // float32 staging of a bfloat16 projection [N, max(nq, nkv)] (halfAct)
	rk, rv, rdk, rdv backend.Tensor // ring buffers [N, kv] (cp > 1)
	tOut, tLse       backend.Tensor // one ring block's attention (cp > 1)
	hN, hn, hLoss    []float32
	ring             []float32 // ring attention's host staging (cp > 1, see ringHostLen)
	numTargets       int
	lossSum          float64
	haveTargets      bool
	keptN, tempN     int // activation floats kept per set, and of the shared scratch
	keptHN, tempHN   int // the same of bfloat16 activations (see halfAct)
	scratchLayer     int // layer whose activations the shared scratch set holds; -1: none
	recomputed       int // layer recomputations so far (for tests)
	// douts and pending are a split backward's kept output gradients
	// (taken from Split from its BackwardInput to its BackwardWeight) and
	// its deferred weight-gradient products, by unit (see BackwardInput).
	douts    []layerDouts
	pending  [][]func()
	ownSplit bool    // Split is the model's own pool
	splitIn  [][]int // splitInputs of each layer
	// f8 marks the linear layers that compute in float8 (see linear.go),
	// f8buf is the float8 emulation's scratch; f8pre holds the scale of
	// each layer whose bound weight FSDP gathered already cast to e4m3
	// (BindFloat8Scales); linErr is the first failed float8 amax
	// all-reduce of the unit computing (see cast8), returned by the
	// unit's next hook call.
	f8     map[linKey]bool
	f8buf  [3]backend.Tensor
	f8pre  map[linKey]float32
	linErr error
}

// New plans and allocates the part of a model given by plan for batches
// of B rows of T tokens on be. Parameters start at zero: call Init or
// load them.
func New(be backend.Backend, cfg Config, B, T int, plan Plan) (*Model, error) {
	m, err := planModel(cfg, B, T, plan)
	if err != nil {
		return nil, err
	}
	m.be = be
	if m.Split == nil {
		m.Split, m.ownSplit = &model.SplitPool{}, true
	}
	if !plan.External {
		n := m.LocalSize()
		m.Params, m.Grads = be.Alloc(backend.Float32, n), be.Alloc(backend.Float32, n)
		m.Bind(m.Params, m.Grads)
	}
	var kept, keptH, temp, tempH backend.Tensor
	if m.keptN > 0 {
		kept = be.Alloc(backend.Float32, m.keptN)
	}
	if m.keptHN > 0 {
		keptH = be.Alloc(backend.BFloat16, m.keptHN)
	}
	if plan.Scratch != nil {
		if temp, tempH, err = plan.Scratch.Take(be, m.tempN, m.tempHN); err != nil {
			return nil, fmt.Errorf("llama: %w", err)
		}
	} else {
		temp = be.Alloc(backend.Float32, m.tempN)
		if m.tempHN > 0 {
			tempH = be.Alloc(backend.BFloat16, m.tempHN)
		}
	}
	m.carve(slicer(kept), slicer(temp), slicer(keptH), slicer(tempH))
	cos, sin := cfg.RoPETables(T)
	m.cos, m.sin = be.Alloc(backend.Float32, len(cos)), be.Alloc(backend.Float32, len(sin))
	be.Upload(m.cos, cos)
	be.Upload(m.sin, sin)
	m.ids = be.Alloc(backend.Int32, m.N)
	m.targets = be.Alloc(backend.Int32, m.N)
	hN, hn, ring := m.hostLens()
	h := plan.Host
	m.hLoss, m.hN, m.hn, m.ring = make([]float32, m.N), h.Float32s("llama.seq.all", hN), h.Float32s("llama.seq.own", hn), h.Float32s("llama.ring", ring)
	return m, nil
}

// slicer returns a function that cuts consecutive views out of t.
func slicer(t backend.Tensor) func(n int) backend.Tensor {
	off := 0
	return func(n int) backend.Tensor {
		v := t.Slice(off, n)
		off += n
		return v
	}
}

// hostLens are the lengths of the host staging buffers: the sequence-
// parallel collectives' [N, D] and [n, D] (tp > 1) and ring attention's
// (cp > 1, see ringHostLen).
func (m *Model) hostLens() (hN, hn, ring int) {
	if m.tp() > 1 {
		hN, hn = m.N*m.Cfg.Dim, m.n*m.Cfg.Dim
	}
	return hN, hn, m.ringHostLen()
}

// HostBytesFor is the host memory (bytes) that New allocates beside the
// activations for plan with batches of B×T tokens: staging, the buffers
// of the sequence-parallel collectives (tp > 1) and of ring attention
// (cp > 1, see ringHostLen), which the models sharing a Plan.Host share;
// own, the model's per-token losses.
func HostBytesFor(cfg Config, B, T int, plan Plan) (staging, own int64, err error) {
	m, err := planModel(cfg, B, T, plan)
	if err != nil {
		return 0, 0, err
	}
	hN, hn, ring := m.hostLens()
	return int64(hN+hn+ring) * 4, int64(m.N) * 4, nil
}

// ActivationBytesFor is the activation memory (bytes) that New plans for
// plan with batches of B×T tokens, computed without allocating it: what
// the model keeps between a forward and its backward and its scratch
// (ScratchLen of it), which models sharing a Plan.Scratch share.
func ActivationBytesFor(cfg Config, B, T int, plan Plan) (int64, error) {
	m, err := planModel(cfg, B, T, plan)
	if err != nil {
		return 0, err
	}
	return int64(m.keptN+m.tempN)*4 + int64(m.keptHN+m.tempHN)*2, nil
}

// ScratchLen is the part of ActivationBytesFor that a pass needs only
// while it runs (forward temporaries, the recomputed layers' scratch set,
// backward buffers and activation gradients, a stage's output), which
// the models sharing a Plan.Scratch hold once: n float32 and nh bfloat16
// elements (nh > 0 under bfloat16 mixed precision).
func ScratchLen(cfg Config, B, T int, plan Plan) (n, nh int, err error) {
	m, err := planModel(cfg, B, T, plan)
	if err != nil {
		return 0, 0, err
	}
	return m.tempN, m.tempHN, nil
}

// SplitBytesFor is the memory (bytes) of one split backward of a part
// planned for plan with batches of B×T tokens (ReserveSplit(n) makes n):
// the output gradients it keeps and its copies of recomputed layers'
// inputs (splitBuffers).
func SplitBytesFor(cfg Config, B, T int, plan Plan) (int64, error) {
	m, err := planModel(cfg, B, T, plan)
	if err != nil {
		return 0, err
	}
	var bytes int64
	m.splitBuffers(func(dt backend.DType, k int) backend.Tensor {
		bytes += int64(k) * int64(dt.Size())
		return backend.Tensor{}
	})
	return bytes, nil
}

// planModel checks the shapes and returns a model without buffers whose
// dimensions, checkpointing policy and activation size are set.
func planModel(cfg Config, B, T int, plan Plan) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if B <= 0 || T <= 0 {
		return nil, fmt.Errorf("llama: batch %d and sequence length %d must be positive", B, T)
	}
	if T > cfg.MaxSeqLen {
		return nil, fmt.Errorf("llama: sequence length %d exceeds the model's max_seq_len %d", T, cfg.MaxSeqLen)
	}
	tp, cp := plan.tp(), plan.cp()
	if err := CheckParallel(cfg, T, tp, cp); err != nil {
		return nil, fmt.Errorf("llama: %w", err)
	}
	if tp*cp > 1 && plan.Comm == nil {
		return nil, fmt.Errorf("llama: tensor parallel %d × context parallel %d needs a ParallelComm", tp, cp)
	}
	if plan.TPRank < 0 || plan.TPRank >= tp || plan.CPRank < 0 || plan.CPRank >= cp {
		return nil, fmt.Errorf("llama: tp rank %d of %d, cp rank %d of %d out of range", plan.TPRank, tp, plan.CPRank, cp)
	}
	spec := whole(cfg)
	if s := plan.Stage; s != nil {
		if s.FirstLayer < 0 || s.NumLayers < 0 || s.FirstLayer+s.NumLayers > cfg.NLayers {
			return nil, fmt.Errorf("llama: stage layers [%d, %d) outside the model's %d layers", s.FirstLayer, s.FirstLayer+s.NumLayers, cfg.NLayers)
		}
		spec = *s
	}
	m := &Model{Cfg: cfg, B: B, T: T, Plan: plan, Spec: spec, scratchLayer: -1, nLayers: spec.NumLayers}
	m.Layout = cfg.LocalLayout(tp, spec)
	m.units = LayoutUnits(m.Layout)
	for i := 0; i < len(m.Layout); i += unitTensors(m.Layout, i) {
		m.first = append(m.first, i)
	}
	m.P, m.G = Params{Layers: make([]LayerParams, spec.NumLayers)}, Params{Layers: make([]LayerParams, spec.NumLayers)}
	var err error
	if m.policy, err = plan.Checkpoint.policies(spec.NumLayers); err != nil {
		return nil, err
	}
	m.hd = cfg.HeadDim()
	m.nh, m.nkv = cfg.NHeads/tp, cfg.KVHeads()/tp
	m.nq, m.nkvd, m.f = m.nh*m.hd, m.nkv*m.hd, cfg.FFNHidden()/tp
	m.nv = cfg.VocabSize / tp
	m.v0 = plan.TPRank * m.nv
	m.cchunk = T / (2 * cp)
	m.N = B * T / cp
	m.n = m.N / tp
	m.chunk = plan.LogitChunk
	if m.chunk <= 0 {
		m.chunk = max(1, (16<<20)/m.N)
	}
	m.chunk = min(m.chunk, m.nv)
	if !spec.Head {
		m.chunk = 1 // no logits: keep their buffer small
	}
	if plan.Precision.Param != backend.Float32 && plan.Precision.Param != backend.BFloat16 {
		return nil, fmt.Errorf("llama: parameters compute in float32 or bfloat16, not %v", plan.Precision.Param)
	}
	if err := m.planFloat8(); err != nil {
		return nil, err
	}
	count := func(c *int) func(n int) backend.Tensor {
		return func(n int) backend.Tensor {
			*c += n
			return backend.Tensor{}
		}
	}
	m.carve(count(&m.keptN), count(&m.tempN), count(&m.keptHN), count(&m.tempHN))
	m.splitIn = make([][]int, m.nLayers)
	for l := range m.splitIn {
		m.splitIn[l] = m.splitInputs(l)
	}
	return m, nil
}

// carve lays every activation view out in a fixed plan, taking what a
// microbatch keeps from its forward to its backward from keep (the
// layers' kept activations under the checkpointing policy, their inputs,
// the head's norm output, statistics and a single logit chunk) and what
// a pass needs only while it runs from temp (the recomputed layers'
// scratch set, forward temporaries, a stage's output, the backward's
// buffers and activation gradients).
//
// keepH and tempH are the same for the activations a layer holds in
// bfloat16 under mixed precision (see halfAct).
func (m *Model) carve(keep, temp, keepH, tempH func(n int) backend.Tensor) {
	N, n, D := m.N, m.n, m.Cfg.Dim
	head, headH := temp, tempH // what only the head's backward reads
	if m.Spec.Head {
		head, headH = keep, keepH
	}
	m.layers = make([]layerActs, m.nLayers)
	pick := func(f32, bf16 func(int) backend.Tensor) func(int, bool) backend.Tensor {
		return func(n int, half bool) backend.Tensor {
			if half && m.halfAct() {
				return bf16(n)
			}
			return f32(n)
		}
	}
	planActs(m.policy, m.layers, m.actFields, pick(keep, keepH), pick(temp, tempH))
	m.resid = make([]backend.Tensor, m.nLayers+1)
	for l := range m.nLayers {
		m.resid[l] = keep(n * D)
	}
	m.resid[m.nLayers] = head(n * D) // the final norm's input, or the stage's output
	m.rstd = head(n)
	if m.tp() == 1 {
		m.final = head(n * D)
		m.xfin = m.final
	} else {
		m.final, m.xfin, m.seq = temp(n*D), head(N*D), temp(n*D)
	}
	// The logits are bfloat16 under mixed precision, as the output
	// layer's bfloat16 product writes them (PyTorch's bfloat16 logits);
	// the loss widens them and writes their gradient rounded.
	logits := pick(temp, tempH) // recomputed chunk by chunk in the backward
	if m.chunk == m.nv {
		logits = pick(head, headH)
	}
	m.logits, m.stats, m.losses = logits(N*m.chunk, true), head(N*3), temp(N)
	m.full, m.dres = temp(N*D), temp(n*D)
	m.dq, m.dk, m.dv, m.dat = temp(N*m.nq), temp(N*m.nkvd), temp(N*m.nkvd), temp(N*m.nq)
	m.dqr, m.dkr = temp(N*m.nq), temp(N*m.nkvd)
	m.dh1, m.dh3, m.dhs = temp(N*m.f), temp(N*m.f), temp(N*m.f)
	if m.halfAct() && m.nLayers > 0 {
		m.proj = temp(N * max(m.nq, m.nkvd))
	}
	if m.cp() > 1 {
		m.rk, m.rv, m.rdk, m.rdv = temp(N*m.nkvd), temp(N*m.nkvd), temp(N*m.nkvd), temp(N*m.nkvd)
		m.tOut, m.tLse = temp(m.cchunk*m.nq), temp(m.nh*m.cchunk)
	}
}

// Backend is the backend the model runs on.
func (m *Model) Backend() backend.Backend { return m.be }

// LocalSize is the number of elements of this rank's flat buffer.
func (m *Model) LocalSize() int {
	last := m.Layout[len(m.Layout)-1]
	return last.LocalOffset + last.LocalSize
}

// Units returns the units of this rank's flat buffer in order (see
// Unit); they tile it.
func (m *Model) Units() []Unit { return m.units }

// Bind lays the parameter and gradient views over params and grads,
// both holding this rank's whole flat buffer (LocalSize elements).
// Several models of the same stage (one per microbatch in flight) may
// share them; Params and Grads become them. A tensor with nil Mem leaves
// those views as they are.
func (m *Model) Bind(params, grads backend.Tensor) {
	if params.Mem != nil {
		m.Params = params
		viewAll(&m.P, m.Layout, params)
	}
	if grads.Mem != nil {
		m.Grads = grads
		viewAll(&m.G, m.Layout, grads)
	}
}

// BindUnit lays unit u's parameter views over params and its gradient
// views over grads, both holding the unit's elements (Units()[u]). A
// tensor with nil Mem leaves those views as they are.
func (m *Model) BindUnit(u int, params, grads backend.Tensor) {
	layer := u
	if m.Spec.Embedding {
		layer--
	}
	if params.Mem != nil {
		bindUnit(&m.P, m.Layout, m.first[u], layer, params)
		m.unbindFloat8(u)
	}
	if grads.Mem != nil {
		bindUnit(&m.G, m.Layout, m.first[u], layer, grads)
	}
}

// Replicated returns the ranges of this rank's flat buffer whose
// parameters every tp rank holds whole (the norms). Their gradients are
// partial sums over each rank's sequence rows: the caller sums them over
// the tp group, and counts them once in the gradient norm.
func (m *Model) Replicated() []Unit {
	var rs []Unit
	for _, p := range m.Layout {
		if p.Kind == Replicated {
			rs = append(rs, Unit{Lo: p.LocalOffset, Hi: p.LocalOffset + p.LocalSize})
		}
	}
	return rs
}

// ActivationBytes is the size of the activation memory the model
// allocated: every layer's kept activations and inputs and the head's;
// unless it shares them through Plan.Scratch (whose owner counts them
// once, ActivationScratch.Bytes), the scratch set of the recomputed
// layers (see ActivationCheckpoint), the temporaries and the activation
// gradients; and unless it shares Plan.Split (counted the same way,
// SplitPool.Bytes), its split backwards' memory.
func (m *Model) ActivationBytes() int64 {
	n, h := int64(m.keptN), int64(m.keptHN)
	if m.Scratch == nil {
		n, h = n+int64(m.tempN), h+int64(m.tempHN)
	}
	b := n*4 + h*2
	if m.ownSplit {
		b += m.Split.Bytes()
	}
	return b
}

// halfAct reports whether the activations that only bfloat16 products
// read (the norm outputs, the SwiGLU product, attention's q, k and v;
// actField.half) are held in bfloat16: under bfloat16 mixed precision.
// The products round their operands to bfloat16 anyway, so the results
// are the same bits as from float32 buffers, at half the memory and half
// the bytes the products' packing reads. So is attention's output, as
// autocast's attention returns it: wo's product rounds it anyway, and the
// attention backward's rowsum(dO·O) reads the bfloat16 output (under
// context parallelism the ring merges the blocks' outputs in float32
// host buffers and rounds the result once; its key/value blocks travel
// as the exact float32 widening of the bfloat16 k and v). So are the
// logits (see carve), which the output layer rounds once from its
// float32 accumulation, as PyTorch's bfloat16 output layer does.
func (m *Model) halfAct() bool { return m.Precision.BF16() }

// claim starts a pass on the activation scratch: when it is shared and
// another model ran a pass on it since this one's last, the recomputed
// layer this model left there is gone. (BackwardWeight needs no claim: it
// reads kept memory only, since a split backward copies what it needs of
// the scratch set.)
func (m *Model) claim() {
	if m.Scratch != nil && !m.Scratch.Claim(m) {
		m.scratchLayer = -1
	}
}

// unit indices of the embedding, of local layer l and of the head.
func (m *Model) embUnit() int { return 0 }
func (m *Model) layerUnit(l int) int {
	if m.Spec.Embedding {
		return 1 + l
	}
	return l
}
func (m *Model) headUnit() int { return len(m.units) - 1 }

// hook runs one of the unit hooks when Hooks is set; first it returns
// the error of a failed float8 amax all-reduce (linErr), if any.
func (m *Model) hook(call func(UnitHooks, int) error, u int) error {
	if err := m.linErr; err != nil {
		m.linErr = nil
		return fmt.Errorf("llama: unit %d: %w", u, err)
	}
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

// Forward runs the model on this rank's tokens [B × T/CP] (per row the
// head chunk then the tail chunk under context parallelism, see CPSlice)
// and, when targets is non-nil and the model has the head, returns the
// mean cross-entropy over its targets >= 0 (targets < 0 are ignored).
// Every tp rank of a group passes the same tokens. A pipeline stage
// without the embedding reads its input from Input(); one without the
// head leaves its output in Output() and returns 0. Activations are kept
// for Backward, except those that Plan.Checkpoint has it recompute.
func (m *Model) Forward(tokens, targets []int32) (float32, error) {
	cfg, be := m.Cfg, m.be
	N, D := m.N, cfg.Dim
	m.haveTargets, m.lossSum = false, 0
	m.claim()
	if m.Spec.Embedding {
		if len(tokens) != N {
			return 0, fmt.Errorf("llama: forward needs %d tokens, got %d", N, len(tokens))
		}
		if err := m.uploadTokens(tokens); err != nil {
			return 0, err
		}
		if err := m.hook(beforeForward, m.embUnit()); err != nil {
			return 0, err
		}
		if err := m.embed(); err != nil {
			return 0, err
		}
		if err := m.hook(afterForward, m.embUnit()); err != nil {
			return 0, err
		}
	}
	for l := range m.layers {
		if err := m.hook(beforeForward, m.layerUnit(l)); err != nil {
			return 0, err
		}
		shared := m.policy[l] != keepAll
		if shared {
			m.scratchLayer = -1
		}
		if err := m.layerForward(l, true, false); err != nil {
			return 0, err
		}
		if shared {
			m.scratchLayer = l
		}
		if err := m.hook(afterForward, m.layerUnit(l)); err != nil {
			return 0, err
		}
	}
	if !m.Spec.Head {
		return 0, nil
	}
	if targets != nil {
		if len(targets) != N {
			return 0, fmt.Errorf("llama: forward needs %d targets, got %d", N, len(targets))
		}
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
	u := m.headUnit()
	if err := m.hook(beforeForward, u); err != nil {
		return 0, err
	}
	if err := m.normGather(m.xfin, m.rstd, m.final, m.resid[m.nLayers], m.P.Norm, false); err != nil {
		return 0, err
	}
	if targets == nil {
		if m.chunk == m.nv {
			m.linear(linKey{0, linOutput}, m.logits, m.xfin, m.P.Output, N, D, m.nv, false)
		}
		return 0, m.hook(afterForward, u)
	}
	be.Upload(m.targets, targets)
	be.CrossEntropyReset(m.stats, N)
	m.forEachChunk(func(logits backend.Tensor, off, nc int) {
		be.CrossEntropyChunk(m.stats, logits, m.targets, N, nc, m.v0+off)
	})
	if m.tp() > 1 {
		if err := m.combineStats(targets); err != nil {
			return 0, err
		}
	}
	if err := m.hook(afterForward, u); err != nil {
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

// uploadTokens checks the tokens and uploads this rank's vocabulary ids
// of them (under tensor parallelism, tokens outside its vocabulary shard
// are marked foreign and looked up as id 0, then masked).
func (m *Model) uploadTokens(tokens []int32) error {
	V := m.Cfg.VocabSize
	for i, t := range tokens {
		if t < 0 || int(t) >= V {
			return fmt.Errorf("llama: token %d at position %d is outside the vocabulary [0, %d)", t, i, V)
		}
	}
	if m.tp() == 1 {
		m.be.Upload(m.ids, tokens)
		return nil
	}
	ids := make([]int32, len(tokens))
	m.foreign = make([]bool, len(tokens))
	for i, t := range tokens {
		if int(t) >= m.v0 && int(t) < m.v0+m.nv {
			ids[i] = t - int32(m.v0)
		} else {
			m.foreign[i] = true
		}
	}
	m.be.Upload(m.ids, ids)
	return nil
}

// embed looks the tokens up into the residual stream resid[0]. Under
// tensor parallelism each rank looks up its vocabulary rows and the sum
// over the tp ranks is reduce-scattered along the sequence.
func (m *Model) embed() error {
	be, N, D := m.be, m.N, m.Cfg.Dim
	if m.tp() == 1 {
		be.EmbeddingForward(m.resid[0], m.P.Embedding, m.ids, N, D)
		return nil
	}
	be.EmbeddingForward(m.full, m.P.Embedding, m.ids, N, D)
	be.Download(m.hN, m.full)
	m.maskForeign(m.hN)
	if err := m.c().ReduceScatterSeq(m.hN, m.hn); err != nil {
		return fmt.Errorf("llama: embedding reduce-scatter: %w", err)
	}
	be.Upload(m.resid[0], m.hn)
	return nil
}

// c is the parallel comm.
func (m *Model) c() ParallelComm { return m.Comm }

// forEachChunk computes the logits of each chunk of this rank's
// vocabulary (columns off..off+nc of it) and calls fn on them.
func (m *Model) forEachChunk(fn func(logits backend.Tensor, off, nc int)) {
	N, D := m.N, m.Cfg.Dim
	for off := 0; off < m.nv; off += m.chunk {
		nc := min(m.chunk, m.nv-off)
		logits := m.logits.Slice(0, N*nc)
		m.linear(linKey{0, linOutput}, logits, m.xfin, m.P.Output.Slice(off*D, nc*D), N, D, nc, false)
		fn(logits, off, nc)
	}
}

// maskForeign zeroes the rows [N, D] of tokens outside this rank's
// vocabulary shard.
func (m *Model) maskForeign(x []float32) {
	D := m.Cfg.Dim
	for i, f := range m.foreign {
		if f {
			clear(x[i*D : (i+1)*D])
		}
	}
}

// combineStats turns the per-shard cross-entropy statistics into those of
// the whole vocabulary (loss parallel): the global row maximum, the sum
// of the exponentials rescaled to it, and the target logit from the shard
// that holds it.
func (m *Model) combineStats(targets []int32) error {
	N := m.N
	st := make([]float32, 3*N)
	m.be.Download(st, m.stats)
	mx, sum, tg := make([]float32, N), make([]float32, N), make([]float32, N)
	for i := range N {
		mx[i] = st[3*i]
	}
	if err := m.c().AllReduceTP(mx, true); err != nil {
		return fmt.Errorf("llama: loss parallel: %w", err)
	}
	for i := range N {
		if targets[i] < 0 {
			continue
		}
		sum[i] = float32(float64(st[3*i+1]) * math.Exp(float64(st[3*i])-float64(mx[i])))
		if t := st[3*i+2]; !math.IsNaN(float64(t)) {
			tg[i] = t
		}
	}
	if err := m.c().AllReduceTP(sum, false); err != nil {
		return fmt.Errorf("llama: loss parallel: %w", err)
	}
	if err := m.c().AllReduceTP(tg, false); err != nil {
		return fmt.Errorf("llama: loss parallel: %w", err)
	}
	for i := range N {
		if targets[i] >= 0 {
			st[3*i], st[3*i+1], st[3*i+2] = mx[i], sum[i], tg[i]
		}
	}
	m.be.Upload(m.stats, st)
	return nil
}

// NumTargets is the number of this rank's targets (>= 0) of the last
// Forward.
func (m *Model) NumTargets() int { return m.numTargets }

// LossSum is the sum of the per-token losses of the last Forward with
// targets (0 on a stage without the head).
func (m *Model) LossSum() float64 { return m.lossSum }

// Logits copies the logits [N, V] of the last Forward into dst (widened
// from bfloat16 under mixed precision). It is available on one tp rank
// only, when its whole vocabulary fits one chunk.
func (m *Model) Logits(dst []float32) error {
	if m.chunk != m.Cfg.VocabSize {
		return fmt.Errorf("llama: logits are chunked (%d of %d columns); set Plan.LogitChunk to the vocabulary size", m.chunk, m.Cfg.VocabSize)
	}
	if m.logits.DType() != backend.BFloat16 {
		m.be.Download(dst, m.logits)
		return nil
	}
	if len(dst) != m.logits.Len {
		return fmt.Errorf("llama: logits: %d elements for the %d of [%d, %d]", len(dst), m.logits.Len, m.N, m.chunk)
	}
	h := make([]uint16, m.logits.Len)
	m.be.Download(h, m.logits)
	numeric.BF16sToFloat32(dst, h)
	return nil
}

// ZeroGrad clears the gradient buffer (none with External).
func (m *Model) ZeroGrad() {
	if m.Grads.Mem != nil {
		m.be.Zero(m.Grads)
	}
}

// Input is the buffer [n, Dim] of this rank's sequence-parallel rows
// that a pipeline stage without the embedding reads its input hidden
// states from; the caller fills it before Forward.
func (m *Model) Input() backend.Tensor { return m.resid[0] }

// Output is a stage's output hidden states (this rank's rows) after
// Forward, for a stage without the head.
func (m *Model) Output() backend.Tensor { return m.resid[m.nLayers] }

// GradOutput is the buffer [n, Dim] of a stage without the head that the
// caller fills with the gradient with respect to Output() right before
// Backward (it is scratch shared by every pass of the model).
func (m *Model) GradOutput() backend.Tensor { return m.dres }

// GradInput is the gradient with respect to the stage's input hidden
// states after Backward (for a stage without the embedding); the next
// pass overwrites it.
func (m *Model) GradInput() backend.Tensor { return m.dres }

// Backward accumulates into the gradients this rank's part of the
// gradient of lossScale × (sum of the per-token losses of the last
// Forward). lossScale = 1/NumTargets() gives the gradient of the mean
// loss; gradient accumulation over microbatches passes 1/(targets in the
// whole global batch). A stage without the head back-propagates the
// gradient the caller left in GradOutput(). Under tensor parallelism the
// replicated (norm) gradients are this rank's partial sums (see
// Replicated).
func (m *Model) Backward(lossScale float32) error { return m.backward(lossScale, false) }

// CanSplit reports that BackwardInput defers the weight gradients of the
// linear layers to BackwardWeight, under every checkpointing policy: the
// inputs of those products that a recomputed layer holds only in the
// shared scratch set are copied out before the next recomputation
// overwrites them (see splitInputs).
func (m *Model) CanSplit() bool { return true }

// BackwardInput is the first half of a split Backward, the "B" of
// zero-bubble schedules: it computes the gradient with respect to the
// input and every gradient except the weight gradients of the linear
// layers (and, with a single logit chunk, of the output projection),
// which BackwardWeight computes. It keeps the output gradients of those
// layers until then, per layer 2·Dim + 2·FFN + (heads + 2·kv heads)·HeadDim
// floats per local token, and, for a layer whose activations are
// recomputed, the inputs the recomputation left in the scratch set.
func (m *Model) BackwardInput(lossScale float32) error {
	return m.backward(lossScale, true)
}

// ReserveSplit makes the memory a split backward keeps (see
// BackwardInput) for n microbatches between their two halves, in the
// pool the model shares with the stage's other activation sets
// (Plan.Split), ahead of the first split backward.
func (m *Model) ReserveSplit(n int) {
	for m.Split.Len() < n {
		m.Split.Put(m.newSplit())
	}
}

// newSplit makes one split backward's memory and counts it in the pool.
func (m *Model) newSplit() []layerDouts {
	var bytes int64
	douts := m.splitBuffers(func(dt backend.DType, k int) backend.Tensor {
		bytes += int64(k) * int64(dt.Size())
		return m.be.Alloc(dt, k)
	})
	m.Split.Made(bytes)
	return douts
}

// splitBuffers lays out one split backward's memory with alloc: per layer
// the output gradients of the linear layers, and the copies of the
// inputs splitInputs lists.
func (m *Model) splitBuffers(alloc func(dt backend.DType, k int) backend.Tensor) []layerDouts {
	N, D := m.N, m.Cfg.Dim
	f32 := func(k int) backend.Tensor { return alloc(backend.Float32, k) }
	douts := make([]layerDouts, m.nLayers)
	for l := range douts {
		o := &douts[l]
		*o = layerDouts{
			ffnOut: f32(N * D), h1: f32(N * m.f), h3: f32(N * m.f),
			attnOut: f32(N * D), qr: f32(N * m.nq), kr: f32(N * m.nkvd), v: f32(N * m.nkvd),
		}
		fields := m.actFields(&o.in)
		for _, i := range m.splitIn[l] {
			f := fields[i]
			dt := backend.Float32
			if f.half && m.halfAct() {
				dt = backend.BFloat16
			}
			*f.t = alloc(dt, f.n)
		}
	}
	return douts
}

// BackwardWeight is the second half of a split Backward, the "W" of
// zero-bubble schedules: it accumulates the weight gradients that
// BackwardInput deferred, unit by unit in decreasing order, with the unit
// hooks around each.
func (m *Model) BackwardWeight() error {
	for u := len(m.pending) - 1; u >= 0; u-- {
		if len(m.pending[u]) == 0 {
			continue
		}
		if err := m.hook(beforeBackward, u); err != nil {
			return err
		}
		for _, f := range m.pending[u] {
			f()
		}
		m.pending[u] = m.pending[u][:0]
		if err := m.hook(afterBackward, u); err != nil {
			return err
		}
	}
	if m.douts != nil {
		m.Split.Put(m.douts)
		m.douts = nil
	}
	return nil
}

// layerDouts are what a split backward keeps of one layer for
// BackwardWeight: the output gradients of its linear layers and, when the
// layer is recomputed, copies of the inputs of those layers that live in
// the scratch set (in; the views splitInputs lists, the rest unset).
type layerDouts struct {
	ffnOut, h1, h3, attnOut, qr, kr, v backend.Tensor
	in                                 layerActs
}

// splitInputs lists, by index in actFields' order, the views of layer l's
// activation set that the deferred weight-gradient products read and
// that the layer's checkpointing policy leaves in the shared scratch set,
// where the next layer's recomputation overwrites them before
// BackwardWeight runs: the norm outputs (inputs of wq, wk, wv, w1 and
// w3), attention's output (wo's) and the SwiGLU product (w2's). A kept
// layer lists none.
func (m *Model) splitInputs(l int) []int {
	var a layerActs
	p := m.policy[l]
	var in []int
	for i, f := range m.actFields(&a) {
		read := f.t == &a.attnNorm || f.t == &a.attn || f.t == &a.ffnNorm || f.t == &a.hs
		if read && (p == recomputeLayer || p == recomputeOps && f.byOps) {
			in = append(in, i)
		}
	}
	return in
}

// backward is Backward, with the weight-gradient products of the linear
// layers deferred to BackwardWeight when split is set.
func (m *Model) backward(lossScale float32, split bool) error {
	for _, p := range m.pending {
		if len(p) != 0 {
			return fmt.Errorf("llama: backward before the weight gradients of the previous one")
		}
	}
	m.claim()
	if split {
		// The split backward's memory, from the stage's pool until
		// BackwardWeight returns it.
		if m.douts == nil {
			if b, ok := m.Split.Get(); ok {
				m.douts = b.([]layerDouts)
			} else {
				m.douts = m.newSplit()
			}
		}
		if m.pending == nil {
			m.pending = make([][]func(), len(m.units))
		}
	}
	be, N, D := m.be, m.N, m.Cfg.Dim
	if m.Spec.Head {
		if !m.haveTargets {
			return fmt.Errorf("llama: backward needs a forward pass with targets")
		}
		u := m.headUnit()
		if err := m.hook(beforeBackward, u); err != nil {
			return err
		}
		// Output projection and loss, chunk by chunk: full = dL/dxfin.
		be.Zero(m.full)
		single := m.chunk == m.nv
		for off := 0; off < m.nv; off += m.chunk {
			nc := min(m.chunk, m.nv-off)
			logits := m.logits.Slice(0, N*nc)
			w := m.P.Output.Slice(off*D, nc*D)
			out := linKey{0, linOutput}
			if !single {
				m.linear(out, logits, m.xfin, w, N, D, nc, false)
			}
			be.CrossEntropyChunkBackward(logits, m.stats, m.targets, N, nc, m.v0+off, lossScale)
			m.linearInputGrad(out, m.full, logits, w, N, D, nc, 1)
			// The logits gradient outlives this loop only with one chunk.
			m.weightGrad(u, split && single, out, func() backend.Tensor { return m.G.Output.Slice(off*D, nc*D) }, logits, m.xfin, N, D, nc)
		}
		// The logits buffer now holds gradients; the forward's logits are gone.
		m.haveTargets = false
		be.Zero(m.dres)
		if err := m.normBackward(m.dres, m.G.Norm, m.full, m.resid[m.nLayers], m.P.Norm, m.rstd); err != nil {
			return err
		}
		if err := m.hook(afterBackward, u); err != nil {
			return err
		}
	}
	for l := m.nLayers - 1; l >= 0; l-- {
		u := m.layerUnit(l)
		if err := m.hook(beforeBackward, u); err != nil {
			return err
		}
		if err := m.restore(l); err != nil {
			return err
		}
		if err := m.layerBackward(l, u, split); err != nil {
			return err
		}
		if err := m.hook(afterBackward, u); err != nil {
			return err
		}
	}
	if !m.Spec.Embedding {
		return nil
	}
	if err := m.hook(beforeBackward, m.embUnit()); err != nil {
		return err
	}
	dx := m.dres
	if m.tp() > 1 {
		if err := m.gather(m.full, m.dres, false); err != nil {
			return err
		}
		be.Download(m.hN, m.full)
		m.maskForeign(m.hN)
		be.Upload(m.full, m.hN)
		dx = m.full
	}
	be.EmbeddingBackward(m.G.Embedding, dx, m.ids, N, D)
	return m.hook(afterBackward, m.embUnit())
}

// weightGrad accumulates dw += dout^T·inp (dout [N, out], inp [N, in])
// for unit u now, or, when deferred, in BackwardWeight; dw is looked up
// when the product runs, on the gradients bound then.
func (m *Model) weightGrad(u int, deferred bool, k linKey, dw func() backend.Tensor, dout, inp backend.Tensor, N, in, outDim int) {
	run := func() { m.linearWeightGrad(k, dw(), dout, inp, N, in, outDim) }
	if deferred {
		m.pending[u] = append(m.pending[u], run)
		return
	}
	run()
}

// Init fills this rank's parameters with exactly the values a whole-model
// initialisation gives those elements (see InitParams).
func (m *Model) Init(seed uint64) {
	if m.Params.Mem == nil {
		return // External: the caller initialises its buffers
	}
	host := make([]float32, m.Params.Len)
	m.InitLocal(seed, host, 0)
	m.be.Upload(m.Params, host)
}

// InitLocal writes the initial values of this rank's flat-buffer
// elements [offset, offset+len(dst)) into dst.
func (m *Model) InitLocal(seed uint64, dst []float32, offset int) {
	initLayout(m.Cfg, m.Layout, m.tp(), m.TPRank, seed, dst, offset)
}

// initLayout writes the initial values of the elements [offset,
// offset+len(dst)) of tp rank r's flat buffer laid out as lay into dst:
// a parameter wholly inside dst in place, one cut by its ends through a
// scratch buffer, so that initialising a model does not leave a second
// copy of it as garbage.
func initLayout(cfg Config, lay []ShardParam, tp, r int, seed uint64, dst []float32, offset int) {
	whole := cfg.Layout()
	end := offset + len(dst)
	var tmp []float32
	for _, p := range lay {
		lo, hi := max(offset, p.LocalOffset), min(end, p.LocalOffset+p.LocalSize)
		if lo >= hi {
			continue
		}
		inside := lo == p.LocalOffset && hi == p.LocalOffset+p.LocalSize
		shard := dst[lo-offset : hi-offset]
		if !inside {
			if len(tmp) < p.LocalSize {
				tmp = make([]float32, p.LocalSize)
			}
			shard = tmp[:p.LocalSize]
		}
		ReadShard(p, tp, r, shard, func(lo int, d []float32) error {
			initParams(whole, seed, d, p.Offset+lo)
			return nil
		})
		if !inside {
			copy(dst[lo-offset:hi-offset], shard[lo-p.LocalOffset:hi-p.LocalOffset])
		}
	}
}

// Init fills the parameters the way torchtitan initialises Llama 3:
// embedding N(0, 1); norms 1; wq, wk, wv, w1 truncated N(0, 0.02); wo, w2,
// w3 truncated N(0, 0.02/sqrt(2(layer+1))) (depth-scaled); output
// truncated N(0, dim^-1/2) cut at ±3σ. Every value depends only on the
// seed, the parameter's name and the element's index, so any shard of
// the model can be initialised on its own and equals the same slice of
// a whole-model initialisation.
//
// InitParams writes the initial values of the whole model's flat-buffer
// elements [offset, offset+len(dst)) into dst.
func InitParams(cfg Config, seed uint64, dst []float32, offset int) {
	initParams(cfg.Layout(), seed, dst, offset)
}

// initParams is InitParams over the model's layout lay (cfg.Layout()).
func initParams(lay []Param, seed uint64, dst []float32, offset int) {
	end := offset + len(dst)
	for _, p := range lay {
		lo, hi := max(offset, p.Offset), min(end, p.Offset+p.Size)
		if lo >= hi {
			continue
		}
		out := dst[lo-offset : hi-offset]
		first := lo - p.Offset
		key := randstream.Key(p.Name, seed)
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
			std = 1 / math.Sqrt(float64(p.Shape[1])) // the model dimension
			cut = 3 * std
		case "attention.wo.weight", "feed_forward.w2.weight", "feed_forward.w3.weight":
			std = 0.02 / math.Sqrt(2*float64(layer+1))
		}
		for i := range out {
			out[i] = float32(randstream.TruncGaussian(key, uint64(first+i), std, cut))
		}
	}
}
