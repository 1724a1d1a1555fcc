package cuda

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// Gemm computes C = alpha op(A) op(B) + beta C (row-major); see
// backend.Backend.Gemm.
func (b *Backend) Gemm(transA, transB bool, m, n, k int, alpha float32, a backend.Tensor, lda int, bm backend.Tensor, ldb int, beta float32, c backend.Tensor, ldc int) {
	b.GemmStridedBatched(transA, transB, m, n, k, alpha, a, lda, 0, bm, ldb, 0, beta, c, ldc, 0, 1)
}

// gemmSpan is the number of elements a batch of row-major matrices of
// rows × cols with leading dimension ld and stride spans.
func gemmSpan(rows, cols, ld, stride, batch int) int {
	if rows == 0 || cols == 0 || batch == 0 {
		return 0
	}
	return (batch-1)*stride + (rows-1)*ld + cols
}

// GemmStridedBatched runs batch Gemms at strides of the three operands.
func (b *Backend) GemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a backend.Tensor, lda, strideA int, bm backend.Tensor, ldb, strideB int, beta float32, c backend.Tensor, ldc, strideC int, batch int) {
	b.gemm(false, transA, transB, m, n, k, alpha, a, lda, strideA, bm, ldb, strideB, beta, c, ldc, strideC, batch)
}

// GemmBF16 is Gemm with both operands multiplied as bfloat16: a Float32
// operand is first rounded to nearest even into scratch memory, as the
// CPU backend rounds it while packing. A bfloat16 C is widened into
// float32 scratch, multiplied into there and rounded back to nearest
// even once.
func (b *Backend) GemmBF16(transA, transB bool, m, n, k int, alpha float32, a backend.Tensor, lda int, bm backend.Tensor, ldb int, beta float32, c backend.Tensor, ldc int) {
	b.gemm(true, transA, transB, m, n, k, alpha, a, lda, 0, bm, ldb, 0, beta, c, ldc, 0, 1)
}

