package cpu

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu/gemm"
	"github.com/titan-go/titan/internal/numeric"
)

// Causal grouped-query attention in the manner of FlashAttention-2:
// queries and keys are cut into tiles of attnTile positions; a worker
// takes a query tile of one head, multiplies it with the key tiles it can
// see using gemm.Sgemm (single-threaded, as the worker is already one of
// many) and keeps an online softmax, so no Tq×Tk matrix is ever held. The
// backward recomputes each probability tile from q, k and the saved
// log-sum-exp.
//
// Query i sees keys 0..visible(i)-1, a prefix of the keys, so a pair of
// tiles is either skipped (nothing visible) or computed with its rows and
// columns trimmed to the visible part, each row then cut at its own
// column count.

// attnGeom is the geometry of one attention call.
type attnGeom struct {
	backend.AttentionDims
	tile       int
	nqt, nkt   int // query and key tiles
	qRow, kRow int // elements between consecutive positions of q and k
	group      int // query heads per key/value head
	scale      float32
}

// newAttnGeom checks d and returns its geometry for tiles of tile positions.
func newAttnGeom(op string, d backend.AttentionDims, tile int) attnGeom {
	if d.B < 0 || d.Tq < 0 || d.Tk < 0 || d.NH <= 0 || d.NKV <= 0 || d.HD <= 0 || d.NH%d.NKV != 0 {
		panic(fmt.Sprintf("cpu: %s: bad dimensions %+v (NH must be a positive multiple of NKV)", op, d))
	}
	return attnGeom{
		AttentionDims: d,
		tile:          tile,
		nqt:           (d.Tq + tile - 1) / tile,
		nkt:           (d.Tk + tile - 1) / tile,
		qRow:          d.NH * d.HD,
		kRow:          d.NKV * d.HD,
		group:         d.NH / d.NKV,
		scale:         float32(1 / math.Sqrt(float64(d.HD))),
	}
}

// mat is one of the matrices attention multiplies: float32, or bfloat16
// (q, k and v of a BF16 call may be, see backend.AttentionDims).
type mat struct {
	f []float32
	h []uint16
}

// f32Mat is the float32 matrix x.
func f32Mat(x []float32) mat { return mat{f: x} }

// attnMat returns the first n elements of q, k or v: float32, or
// bfloat16 when the call's products are (d.BF16).
func attnMat(op, name string, t backend.Tensor, n int, d backend.AttentionDims) mat {
	if t.Mem == nil || t.DType() != backend.BFloat16 {
		return mat{f: f32n(op, name, t, n)}
	}
	if !d.BF16 {
		panic(fmt.Sprintf("cpu: %s: %s is bfloat16 but the products are float32 (AttentionDims.BF16 unset)", op, name))
	}
	h := u16(op, name, t)
	if len(h) < n {
		panic(fmt.Sprintf("cpu: %s: %s has %d elements, need %d", op, name, len(h), n))
	}
	return mat{h: h[:n:n]}
}

// operand is the n elements of x from off as a bfloat16 product's operand.
func (x mat) operand(off, n int) gemm.Operand {
	if x.h != nil {
		if n == 0 {
			return gemm.BF16(nil)
		}
		return gemm.BF16(x.h[off : off+n : off+n])
	}
	return gemm.F32(window(x.f, off, n))
}

// mm is the tiles' product: sgemm, or with BF16 its bfloat16 twin (the
// only one that takes bfloat16 matrices).
func (g *attnGeom) mm(transA, transB bool, m, n, k int, alpha float32,
	a mat, aOff, lda int, b mat, bOff, ldb int, beta float32, c []float32, cOff, ldc int) {
	if !g.BF16 {
		sgemm(transA, transB, m, n, k, alpha, a.f, aOff, lda, b.f, bOff, ldb, beta, c, cOff, ldc)
		return
	}
	sa, sb, sc := gemmSpans("attention", transA, transB, m, n, k, lda, ldb, ldc)
	gemm.GemmBF16(nil, transA, transB, m, n, k, alpha, a.operand(aOff, sa), lda, b.operand(bOff, sb), ldb, beta, gemm.F32(window(c, cOff, sc)), ldc)
}

