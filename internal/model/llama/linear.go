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
func (m *Model) fqn(k linKey) string { return linearFQN(m.Spec.FirstLayer+k.l, k.id) }

// linearFQN is the fully qualified name of linear layer id of block layer.
func linearFQN(layer int, id linID) string {
	if id == linOutput {
		return "output"
	}
	return fmt.Sprintf("layers.%d.%s", layer, linNames[id])
}

// BlockLinearFQNs lists the fully qualified names of every block's linear
// layers (the output projection, "output", is not among them), as
// float8.filter_fqns match them.
func BlockLinearFQNs(c Config) []string {
	var out []string
	for l := 0; l < c.NLayers; l++ {
		for id := linWq; id < linOutput; id++ {
			out = append(out, linearFQN(l, id))
		}
	}
	return out
}

// planFloat8 decides which linear layers compute in float8. Under tensor
// parallelism each rank casts its shards with the scales of the whole
// tensors (see cast8).
func (m *Model) planFloat8() error {
	c := m.Precision.Float8
	if c == nil {
		return nil
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
		m.f8WeightGrad(k, dw, dout, inp, N, in, outDim)
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

// granularity is how a float8 operand is scaled: by tensor (one scale),
// by row, or by column.
type granularity uint8

const (
	byTensor granularity = iota
	byRow
	byCol
)

// f8Operand is one operand of a float8 product: src [rows, cols] cast
// into dst in format f with scales by g, rounded down to powers of two
// with pow2. Under tensor parallelism splitRows and splitCols say that
// this rank holds a shard of the whole operand split along that
// dimension (see tpSplit).
type f8Operand struct {
	dst, src             []float32
	rows, cols           int
	f                    float8.Format
	g                    granularity
	pow2                 bool
	splitRows, splitCols bool
}

// spansShards reports whether o's scales are maxima over a dimension the
// tp ranks split: the whole tensor's when it is split at all, a row's
// when its columns are, a column's when its rows are.
func (o *f8Operand) spansShards() bool {
	switch o.g {
	case byRow:
		return o.splitCols
	case byCol:
		return o.splitRows
	}
	return o.splitRows || o.splitCols
}

// tpSplit says which of layer k's feature dimensions this rank holds a
// shard of under tensor parallelism: in for the row-parallel wo and w2,
// out for the column-parallel wq, wk, wv, w1, w3 and the vocabulary-
// parallel output projection. Operands: x [N, in], W [out, in] and
// dy [N, out]; the tokens N are never split (the linear layers' inputs
// and the row-parallel ones' output gradients are gathered over the tp
// ranks).
func (m *Model) tpSplit(k linKey) (in, out bool) {
	if m.tp() == 1 {
		return false, false
	}
	row := k.id == linWo || k.id == linW2
	return row, !row
}

// cast8 casts layer k's operands of one float8 product and returns each
// one's scales (one for a tensor, one per row or column). Where a scale
// spans the tp shards (spansShards), its amax is this rank's shard's
// max all-reduced over the tp ranks, in one collective for the product
// (exact: a maximum does not depend on the order), so that every rank
// casts with the whole tensor's scales, as one process does. A failed
// collective leaves the local amaxes and is reported at the unit's end
// (Model.hook).
func (m *Model) cast8(k linKey, ops ...f8Operand) [][]float32 {
	amax := make([][]float32, len(ops))
	var shared []float32
	for i := range ops {
		o := &ops[i]
		src := o.src[:o.rows*o.cols]
		switch o.g {
		case byRow:
			amax[i] = make([]float32, o.rows)
			float8.RowAmax(amax[i], src, o.rows, o.cols)
		case byCol:
			amax[i] = make([]float32, o.cols)
			float8.ColAmax(amax[i], src, o.rows, o.cols)
		default:
			amax[i] = []float32{float8.Amax(src)}
		}
		if o.spansShards() {
			shared = append(shared, amax[i]...)
		}
	}
	if len(shared) > 0 && m.linErr == nil {
		if err := m.c().AllReduceTP(shared, true); err != nil {
			m.linErr = fmt.Errorf("llama: float8 amax all-reduce of %s: %w", m.fqn(k), err)
		}
		for i := range ops {
			if ops[i].spansShards() {
				shared = shared[copy(amax[i], shared):]
			}
		}
	}
	for i := range ops {
		o := &ops[i]
		src, dst := o.src[:o.rows*o.cols], o.dst[:o.rows*o.cols]
		float8.Scales(amax[i], amax[i], o.f, o.pow2)
		switch o.g {
		case byRow:
			float8.CastRows(dst, src, o.rows, o.cols, o.f, amax[i])
		case byCol:
			float8.CastCols(dst, src, o.rows, o.cols, o.f, amax[i])
		default:
			float8.Cast(dst, src, amax[i][0], o.f)
		}
	}
	return amax
}

// castWithWeight casts operand o and layer k's weight operand wt (in one
// cast8) and returns their scales and the weight for the product: tb,
// holding wt's cast, or the bound weight w itself with its scale when
// FSDP gathered it cast already (BindFloat8Scales).
func (m *Model) castWithWeight(k linKey, o, wt f8Operand, w, tb backend.Tensor) (so, sw []float32, wb backend.Tensor) {
	if s, ok := m.f8pre[k]; ok {
		return m.cast8(k, o)[0], []float32{s}, w
	}
	s := m.cast8(k, o, wt)
	return s[0], s[1], tb
}

// f8Forward: out = x·Wᵀ with x and W in e4m3, by tensor or by row.
func (m *Model) f8Forward(k linKey, out, inp, w backend.Tensor, N, in, outDim int, beta float32) {
	a, b, c, ta, tb, tc := m.f8Scratch(max(N, outDim) * max(in, outDim))
	g, pow2 := byTensor, false
	if m.Precision.Float8.Recipe != float8.Tensorwise {
		g, pow2 = byRow, true
	}
	sIn, sOut := m.tpSplit(k)
	x := f8Operand{dst: a, src: hostIn(a, inp), rows: N, cols: in, f: float8.E4M3, g: g, pow2: pow2, splitCols: sIn}
	wt := f8Operand{dst: b, src: hostOf(w), rows: outDim, cols: in, f: float8.E4M3, g: g, pow2: pow2, splitRows: sOut, splitCols: sIn}
	sx, sw, tb := m.castWithWeight(k, x, wt, w, tb)
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
	sIn, sOut := m.tpSplit(k)
	dy := f8Operand{dst: a, src: hostIn(a, dout), rows: N, cols: outDim, f: float8.E4M3, g: byRow, pow2: true, splitCols: sOut}
	wt := f8Operand{dst: b, src: hostOf(w), rows: outDim, cols: in, f: float8.E4M3, g: byCol, pow2: true, splitRows: sOut, splitCols: sIn}
	switch m.Precision.Float8.Recipe {
	case float8.Tensorwise:
		dy.f, dy.g, dy.pow2 = float8.E5M2, byTensor, false
		wt.g, wt.pow2 = byTensor, false
	case float8.RowwiseGWHP:
		wt.g = byTensor
	}
	sg, sw, tb := m.castWithWeight(k, dy, wt, w, tb)
	m.be.GemmBF16(false, false, N, in, outDim, 1, ta, outDim, tb, in, 0, tc, in)
	float8.Unscale(hostOf(dinp), in, c, N, in, sg, sw, beta)
}

// f8WeightGrad: dW += dyᵀ·x; tensorwise: dy in e5m2, x in e4m3, by
// tensor; rowwise: both e4m3 by column (their contracted dimension is the
// tokens).
func (m *Model) f8WeightGrad(k linKey, dw, dout, inp backend.Tensor, N, in, outDim int) {
	a, b, c, ta, tb, tc := m.f8Scratch(max(N, outDim) * max(in, outDim))
	sIn, sOut := m.tpSplit(k)
	dy := f8Operand{dst: a, src: hostIn(a, dout), rows: N, cols: outDim, f: float8.E4M3, g: byCol, pow2: true, splitCols: sOut}
	x := f8Operand{dst: b, src: hostIn(b, inp), rows: N, cols: in, f: float8.E4M3, g: byCol, pow2: true, splitCols: sIn}
	if m.Precision.Float8.Recipe == float8.Tensorwise {
		dy.f, dy.g, dy.pow2 = float8.E5M2, byTensor, false
		x.g, x.pow2 = byTensor, false
	}
	s := m.cast8(k, dy, x)
	m.be.GemmBF16(true, false, outDim, in, N, 1, ta, outDim, tb, in, 0, tc, in)
	float8.Unscale(hostOf(dw), in, c, outDim, in, s[0], s[1], 1)
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