// gemm is GemmStridedBatched; with bf16 set both operands are multiplied
// as bfloat16, and C may be bfloat16.
func (b *Backend) gemm(bf16 bool, transA, transB bool, m, n, k int, alpha float32, a backend.Tensor, lda, strideA int, bm backend.Tensor, ldb, strideB int, beta float32, c backend.Tensor, ldc, strideC int, batch int) {
	const op = "Gemm"
	if m < 0 || n < 0 || k < 0 || batch < 0 {
		panic(fmt.Sprintf("cuda: %s: bad dimensions m=%d n=%d k=%d batch=%d", op, m, n, k, batch))
	}
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	if lda < max(ac, 1) || ldb < max(bc, 1) || ldc < n {
		panic(fmt.Sprintf("cuda: %s: leading dimensions lda=%d ldb=%d ldc=%d too small for m=%d n=%d k=%d", op, lda, ldb, ldc, m, n, k))
	}
	aDT, bDT := a.DType(), bm.DType()
	sa, sb, sc := gemmSpan(ar, ac, lda, strideA, batch), gemmSpan(br, bc, ldb, strideB, batch), gemmSpan(m, n, ldc, strideC, batch)
	pa := ptr(op, "A", a, aDT, sa)
	pb := ptr(op, "B", bm, bDT, sb)
	halfC := bf16 && c.Mem != nil && c.DType() == backend.BFloat16
	var pc uintptr
	if !halfC {
		pc = f32p(op, "C", c, sc)
	}
	for _, dt := range []backend.DType{aDT, bDT} {
		if dt != backend.Float32 && dt != backend.BFloat16 {
			panic(fmt.Sprintf("cuda: %s: operand of type %s", op, dt))
		}
	}
	locked := false
	if round := bf16 && (aDT == backend.Float32 || bDT == backend.Float32); round || halfC {
		// One scratch allocation: a bfloat16 C widened to float32 first,
		// then the bfloat16 roundings of the float32 operands (A's, then
		// B's), which are multiplied instead.
		b.mu.Lock()
		defer b.mu.Unlock()
		locked = true
		need := 0
		if halfC {
			need += 4 * sc
		}
		if aDT == backend.Float32 && bf16 {
			need += 2 * sa
		}
		if bDT == backend.Float32 && bf16 {
			need += 2 * sb
		}
		s := b.scratchBytes(need)
		if halfC {
			// The whole span, gaps between rows included: rounding the
			// widened gaps back leaves them as they were.
			h := ptr(op, "C", c, backend.BFloat16, sc)
			b.launch(op, "cast_bf16_to_f32", elemGrid(sc), Dim3{elemBlock, 1, 1}, s, h, int64(sc))
			pc = s
			s += uintptr(4 * sc)
			defer b.launch(op, "cast_f32_to_bf16", elemGrid(sc), Dim3{elemBlock, 1, 1}, h, pc, int64(sc))
		}
		if aDT == backend.Float32 && round {
			b.launch(op, "cast_f32_to_bf16", elemGrid(sa), Dim3{elemBlock, 1, 1}, s, pa, int64(sa))
			pa, aDT = s, backend.BFloat16
			s += uintptr(2 * sa)
		}
		if bDT == backend.Float32 && round {
			b.launch(op, "cast_f32_to_bf16", elemGrid(sb), Dim3{elemBlock, 1, 1}, s, pb, int64(sb))
			pb, bDT = s, backend.BFloat16
		}
	}
	bf := aDT == backend.BFloat16 || bDT == backend.BFloat16
	if b.mm != nil {
		if !locked {
			b.mu.Lock()
			defer b.mu.Unlock()
		}
		if bf && aDT != bDT {
			// cuBLASLt wants one input type: round the float32 operand.
			if aDT == backend.Float32 {
				pa = b.roundToScratch(pa, sa)
			} else {
				pb = b.roundToScratch(pb, sb)
			}
		}
		b.must(op, b.mm.Matmul(MatmulArgs{
			TransA: transA, TransB: transB, M: m, N: n, K: k, Alpha: alpha, Beta: beta,
			A: pa, B: pb, C: pc, Lda: lda, Ldb: ldb, Ldc: ldc,
			SA: int64(strideA), SB: int64(strideB), SC: int64(strideC), Batch: batch,
			BF16: bf, TF32: b.tf32 && !bf,
		}))
		return
	}
	flag := func(dt backend.DType) int32 {
		if dt == backend.BFloat16 {
			return 1
		}
		return 0
	}
	bool32 := func(x bool) int32 {
		if x {
			return 1
		}
		return 0
	}
	b.launch(op, "gemm_tiled", Dim3{blocks(n, 16), blocks(m, 16), uint32(batch)}, Dim3{16, 16, 1},
		bool32(transA), bool32(transB), int32(m), int32(n), int32(k), alpha,
		pa, flag(aDT), int32(lda), int64(strideA),
		pb, flag(bDT), int32(ldb), int64(strideB),
		beta, pc, int32(ldc), int64(strideC))
}

// roundToScratch rounds n float32 at p to bfloat16 in scratch memory
// (b.mu held) and returns their address.
func (b *Backend) roundToScratch(p uintptr, n int) uintptr {
	s := b.scratchBytes(2 * n)
	b.launch("Gemm", "cast_f32_to_bf16", elemGrid(n), Dim3{elemBlock, 1, 1}, s, p, int64(n))
	return s
}

// EmbeddingForward gathers out[i,:] = table[tokens[i],:]. The tokens are
// checked on the host first, so that a bad token is an error naming it.
func (b *Backend) EmbeddingForward(out, table, tokens backend.Tensor, N, C int) {
	const op = "EmbeddingForward"
	rows := b.checkTokens(op, "table", table, tokens, N, C)
	_ = rows
	b.launch(op, "embedding_fwd", elemGrid(N*C), Dim3{elemBlock, 1, 1},
		f32p(op, "out", out, N*C), f32p(op, "table", table, 0), i32p(op, "tokens", tokens, N), int32(N), int32(C))
}

// EmbeddingBackward accumulates dtable[tokens[i],:] += dout[i,:] in token
// order (bitwise as the CPU backend).
func (b *Backend) EmbeddingBackward(dtable, dout, tokens backend.Tensor, N, C int) {
	const op = "EmbeddingBackward"
	b.checkTokens(op, "dtable", dtable, tokens, N, C)
	b.launch(op, "embedding_bwd", Dim3{blocks(C, colBlock), 1, 1}, Dim3{colBlock, 1, 1},
		f32p(op, "dtable", dtable, 0), f32p(op, "dout", dout, N*C), i32p(op, "tokens", tokens, N), int32(N), int32(C))
}

