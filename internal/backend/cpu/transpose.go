package cpu

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// transposeTile is the edge of the square tiles Transpose copies, so
// that both the rows read and the rows written stay in cache.
const transposeTile = 32

// Transpose writes out[b, c, r] = inp[b, r, c] for B matrices of R×C
// elements. out must not alias inp.
func (b *Backend) Transpose(out, inp backend.Tensor, B, R, C int) {
	const op = "Transpose"
	n := B * R * C
	o := f32n(op, "out", out, n)
	x := f32n(op, "inp", inp, n)
	if n > 0 && out.Mem == inp.Mem && out.Off < inp.Off+n && inp.Off < out.Off+n {
		panic(fmt.Sprintf("cpu: %s: out and inp overlap", op))
	}
	rt := (R + transposeTile - 1) / transposeTile
	ct := (C + transposeTile - 1) / transposeTile
	tiles := B * rt * ct
	b.pool.For(tiles, max(1, elemGrain/(transposeTile*transposeTile)), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			bi := t / (rt * ct)
			r0 := (t / ct % rt) * transposeTile
			c0 := (t % ct) * transposeTile
			r1, c1 := min(r0+transposeTile, R), min(c0+transposeTile, C)
			xb, ob := x[bi*R*C:(bi+1)*R*C], o[bi*R*C:(bi+1)*R*C]
			for r := r0; r < r1; r++ {
				row := xb[r*C : r*C+c1]
				for c := c0; c < c1; c++ {
					ob[c*R+r] = row[c]
				}
			}
		}
	})
}
