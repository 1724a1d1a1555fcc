package hyena

import "github.com/titan-go/titan/internal/backend"

// This file is the Hyena block: its forward and backward passes, and
// those of its implicit filter, as plain sequences of backend operations.
//
// Layouts: the residual stream, the norms and the dense layers are
// token-major [N, ·] (N = B·T). The short convolution and everything up
// to out_proj run channel-major, [B, (N+1)D, T] after in_proj, so that
// chunk i (x_i, or v for i = Order) of row b is one contiguous [D, T]
// block and each long convolution's input and output are [B, D, T], as
// backend.LongConv wants them.

// linearBias computes out [rows, outDim] = inp [rows, in] · w^T + bias.
func linearBias(be backend.Backend, out, inp, w, bias backend.Tensor, rows, in, outDim int) {
	be.BroadcastRows(out, bias, rows, outDim)
	be.Gemm(false, true, rows, outDim, in, 1, inp, in, w, in, 1, out, outDim)
}

// linearBackward accumulates dw += dout^T·inp and dbias += Σ dout, and
// overwrites dinp with dout·w (for dout [rows, outDim], inp [rows, in]).
func linearBackward(be backend.Backend, dinp, dw, dbias, dout, inp, w backend.Tensor, rows, in, outDim int) {
	be.Gemm(false, false, rows, in, outDim, 1, dout, outDim, w, in, 0, dinp, in)
	be.Gemm(true, false, outDim, in, rows, 1, dout, outDim, inp, in, 1, dw, in)
	be.SumRows(dbias, dout, rows, outDim)
}

// chunkOf is chunk i ([D, T]) of row b of a channel-major [B, (N+1)D, T]
// buffer.
func (m *Model) chunkOf(buf backend.Tensor, b, i int) backend.Tensor {
	DT := m.Cfg.DModel * m.T
	return buf.Slice((b*(m.Cfg.Order+1)+i)*DT, DT)
}

// row is row b ([D, T]) of a [B, D, T] buffer.
func (m *Model) row(buf backend.Tensor, b int) backend.Tensor {
	DT := m.Cfg.DModel * m.T
	return buf.Slice(b*DT, DT)
}

// v is row b of the value entering the o-th long convolution's gate (v_o
// of the recurrence): the last chunk for o = 0, else the previous
// convolution's output.
func (m *Model) v(a *layerActs, o, b int) backend.Tensor {
	if o == 0 {
		return m.chunkOf(a.zcT, b, m.Cfg.Order)
	}
	return m.row(a.y[o-1], b)
}

// skipTerms writes the skip terms of layer l's convolutions, [Order-1, D]
// ("o v"), from filter_fn.bias ("(v o)") into skipT.
func (m *Model) skipTerms(p *LayerParams) {
	m.be.Transpose(m.skipT, p.Skip, 1, m.Cfg.DModel, m.Cfg.Order-1)
}

// layerForward runs local layer l from resid[l] to resid[l+1], keeping
// its activations.
func (m *Model) layerForward(l int) {
	cfg, be := m.Cfg, m.be
	N, B, T, D := m.N, m.B, m.T, cfg.DModel
	C, H, K, n := cfg.Channels(), cfg.Inner(), cfg.ShortFilterOrder, cfg.Order
	DT := D * T
	a, p := &m.layers[l], &m.P.Layers[l]
	eps := float32(cfg.NormEps)

	// Mixer: mid = resid[l] + out_proj(Hyena(LN1(resid[l]))).
	be.LayerNormForward(a.ln1, a.mean1, a.rstd1, m.resid[l], p.Norm1W, p.Norm1B, N, D, eps)
	linearBias(be, m.zN, a.ln1, p.InW, p.InB, N, D, C)
	be.Transpose(a.zT, m.zN, B, T, C)
	be.ShortConvForward(a.zcT, a.zT, p.ConvW, p.ConvB, B, C, T, K)
	m.filterForward(a, p)
	m.skipTerms(p)
	for o := 0; o < n-1; o++ {
		k := n - 1 - o
		for b := 0; b < B; b++ {
			be.Mul(m.row(a.s[o], b), m.v(a, o, b), m.chunkOf(a.zcT, b, k))
		}
		m.lc.CausalConv(a.y[o], a.s[o], a.hT.Slice(o*DT, DT), B, D, T)
		be.ChannelScaleAdd(a.y[o], a.y[o], a.s[o], m.skipT.Slice(o*D, D), B, D, T)
	}
	for b := 0; b < B; b++ {
		be.Mul(m.row(m.gT, b), m.v(a, n-1, b), m.chunkOf(a.zcT, b, 0))
	}
	be.Transpose(a.g, m.gT, B, D, T)
	linearBias(be, a.mid, a.g, p.OutW, p.OutB, N, D, D)
	be.Add(a.mid, a.mid, m.resid[l])

	// MLP: resid[l+1] = mid + fc2(gelu(fc1(LN2(mid)))).
	be.LayerNormForward(a.ln2, a.mean2, a.rstd2, a.mid, p.Norm2W, p.Norm2B, N, D, eps)
	linearBias(be, a.f1, a.ln2, p.Fc1W, p.Fc1B, N, D, H)
	be.GELUTanhForward(a.a1, a.f1, N*H)
	out := m.resid[l+1]
	linearBias(be, out, a.a1, p.Fc2W, p.Fc2B, N, H, D)
	be.Add(out, out, a.mid)
}