func (b *Backend) checkTokens(op, name string, table, tokens backend.Tensor, N, C int) int {
	if C <= 0 {
		panic(fmt.Sprintf("cuda: %s: row width %d", op, C))
	}
	rows := table.Len / C
	tok := make([]int32, N)
	if N > 0 {
		b.Download(tok, tokens.Slice(0, N))
	}
	for i, t := range tok {
		if t < 0 || int(t) >= rows {
			panic(fmt.Sprintf("cuda: %s: token %d at position %d outside the %d-row %s", op, t, i, rows, name))
		}
	}
	return rows
}

// RMSNormForward: see backend.Backend.
func (b *Backend) RMSNormForward(out, rstd, inp, weight backend.Tensor, N, C int, eps float32) {
	const op = "RMSNormForward"
	if N == 0 {
		return
	}
	po, done := b.f32View(op, "out", out, N*C, false, true)
	defer done()
	b.launch(op, "rmsnorm_fwd", Dim3{uint32(N), 1, 1}, Dim3{rowBlock, 1, 1},
		po, f32p(op, "rstd", rstd, N), f32p(op, "inp", inp, N*C), f32p(op, "weight", weight, C),
		int32(N), int32(C), eps)
}

// f32View returns where a kernel reads or writes the n float32 values of
// t: t itself when it is float32; for a bfloat16 t, scratch memory that
// holds t's exact widening when read is set, and that done rounds back
// into t (nearest even, as the CPU backend) when write is set. Call done
// after the launch.
func (b *Backend) f32View(op, name string, t backend.Tensor, n int, read, write bool) (p uintptr, done func()) {
	if !isBF16(t) {
		return f32p(op, name, t, n), func() {}
	}
	h := ptr(op, name, t, backend.BFloat16, n)
	b.mu.Lock()
	s := b.scratchBytes(4 * n)
	if read {
		b.launch(op, "cast_bf16_to_f32", elemGrid(n), Dim3{elemBlock, 1, 1}, s, h, int64(n))
	}
	return s, func() {
		defer b.mu.Unlock()
		if write {
			b.launch(op, "cast_f32_to_bf16", elemGrid(n), Dim3{elemBlock, 1, 1}, h, s, int64(n))
		}
	}
}

// isBF16 reports whether t is a bfloat16 tensor.
func isBF16(t backend.Tensor) bool { return t.Mem != nil && t.DType() == backend.BFloat16 }

// RMSNormBackward accumulates dinp and dweight.
func (b *Backend) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd backend.Tensor, N, C int) {
	const op = "RMSNormBackward"
	if N == 0 {
		return
	}
	pdo, pin, prs := f32p(op, "dout", dout, N*C), f32p(op, "inp", inp, N*C), f32p(op, "rstd", rstd, N)
	b.launch(op, "rmsnorm_bwd_dx", Dim3{uint32(N), 1, 1}, Dim3{rowBlock, 1, 1},
		f32p(op, "dinp", dinp, N*C), pdo, pin, f32p(op, "weight", weight, C), prs, int32(N), int32(C))
	P := int(blocks(N, colRows))
	b.mu.Lock()
	defer b.mu.Unlock()
	part := b.scratchBytes(P * C * 8)
	b.launch(op, "rmsnorm_dw_partial", Dim3{blocks(C, colBlock), uint32(P), 1}, Dim3{colBlock, 1, 1},
		part, pdo, pin, prs, int32(N), int32(C), int32(colRows))
	b.colReduce(op, f32p(op, "dweight", dweight, C), part, P, C)
}

// colReduce queues dst[j] += Σ_p part[p, j].
func (b *Backend) colReduce(op string, dst, part uintptr, P, C int) {
	b.launch(op, "col_reduce_f64", Dim3{blocks(C, colBlock), 1, 1}, Dim3{colBlock, 1, 1}, dst, part, int32(P), int32(C))
}

func ropeCheck(op string, B, T, NH, HD int) {
	if B < 0 || T < 0 || NH < 0 || HD < 0 || HD%2 != 0 {
		panic(fmt.Sprintf("cuda: %s: bad dimensions B=%d T=%d NH=%d HD=%d (HD must be even)", op, B, T, NH, HD))
	}
}

