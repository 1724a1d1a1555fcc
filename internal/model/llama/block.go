package llama

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/numeric"
	"github.com/titan-go/titan/internal/trace"
)

// This file is the transformer block, written once: its forward, its
// backward (optionally split into input and weight gradients), its
// recomputation under activation checkpointing, and the sequence- and
// context-parallel pieces it calls, which do nothing extra at TP = CP = 1.
//
// Shapes: N is this rank's tokens (B × T/CP), n = N/TP its sequence-
// parallel rows; the residual stream and the norms' inputs hold n rows,
// the linear layers' inputs all N rows (gathered over the tp ranks).

// layerActs are the activations of one block kept for the backward pass.
type layerActs struct {
	attnNorm, attnRstd backend.Tensor // norm output, gathered [N, D]; 1/rms [n]
	q, k, v            backend.Tensor // projections after RoPE [N, nq], [N, nkv]
	attn, lse          backend.Tensor // attention output (read by wo) [N, nq], log-sum-exp [N·nh]
	mid                backend.Tensor // residual stream after attention [n, D]
	ffnNorm, ffnRstd   backend.Tensor // [N, D]; [n]
	h1, h3, hs         backend.Tensor // w1·x, w3·x, silu(w1·x)*(w3·x) [N, f]
}

// actFields lists the views of a layerActs (see actField).
func (m *Model) actFields(a *layerActs) []actField {
	N, n, D := m.N, m.n, m.Cfg.Dim
	norm := m.tp() == 1 // gathered from float32 host buffers under tp
	return []actField{
		{&a.attnNorm, N * D, true, norm}, {&a.attnRstd, n, true, false},
		{&a.q, N * m.nq, false, true}, {&a.k, N * m.nkvd, true, true}, {&a.v, N * m.nkvd, false, true},
		{&a.attn, N * m.nq, false, true}, {&a.lse, N * m.nh, false, false},
		{&a.mid, n * D, true, false},
		{&a.ffnNorm, N * D, true, norm}, {&a.ffnRstd, n, true, false},
		{&a.h1, N * m.f, false, false}, {&a.h3, N * m.f, true, false}, {&a.hs, N * m.f, true, true},
	}
}

// layerForward runs layer l's forward from resid[l] into its activations
// and, when out is set, its output resid[l+1]. The backward pass's
// recomputation leaves out unset: the output is kept anyway. With
// keptOps (the per-operation policy's recomputation) it skips the
// products whose outputs that policy keeps (wq, wv, w1 and the
// attention) and recomputes the rest from them.
func (m *Model) layerForward(l int, out, keptOps bool) error {
	be, N, D := m.be, m.N, m.Cfg.Dim
	a, p := &m.layers[l], &m.P.Layers[l]
	// Attention: mid = resid[l] + wo(attn(rope(wq x), rope(wk x), wv x)), x = norm(resid[l]).
	span := trace.Begin(trace.CatNorm, "attention_norm")
	err := m.normGather(a.attnNorm, a.attnRstd, m.seq, m.resid[l], p.AttnNorm, true)
	span.End()
	if err != nil {
		return err
	}
	// The projections, q and k rotated: in place, or through float32
	// staging into bfloat16 activations (m.proj, see halfAct).
	stage := func(dst backend.Tensor) backend.Tensor {
		if m.proj.Mem != nil && dst.DType() == backend.BFloat16 {
			return m.proj.Slice(0, dst.Len)
		}
		return dst
	}
	span = trace.Begin(trace.CatGEMM, "qkv")
	q, k, v := stage(a.q), stage(a.k), stage(a.v)
	if !keptOps {
		m.linear(linKey{l, linWq}, q, a.attnNorm, p.Wq, N, D, m.nq, false)
		m.rope(a.q, q, m.nh, false)
	}
	m.linear(linKey{l, linWk}, k, a.attnNorm, p.Wk, N, D, m.nkvd, false)
	m.rope(a.k, k, m.nkv, false)
	if !keptOps {
		m.linear(linKey{l, linWv}, v, a.attnNorm, p.Wv, N, D, m.nkvd, false)
		if v != a.v {
			be.Copy(a.v, v)
		}
	}
	span.End()
	if !keptOps {
		span = trace.Begin(trace.CatAttention, "attention")
		err = m.attention(a)
		span.End()
		if err != nil {
			return err
		}
	}
	span = trace.Begin(trace.CatGEMM, "wo")
	err = m.rowOut(linKey{l, linWo}, a.mid, m.resid[l], a.attn, p.Wo, m.nq)
	span.End()
	if err != nil {
		return err
	}
	// Feed-forward: resid[l+1] = mid + w2(silu(w1 x) * w3 x), x = norm(mid).
	span = trace.Begin(trace.CatNorm, "ffn_norm")
	err = m.normGather(a.ffnNorm, a.ffnRstd, m.seq, a.mid, p.FFNNorm, true)
	span.End()
	if err != nil {
		return err
	}
	span = trace.Begin(trace.CatGEMM, "w1_w3")
	if !keptOps {
		m.linear(linKey{l, linW1}, a.h1, a.ffnNorm, p.W1, N, D, m.f, false)
	}
	m.linear(linKey{l, linW3}, a.h3, a.ffnNorm, p.W3, N, D, m.f, false)
	span.End()
	span = trace.Begin(trace.CatElementw, "swiglu")
	be.SwiGLUForward(a.hs, a.h1, a.h3, N*m.f)
	span.End()
	if !out {
		return nil
	}
	span = trace.Begin(trace.CatGEMM, "w2")
	defer span.End()
	return m.rowOut(linKey{l, linW2}, m.resid[l+1], a.mid, a.hs, p.W2, m.f)
}