// rowsNT computes the scores-like product c = alpha·X Yᵀ of the tile's
// query rows r0..rows-1 (x, rows of head h of batch bi from query i0)
// with its cols keys (y from offset yOff) into c (leading dimension
// tile, row 0 for query row r0), rows below cut.mid over cut.c1 keys
// only.
func (g *attnGeom) rowsNT(cut attnCut, r0, rows, cols, k int, alpha float32, x mat, bi, i0, h int, y mat, yOff int, c []float32) {
	T := g.tile
	g.mm(false, true, cut.mid-r0, cut.c1, k, alpha, x, g.qOff(bi, i0+r0, h), g.qRow, y, yOff, g.kRow, 0, c, 0, T)
	if cut.mid < rows {
		g.mm(false, true, rows-cut.mid, cols, k, alpha, x, g.qOff(bi, i0+cut.mid, h), g.qRow, y, yOff, g.kRow, 0, c, (cut.mid-r0)*T, T)
	}
}

// rowsNN accumulates out = alpha·S Y + beta·out for the tile's query
// rows r0..rows-1: s holds them from its row 0 (leading dimension tile)
// over cols keys, y the keys from offset yOff, out the tile's rows, row
// r at oOff + r·ldo. Rows below cut.mid sum over cut.c1 keys only.
func (g *attnGeom) rowsNN(cut attnCut, r0, rows, cols int, alpha float32, s []float32, y mat, yOff int, beta float32, out []float32, oOff, ldo int) {
	T, HD := g.tile, g.HD
	g.mm(false, false, cut.mid-r0, HD, cut.c1, alpha, f32Mat(s), 0, T, y, yOff, g.kRow, beta, out, oOff+r0*ldo, ldo)
	if cut.mid < rows {
		g.mm(false, false, rows-cut.mid, HD, cols, alpha, f32Mat(s), (cut.mid-r0)*T, T, y, yOff, g.kRow, beta, out, oOff+cut.mid*ldo, ldo)
	}
}

// keysTN accumulates dst += alpha·Sᵀ X for the cols keys of the tile
// starting at key j0 of key/value head kvh of batch kb: s holds query
// rows r0..rows-1 from its row 0 (leading dimension tile), x those rows
// of head h of batch bi from query i0. Keys from cut.c1 on sum over the
// rows from cut.rs only.
func (g *attnGeom) keysTN(cut attnCut, r0, rows, cols int, alpha float32, s []float32, x mat, bi, i0, h int, dst []float32, kb, j0, kvh int) {
	T, HD := g.tile, g.HD
	g.mm(true, false, cut.c1, HD, rows-r0, alpha, f32Mat(s), 0, T, x, g.qOff(bi, i0+r0, h), g.qRow, 1, dst, g.kOff(kb, j0, kvh), g.kRow)
	if cut.c1 < cols && cut.rs < rows {
		g.mm(true, false, cols-cut.c1, HD, rows-cut.rs, alpha, f32Mat(s), (cut.rs-r0)*T+cut.c1, T, x, g.qOff(bi, i0+cut.rs, h), g.qRow, 1, dst, g.kOff(kb, j0+cut.c1, kvh), g.kRow)
	}
}

// visible is the number of keys query i attends to.
func (g *attnGeom) visible(i int) int {
	return min(max(g.QPos+i-g.KPos+1, 0), g.Tk)
}

// firstQuery is the first query that attends to key j (Tq or more if
// none does).
func (g *attnGeom) firstQuery(j int) int {
	return max(j+g.KPos-g.QPos, 0)
}