// RoPEForward rotates interleaved pairs; out may alias inp.
func (b *Backend) RoPEForward(out, inp, cos, sin backend.Tensor, B, T, NH, HD int) {
	const op = "RoPEForward"
	ropeCheck(op, B, T, NH, HD)
	n := B * T * NH * HD
	po, done := b.f32View(op, "out", out, n, false, true)
	defer done()
	b.launch(op, "rope_fwd", elemGrid(n/2), Dim3{elemBlock, 1, 1}, po, f32p(op, "inp", inp, n),
		f32p(op, "cos", cos, T*HD/2), f32p(op, "sin", sin, T*HD/2), int32(B), int32(T), int32(NH), int32(HD))
}

// RoPEBackward accumulates the inverse rotation of dout into dinp.
func (b *Backend) RoPEBackward(dinp, dout, cos, sin backend.Tensor, B, T, NH, HD int) {
	const op = "RoPEBackward"
	ropeCheck(op, B, T, NH, HD)
	n := B * T * NH * HD
	b.launch(op, "rope_bwd", elemGrid(n/2), Dim3{elemBlock, 1, 1}, f32p(op, "dinp", dinp, n), f32p(op, "dout", dout, n),
		f32p(op, "cos", cos, T*HD/2), f32p(op, "sin", sin, T*HD/2), int32(B), int32(T), int32(NH), int32(HD))
}

// RoPEScaling is Llama 3.1's frequency scaling (Factor 0: none); see
// llama.Config.RoPEFrequencies.
type RoPEScaling struct {
	Factor, LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositionEmbeddings         int
}

// RoPETables fills cos and sin [T, HD/2] on the device for positions
// pos0.. with base theta and scaling s, as llama.Config.RoPETables does
// on the host.
func (b *Backend) RoPETables(cos, sin backend.Tensor, T, HD, pos0 int, theta float64, s RoPEScaling) {
	const op = "RoPETables"
	ropeCheck(op, 1, T, 1, HD)
	n := T * HD / 2
	b.launch(op, "rope_tables", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "cos", cos, n), f32p(op, "sin", sin, n),
		int32(T), int32(HD), int32(pos0), theta, s.Factor, s.LowFreqFactor, s.HighFreqFactor, float64(s.OriginalMaxPositionEmbeddings))
}

// attHDMax is the largest head dimension of the attention kernels
// (ATT_HD_MAX in kernels/attention.cu) and attWarps their warps per block.
const (
	attHDMax = 128
	attWarps = 4
	attBC    = 32
)

func attCheck(op string, d backend.AttentionDims) {
	if d.B < 0 || d.Tq < 0 || d.Tk < 0 || d.NH <= 0 || d.NKV <= 0 || d.HD <= 0 || d.NH%d.NKV != 0 {
		panic(fmt.Sprintf("cuda: %s: bad dimensions %+v (NH must be a positive multiple of NKV)", op, d))
	}
	if d.HD > attHDMax {
		panic(fmt.Sprintf("cuda: %s: head dim %d above the %d the attention kernels support", op, d.HD, attHDMax))
	}
}

func attArgs(d backend.AttentionDims) []any {
	return []any{int32(d.B), int32(d.Tq), int32(d.Tk), int32(d.NH), int32(d.NKV), int32(d.HD), int32(d.QPos), int32(d.KPos)}
}

// AttentionForward: tiled causal GQA attention saving the log-sum-exp.
// A bfloat16 out receives the float32 kernel's output (in scratch)
// rounded to nearest even, as the CPU backend's.
func (b *Backend) AttentionForward(out, lse, q, k, v backend.Tensor, d backend.AttentionDims) {
	const op = "AttentionForward"
	attCheck(op, d)
	if d.B == 0 || d.Tq == 0 {
		return
	}
	nq, nk := d.B*d.Tq*d.NH*d.HD, d.B*d.Tk*d.NKV*d.HD
	half := isBF16(out)
	extra := 0
	if half {
		extra = 4 * nq
	}
	pq, pk, pv, po, unlock := b.attnQKV(op, q, k, v, d, nq, nk, extra)
	defer unlock()
	if !half {
		po = f32p(op, "out", out, nq)
	}
	args := append([]any{po, f32p(op, "lse", lse, d.B*d.NH*d.Tq), pq, pk, pv}, attArgs(d)...)
	b.launch(op, "attention_fwd", Dim3{blocks(d.Tq, attWarps), uint32(d.NH), uint32(d.B)}, Dim3{attWarps * 32, 1, 1}, args...)
	if half {
		b.launch(op, "cast_f32_to_bf16", elemGrid(nq), Dim3{elemBlock, 1, 1}, ptr(op, "out", out, backend.BFloat16, nq), po, int64(nq))
	}
}