// layerBackward back-propagates through layer l (unit u): dres holds the
// gradient with respect to resid[l+1] and is left holding the gradient
// with respect to resid[l]. With split, the weight-gradient products are
// deferred to BackwardWeight and their output gradients kept.
func (m *Model) layerBackward(l, u int, split bool) error {
	be, N, D := m.be, m.N, m.Cfg.Dim
	a, p := &m.layers[l], &m.P.Layers[l]
	g := func() *LayerParams { return &m.G.Layers[l] }
	dh1, dh3, dqr, dkr, dv := m.dh1, m.dh3, m.dqr, m.dkr, m.dv
	var o *layerDouts
	if split {
		o = &m.douts[l]
		dh1, dh3, dqr, dkr, dv = o.h1, o.h3, o.qr, o.kr, o.v
	}
	keep := func(dst, dout backend.Tensor) backend.Tensor {
		be.Copy(dst, dout)
		return dst
	}
	// inputs holds the inputs the weight-gradient products read: the layer's
	// activations, with the split backward's copies in place of those a
	// recomputation left in the scratch set.
	inputs := *a
	if split {
		src, dst := m.actFields(&inputs), m.actFields(&o.in)
		for _, i := range m.splitIn[l] {
			*src[i].t = keep(*dst[i].t, *src[i].t)
		}
	}
	lin := func(id linID, dinp backend.Tensor, dw func() backend.Tensor, dout, inp, w backend.Tensor, in, outDim int, overwrite bool) {
		beta := float32(1)
		if overwrite {
			beta = 0
		}
		k := linKey{l, id}
		m.linearInputGrad(k, dinp, dout, w, N, in, outDim, beta)
		m.weightGrad(u, split, k, dw, dout, inp, N, in, outDim)
	}

	// Feed-forward.
	dout, err := m.gatherGrad()
	if err != nil {
		return err
	}
	if split {
		dout = keep(o.ffnOut, dout)
	}
	span := trace.Begin(trace.CatGEMM, "w2_backward")
	lin(linW2, m.dhs, func() backend.Tensor { return g().W2 }, dout, inputs.hs, p.W2, m.f, D, true)
	span.End()
	span = trace.Begin(trace.CatElementw, "swiglu_backward")
	be.Zero(dh1)
	be.Zero(dh3)
	be.SwiGLUBackward(dh1, dh3, m.dhs, a.h1, a.h3, N*m.f)
	span.End()
	span = trace.Begin(trace.CatGEMM, "w1_w3_backward")
	lin(linW1, m.full, func() backend.Tensor { return g().W1 }, dh1, inputs.ffnNorm, p.W1, D, m.f, true)
	lin(linW3, m.full, func() backend.Tensor { return g().W3 }, dh3, inputs.ffnNorm, p.W3, D, m.f, false)
	span.End()
	span = trace.Begin(trace.CatNorm, "ffn_norm_backward")
	err = m.normBackward(m.dres, g().FFNNorm, m.full, a.mid, p.FFNNorm, a.ffnRstd)
	span.End()
	if err != nil {
		return err
	}

	// Attention.
	if dout, err = m.gatherGrad(); err != nil {
		return err
	}
	if split {
		dout = keep(o.attnOut, dout)
	}
	span = trace.Begin(trace.CatGEMM, "wo_backward")
	lin(linWo, m.dat, func() backend.Tensor { return g().Wo }, dout, inputs.attn, p.Wo, m.nq, D, true)
	span.End()
	span = trace.Begin(trace.CatAttention, "attention_backward")
	err = m.attentionBackward(a, dv)
	if err == nil {
		be.Zero(dqr)
		be.Zero(dkr)
		m.rope(dqr, m.dq, m.nh, true)
		m.rope(dkr, m.dk, m.nkv, true)
	}
	span.End()
	if err != nil {
		return err
	}
	span = trace.Begin(trace.CatGEMM, "qkv_backward")
	lin(linWq, m.full, func() backend.Tensor { return g().Wq }, dqr, inputs.attnNorm, p.Wq, D, m.nq, true)
	lin(linWk, m.full, func() backend.Tensor { return g().Wk }, dkr, inputs.attnNorm, p.Wk, D, m.nkvd, false)
	lin(linWv, m.full, func() backend.Tensor { return g().Wv }, dv, inputs.attnNorm, p.Wv, D, m.nkvd, false)
	span.End()
	span = trace.Begin(trace.CatNorm, "attention_norm_backward")
	defer span.End()
	return m.normBackward(m.dres, g().AttnNorm, m.full, m.resid[l], p.AttnNorm, a.attnRstd)
}

