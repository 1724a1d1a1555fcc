package llama

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/backend"
)

// ParallelComm is what a tensor- and context-parallel model (Sharded)
// needs from its peers. Buffers are host float32 slices. The model does
// not know how ranks communicate; internal/parallel/tp implements it with
// comm groups on the mesh's "tp" and "cp" dimensions.
type ParallelComm interface {
	// AllGatherSeq concatenates every tp rank's send, in tp rank order,
	// into recv (len(recv) = tp × len(send)).
	AllGatherSeq(send, recv []float32) error
	// ReduceScatterSeq sums send over the tp ranks and stores this rank's
	// chunk (of len(send)/tp elements, in tp rank order) in recv.
	ReduceScatterSeq(send, recv []float32) error
	// AllReduceTP replaces x with its element-wise maximum (max set) or
	// sum over the tp ranks.
	AllReduceTP(x []float32, max bool) error
	// RingShift sends send to the next cp rank and receives the previous
	// cp rank's send into recv (same length).
	RingShift(send, recv []float32) error
}

// ShardKind says how tensor parallelism splits a parameter.
type ShardKind uint8

// Shard kinds.
const (
	// Replicated parameters (the norms) are whole on every tp rank.
	Replicated ShardKind = iota
	// RowBlock parameters [out, in] are split along out: tp rank r holds
	// the contiguous rows [r·out/tp, (r+1)·out/tp) (column-parallel
	// linears, the vocabulary-parallel embedding and output).
	RowBlock
	// ColBlock parameters [out, in] are split along in: tp rank r holds
	// columns [r·in/tp, (r+1)·in/tp) of every row (row-parallel linears).
	ColBlock
)

// ShardParam is one parameter of a tensor-parallel rank's flat buffer.
type ShardParam struct {
	Param           // the whole (logical) parameter in Config.Layout
	Kind  ShardKind // how it is split
	// LocalOffset and LocalSize place the rank's shard in its flat buffer.
	LocalOffset, LocalSize int
}

// ShardLayout returns the parameters of a tp rank's flat buffer in layout
// order (the same for every rank of the tp group).
func (c Config) ShardLayout(tp int) []ShardParam {
	var out []ShardParam
	off := 0
	for _, p := range c.Layout() {
		sp := ShardParam{Param: p, Kind: shardKind(p), LocalSize: p.Size}
		if sp.Kind != Replicated {
			sp.LocalSize = p.Size / tp
		}
		sp.LocalOffset = off
		off += sp.LocalSize
		out = append(out, sp)
	}
	return out
}

