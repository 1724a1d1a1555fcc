package llama

import (
	"fmt"
	"strings"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/numeric"
)

// This file is the model's linear layers in their precision (see
// Plan.Precision): the three products of each layer — the output
// y = x·Wᵀ, the input gradient dx = dy·W and the weight gradient
// dW += dyᵀ·x — as float32 GEMMs, as bfloat16 GEMMs (mixed precision:
// both operands rounded to bfloat16, float32 accumulation), or as float8
// products (float8 converter, see internal/float8) for the layers it
// converts.

// linID is one of a block's linear layers, or the output projection.
type linID uint8

const (
	linWq linID = iota
	linWk
	linWv
	linWo
	linW1
	linW2
	linW3
	linOutput
)

var linNames = [...]string{"attention.wq", "attention.wk", "attention.wv", "attention.wo",
	"feed_forward.w1", "feed_forward.w2", "feed_forward.w3", "output"}

// linKey is one linear layer of this rank's part: local layer l (unused
// for the output projection) and which.
type linKey struct {
	l  int
	id linID
}

// fqn is the layer's fully qualified name as torchtitan's module tree has
// it ("layers.3.attention.wq", "output"), which float8.filter_fqns match.
func (m *Model) fqn(k linKey) string {
	if k.id == linOutput {
		return "output"
	}
	return fmt.Sprintf("layers.%d.%s", m.Spec.FirstLayer+k.l, linNames[k.id])
}

// planFloat8 decides which linear layers compute in float8.
func (m *Model) planFloat8() error {
	c := m.Precision.Float8
	if c == nil {
		return nil
	}
	if m.tp() > 1 {
		// The dynamic scales are maxima over whole tensors and rows that
		// tensor parallelism splits; they would need their own collectives.
		return fmt.Errorf("model.converters float8: tensor_parallel_degree %d is not supported (float8 scales span the tp shards)", m.tp())
	}
	m.f8 = map[linKey]bool{}
	for l := 0; l < m.nLayers; l++ {
		for id := linWq; id <= linW3; id++ {
			k := linKey{l, id}
			m.f8[k] = c.Converts(m.fqn(k))
		}
	}
	if m.Spec.Head && c.Converts("output") {
		if m.chunk != m.nv {
			return fmt.Errorf("float8.filter_fqns: the output projection computes in float8 only when its logits are one chunk (%d of %d columns); add \"output\" to filter_fqns", m.chunk, m.nv)
		}
		m.f8[linKey{0, linOutput}] = true
	}
	return nil
}

// gemm is Gemm in the parameters' precision: GemmBF16 under bfloat16
// mixed precision.
func (m *Model) gemm(transA, transB bool, rows, cols, k int, a backend.Tensor, lda int, b backend.Tensor, ldb int, beta float32, c backend.Tensor, ldc int) {
	if m.Precision.BF16() {
		m.be.GemmBF16(transA, transB, rows, cols, k, 1, a, lda, b, ldb, beta, c, ldc)
		return
	}
	m.be.Gemm(transA, transB, rows, cols, k, 1, a, lda, b, ldb, beta, c, ldc)
}

// linear computes out[N, outDim] = inp[N, in]·w[outDim, in]ᵀ (+ out when
// accumulate) for layer k.
func (m *Model) linear(k linKey, out, inp, w backend.Tensor, N, in, outDim int, accumulate bool) {
	beta := float32(0)
	if accumulate {
		beta = 1
	}
	if m.f8[k] {
		m.f8Forward(k, out, inp, w, N, in, outDim, beta)
		return
	}
	m.gemm(false, true, N, outDim, in, inp, in, w, in, beta, out, outDim)
}

// linearInputGrad computes dinp[N, in] = dout[N, outDim]·w + beta·dinp
// for layer k.
func (m *Model) linearInputGrad(k linKey, dinp, dout, w backend.Tensor, N, in, outDim int, beta float32) {
	if m.f8[k] {
		m.f8InputGrad(k, dinp, dout, w, N, in, outDim, beta)
		return
	}
	m.gemm(false, false, N, in, outDim, dout, outDim, w, in, beta, dinp, in)
}

// linearWeightGrad accumulates dw[outDim, in] += dout[N, outDim]ᵀ·inp[N, in]
// for layer k.
func (m *Model) linearWeightGrad(k linKey, dw, dout, inp backend.Tensor, N, in, outDim int) {
	if m.f8[k] && m.Precision.Float8.Recipe != float8.RowwiseGWHP {
		m.f8WeightGrad(dw, dout, inp, N, in, outDim)
		return
	}
	m.gemm(true, false, outDim, in, N, dout, outDim, inp, in, 1, dw, in)
}