// attnQKV returns float32 pointers to q, k and v: their own, or for a
// bfloat16 one (d.BF16: the kernels' products round to bfloat16 anyway)
// its exact widening into scratch memory; rest is extra bytes of
// scratch reserved for the caller. unlock releases the scratch.
func (b *Backend) attnQKV(op string, q, k, v backend.Tensor, d backend.AttentionDims, nq, nk, extra int) (pq, pk, pv, rest uintptr, unlock func()) {
	ts, names, ns := [3]backend.Tensor{q, k, v}, [3]string{"q", "k", "v"}, [3]int{nq, nk, nk}
	need := extra
	for i, t := range ts {
		if isBF16(t) {
			if !d.BF16 {
				panic(fmt.Sprintf("cuda: %s: %s is bfloat16 but the products are float32 (AttentionDims.BF16 unset)", op, names[i]))
			}
			need += 4 * ns[i]
		}
	}
	var ps [3]uintptr
	if need == 0 {
		for i, t := range ts {
			ps[i] = f32p(op, names[i], t, ns[i])
		}
		return ps[0], ps[1], ps[2], 0, func() {}
	}
	b.mu.Lock()
	s := b.scratchBytes(need)
	off := s + uintptr(extra)
	for i, t := range ts {
		if !isBF16(t) {
			ps[i] = f32p(op, names[i], t, ns[i])
			continue
		}
		b.launch(op, "cast_bf16_to_f32", elemGrid(ns[i]), Dim3{elemBlock, 1, 1}, off, ptr(op, names[i], t, backend.BFloat16, ns[i]), int64(ns[i]))
		ps[i], off = off, off+uintptr(4*ns[i])
	}
	return ps[0], ps[1], ps[2], s, b.mu.Unlock
}

// AttentionBackward accumulates dq, dk and dv; a bfloat16 out is
// widened exactly into scratch for rowsum(dout·out).
func (b *Backend) AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse backend.Tensor, d backend.AttentionDims) {
	const op = "AttentionBackward"
	attCheck(op, d)
	if d.B == 0 || d.Tq == 0 || d.Tk == 0 {
		return
	}
	nq, nk, nl := d.B*d.Tq*d.NH*d.HD, d.B*d.Tk*d.NKV*d.HD, d.B*d.NH*d.Tq
	pdo, plse := f32p(op, "dout", dout, nq), f32p(op, "lse", lse, nl)
	half := isBF16(out)
	extra := nl * 4
	if half {
		extra += 4 * nq
	}
	pq, pk, pv, D, unlock := b.attnQKV(op, q, k, v, d, nq, nk, extra)
	defer unlock()
	var po uintptr
	if half {
		po = D + uintptr(nl*4)
		b.launch(op, "cast_bf16_to_f32", elemGrid(nq), Dim3{elemBlock, 1, 1}, po, ptr(op, "out", out, backend.BFloat16, nq), int64(nq))
	} else {
		po = f32p(op, "out", out, nq)
	}
	rows := d.B * d.Tq * d.NH
	b.launch(op, "attention_bwd_d", Dim3{blocks(rows, attWarps), 1, 1}, Dim3{attWarps * 32, 1, 1},
		D, pdo, po, int32(d.B), int32(d.Tq), int32(d.NH), int32(d.HD))
	b.launch(op, "attention_bwd_dq", Dim3{blocks(d.Tq, attWarps), uint32(d.NH), uint32(d.B)}, Dim3{attWarps * 32, 1, 1},
		append([]any{f32p(op, "dq", dq, nq), pdo, pq, pk, pv, plse, D}, attArgs(d)...)...)
	b.launch(op, "attention_bwd_dkdv", Dim3{blocks(d.Tk, attBC), uint32(d.NKV), uint32(d.B)}, Dim3{attWarps * 32, 1, 1},
		append([]any{f32p(op, "dk", dk, nk), f32p(op, "dv", dv, nk), pdo, pq, pk, pv, plse, D}, attArgs(d)...)...)
}