// restore makes layer l's activations available to its backward pass,
// recomputing them into the shared scratch set unless they are kept or
// still there (the last checkpointed layer of the forward pass is not
// recomputed: nothing overwrote its activations). A recomputation issues
// the same collectives as the forward; every rank of a tp and cp group
// has the same policy, so all of them recompute, or none.
func (m *Model) restore(l int) error {
	p := m.policy[l]
	if p == keepAll || m.scratchLayer == l {
		return nil
	}
	m.scratchLayer = -1
	if err := m.layerForward(l, false, p == recomputeOps); err != nil {
		return err
	}
	m.recomputed++
	m.scratchLayer = l
	return nil
}

// normGather normalises this rank's rows x [n, D] (1/rms into rstd [n])
// and leaves the result for all N rows in dst [N, D], all-gathered over
// the tp ranks through tmp [n, D]. At TP = 1 it normalises into dst.
// layer says that dst is a layer's norm output, which one process holds
// in bfloat16 under mixed precision (actFields): the gathered rows are
// its values (see gather).
func (m *Model) normGather(dst, rstd, tmp, x, w backend.Tensor, layer bool) error {
	eps := float32(m.Cfg.NormEps)
	if m.tp() == 1 {
		m.be.RMSNormForward(dst, rstd, x, w, m.n, m.Cfg.Dim, eps)
		return nil
	}
	m.be.RMSNormForward(tmp, rstd, x, w, m.n, m.Cfg.Dim, eps)
	return m.gather(dst, tmp, layer && m.halfAct())
}

// normBackward accumulates into dres [n, D] and gw the gradient of a
// norm whose output gradient for all N rows is dx [N, D] (summed over the
// tp ranks and scattered to this rank's rows first).
func (m *Model) normBackward(dres, gw, dx, x, w, rstd backend.Tensor) error {
	if m.tp() > 1 {
		if err := m.scatter(m.seq, dx); err != nil {
			return err
		}
		dx = m.seq
	}
	m.be.RMSNormBackward(dres, gw, dx, x, w, rstd, m.n, m.Cfg.Dim)
	return nil
}

// rowOut computes, for layer k, dst [n, D] = resid + (inp [N, in] · w^T), the output of
// a row-parallel linear summed over the tp ranks and scattered to this
// rank's rows, plus the residual. At TP = 1 the product accumulates onto
// a copy of the residual.
func (m *Model) rowOut(k linKey, dst, resid, inp, w backend.Tensor, in int) error {
	be, N, D := m.be, m.N, m.Cfg.Dim
	if m.tp() == 1 {
		be.Copy(dst, resid)
		m.linear(k, dst, inp, w, N, in, D, true)
		return nil
	}
	m.linear(k, m.full, inp, w, N, in, D, false)
	if err := m.scatter(m.seq, m.full); err != nil {
		return err
	}
	be.Add(dst, resid, m.seq)
	return nil
}

// gatherGrad returns the gradient with respect to the residual stream
// for all N rows: dres itself at TP = 1, else dres all-gathered into full.
func (m *Model) gatherGrad() (backend.Tensor, error) {
	if m.tp() == 1 {
		return m.dres, nil
	}
	return m.full, m.gather(m.full, m.dres, false)
}