// f8Scratch returns the float8 emulation's scratch: two operand buffers
// and the product buffer, each of at least n elements, allocated on first
// use and grown as needed.
func (m *Model) f8Scratch(n int) (a, b, c []float32, ta, tb, tc backend.Tensor) {
	if m.f8buf[0].Len < n {
		for i := range m.f8buf {
			m.f8buf[i] = m.be.Alloc(backend.Float32, n)
		}
	}
	return hostOf(m.f8buf[0]), hostOf(m.f8buf[1]), hostOf(m.f8buf[2]), m.f8buf[0], m.f8buf[1], m.f8buf[2]
}

// hostOf returns a host tensor's elements; the float8 emulation computes
// on the host.
func hostOf(t backend.Tensor) []float32 {
	h, ok := t.HostFloat32()
	if !ok {
		panic("llama: float8 emulation needs host float32 memory")
	}
	return h
}

// hostIn is hostOf for a linear layer's input or output gradient, which
// may be a bfloat16 activation (Model.halfAct) or the output layer's
// bfloat16 logits gradient: that one is widened (exactly) into buf,
// which the cast then overwrites in place.
func hostIn(buf []float32, inp backend.Tensor) []float32 {
	h, ok := inp.HostBF16()
	if !ok || inp.Mem == nil {
		return hostOf(inp)
	}
	buf = buf[:len(h)]
	numeric.BF16sToFloat32(buf, h)
	return buf
}

// cast8 casts src [rows, cols] into dst with the recipe's granularity:
// by tensor (one scale, returned as a 1-vector), by row, or by column.
type granularity uint8

const (
	byTensor granularity = iota
	byRow
	byCol
)

func cast8(dst, src []float32, rows, cols int, f float8.Format, g granularity, pow2 bool) []float32 {
	src, dst = src[:rows*cols], dst[:rows*cols]
	switch g {
	case byRow:
		s := make([]float32, rows)
		float8.CastRows(dst, src, rows, cols, f, pow2, s)
		return s
	case byCol:
		s := make([]float32, cols)
		float8.CastCols(dst, src, rows, cols, f, pow2, s)
		return s
	}
	s := float8.Scale(float8.Amax(src), f, pow2)
	float8.Cast(dst, src, s, f)
	return []float32{s}
}

// f8Forward: out = x·Wᵀ with x and W in e4m3, by tensor or by row.
func (m *Model) f8Forward(k linKey, out, inp, w backend.Tensor, N, in, outDim int, beta float32) {
	a, b, c, ta, tb, tc := m.f8Scratch(max(N, outDim) * max(in, outDim))
	g, pow2 := byTensor, false
	if m.Precision.Float8.Recipe != float8.Tensorwise {
		g, pow2 = byRow, true
	}
	sx := cast8(a, hostIn(a, inp), N, in, float8.E4M3, g, pow2)
	var sw []float32
	if s, ok := m.f8pre[k]; ok {
		tb, sw = w, []float32{s}
	} else {
		sw = cast8(b, hostOf(w), outDim, in, float8.E4M3, g, pow2)
	}
	m.be.GemmBF16(false, true, N, outDim, in, 1, ta, in, tb, in, 0, tc, outDim)
	if h, ok := out.HostBF16(); ok && out.Mem != nil {
		// The output layer's bfloat16 logits (halfAct): unscaled in
		// place, then rounded to nearest even, as the bfloat16 output of
		// torchao's Float8Linear.
		if beta != 0 {
			panic("llama: float8 " + m.fqn(k) + ": a bfloat16 output cannot accumulate")
		}
		float8.Unscale(c, outDim, c, N, outDim, sx, sw, 0)
		numeric.Float32sToBF16(h, c[:N*outDim])
		return
	}
	float8.Unscale(hostOf(out), outDim, c, N, outDim, sx, sw, beta)
}

// f8InputGrad: dinp = dy·W + beta·dinp; tensorwise: dy in e5m2 and W in
// e4m3 by tensor; rowwise: dy by row and W by column (its contracted
// dimension is its rows), both e4m3; rowwise_with_gw_hp: dy by row, W by
// tensor, both e4m3.
func (m *Model) f8InputGrad(k linKey, dinp, dout, w backend.Tensor, N, in, outDim int, beta float32) {
	a, b, c, ta, tb, tc := m.f8Scratch(max(N, outDim) * max(in, outDim))
	var sg, sw []float32
	switch m.Precision.Float8.Recipe {
	case float8.Tensorwise:
		sg = cast8(a, hostIn(a, dout), N, outDim, float8.E5M2, byTensor, false)
		if s, ok := m.f8pre[k]; ok {
			tb, sw = w, []float32{s}
		} else {
			sw = cast8(b, hostOf(w), outDim, in, float8.E4M3, byTensor, false)
		}
	case float8.Rowwise:
		sg = cast8(a, hostIn(a, dout), N, outDim, float8.E4M3, byRow, true)
		sw = cast8(b, hostOf(w), outDim, in, float8.E4M3, byCol, true)
	default:
		sg = cast8(a, hostIn(a, dout), N, outDim, float8.E4M3, byRow, true)
		sw = cast8(b, hostOf(w), outDim, in, float8.E4M3, byTensor, true)
	}
	m.be.GemmBF16(false, false, N, in, outDim, 1, ta, outDim, tb, in, 0, tc, in)
	float8.Unscale(hostOf(dinp), in, c, N, in, sg, sw, beta)
}