// layerBackward back-propagates through local layer l: dres holds the
// gradient with respect to resid[l+1] and is left holding the gradient
// with respect to resid[l].
func (m *Model) layerBackward(l int) {
	cfg, be := m.Cfg, m.be
	N, B, T, D := m.N, m.B, m.T, cfg.DModel
	C, H, K, n := cfg.Channels(), cfg.Inner(), cfg.ShortFilterOrder, cfg.Order
	DT := D * T
	a, p, g := &m.layers[l], &m.P.Layers[l], &m.G.Layers[l]

	// MLP.
	linearBackward(be, m.dA, g.Fc2W, g.Fc2B, m.dres, a.a1, p.Fc2W, N, H, D)
	be.Zero(m.dF)
	be.GELUTanhBackward(m.dF, m.dA, a.f1, N*H)
	linearBackward(be, m.dN, g.Fc1W, g.Fc1B, m.dF, a.ln2, p.Fc1W, N, D, H)
	be.LayerNormBackward(m.dres, g.Norm2W, g.Norm2B, m.dN, a.mid, p.Norm2W, a.mean2, a.rstd2, N, D)

	// Mixer: dres is now the gradient with respect to mid.
	linearBackward(be, m.dg, g.OutW, g.OutB, m.dres, a.g, p.OutW, N, D, D)
	be.Transpose(m.dgT, m.dg, B, T, D)
	m.skipTerms(p)
	be.Zero(m.dzcT)
	be.Zero(m.dhT)
	be.Zero(m.dskipT)
	// g = v_{N-1} ⊙ x0.
	dv := m.dv0
	be.Zero(dv)
	for b := 0; b < B; b++ {
		be.MulBackward(m.row(dv, b), m.chunkOf(m.dzcT, b, 0), m.row(m.dgT, b), m.v(a, n-1, b), m.chunkOf(a.zcT, b, 0))
	}
	for o := n - 2; o >= 0; o-- {
		k := n - 1 - o
		// y[o] = h_o ∗ s[o] + skip_o ⊙ s[o], its gradient in dv.
		be.Zero(m.ds)
		m.lc.CausalConvBackward(m.ds, m.dhT.Slice(o*DT, DT), dv, a.s[o], a.hT.Slice(o*DT, DT), B, D, T)
		be.ChannelScaleAddBackward(m.ds, m.dskipT.Slice(o*D, D), dv, a.s[o], m.skipT.Slice(o*D, D), B, D, T)
		// s[o] = v_o ⊙ x_k.
		next := m.dv1
		if dv == m.dv1 {
			next = m.dv0
		}
		if o > 0 {
			be.Zero(next)
		}
		for b := 0; b < B; b++ {
			dvo := m.chunkOf(m.dzcT, b, n)
			if o > 0 {
				dvo = m.row(next, b)
			}
			be.MulBackward(dvo, m.chunkOf(m.dzcT, b, k), m.row(m.ds, b), m.v(a, o, b), m.chunkOf(a.zcT, b, k))
		}
		dv = next
	}
	be.Transpose(m.dskip, m.dskipT, 1, n-1, D)
	be.Axpy(g.Skip, 1, m.dskip)
	m.filterBackward(a, p, g)
	be.Zero(m.dzT)
	be.ShortConvBackward(m.dzT, g.ConvW, g.ConvB, m.dzcT, a.zT, p.ConvW, B, C, T, K)
	be.Transpose(m.dzN, m.dzT, B, C, T)
	linearBackward(be, m.dN, g.InW, g.InB, m.dzN, a.ln1, p.InW, N, D, C)
	be.LayerNormBackward(m.dres, g.Norm1W, g.Norm1B, m.dN, m.resid[l], p.Norm1W, a.mean1, a.rstd1, N, D)
}