// gather all-gathers the sequence-parallel rows src [n, D] into dst [N, D],
// their values rounded to bfloat16 with half: a norm output under mixed
// precision, which one process stores in bfloat16 (see actFields) and
// tensor parallelism gathers in float32, so that every product (a float8
// cast included) reads the same values.
func (m *Model) gather(dst, src backend.Tensor, half bool) error {
	m.be.Download(m.hn, src)
	if half {
		for i, v := range m.hn {
			m.hn[i] = numeric.RoundBF16(v)
		}
	}
	if err := m.c().AllGatherSeq(m.hn, m.hN); err != nil {
		return fmt.Errorf("llama: sequence all-gather: %w", err)
	}
	m.be.Upload(dst, m.hN)
	return nil
}

// scatter sums src [N, D] over the tp ranks and stores this rank's rows
// in dst [n, D].
func (m *Model) scatter(dst, src backend.Tensor) error {
	m.be.Download(m.hN, src)
	if err := m.c().ReduceScatterSeq(m.hN, m.hn); err != nil {
		return fmt.Errorf("llama: sequence reduce-scatter: %w", err)
	}
	m.be.Upload(dst, m.hn)
	return nil
}

// rope rotates x [N, heads, HD] (in place, or its gradient into dst when
// backward) by each token's true position.
func (m *Model) rope(dst, x backend.Tensor, heads int, backward bool) {
	be, hd := m.be, m.hd
	if m.cp() == 1 {
		if backward {
			be.RoPEBackward(dst, x, m.cos, m.sin, m.B, m.T, heads, hd)
		} else {
			be.RoPEForward(dst, x, m.cos, m.sin, m.B, m.T, heads, hd)
		}
		return
	}
	c := m.cchunk
	blk := c * heads * hd
	for b := 0; b < m.B; b++ {
		for h := 0; h < 2; h++ {
			p := ChunkStart(m.T, m.cp(), m.CPRank, h)
			cs, sn := m.cos.Slice(p*hd/2, c*hd/2), m.sin.Slice(p*hd/2, c*hd/2)
			off := (b*2 + h) * blk
			if backward {
				be.RoPEBackward(dst.Slice(off, blk), x.Slice(off, blk), cs, sn, 1, c, heads, hd)
			} else {
				be.RoPEForward(dst.Slice(off, blk), x.Slice(off, blk), cs, sn, 1, c, heads, hd)
			}
		}
	}
}

// blockPairs calls fn for every (row, query half, key half) whose keys,
// held by cp rank src, are visible to some of the queries; dims has the
// block's positions.
func (m *Model) blockPairs(src int, fn func(qOff, kOff, lOff int, d backend.AttentionDims)) {
	c, cp := m.cchunk, m.cp()
	for b := 0; b < m.B; b++ {
		for qh := 0; qh < 2; qh++ {
			qp := ChunkStart(m.T, cp, m.CPRank, qh)
			for kh := 0; kh < 2; kh++ {
				kp := ChunkStart(m.T, cp, src, kh)
				if kp > qp {
					continue // every key is after every query
				}
				d := backend.AttentionDims{B: 1, Tq: c, Tk: c, NH: m.nh, NKV: m.nkv, HD: m.hd, QPos: qp, KPos: kp, BF16: m.Precision.BF16()}
				fn((b*2+qh)*c*m.nq, (b*2+kh)*c*m.nkvd, (b*2+qh)*m.nh*c, d)
			}
		}
	}
}

// attnDims are the dimensions of causal attention over whole rows, its
// products in the parameters' precision.
func (m *Model) attnDims() backend.AttentionDims {
	return backend.AttentionDims{B: m.B, Tq: m.T, Tk: m.T, NH: m.nh, NKV: m.nkv, HD: m.hd, BF16: m.Precision.BF16()}
}