// A cut of a pair of tiles that crosses the diagonal: rows r0..mid-1 of
// the query tile see at most the first c1 of its cols keys, and keys
// c1..cols-1 are seen only from row rs on. The products then skip the
// masked corner: for each product, either the rows below mid multiply
// only c1 columns (S = Q Kᵀ, dP = dO Vᵀ; P V and dS K with a shorter
// inner dimension) or the keys past c1 only rows from rs (Pᵀ dO, dSᵀ Q
// with a later start of the inner dimension). The terms left out are
// products with masked, zero probabilities; rs keeps the inner dimension
// of those products at an even offset from r0, so that the bfloat16
// kernel multiplies the same pairs of rows. Without a useful cut, mid is
// rows, c1 cols and rs r0.
type attnCut struct{ mid, c1, rs int }

// cut returns the cut of query rows r0..rows-1 of the tile starting at
// query i0 with the cols keys starting at key j0.
func (g *attnGeom) cut(i0, j0, r0, rows, cols int) attnCut {
	none := attnCut{rows, cols, r0}
	mid := r0 + (rows-r0+1)/2
	if mid >= rows {
		return none
	}
	c1 := min(cols, g.visible(i0+mid-1)-j0)
	if c1 >= cols {
		return none
	}
	rs := r0 + (max(0, g.firstQuery(j0+c1)-i0-r0))/2*2
	return attnCut{mid, c1, min(rs, rows)}
}

// qOff is the offset of q[b, i, h, 0] (also of out, dq and dout).
func (g *attnGeom) qOff(b, i, h int) int { return ((b*g.Tq+i)*g.NH + h) * g.HD }

// kOff is the offset of k[b, j, kvh, 0] (also of v, dk and dv).
func (g *attnGeom) kOff(b, j, kvh int) int { return ((b*g.Tk+j)*g.NKV + kvh) * g.HD }

// lseOff is the offset of lse[b, h, i].
func (g *attnGeom) lseOff(b, h, i int) int { return (b*g.NH+h)*g.Tq + i }

// AttentionForward computes out = softmax(q k^T / sqrt(HD) + causal mask) v
// and lse, each row's log-sum-exp of the scaled scores. Rows that see no
// key get out = 0 and lse = -Inf. Each output row is computed by one
// worker in a fixed order, so the result does not depend on the thread
// count. A bfloat16 out receives the float32 result rounded to nearest
// even: a tile's rows accumulate in the worker's float32 scratch.
func (b *Backend) AttentionForward(out, lse, q, k, v backend.Tensor, d backend.AttentionDims) {
	const op = "AttentionForward"
	g := newAttnGeom(op, d, b.attnTile)
	nq, nk := d.B*d.Tq*g.qRow, d.B*d.Tk*g.kRow
	o := outF32OrBF16(op, out, nq)
	ls := f32n(op, "lse", lse, d.B*d.NH*d.Tq)
	qs := attnMat(op, "q", q, nq, d)
	ks := attnMat(op, "k", k, nk, d)
	vs := attnMat(op, "v", v, nk, d)

	b.mu.Lock()
	defer b.mu.Unlock()
	bh := d.B * d.NH
	n := g.tile*g.tile + 3*g.tile
	if o.h != nil {
		n += g.tile * d.HD // the tile's float32 rows
	}
	// Later query tiles see more keys: hand them out first.
	b.forItems(bh*g.nqt, func(w, it int) {
		qt := g.nqt - 1 - it/bh
		bi, h := it%bh/d.NH, it%d.NH
		g.forwardTile(b.workerScratch(w, n), o, ls, qs, ks, vs, bi, h, qt)
	})
}