// SwiGLUForward computes out = silu(gate) * up (float32 or bfloat16 out).
func (b *Backend) SwiGLUForward(out, gate, up backend.Tensor, n int) {
	const op = "SwiGLUForward"
	po, done := b.f32View(op, "out", out, n, false, true)
	defer done()
	b.launch(op, "swiglu_fwd", elemGrid(n), Dim3{elemBlock, 1, 1}, po, f32p(op, "gate", gate, n), f32p(op, "up", up, n), int64(n))
}

// SwiGLUBackward accumulates dgate and dup.
func (b *Backend) SwiGLUBackward(dgate, dup, dout, gate, up backend.Tensor, n int) {
	const op = "SwiGLUBackward"
	b.launch(op, "swiglu_bwd", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "dgate", dgate, n), f32p(op, "dup", dup, n),
		f32p(op, "dout", dout, n), f32p(op, "gate", gate, n), f32p(op, "up", up, n), int64(n))
}

// GELUTanhForward computes the tanh-approximated GELU.
func (b *Backend) GELUTanhForward(out, inp backend.Tensor, n int) {
	const op = "GELUTanhForward"
	b.launch(op, "gelu_tanh_fwd", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "out", out, n), f32p(op, "inp", inp, n), int64(n))
}

// GELUTanhBackward accumulates dinp += dout · gelu'(inp).
func (b *Backend) GELUTanhBackward(dinp, dout, inp backend.Tensor, n int) {
	const op = "GELUTanhBackward"
	b.launch(op, "gelu_tanh_bwd", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "dinp", dinp, n), f32p(op, "dout", dout, n), f32p(op, "inp", inp, n), int64(n))
}

// CrossEntropyReset prepares stats [N, 3].
func (b *Backend) CrossEntropyReset(stats backend.Tensor, N int) {
	const op = "CrossEntropyReset"
	b.launch(op, "ce_reset", elemGrid(N), Dim3{elemBlock, 1, 1}, f32p(op, "stats", stats, 3*N), int32(N))
}

func ceCheck(op string, V, vOff int) {
	if V <= 0 || vOff < 0 {
		panic(fmt.Sprintf("cuda: %s: bad chunk V=%d vOff=%d", op, V, vOff))
	}
}

// CrossEntropyChunk folds a vocabulary chunk (float32 or bfloat16
// logits) into stats.
func (b *Backend) CrossEntropyChunk(stats, logits, targets backend.Tensor, N, V, vOff int) {
	const op = "CrossEntropyChunk"
	ceCheck(op, V, vOff)
	if N == 0 {
		return
	}
	pl, done := b.f32View(op, "logits", logits, N*V, true, false)
	defer done()
	b.launch(op, "ce_chunk", Dim3{uint32(N), 1, 1}, Dim3{rowBlock, 1, 1}, f32p(op, "stats", stats, 3*N),
		pl, i32p(op, "targets", targets, N), int32(N), int32(V), int32(vOff))
}

// CrossEntropyLoss writes the per-row losses.
func (b *Backend) CrossEntropyLoss(losses, stats, targets backend.Tensor, N int) {
	const op = "CrossEntropyLoss"
	b.launch(op, "ce_loss", elemGrid(N), Dim3{elemBlock, 1, 1}, f32p(op, "losses", losses, N), f32p(op, "stats", stats, 3*N),
		i32p(op, "targets", targets, N), int32(N))
}

// CrossEntropyChunkBackward overwrites the chunk with its gradient
// (rounded to nearest even into bfloat16 logits).
func (b *Backend) CrossEntropyChunkBackward(logits, stats, targets backend.Tensor, N, V, vOff int, scale float32) {
	const op = "CrossEntropyChunkBackward"
	ceCheck(op, V, vOff)
	if N == 0 {
		return
	}
	pl, done := b.f32View(op, "logits", logits, N*V, true, true)
	defer done()
	b.launch(op, "ce_chunk_bwd", Dim3{uint32(N), 1, 1}, Dim3{rowBlock, 1, 1}, pl,
		f32p(op, "stats", stats, 3*N), i32p(op, "targets", targets, N), int32(N), int32(V), int32(vOff), scale)
}