// f8WeightGrad: dW += dyᵀ·x; tensorwise: dy in e5m2, x in e4m3, by
// tensor; rowwise: both e4m3 by column (their contracted dimension is the
// tokens).
func (m *Model) f8WeightGrad(dw, dout, inp backend.Tensor, N, in, outDim int) {
	a, b, c, ta, tb, tc := m.f8Scratch(max(N, outDim) * max(in, outDim))
	var sg, sx []float32
	if m.Precision.Float8.Recipe == float8.Tensorwise {
		sg = cast8(a, hostIn(a, dout), N, outDim, float8.E5M2, byTensor, false)
		sx = cast8(b, hostIn(b, inp), N, in, float8.E4M3, byTensor, false)
	} else {
		sg = cast8(a, hostIn(a, dout), N, outDim, float8.E4M3, byCol, true)
		sx = cast8(b, hostIn(b, inp), N, in, float8.E4M3, byCol, true)
	}
	m.be.GemmBF16(true, false, outDim, in, N, 1, ta, outDim, tb, in, 0, tc, in)
	float8.Unscale(hostOf(dw), in, c, outDim, in, sg, sx, 1)
}

// float8Keys are the float8 layers of unit u, in flat-buffer order.
func (m *Model) float8Keys(u int) []linKey {
	var ks []linKey
	switch unitTensors(m.Layout, m.first[u]) {
	case 1: // the embedding
	case 2:
		if k := (linKey{0, linOutput}); m.f8[k] {
			ks = append(ks, k)
		}
	default:
		l := u
		if m.Spec.Embedding {
			l--
		}
		for id := linWq; id <= linW3; id++ {
			if k := (linKey{l, id}); m.f8[k] {
				ks = append(ks, k)
			}
		}
	}
	return ks
}

// weightOf is layer k's weight in Layout, found by name among unit u's
// tensors.
func (m *Model) weightOf(u int, k linKey) ShardParam {
	want := "." + linNames[k.id] + ".weight"
	if k.id == linOutput {
		want = "output.weight"
	}
	for i := m.first[u]; i < len(m.Layout); i++ {
		if p := m.Layout[i]; strings.HasSuffix(p.Name, want) {
			return p
		}
	}
	panic("llama: no weight " + want + " in unit " + fmt.Sprint(u))
}

// Float8Weights are unit u's float8 linear weights (tensorwise recipe),
// ranges of the part's flat buffer in order, that FSDP may all-gather as
// float8 (model.Float8Part).
func (m *Model) Float8Weights(u int) []Unit {
	if m.Precision.Float8 == nil || m.Precision.Float8.Recipe != float8.Tensorwise {
		return nil
	}
	var rs []Unit
	for _, k := range m.float8Keys(u) {
		p := m.weightOf(u, k)
		rs = append(rs, Unit{Lo: p.LocalOffset, Hi: p.LocalOffset + p.LocalSize})
	}
	return rs
}

// Float8UnitsFor returns the units of the part planned for plan with
// batches of B×T tokens and each unit's float8 weights (Float8Weights),
// computed without allocating anything.
func Float8UnitsFor(cfg Config, B, T int, plan Plan) (units []Unit, weights [][]Unit, err error) {
	m, err := planModel(cfg, B, T, plan)
	if err != nil {
		return nil, nil, err
	}
	for u := range m.units {
		weights = append(weights, m.Float8Weights(u))
	}
	return m.units, weights, nil
}

// BindFloat8Scales says that unit u's bound float8 weights (its
// Float8Weights, in order) hold their e4m3 values, cast with scales: the
// layers multiply them as they are, with those scales, until the unit's
// parameters are bound again.
func (m *Model) BindFloat8Scales(u int, scales []float32) {
	ks := m.float8Keys(u)
	if len(scales) != len(ks) || m.Precision.Float8.Recipe != float8.Tensorwise {
		panic(fmt.Sprintf("llama: %d float8 scales for unit %d's %d tensorwise float8 weights", len(scales), u, len(ks)))
	}
	if m.f8pre == nil {
		m.f8pre = map[linKey]float32{}
	}
	for i, k := range ks {
		m.f8pre[k] = scales[i]
	}
}

// unbindFloat8 forgets unit u's scales: its parameters are bound anew.
func (m *Model) unbindFloat8(u int) {
	if len(m.f8pre) == 0 {
		return
	}
	for _, k := range m.float8Keys(u) {
		delete(m.f8pre, k)
	}
}