// attention computes a.attn and a.lse from a.q, a.k, a.v: causal
// attention over the whole rows at CP = 1, otherwise ring attention: K/V
// travel around the cp ring and each block's partial result is merged by
// its log-sum-exp.
func (m *Model) attention(a *layerActs) error {
	be, N, cp := m.be, m.N, m.cp()
	if cp == 1 {
		be.AttentionForward(a.attn, a.lse, a.q, a.k, a.v, m.attnDims())
		return nil
	}
	kvn := N * m.nkvd
	cur, next, out, lse, to, tl := m.ringForward()
	for i := range lse {
		lse[i] = float32(math.Inf(-1))
	}
	clear(out)
	be.Download(cur[:kvn], a.k)
	be.Download(cur[kvn:], a.v)
	for s := 0; s < cp; s++ {
		// The next block travels while this one computes.
		var shift func() error
		if s < cp-1 {
			shift = m.c().RingShiftAsync(cur, next)
		}
		src := (m.CPRank - s + cp) % cp
		K, V := a.k, a.v
		if s > 0 {
			be.Upload(m.rk, cur[:kvn])
			be.Upload(m.rv, cur[kvn:])
			K, V = m.rk, m.rv
		}
		m.blockPairs(src, func(qOff, kOff, lOff int, d backend.AttentionDims) {
			be.AttentionForward(m.tOut, m.tLse, a.q.Slice(qOff, d.Tq*m.nq), K.Slice(kOff, d.Tk*m.nkvd), V.Slice(kOff, d.Tk*m.nkvd), d)
			be.Download(to, m.tOut)
			be.Download(tl, m.tLse)
			MergeAttention(out[qOff:qOff+d.Tq*m.nq], lse[lOff:lOff+m.nh*d.Tq], to, tl, d.Tq, m.nh, m.hd)
		})
		if shift != nil {
			if err := shift(); err != nil {
				return fmt.Errorf("llama: ring attention: %w", err)
			}
			cur, next = next, cur
		}
	}
	be.Upload(a.attn, out)
	be.Upload(a.lse, lse)
	return nil
}

// attentionBackward computes m.dq, m.dk and dv (overwritten) from m.dat.
// Under context parallelism the K/V gradients travel around the ring with
// the K/V blocks and come home after CP steps.
func (m *Model) attentionBackward(a *layerActs, dv backend.Tensor) error {
	be, kvn, cp := m.be, m.N*m.nkvd, m.cp()
	be.Zero(m.dq)
	be.Zero(m.dk)
	be.Zero(dv)
	if cp == 1 {
		be.AttentionBackward(m.dq, m.dk, dv, m.dat, a.q, a.k, a.v, a.attn, a.lse, m.attnDims())
		return nil
	}
	cur, next, dcur, dnext := m.ringBackward()
	be.Download(cur[:kvn], a.k)
	be.Download(cur[kvn:], a.v)
	for s := 0; s < cp; s++ {
		// The next key/value block travels while this one computes; its
		// gradients can only leave once computed.
		var shift func() error
		if s < cp-1 {
			shift = m.c().RingShiftAsync(cur, next)
		}
		src := (m.CPRank - s + cp) % cp
		K, V, dK, dV := a.k, a.v, m.dk, dv
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
		be.Download(dcur[:kvn], dK)
		be.Download(dcur[kvn:], dV)
		errG := m.c().RingShiftAsync(dcur, dnext)()
		if shift != nil {
			if err := shift(); err != nil {
				return fmt.Errorf("llama: ring attention backward: %w", err)
			}
			cur, next = next, cur
		}
		if errG != nil {
			return fmt.Errorf("llama: ring attention backward: %w", errG)
		}
		dcur, dnext = dnext, dcur
	}
	be.Upload(m.dk, dcur[:kvn])
	be.Upload(dv, dcur[kvn:])
	return nil
}

// ringHostLen is the length of the host buffer ring attention stages
// its rotations in (m.ring, allocated once in New): the forward's two
// key/value blocks (the one computed with and the one arriving), the
// merged output and log-sum-exp of this rank's queries and one block's
// partial result; the backward's two key/value blocks and two blocks of
// their gradients. Forward and backward take turns, so they share it.
func (m *Model) ringHostLen() int {
	if m.cp() == 1 {
		return 0
	}
	kvn := m.N * m.nkvd
	fwd := 4*kvn + m.N*m.nq + m.N*m.nh + m.cchunk*m.nq + m.nh*m.cchunk
	return max(fwd, 8*kvn)
}

// ringForward cuts the forward's buffers out of m.ring: the current and
// next key/value blocks [2·N·kv], the merged output [N, nq] and
// log-sum-exp [N·nh], one block's partial output and log-sum-exp.
func (m *Model) ringForward() (cur, next, out, lse, to, tl []float32) {
	r, kvn := m.ring, 2*m.N*m.nkvd
	take := func(n int) []float32 {
		b := r[:n:n]
		r = r[n:]
		return b
	}
	return take(kvn), take(kvn), take(m.N * m.nq), take(m.N * m.nh), take(m.cchunk * m.nq), take(m.nh * m.cchunk)
}

// ringBackward cuts the backward's buffers out of m.ring: the current and
// next key/value blocks and their gradients, [2·N·kv] each.
func (m *Model) ringBackward() (cur, next, dcur, dnext []float32) {
	kvn := 2 * m.N * m.nkvd
	return m.ring[:kvn:kvn], m.ring[kvn : 2*kvn : 2*kvn], m.ring[2*kvn : 3*kvn : 3*kvn], m.ring[3*kvn : 4*kvn : 4*kvn]
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