// LayerNormForward: see backend.Backend.
func (b *Backend) LayerNormForward(out, mean, rstd, inp, weight, bias backend.Tensor, N, C int, eps float32) {
	const op = "LayerNormForward"
	if N == 0 {
		return
	}
	b.launch(op, "layernorm_fwd", Dim3{uint32(N), 1, 1}, Dim3{rowBlock, 1, 1}, f32p(op, "out", out, N*C),
		f32p(op, "mean", mean, N), f32p(op, "rstd", rstd, N), f32p(op, "inp", inp, N*C), f32p(op, "weight", weight, C),
		f32p(op, "bias", bias, C), int32(N), int32(C), eps)
}

// LayerNormBackward accumulates dinp, dweight and dbias.
func (b *Backend) LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd backend.Tensor, N, C int) {
	const op = "LayerNormBackward"
	if N == 0 {
		return
	}
	pdo, pin, pm, pr := f32p(op, "dout", dout, N*C), f32p(op, "inp", inp, N*C), f32p(op, "mean", mean, N), f32p(op, "rstd", rstd, N)
	b.launch(op, "layernorm_bwd_dx", Dim3{uint32(N), 1, 1}, Dim3{rowBlock, 1, 1}, f32p(op, "dinp", dinp, N*C),
		pdo, pin, f32p(op, "weight", weight, C), pm, pr, int32(N), int32(C))
	P := int(blocks(N, colRows))
	b.mu.Lock()
	defer b.mu.Unlock()
	pw := b.scratchBytes(2 * P * C * 8)
	pb := pw + uintptr(P*C*8)
	b.launch(op, "layernorm_dw_partial", Dim3{blocks(C, colBlock), uint32(P), 1}, Dim3{colBlock, 1, 1},
		pw, pb, pdo, pin, pm, pr, int32(N), int32(C), int32(colRows))
	b.colReduce(op, f32p(op, "dweight", dweight, C), pw, P, C)
	b.colReduce(op, f32p(op, "dbias", dbias, C), pb, P, C)
}

// BroadcastRows sets every row of out [N, C] to row.
func (b *Backend) BroadcastRows(out, row backend.Tensor, N, C int) {
	const op = "BroadcastRows"
	b.launch(op, "broadcast_rows", elemGrid(N*C), Dim3{elemBlock, 1, 1}, f32p(op, "out", out, N*C), f32p(op, "row", row, C), int32(N), int32(C))
}

// SumRows accumulates dst[j] += Σ_i src[i, j].
func (b *Backend) SumRows(dst, src backend.Tensor, N, C int) {
	const op = "SumRows"
	if N == 0 || C == 0 {
		return
	}
	P := int(blocks(N, colRows))
	b.mu.Lock()
	defer b.mu.Unlock()
	part := b.scratchBytes(P * C * 8)
	b.launch(op, "sum_rows_partial", Dim3{blocks(C, colBlock), uint32(P), 1}, Dim3{colBlock, 1, 1},
		part, f32p(op, "src", src, N*C), int32(N), int32(C), int32(colRows))
	b.colReduce(op, f32p(op, "dst", dst, C), part, P, C)
}

// Transpose writes out[b, c, r] = inp[b, r, c].
func (b *Backend) Transpose(out, inp backend.Tensor, B, R, C int) {
	const op = "Transpose"
	if B == 0 || R == 0 || C == 0 {
		return
	}
	n := B * R * C
	b.launch(op, "transpose_f32", Dim3{blocks(C, 32), blocks(R, 32), uint32(B)}, Dim3{32, 8, 1},
		f32p(op, "out", out, n), f32p(op, "inp", inp, n), int32(B), int32(R), int32(C))
}

// ChannelScaleAdd computes out = a + w[c]·x over [B, C, L].
func (b *Backend) ChannelScaleAdd(out, a, x, w backend.Tensor, B, C, L int) {
	const op = "ChannelScaleAdd"
	n := B * C * L
	b.launch(op, "channel_scale_add", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "out", out, n), f32p(op, "a", a, n),
		f32p(op, "x", x, n), f32p(op, "w", w, C), int32(B), int32(C), int32(L))
}