// forwardTile computes the rows of query tile qt of head h of batch bi:
// in place in a float32 out, or in buf's float32 rows, rounded into a
// bfloat16 out at the end.
func (g *attnGeom) forwardTile(buf []float32, out outBuf, ls []float32, qs, ks, vs mat, bi, h, qt int) {
	T, HD := g.tile, g.HD
	kvh := h / g.group
	i0 := qt * T
	rows := min(T, g.Tq-i0)
	last := g.visible(i0 + rows - 1) // keys [0, last) matter to this tile
	first := rows                    // rows [0, first) see no key at all
	if last > 0 {
		first = max(0, g.firstQuery(0)-i0)
	}
	negInf := float32(math.Inf(-1))
	for r := 0; r < first; r++ {
		off := g.qOff(bi, i0+r, h)
		if out.h != nil {
			clear(out.h[off : off+HD])
		} else {
			clear(out.f32[off : off+HD])
		}
		ls[g.lseOff(bi, h, i0+r)] = negInf
	}
	if first == rows {
		return
	}
	s := buf[:T*T]
	m := buf[T*T : T*T+T]
	l := buf[T*T+T : T*T+2*T]
	alpha := buf[T*T+2*T : T*T+3*T]
	// Row r of the tile's output is o[oOff+r·ld:][:HD].
	o, oOff, ld := out.f32, g.qOff(bi, i0, h), g.qRow
	if out.h != nil {
		o, oOff, ld = buf[T*T+3*T:T*T+3*T+T*HD], 0, HD
	}
	for r := first; r < rows; r++ {
		m[r], l[r] = negInf, 0
	}
	for j0 := 0; j0 < last; j0 += T {
		cols := min(T, last-j0)
		r0 := max(0, g.firstQuery(j0)-i0) // rows r0.. see key j0
		cut := g.cut(i0, j0, r0, rows, cols)
		// S = scale * Q K^T for rows r0.. and the visible columns.
		g.rowsNT(cut, r0, rows, cols, HD, g.scale, qs, bi, i0, h, ks, g.kOff(bi, j0, kvh), s)
		for r := r0; r < rows; r++ {
			c := min(cols, g.visible(i0+r)-j0)
			row := s[(r-r0)*T : (r-r0)*T+cols]
			mOld := m[r]
			mNew := rowMax(row[:c])
			if mOld > mNew {
				mNew = mOld
			}
			sum := expShiftSum(row[:c], mNew)
			clear(row[c:])
			corr := expf(mOld - mNew) // 0 on a row's first tile
			l[r] = l[r]*corr + sum
			m[r] = mNew
			alpha[r] = corr
		}
		var beta float32
		if j0 > 0 {
			beta = 1
			for r := r0; r < rows; r++ {
				if alpha[r] != 1 {
					off := oOff + r*ld
					scale(o[off:off+HD], alpha[r])
				}
			}
		}
		// O = O*alpha + P V.
		g.rowsNN(cut, r0, rows, cols, 1, s, vs, g.kOff(bi, j0, kvh), beta, o, oOff, ld)
	}
	for r := first; r < rows; r++ {
		off := oOff + r*ld
		scale(o[off:off+HD], 1/l[r])
		ls[g.lseOff(bi, h, i0+r)] = float32(float64(m[r]) + math.Log(float64(l[r])))
		if out.h != nil {
			dst := g.qOff(bi, i0+r, h)
			numeric.Float32sToBF16(out.h[dst:dst+HD], o[off:off+HD])
		}
	}
}