// filterBufs are the buffers one computation of a layer's filters for
// length T uses: the MLP's pre-activations fa[i] and Sin outputs fs[i]
// [T, F], one convolution's filter before transposing hraw [T, D], the
// modulation mod [Order-1, T, D] (unused without Modulate) and the
// result hT [Order-1, D, T].
type filterBufs struct {
	T             int
	fa, fs        []backend.Tensor
	hraw, mod, hT backend.Tensor
}

// computeFilter computes the layer's long filters for length f.T into
// f.hT: the MLP of the first T rows of the positional features, then for
// each convolution o its channels d·(Order-1)+o of the last linear layer
// (rows of its weight Order-1 apart), modulated and transposed to
// channel-major.
func computeFilter(be backend.Backend, cfg Config, p *LayerParams, f filterBufs) {
	T, D, F, E, O := f.T, cfg.DModel, cfg.FilterOrder, cfg.EmbDim, cfg.Order-1
	mm := cfg.NumInnerMLPs
	linearBias(be, f.fa[0], p.Z.Slice(0, T*E), p.FilterW[0], p.FilterB[0], T, E, F)
	be.SinForward(f.fs[0], f.fa[0], p.Freq, T, F)
	for i := 1; i <= mm; i++ {
		linearBias(be, f.fa[i], f.fs[i-1], p.FilterW[i], p.FilterB[i], T, F, F)
		be.SinForward(f.fs[i], f.fa[i], p.Freq, T, F)
	}
	span := (D-1)*O*F + F
	for o := 0; o < O; o++ {
		be.Gemm(false, true, T, D, F, 1, f.fs[mm], F, p.FilterW[mm+1].Slice(o*F, span), O*F, 0, f.hraw, D)
		if cfg.Modulate {
			be.Mul(f.hraw, f.hraw, f.mod.Slice(o*T*D, T*D))
		}
		be.Transpose(f.hT.Slice(o*D*T, D*T), f.hraw, 1, T, D)
	}
}

// filterForward computes layer a's filters for the model's length T.
func (m *Model) filterForward(a *layerActs, p *LayerParams) {
	computeFilter(m.be, m.Cfg, p, filterBufs{T: m.T, fa: a.fa, fs: a.fs, hraw: m.hraw, mod: m.mod, hT: a.hT})
}

// filterBackward back-propagates the filters' gradient dhT into the
// filter MLP's parameters and the positional features.
func (m *Model) filterBackward(a *layerActs, p, g *LayerParams) {
	cfg, be := m.Cfg, m.be
	T, D, F, E, O := m.T, cfg.DModel, cfg.FilterOrder, cfg.EmbDim, cfg.Order-1
	mm := cfg.NumInnerMLPs
	span := (D-1)*O*F + F
	for o := 0; o < O; o++ {
		be.Transpose(m.hraw, m.dhT.Slice(o*D*T, D*T), 1, D, T)
		if cfg.Modulate {
			be.Mul(m.hraw, m.hraw, m.mod.Slice(o*T*D, T*D))
		}
		be.Gemm(true, false, D, F, T, 1, m.hraw, D, a.fs[mm], F, 1, g.FilterW[mm+1].Slice(o*F, span), O*F)
		beta := float32(1)
		if o == 0 {
			beta = 0
		}
		be.Gemm(false, false, T, F, D, 1, m.hraw, D, p.FilterW[mm+1].Slice(o*F, span), O*F, beta, m.dfs, F)
	}
	for i := mm; i >= 0; i-- {
		be.Zero(m.dfa)
		be.SinBackward(m.dfa, g.Freq, m.dfs, a.fa[i], p.Freq, T, F)
		be.SumRows(g.FilterB[i], m.dfa, T, F)
		if i > 0 {
			be.Gemm(true, false, F, F, T, 1, m.dfa, F, a.fs[i-1], F, 1, g.FilterW[i], F)
			be.Gemm(false, false, T, F, F, 1, m.dfa, F, p.FilterW[i], F, 0, m.dfs, F)
			continue
		}
		z := p.Z.Slice(0, T*E)
		be.Gemm(true, false, F, E, T, 1, m.dfa, F, z, E, 1, g.FilterW[0], E)
		be.Gemm(false, false, T, E, F, 1, m.dfa, F, p.FilterW[0], E, 1, g.Z.Slice(0, T*E), E)
	}
}