// ChannelScaleAddBackward accumulates dx and dw.
func (b *Backend) ChannelScaleAddBackward(dx, dw, dout, x, w backend.Tensor, B, C, L int) {
	const op = "ChannelScaleAddBackward"
	if C == 0 {
		return
	}
	n := B * C * L
	b.launch(op, "channel_scale_add_bwd", Dim3{uint32(C), 1, 1}, Dim3{rowBlock, 1, 1}, optF32(op, "dx", dx, n),
		optF32(op, "dw", dw, C), f32p(op, "dout", dout, n), f32p(op, "x", x, n), f32p(op, "w", w, C), int32(B), int32(C), int32(L))
}

// ShortConvForward is the causal depthwise convolution of width K.
func (b *Backend) ShortConvForward(out, inp, weight, bias backend.Tensor, B, C, L, K int) {
	const op = "ShortConvForward"
	n := B * C * L
	b.launch(op, "short_conv_fwd", elemGrid(n), Dim3{elemBlock, 1, 1}, f32p(op, "out", out, n), f32p(op, "inp", inp, n),
		f32p(op, "weight", weight, C*K), optF32(op, "bias", bias, C), int32(B), int32(C), int32(L), int32(K))
}

// ShortConvBackward accumulates dinp, dweight and dbias.
func (b *Backend) ShortConvBackward(dinp, dweight, dbias, dout, inp, weight backend.Tensor, B, C, L, K int) {
	const op = "ShortConvBackward"
	if C == 0 {
		return
	}
	n := B * C * L
	b.launch(op, "short_conv_bwd", Dim3{uint32(C), 1, 1}, Dim3{rowBlock, 1, 1}, optF32(op, "dinp", dinp, n),
		optF32(op, "dweight", dweight, C*K), optF32(op, "dbias", dbias, C), f32p(op, "dout", dout, n), f32p(op, "inp", inp, n),
		f32p(op, "weight", weight, C*K), int32(B), int32(C), int32(L), int32(K))
}

// ShortConvStep advances the convolution by one position.
func (b *Backend) ShortConvStep(out, state, inp, weight, bias backend.Tensor, B, C, K int) {
	const op = "ShortConvStep"
	b.launch(op, "short_conv_step", elemGrid(B*C), Dim3{elemBlock, 1, 1}, f32p(op, "out", out, B*C),
		f32p(op, "state", state, B*C*(K-1)), f32p(op, "inp", inp, B*C), f32p(op, "weight", weight, C*K),
		optF32(op, "bias", bias, C), int32(B), int32(C), int32(K))
}

// SinForward computes out = sin(freq[j]·inp).
func (b *Backend) SinForward(out, inp, freq backend.Tensor, N, C int) {
	const op = "SinForward"
	b.launch(op, "sin_fwd", elemGrid(N*C), Dim3{elemBlock, 1, 1}, f32p(op, "out", out, N*C), f32p(op, "inp", inp, N*C),
		f32p(op, "freq", freq, C), int32(N), int32(C))
}

// SinBackward accumulates dinp and dfreq.
func (b *Backend) SinBackward(dinp, dfreq, dout, inp, freq backend.Tensor, N, C int) {
	const op = "SinBackward"
	if N == 0 || C == 0 {
		return
	}
	pdo, pin, pf := f32p(op, "dout", dout, N*C), f32p(op, "inp", inp, N*C), f32p(op, "freq", freq, C)
	b.launch(op, "sin_bwd_dx", elemGrid(N*C), Dim3{elemBlock, 1, 1}, f32p(op, "dinp", dinp, N*C), pdo, pin, pf, int32(N), int32(C))
	P := int(blocks(N, colRows))
	b.mu.Lock()
	defer b.mu.Unlock()
	part := b.scratchBytes(P * C * 8)
	b.launch(op, "sin_dfreq_partial", Dim3{blocks(C, colBlock), uint32(P), 1}, Dim3{colBlock, 1, 1}, part, pdo, pin, pf, int32(N), int32(C), int32(colRows))
	b.colReduce(op, f32p(op, "dfreq", dfreq, C), part, P, C)
}