// AttentionBackward accumulates dq, dk and dv. It recomputes, tile by
// tile, P = exp(scale q k^T - lse), dP = dout v^T and dS = P*(dP - D) with
// D = rowsum(dout*out), and adds dv += P^T dout, dk += scale dS^T q and
// dq += scale dS k. out is float32, or bfloat16 (AttentionForward's
// rounded output), widened exactly for D.
//
// Two strategies share the work. When the (batch, key/value head) pairs
// balance over the workers, one worker owns a pair with all its key tiles
// and computes dq, dk and dv together. Otherwise one pass over (batch,
// key/value head, key tile) computes dk and dv, and a second over (batch,
// head, query tile) recomputes the tiles for dq. Both perform the same
// products on the same tiles and accumulate every gradient element in the
// same order, so the result depends neither on the strategy nor on the
// thread count.
func (b *Backend) AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse backend.Tensor, d backend.AttentionDims) {
	const op = "AttentionBackward"
	g := newAttnGeom(op, d, b.attnTile)
	nq, nk := d.B*d.Tq*g.qRow, d.B*d.Tk*g.kRow
	a := attnBackwardArgs{
		dq:   f32n(op, "dq", dq, nq),
		dk:   f32n(op, "dk", dk, nk),
		dv:   f32n(op, "dv", dv, nk),
		dout: f32Mat(f32n(op, "dout", dout, nq)),
		q:    attnMat(op, "q", q, nq, d),
		k:    attnMat(op, "k", k, nk, d),
		v:    attnMat(op, "v", v, nk, d),
		lse:  f32n(op, "lse", lse, d.B*d.NH*d.Tq),
	}
	o := outF32OrBF16(op, out, nq)

	b.mu.Lock()
	defer b.mu.Unlock()
	// D[b, h, i] = dout[b, i, h, :] . out[b, i, h, :]
	a.D = b.sharedScratch(d.B * d.NH * d.Tq)
	b.pool.For(d.B*d.Tq, rowGrain(g.qRow), func(lo, hi int) {
		var wide []float32 // a bfloat16 out's row, widened
		if o.h != nil {
			wide = make([]float32, d.HD)
		}
		for bt := lo; bt < hi; bt++ {
			bi, i := bt/d.Tq, bt%d.Tq
			for h := 0; h < d.NH; h++ {
				off := g.qOff(bi, i, h)
				row := wide
				if o.h != nil {
					numeric.BF16sToFloat32(wide, o.h[off:off+d.HD])
				} else {
					row = o.f32[off : off+d.HD]
				}
				a.D[g.lseOff(bi, h, i)] = dot(a.dout.f[off:off+d.HD], row)
			}
		}
	})
	scratch := 2 * g.tile * g.tile
	pairs := d.B * d.NKV
	threads := b.pool.Size()
	fused := pairs >= 2*threads || pairs%threads == 0
	if b.attnFusedMin > 0 {
		fused = pairs >= b.attnFusedMin
	}
	if fused {
		b.forItems(pairs, func(w, it int) {
			buf := b.workerScratch(w, scratch)
			for kt := 0; kt < g.nkt; kt++ {
				g.backwardKV(buf, &a, it/d.NKV, it%d.NKV, kt, true)
			}
		})
		return
	}
	// Earlier key tiles are seen by more queries: hand them out first.
	b.forItems(pairs*g.nkt, func(w, it int) {
		g.backwardKV(b.workerScratch(w, scratch), &a, it%pairs/d.NKV, it%d.NKV, it/pairs, false)
	})
	bh := d.B * d.NH
	b.forItems(bh*g.nqt, func(w, it int) {
		g.backwardQ(b.workerScratch(w, scratch), &a, it%bh/d.NH, it%d.NH, g.nqt-1-it/bh)
	})
}

// attnBackwardArgs holds the slices of one AttentionBackward call.
type attnBackwardArgs struct {
	dq, dk, dv, lse []float32
	dout, q, k, v   mat
	D               []float32 // rowsum(dout*out), laid out like lse
}