func shardKind(p Param) ShardKind {
	switch {
	case len(p.Shape) == 1:
		return Replicated
	case hasSuffix(p.Name, "attention.wo.weight"), hasSuffix(p.Name, "feed_forward.w2.weight"):
		return ColBlock
	}
	return RowBlock
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

// CheckParallel reports why a model of shape c cannot train sequences of
// T tokens with tensor parallel degree tp and context parallel degree cp.
func CheckParallel(c Config, T, tp, cp int) error {
	if tp < 1 || cp < 1 {
		return fmt.Errorf("parallelism: tensor_parallel_degree %d and context_parallel_degree %d must be positive", tp, cp)
	}
	for _, d := range []struct {
		what string
		n    int
	}{
		{"n_heads", c.NHeads}, {"n_kv_heads", c.KVHeads()}, {"FFN hidden size", c.FFNHidden()}, {"vocab_size", c.VocabSize},
	} {
		if d.n%tp != 0 {
			return fmt.Errorf("parallelism.tensor_parallel_degree %d: %s %d is not divisible by %d", tp, d.what, d.n, tp)
		}
	}
	if T%(2*cp) != 0 {
		return fmt.Errorf("parallelism.context_parallel_degree %d: training.seq_len %d is not divisible by 2×%d = %d (each rank holds a head and a tail chunk)", cp, T, cp, 2*cp)
	}
	if (T/cp)%tp != 0 {
		return fmt.Errorf("parallelism.tensor_parallel_degree %d: training.seq_len %d / context_parallel_degree %d = %d is not divisible by %d (sequence parallel)", tp, T, cp, T/cp, tp)
	}
	return nil
}

// ShardFlat extracts tp rank r's shards from the whole flat buffer full
// (Config.Layout order) into a new buffer in ShardLayout order.
func ShardFlat(c Config, tp, r int, full []float32) []float32 {
	lay := c.ShardLayout(tp)
	last := lay[len(lay)-1]
	out := make([]float32, last.LocalOffset+last.LocalSize)
	for _, p := range lay {
		dst := out[p.LocalOffset : p.LocalOffset+p.LocalSize]
		src := full[p.Offset : p.Offset+p.Size]
		switch p.Kind {
		case Replicated:
			copy(dst, src)
		case RowBlock:
			copy(dst, src[r*p.LocalSize:])
		case ColBlock:
			in := p.Shape[1]
			w := in / tp
			for i := 0; i < p.Shape[0]; i++ {
				copy(dst[i*w:(i+1)*w], src[i*in+r*w:])
			}
		}
	}
	return out
}

// UnshardFlat is the inverse of ShardFlat: it assembles the whole flat
// buffer from every tp rank's shards (locals[r] from rank r; replicated
// parameters are taken from rank 0).
func UnshardFlat(c Config, locals [][]float32) []float32 {
	tp := len(locals)
	full := make([]float32, c.NumParams())
	for _, p := range c.ShardLayout(tp) {
		dst := full[p.Offset : p.Offset+p.Size]
		for r, loc := range locals {
			src := loc[p.LocalOffset : p.LocalOffset+p.LocalSize]
			switch p.Kind {
			case Replicated:
				if r == 0 {
					copy(dst, src)
				}
			case RowBlock:
				copy(dst[r*p.LocalSize:], src)
			case ColBlock:
				in := p.Shape[1]
				w := in / tp
				for i := 0; i < p.Shape[0]; i++ {
					copy(dst[i*in+r*w:i*in+(r+1)*w], src[i*w:])
				}
			}
		}
	}
	return full
}

// ChunkStart is the position of the first token of local chunk half
// (0: head, 1: tail) on context-parallel rank r of cp, for sequences of T
// tokens split into 2·cp chunks: rank r holds chunks r and 2cp-1-r.
func ChunkStart(T, cp, r, half int) int {
	c := T / (2 * cp)
	if half == 0 {
		return r * c
	}
	return (2*cp - 1 - r) * c
}

// CPSlice copies context-parallel rank r's tokens of every row of x
// (rows of T tokens) into a new slice: per row the head chunk then the
// tail chunk.
func CPSlice(x []int32, T, cp, r int) []int32 {
	c := T / (2 * cp)
	rows := len(x) / T
	out := make([]int32, 0, rows*2*c)
	for b := 0; b < rows; b++ {
		for h := 0; h < 2; h++ {
			s := b*T + ChunkStart(T, cp, r, h)
			out = append(out, x[s:s+c]...)
		}
	}
	return out
}

// shardActs are the activations of one block kept for the backward pass
// by a Sharded model. "seq" tensors hold this rank's sequence-parallel
// rows [n, D]; the others all N local tokens.
type shardActs struct {
	attnNorm, attnRstd backend.Tensor // gathered norm output [N, D]; 1/rms [n]
	q, k, v            backend.Tensor // after RoPE [N, q], [N, kv]
	attn, lse          backend.Tensor // [N, q]; per (row, half): [nh, c]
	mid                backend.Tensor // seq [n, D]
	ffnNorm, ffnRstd   backend.Tensor // [N, D]; [n]
	h1, h3, hs         backend.Tensor // [N, f]
}

// Sharded is a Llama 3 model trained with Megatron-style tensor
// parallelism (column-parallel wq, wk, wv, w1, w3; row-parallel wo, w2;
// vocabulary-parallel embedding and output), sequence parallelism (the
// residual stream and the norms are split along the tokens across tp
// ranks) with loss parallelism (the cross-entropy is computed from the
// vocabulary shards' statistics, without gathering logits), and context
// parallelism (ring attention with causal load balancing: each cp rank
// holds a head and a tail chunk of every sequence).
//
// ShardPlan.Checkpoint selects the activations it recomputes in the
// backward pass, as Options.Checkpoint does for Model, with the same
// bitwise results as keeping them all.
type Sharded struct {
	Cfg Config
	// B and T are the rows and the full sequence length of a batch; this
	// rank holds T/CP tokens of each row.
	B, T                   int
	TP, TPRank, CP, CPRank int
	Layout                 []ShardParam
	// Params and Grads are this rank's flat shards (ShardLayout order);
	// P and G view them.
	Params, Grads backend.Tensor
	P, G          Params

	be               backend.Backend
	c                ParallelComm
	nh, nkv, hd      int // local heads
	nq, nkvd, f      int // local widths
	nv, v0, lchunk   int // local vocabulary and logit chunk
	chunk, N, n      int
	cos, sin         backend.Tensor
	ids, targets     backend.Tensor
	foreign          []bool // token not in this rank's vocabulary shard
	resid            []backend.Tensor
	layers           []shardActs
	final, rstd      backend.Tensor
	xfin             backend.Tensor
	logits, stats    backend.Tensor
	losses           backend.Tensor
	full, seq, seq2  backend.Tensor // scratch [N, D], [n, D], [n, D]
	dq, dk, dv       backend.Tensor
	dqr, dkr, dat    backend.Tensor
	dh1, dh3, dhs    backend.Tensor
	rk, rv, rdk, rdv backend.Tensor // ring buffers [N, kv]
	tOut, tLse       backend.Tensor
	hN, hn           []float32
	numTargets       int
	lossSum          float64
	haveTargets      bool
	// stage is the pipeline stage this model computes (nil: the whole
	// model); Cfg then has the stage's layers and full the whole model's.
	stage    *StageSpec
	wholeCfg Config
	// Activation checkpointing, as in Model.
	policy       []layerPolicy
	layerFloats  int // size of the layer activations
	scratchLayer int // layer whose activations the shared scratch set holds; -1: none
	recomputed   int // layer recomputations so far (for tests)
}

// ShardPlan places a Sharded model in its tensor- and context-parallel
// groups.
type ShardPlan struct {
	// TP and CP are the degrees, TPRank and CPRank this rank's place.
	TP, TPRank, CP, CPRank int
	// LogitChunk bounds how many columns of this rank's vocabulary shard
	// have logits at once (the output projection is then recomputed in
	// the backward); 0 keeps them under about 64 MiB.
	LogitChunk int
	// Stage, when set, restricts the model to one pipeline stage: its
	// layers, with the embedding and the head only if the stage has them.
	// Params and Grads are then not allocated: call Bind.
	Stage *StageSpec
	// Checkpoint selects the activations recomputed in the backward pass
	// (see ActivationCheckpoint); a pipeline stage numbers its own layers
	// from 0 for the selective "N" rule.
	Checkpoint ActivationCheckpoint
}

// NewSharded plans and allocates the part of a model for batches of B
// rows of T tokens that rank plan.TPRank of the tp group and
// plan.CPRank of the cp group holds. Parameters start at zero: call Init
// or LoadFull.
func NewSharded(be backend.Backend, cfg Config, B, T int, plan ShardPlan, c ParallelComm) (*Sharded, error) {
	tp, tpRank, cp, cpRank := plan.TP, plan.TPRank, plan.CP, plan.CPRank
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if B <= 0 || T <= 0 || T > cfg.MaxSeqLen {
		return nil, fmt.Errorf("llama: batch %d × sequence length %d does not fit max_seq_len %d", B, T, cfg.MaxSeqLen)
	}
	if err := CheckParallel(cfg, T, tp, cp); err != nil {
		return nil, err
	}
	m := &Sharded{Cfg: cfg, B: B, T: T, TP: tp, TPRank: tpRank, CP: cp, CPRank: cpRank, be: be, c: c, wholeCfg: cfg, scratchLayer: -1}
	if s := plan.Stage; s != nil {
		if s.FirstLayer < 0 || s.NumLayers < 0 || s.FirstLayer+s.NumLayers > cfg.NLayers {
			return nil, fmt.Errorf("llama: stage layers [%d, %d) outside the model's %d layers", s.FirstLayer, s.FirstLayer+s.NumLayers, cfg.NLayers)
		}
		spec := *s
		m.stage = &spec
		m.Cfg.NLayers = s.NumLayers
		cfg = m.Cfg
		m.Layout = spec.ShardLayout(m.wholeCfg, tp)
	} else {
		m.Layout = cfg.ShardLayout(tp)
		last := m.Layout[len(m.Layout)-1]
		size := last.LocalOffset + last.LocalSize
		m.Params, m.Grads = be.Alloc(backend.Float32, size), be.Alloc(backend.Float32, size)
		m.P, m.G = viewShards(cfg, m.Layout, m.Params), viewShards(cfg, m.Layout, m.Grads)
	}
	D := cfg.Dim
	m.hd = cfg.HeadDim()
	m.nh, m.nkv = cfg.NHeads/tp, cfg.KVHeads()/tp
	m.nq, m.nkvd, m.f = m.nh*m.hd, m.nkv*m.hd, cfg.FFNHidden()/tp
	m.nv = cfg.VocabSize / tp
	m.v0 = tpRank * m.nv
	m.chunk = T / (2 * cp)
	m.N = B * 2 * m.chunk
	m.n = m.N / tp
	N, n := m.N, m.n
	var err error
	if m.policy, err = plan.Checkpoint.policies(cfg.NLayers); err != nil {
		return nil, err
	}
	a := func(k int) backend.Tensor { return be.Alloc(backend.Float32, k) }
	m.resid = make([]backend.Tensor, cfg.NLayers+1)
	for l := range m.resid {
		m.resid[l] = a(n * D)
	}
	m.layerFloats = m.planLayers()
	m.final, m.rstd, m.xfin = a(n*D), a(n), a(N*D)
	m.lchunk = plan.LogitChunk
	if m.lchunk <= 0 {
		m.lchunk = max(1, (16<<20)/N)
	}
	m.lchunk = min(m.lchunk, m.nv)
	if m.stage != nil && !m.stage.Head {
		m.lchunk = 1 // no logits: keep their buffer small
	}
	m.logits, m.stats, m.losses = a(N*m.lchunk), a(N*3), a(N)
	m.full, m.seq, m.seq2 = a(N*D), a(n*D), a(n*D)
	m.dq, m.dk, m.dv = a(N*m.nq), a(N*m.nkvd), a(N*m.nkvd)
	m.dqr, m.dkr, m.dat = a(N*m.nq), a(N*m.nkvd), a(N*m.nq)
	m.dh1, m.dh3, m.dhs = a(N*m.f), a(N*m.f), a(N*m.f)
	m.rk, m.rv, m.rdk, m.rdv = a(N*m.nkvd), a(N*m.nkvd), a(N*m.nkvd), a(N*m.nkvd)
	m.tOut, m.tLse = a(m.chunk*m.nq), a(m.nh*m.chunk)
	cos, sin := cfg.RoPETables(T)
	m.cos, m.sin = a(len(cos)), a(len(sin))
	be.Upload(m.cos, cos)
	be.Upload(m.sin, sin)
	m.ids = be.Alloc(backend.Int32, N)
	m.targets = be.Alloc(backend.Int32, N)
	m.hN, m.hn = make([]float32, N*D), make([]float32, n*D)
	return m, nil
}

// viewShards lays the parameter views over a rank's flat shards.
func viewShards(cfg Config, lay []ShardParam, flat backend.Tensor) Params {
	t := func(i int) backend.Tensor { return flat.Slice(lay[i].LocalOffset, lay[i].LocalSize) }
	p := Params{Embedding: t(0), Layers: make([]LayerParams, cfg.NLayers)}
	for l := range p.Layers {
		i := 1 + 9*l
		p.Layers[l] = LayerParams{
			AttnNorm: t(i), Wq: t(i + 1), Wk: t(i + 2), Wv: t(i + 3), Wo: t(i + 4),
			FFNNorm: t(i + 5), W1: t(i + 6), W2: t(i + 7), W3: t(i + 8),
		}
	}
	n := len(lay)
	p.Norm, p.Output = t(n-2), t(n-1)
	return p
}

// Init fills this rank's shards with exactly the values a whole-model
// Init(seed) gives those elements.
func (m *Sharded) Init(seed uint64) {
	full := make([]float32, m.Cfg.NumParams())
	InitParams(m.Cfg, seed, full, 0)
	m.LoadFull(m.Params, full)
}

// LoadFull uploads this rank's shards of the whole flat buffer full
// (parameters or an optimizer moment) into dst, a buffer of this rank's
// flat size.
func (m *Sharded) LoadFull(dst backend.Tensor, full []float32) {
	m.be.Upload(dst, ShardFlat(m.Cfg, m.TP, m.TPRank, full))
}

// Backend is the backend the model runs on.
func (m *Sharded) Backend() backend.Backend { return m.be }

// ZeroGrad clears the gradients.
func (m *Sharded) ZeroGrad() { m.be.Zero(m.Grads) }

// NumTargets is the number of this rank's targets (>= 0) of the last
// Forward.
func (m *Sharded) NumTargets() int { return m.numTargets }

// ActivationBytes is the size of the activation memory.
func (m *Sharded) ActivationBytes() int64 {
	D := m.Cfg.Dim
	n := m.layerFloats + (m.Cfg.NLayers+1)*m.n*D + 2*m.n*D + m.n + m.N*D + m.N*(m.lchunk+4)
	return int64(n) * 4
}

// gather all-gathers the sequence-parallel rows src [n, D] into dst [N, D].
func (m *Sharded) gather(dst, src backend.Tensor) error {
	if m.TP == 1 {
		m.be.Copy(dst, src)
		return nil
	}
	m.be.Download(m.hn, src)
	if err := m.c.AllGatherSeq(m.hn, m.hN); err != nil {
		return fmt.Errorf("llama: sequence all-gather: %w", err)
	}
	m.be.Upload(dst, m.hN)
	return nil
}

// scatter sums src [N, D] over the tp ranks and stores this rank's rows
// in dst [n, D]. src's host copy is m.hN when fromHost.
func (m *Sharded) scatter(dst, src backend.Tensor, fromHost bool) error {
	if m.TP == 1 {
		if fromHost {
			m.be.Upload(dst, m.hN)
		} else {
			m.be.Copy(dst, src)
		}
		return nil
	}
	if !fromHost {
		m.be.Download(m.hN, src)
	}
	if err := m.c.ReduceScatterSeq(m.hN, m.hn); err != nil {
		return fmt.Errorf("llama: sequence reduce-scatter: %w", err)
	}
	m.be.Upload(dst, m.hn)
	return nil
}

// rope rotates x [N, heads, HD] (in place, or its gradient into dst when
// backward) by each token's true position.
func (m *Sharded) rope(dst, x backend.Tensor, heads int, backward bool) {
	c, hd := m.chunk, m.hd
	blk := c * heads * hd
	for b := 0; b < m.B; b++ {
		for h := 0; h < 2; h++ {
			p := ChunkStart(m.T, m.CP, m.CPRank, h)
			cs, sn := m.cos.Slice(p*hd/2, c*hd/2), m.sin.Slice(p*hd/2, c*hd/2)
			off := (b*2 + h) * blk
			if backward {
				m.be.RoPEBackward(dst.Slice(off, blk), x.Slice(off, blk), cs, sn, 1, c, heads, hd)
			} else {
				m.be.RoPEForward(x.Slice(off, blk), x.Slice(off, blk), cs, sn, 1, c, heads, hd)
			}
		}
	}
}

// blockPairs calls fn for every (row, query half, key half) whose keys,
// held by cp rank src, are visible to some of the queries; dims has the
// block's positions.
func (m *Sharded) blockPairs(src int, fn func(qOff, kOff, lOff int, d backend.AttentionDims)) {
	c := m.chunk
	for b := 0; b < m.B; b++ {
		for qh := 0; qh < 2; qh++ {
			qp := ChunkStart(m.T, m.CP, m.CPRank, qh)
			for kh := 0; kh < 2; kh++ {
				kp := ChunkStart(m.T, m.CP, src, kh)
				if kp > qp {
					continue // every key is after every query
				}
				d := backend.AttentionDims{B: 1, Tq: c, Tk: c, NH: m.nh, NKV: m.nkv, HD: m.hd, QPos: qp, KPos: kp}
				fn((b*2+qh)*c*m.nq, (b*2+kh)*c*m.nkvd, (b*2+qh)*m.nh*c, d)
			}
		}
	}
}

// MergeAttention folds a partial attention result (out2 [Tq, NH, HD],
// lse2 [NH, Tq]) into the running one (out1, lse1), in place: the
// combination is the attention over the union of both key sets.
func MergeAttention(out1, lse1, out2, lse2 []float32, Tq, NH, HD int) {
	for h := 0; h < NH; h++ {
		for i := 0; i < Tq; i++ {
			l2 := float64(lse2[h*Tq+i])
			if math.IsInf(l2, -1) {
				continue
			}
			l1 := float64(lse1[h*Tq+i])
			o1 := out1[(i*NH+h)*HD : (i*NH+h+1)*HD]
			o2 := out2[(i*NH+h)*HD : (i*NH+h+1)*HD]
			if math.IsInf(l1, -1) {
				copy(o1, o2)
				lse1[h*Tq+i] = float32(l2)
				continue
			}
			mx := max(l1, l2)
			l := mx + math.Log(math.Exp(l1-mx)+math.Exp(l2-mx))
			w1, w2 := math.Exp(l1-l), math.Exp(l2-l)
			for j := range o1 {
				o1[j] = float32(w1*float64(o1[j]) + w2*float64(o2[j]))
			}
			lse1[h*Tq+i] = float32(l)
		}
	}
}

// attention runs ring attention for layer activations a: K/V travel
// around the cp ring and each block's partial result is merged by its
// log-sum-exp.
func (m *Sharded) attention(a *shardActs) error {
	be, N := m.be, m.N
	out := make([]float32, N*m.nq)
	lse := make([]float32, N*m.nh)
	for i := range lse {
		lse[i] = float32(math.Inf(-1))
	}
	to, tl := make([]float32, m.chunk*m.nq), make([]float32, m.nh*m.chunk)
	var cur, next []float32
	if m.CP > 1 {
		cur, next = make([]float32, 2*N*m.nkvd), make([]float32, 2*N*m.nkvd)
		be.Download(cur[:N*m.nkvd], a.k)
		be.Download(cur[N*m.nkvd:], a.v)
	}
	for s := 0; s < m.CP; s++ {
		src := (m.CPRank - s + m.CP) % m.CP
		K, V := a.k, a.v
		if s > 0 {
			be.Upload(m.rk, cur[:N*m.nkvd])
			be.Upload(m.rv, cur[N*m.nkvd:])
			K, V = m.rk, m.rv
		}
		m.blockPairs(src, func(qOff, kOff, lOff int, d backend.AttentionDims) {
			be.AttentionForward(m.tOut, m.tLse, a.q.Slice(qOff, d.Tq*m.nq), K.Slice(kOff, d.Tk*m.nkvd), V.Slice(kOff, d.Tk*m.nkvd), d)
			be.Download(to, m.tOut)
			be.Download(tl, m.tLse)
			MergeAttention(out[qOff:qOff+d.Tq*m.nq], lse[lOff:lOff+m.nh*d.Tq], to, tl, d.Tq, m.nh, m.hd)
		})
		if s < m.CP-1 {
			if err := m.c.RingShift(cur, next); err != nil {
				return fmt.Errorf("llama: ring attention: %w", err)
			}
			cur, next = next, cur
		}
	}
	be.Upload(a.attn, out)
	be.Upload(a.lse, lse)
	return nil
}

// attentionBackward accumulates m.dq, m.dk, m.dv (overwritten) from
// m.dat; the K/V gradients travel around the ring with the K/V blocks and
// come home after CP steps.
func (m *Sharded) attentionBackward(a *shardActs) error {
	be, kvn := m.be, m.N*m.nkvd
	be.Zero(m.dq)
	be.Zero(m.dk)
	be.Zero(m.dv)
	var cur, next, dcur, dnext []float32
	if m.CP > 1 {
		cur, next = make([]float32, 2*kvn), make([]float32, 2*kvn)
		dcur, dnext = make([]float32, 2*kvn), make([]float32, 2*kvn)
		be.Download(cur[:kvn], a.k)
		be.Download(cur[kvn:], a.v)
	}
	for s := 0; s < m.CP; s++ {
		src := (m.CPRank - s + m.CP) % m.CP
		K, V, dK, dV := a.k, a.v, m.dk, m.dv
		if s > 0 {
			be.Upload(m.rk, cur[:kvn])
			be.Upload(m.rv, cur[kvn:])
			be.Upload(m.rdk, dcur[:kvn])
			be.Upload(m.rdv, dcur[kvn:])
			K, V, dK, dV = m.rk, m.rv, m.rdk, m.rdv
		}
		m.blockPairs(src, func(qOff, kOff, lOff int, d backend.AttentionDims) {
			nq, nk := d.Tq*m.nq, d.Tk*m.nkvd
			be.AttentionBackward(m.dq.Slice(qOff, nq), dK.Slice(kOff, nk), dV.Slice(kOff, nk), m.dat.Slice(qOff, nq),
				a.q.Slice(qOff, nq), K.Slice(kOff, nk), V.Slice(kOff, nk), a.attn.Slice(qOff, nq), a.lse.Slice(lOff, m.nh*d.Tq), d)
		})
		if m.CP == 1 {
			break
		}
		be.Download(dcur[:kvn], dK)
		be.Download(dcur[kvn:], dV)
		if s < m.CP-1 {
			if err := m.c.RingShift(cur, next); err != nil {
				return fmt.Errorf("llama: ring attention backward: %w", err)
			}
			cur, next = next, cur
		}
		if err := m.c.RingShift(dcur, dnext); err != nil {
			return fmt.Errorf("llama: ring attention backward: %w", err)
		}
		dcur, dnext = dnext, dcur
	}
	if m.CP > 1 {
		be.Upload(m.dk, dcur[:kvn])
		be.Upload(m.dv, dcur[kvn:])
	}
	return nil
}

// Forward runs the model on this rank's tokens [B × T/CP] (per row the
// head chunk then the tail chunk, see CPSlice) and, when targets is
// non-nil, returns the mean cross-entropy over its targets >= 0. Every tp
// rank of a group must pass the same tokens.
func (m *Sharded) Forward(tokens, targets []int32) (float32, error) {
	cfg, be := m.Cfg, m.be
	N, n, D := m.N, m.n, cfg.Dim
	eps := float32(cfg.NormEps)
	if len(tokens) != N || (targets != nil && len(targets) != N) {
		return 0, fmt.Errorf("llama: forward needs %d tokens and targets, got %d and %d", N, len(tokens), len(targets))
	}
	ids := make([]int32, N)
	m.foreign = make([]bool, N)
	for i, t := range tokens {
		if t < 0 || int(t) >= cfg.VocabSize {
			return 0, fmt.Errorf("llama: token %d at position %d is outside the vocabulary [0, %d)", t, i, cfg.VocabSize)
		}
		if int(t) >= m.v0 && int(t) < m.v0+m.nv {
			ids[i] = t - int32(m.v0)
		} else {
			m.foreign[i] = true
		}
	}
	be.Upload(m.ids, ids)
	if m.stage == nil || m.stage.Embedding {
		// Vocabulary-parallel embedding: each rank looks up its rows; the
		// sum over tp ranks is reduce-scattered along the sequence.
		be.EmbeddingForward(m.full, m.P.Embedding, m.ids, N, D)
		be.Download(m.hN, m.full)
		m.maskForeign(m.hN)
		if err := m.scatter(m.resid[0], m.full, true); err != nil {
			return 0, err
		}
	}
	for l := range m.layers {
		shared := m.policy[l] != keepAll
		if shared {
			m.scratchLayer = -1
		}
		if err := m.layerForward(l, true); err != nil {
			return 0, err
		}
		if shared {
			m.scratchLayer = l
		}
	}
	m.lossSum = 0
	if m.stage != nil && !m.stage.Head {
		m.haveTargets = false
		return 0, nil
	}
	be.RMSNormForward(m.final, m.rstd, m.resid[cfg.NLayers], m.P.Norm, n, D, eps)
	if err := m.gather(m.xfin, m.final); err != nil {
		return 0, err
	}
	m.haveTargets = false
	if targets == nil {
		if m.lchunk == m.nv {
			linear(be, m.logits, m.xfin, m.P.Output, N, D, m.nv, false)
		}
		return 0, nil
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
	be.Upload(m.targets, targets)
	be.CrossEntropyReset(m.stats, N)
	m.forEachChunk(func(logits backend.Tensor, off, nc int) {
		be.CrossEntropyChunk(m.stats, logits, m.targets, N, nc, m.v0+off)
	})
	if m.TP > 1 {
		if err := m.combineStats(targets); err != nil {
			return 0, err
		}
	}
	m.haveTargets = true
	be.CrossEntropyLoss(m.losses, m.stats, m.targets, N)
	host := make([]float32, N)
	be.Download(host, m.losses)
	var sum float64
	for _, l := range host {
		sum += float64(l)
	}
	m.lossSum = sum
	if m.numTargets == 0 {
		return 0, nil
	}
	return float32(sum / float64(m.numTargets)), nil
}

// forEachChunk computes the logits of each chunk of this rank's
// vocabulary shard (columns off..off+nc of it) and calls fn on them.
func (m *Sharded) forEachChunk(fn func(logits backend.Tensor, off, nc int)) {
	N, D := m.N, m.Cfg.Dim
	for off := 0; off < m.nv; off += m.lchunk {
		nc := min(m.lchunk, m.nv-off)
		logits := m.logits.Slice(0, N*nc)
		linear(m.be, logits, m.xfin, m.P.Output.Slice(off*D, nc*D), N, D, nc, false)
		fn(logits, off, nc)
	}
}

// maskForeign zeroes the rows [N, D] of tokens outside this rank's
// vocabulary shard.
func (m *Sharded) maskForeign(x []float32) {
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
func (m *Sharded) combineStats(targets []int32) error {
	N := m.N
	st := make([]float32, 3*N)
	m.be.Download(st, m.stats)
	mx, sum, tg := make([]float32, N), make([]float32, N), make([]float32, N)
	for i := range N {
		mx[i] = st[3*i]
	}
	if err := m.c.AllReduceTP(mx, true); err != nil {
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
	if err := m.c.AllReduceTP(sum, false); err != nil {
		return fmt.Errorf("llama: loss parallel: %w", err)
	}
	if err := m.c.AllReduceTP(tg, false); err != nil {
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

// Backward accumulates into Grads this rank's part of the gradient of
// lossScale × (sum of the per-token losses of the last Forward). The
// replicated norm gradients are partial sums over this rank's sequence
// rows: call ReduceReplicated once the step's backward passes are done.
func (m *Sharded) Backward(lossScale float32) error {
	head := m.stage == nil || m.stage.Head
	if head && !m.haveTargets {
		return fmt.Errorf("llama: backward needs a forward pass with targets")
	}
	m.haveTargets = false
	cfg, be := m.Cfg, m.be
	N, n, D := m.N, m.n, cfg.Dim
	dres := m.seq2 // without the head: filled by the caller (StageGrad)
	if head {
		be.Zero(m.full)
		for off := 0; off < m.nv; off += m.lchunk {
			nc := min(m.lchunk, m.nv-off)
			logits := m.logits.Slice(0, N*nc)
			w, dw := m.P.Output.Slice(off*D, nc*D), m.G.Output.Slice(off*D, nc*D)
			if m.lchunk != m.nv {
				linear(be, logits, m.xfin, w, N, D, nc, false)
			}
			be.CrossEntropyChunkBackward(logits, m.stats, m.targets, N, nc, m.v0+off, lossScale)
			linearBackward(be, m.full, dw, logits, m.xfin, w, N, D, nc, false)
		}
		if err := m.scatter(m.seq, m.full, false); err != nil {
			return err
		}
		be.Zero(dres)
		be.RMSNormBackward(dres, m.G.Norm, m.seq, m.resid[cfg.NLayers], m.P.Norm, m.rstd, n, D)
	}
	for l := cfg.NLayers - 1; l >= 0; l-- {
		if err := m.restore(l); err != nil {
			return err
		}
		a, p, g := &m.layers[l], &m.P.Layers[l], &m.G.Layers[l]
		if err := m.gather(m.full, dres); err != nil {
			return err
		}
		linearBackward(be, m.dhs, g.W2, m.full, a.hs, p.W2, N, m.f, D, true)
		be.Zero(m.dh1)
		be.Zero(m.dh3)
		be.SwiGLUBackward(m.dh1, m.dh3, m.dhs, a.h1, a.h3, N*m.f)
		linearBackward(be, m.full, g.W1, m.dh1, a.ffnNorm, p.W1, N, D, m.f, true)
		linearBackward(be, m.full, g.W3, m.dh3, a.ffnNorm, p.W3, N, D, m.f, false)
		if err := m.scatter(m.seq, m.full, false); err != nil {
			return err
		}
		be.RMSNormBackward(dres, g.FFNNorm, m.seq, a.mid, p.FFNNorm, a.ffnRstd, n, D)

		if err := m.gather(m.full, dres); err != nil {
			return err
		}
		linearBackward(be, m.dat, g.Wo, m.full, a.attn, p.Wo, N, m.nq, D, true)
		if err := m.attentionBackward(a); err != nil {
			return err
		}
		be.Zero(m.dqr)
		be.Zero(m.dkr)
		m.rope(m.dqr, m.dq, m.nh, true)
		m.rope(m.dkr, m.dk, m.nkv, true)
		linearBackward(be, m.full, g.Wq, m.dqr, a.attnNorm, p.Wq, N, D, m.nq, true)
		linearBackward(be, m.full, g.Wk, m.dkr, a.attnNorm, p.Wk, N, D, m.nkvd, false)
		linearBackward(be, m.full, g.Wv, m.dv, a.attnNorm, p.Wv, N, D, m.nkvd, false)
		if err := m.scatter(m.seq, m.full, false); err != nil {
			return err
		}
		be.RMSNormBackward(dres, g.AttnNorm, m.seq, m.resid[l], p.AttnNorm, a.attnRstd, n, D)
	}
	if m.stage != nil && !m.stage.Embedding {
		return nil
	}
	if err := m.gather(m.full, dres); err != nil {
		return err
	}
	be.Download(m.hN, m.full)
	m.maskForeign(m.hN)
	be.Upload(m.full, m.hN)
	be.EmbeddingBackward(m.G.Embedding, m.full, m.ids, N, D)
	return nil
}

// replicated returns the gradient views of the replicated parameters.
func (m *Sharded) replicated() []backend.Tensor {
	ts := []backend.Tensor{m.G.Norm}
	for _, g := range m.G.Layers {
		ts = append(ts, g.AttnNorm, g.FFNNorm)
	}
	return ts
}

// ReduceReplicated sums the gradients of the replicated parameters (the
// norms, each rank's from its sequence rows) over the tp ranks.
func (m *Sharded) ReduceReplicated() error {
	if m.TP == 1 {
		return nil
	}
	for _, t := range m.replicated() {
		if t.Len == 0 {
			continue // a pipeline stage without the head has no final norm
		}
		h := make([]float32, t.Len)
		m.be.Download(h, t)
		if err := m.c.AllReduceTP(h, false); err != nil {
			return fmt.Errorf("llama: norm gradients: %w", err)
		}
		m.be.Upload(t, h)
	}
	return nil
}

// GradSumSquares is this rank's share of the squared gradient norm: its
// shards of the split parameters and, on tp rank 0 only, the replicated
// ones, so that the sum over a tp group is the whole model's.
func (m *Sharded) GradSumSquares() float64 {
	var s float64
	for _, p := range m.Layout {
		if p.Kind == Replicated && m.TPRank != 0 {
			continue
		}
		s += m.be.SumSquares(m.Grads.Slice(p.LocalOffset, p.LocalSize))
	}
	return s
}

// ShardLayout returns the parameters of the stage's part of a tp rank's
// flat buffer (Config.ShardLayout of full, restricted to the stage, which
// is a contiguous range of it), their LocalOffset relative to the
// stage's first element.
func (s StageSpec) ShardLayout(full Config, tp int) []ShardParam {
	lay := full.ShardLayout(tp)
	first, last := 1+9*s.FirstLayer, 1+9*(s.FirstLayer+s.NumLayers)
	if s.Embedding {
		first = 0
	}
	if s.Head {
		last = len(lay)
	}
	out := append([]ShardParam(nil), lay[first:last]...)
	for i := range out {
		out[i].LocalOffset -= lay[first].LocalOffset
	}
	return out
}

// ShardRange returns the elements [lo, hi) of a tp rank's flat buffer
// (Config.ShardLayout of full) that the stage's parameters occupy. With
// tp = 1 it is Range.
func (s StageSpec) ShardRange(full Config, tp int) (lo, hi int) {
	lay := full.ShardLayout(tp)
	first, last := 1+9*s.FirstLayer, 1+9*(s.FirstLayer+s.NumLayers)
	if s.Embedding {
		first = 0
	}
	if s.Head {
		last = len(lay)
	}
	return lay[first].LocalOffset, lay[last-1].LocalOffset + lay[last-1].LocalSize
}

// Bind lays a pipeline stage's parameter and gradient views over params
// and grads, both holding the stage's ShardRange of the rank's flat
// buffer. Several models of the same stage (one per microbatch in
// flight) may share them.
func (m *Sharded) Bind(params, grads backend.Tensor) {
	m.Params, m.Grads = params, grads
	m.P, m.G = m.viewStage(params), m.viewStage(grads)
}

func (m *Sharded) viewStage(flat backend.Tensor) Params {
	lay, s := m.Layout, m.stage
	t := func(i int) backend.Tensor { return flat.Slice(lay[i].LocalOffset, lay[i].LocalSize) }
	p := Params{Layers: make([]LayerParams, s.NumLayers)}
	i := 0
	if s.Embedding {
		p.Embedding = t(0)
		i = 1
	}
	for l := range p.Layers {
		p.Layers[l] = LayerParams{
			AttnNorm: t(i), Wq: t(i + 1), Wk: t(i + 2), Wv: t(i + 3), Wo: t(i + 4),
			FFNNorm: t(i + 5), W1: t(i + 6), W2: t(i + 7), W3: t(i + 8),
		}
		i += 9
	}
	if s.Head {
		p.Norm, p.Output = t(i), t(i+1)
	}
	return p
}

// LossSum is the sum of the per-token losses of the last Forward with
// targets (on a model with the head).
func (m *Sharded) LossSum() float64 { return m.lossSum }

// StageInput is the buffer [n, Dim] of this rank's sequence-parallel rows
// that a pipeline stage without the embedding reads its input hidden
// states from; the caller fills it before Forward.
func (m *Sharded) StageInput() backend.Tensor { return m.resid[0] }

// StageOutput is a stage's output hidden states (this rank's rows) after
// Forward, for a stage without the head.
func (m *Sharded) StageOutput() backend.Tensor { return m.resid[m.Cfg.NLayers] }

// StageGrad is the buffer [n, Dim] of a stage without the head that the
// caller fills with the gradient with respect to StageOutput before
// Backward; after Backward it holds the gradient with respect to
// StageInput (for a stage without the embedding).
func (m *Sharded) StageGrad() backend.Tensor { return m.seq2 }