// backwardKV accumulates into dk and dv the key tile kt of key/value head
// kvh of batch bi, over every query head of its group and every query
// tile that sees it; withDQ also accumulates dq for those query tiles.
func (g *attnGeom) backwardKV(buf []float32, a *attnBackwardArgs, bi, kvh, kt int, withDQ bool) {
	T := g.tile
	j0 := kt * T
	kOff := g.kOff(bi, j0, kvh)
	for h := kvh * g.group; h < (kvh+1)*g.group; h++ {
		for qt := g.firstQuery(j0) / T; qt < g.nqt; qt++ {
			i0 := qt * T
			r0, nr, cols := g.backwardTile(buf, a, bi, h, i0, j0)
			if nr == 0 {
				continue
			}
			cut := g.cut(i0, j0, r0, r0+nr, cols)
			sP, sDS := buf[:T*T], buf[T*T:2*T*T]
			// dV += P^T dO
			g.keysTN(cut, r0, r0+nr, cols, 1, sP, a.dout, bi, i0, h, a.dv, bi, j0, kvh)
			// dK += scale dS^T Q
			g.keysTN(cut, r0, r0+nr, cols, g.scale, sDS, a.q, bi, i0, h, a.dk, bi, j0, kvh)
			if withDQ {
				// dQ += scale dS K
				g.rowsNN(cut, r0, r0+nr, cols, g.scale, sDS, a.k, kOff, 1, a.dq, g.qOff(bi, i0, h), g.qRow)
			}
		}
	}
}

// backwardQ accumulates into dq query tile qt of head h of batch bi.
func (g *attnGeom) backwardQ(buf []float32, a *attnBackwardArgs, bi, h, qt int) {
	T := g.tile
	i0 := qt * T
	rows := min(T, g.Tq-i0)
	last := g.visible(i0 + rows - 1)
	kvh := h / g.group
	for j0 := 0; j0 < last; j0 += T {
		r0, nr, cols := g.backwardTile(buf, a, bi, h, i0, j0)
		if nr == 0 {
			continue
		}
		cut := g.cut(i0, j0, r0, r0+nr, cols)
		g.rowsNN(cut, r0, r0+nr, cols, g.scale, buf[T*T:2*T*T], a.k, g.kOff(bi, j0, kvh), 1, a.dq, g.qOff(bi, i0, h), g.qRow)
	}
}

// backwardTile recomputes, for the query tile starting at row i0 of head h
// and the key tile starting at key j0, the probabilities P (into buf[:T*T])
// and dS = P*(dP - D) (into buf[T*T:2*T*T]), both with leading dimension T.
// Only rows r0..r0+nr-1 of the query tile and the first cols keys of the
// key tile can be visible; entries outside the mask are zero. nr is zero
// when the tiles do not interact.
func (g *attnGeom) backwardTile(buf []float32, a *attnBackwardArgs, bi, h, i0, j0 int) (r0, nr, cols int) {
	T, HD := g.tile, g.HD
	rows := min(T, g.Tq-i0)
	last := g.visible(i0 + rows - 1)
	if last <= j0 {
		return 0, 0, 0
	}
	kvh := h / g.group
	cols = min(T, last-j0)
	r0 = max(0, g.firstQuery(j0)-i0)
	nr = rows - r0
	sP, sDS := buf[:T*T], buf[T*T:2*T*T]
	kOff := g.kOff(bi, j0, kvh)
	cut := g.cut(i0, j0, r0, rows, cols)
	// S = scale Q K^T and dP = dO V^T.
	g.rowsNT(cut, r0, rows, cols, HD, g.scale, a.q, bi, i0, h, a.k, kOff, sP)
	g.rowsNT(cut, r0, rows, cols, HD, 1, a.dout, bi, i0, h, a.v, kOff, sDS)
	for r := r0; r < rows; r++ {
		c := min(cols, g.visible(i0+r)-j0)
		lse := a.lse[g.lseOff(bi, h, i0+r)]
		dd := a.D[g.lseOff(bi, h, i0+r)]
		ps := sP[(r-r0)*T : (r-r0)*T+cols]
		ds := sDS[(r-r0)*T : (r-r0)*T+cols][:len(ps)]
		expShiftSum(ps[:c], lse)
		for x, e := range ps[:c] {
			ds[x] = e * (ds[x] - dd)
		}
		clear(ps[c:])
		clear(ds[c:])
	}
	return r0, nr, cols
}
