package cpu

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// rowGrain returns how many rows of width c make a worthwhile share of
// work for one worker in a memory-bound loop.
func rowGrain(c int) int {
	return max(1, elemGrain/max(c, 1))
}

// EmbeddingForward gathers out[i,:] = table[tokens[i],:] for N tokens of
// width C. It panics if a token is outside the table.
func (b *Backend) EmbeddingForward(out, table, tokens backend.Tensor, N, C int) {
	const op = "EmbeddingForward"
	o := f32n(op, "out", out, N*C)
	tab := f32(op, "table", table)
	tok := i32n(op, "tokens", tokens, N)
	rows := rowsOf(op, "table", len(tab), C)
	b.pool.For(N, rowGrain(C), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			t := checkToken(op, i, tok[i], rows)
			copy(o[i*C:(i+1)*C], tab[t*C:(t+1)*C])
		}
	})
}

// EmbeddingBackward accumulates dtable[tokens[i],:] += dout[i,:]. Workers
// split the C columns, so repeated tokens never race, and each element
// sums its contributions in token order whatever the thread count.
func (b *Backend) EmbeddingBackward(dtable, dout, tokens backend.Tensor, N, C int) {
	const op = "EmbeddingBackward"
	d := f32n(op, "dout", dout, N*C)
	tab := f32(op, "dtable", dtable)
	tok := i32n(op, "tokens", tokens, N)
	rows := rowsOf(op, "dtable", len(tab), C)
	for i, t := range tok {
		checkToken(op, i, t, rows)
	}
	// Column strips of 16 floats (one cache line) keep workers apart.
	const strip = 16
	strips := (C + strip - 1) / strip
	grain := max(1, elemGrain/max(N*strip, 1))
	b.pool.For(strips, grain, func(lo, hi int) {
		c0, c1 := lo*strip, min(hi*strip, C)
		for i, t := range tok {
			axpy(tab[int(t)*C+c0:int(t)*C+c1], 1, d[i*C+c0:i*C+c1])
		}
	})
}

// rowsOf returns how many rows of width c a tensor of n elements holds.
func rowsOf(op, name string, n, c int) int {
	if c <= 0 {
		panic(fmt.Sprintf("cpu: %s: row width %d", op, c))
	}
	return n / c
}

// checkToken panics unless token t at position i indexes one of rows rows.
func checkToken(op string, i int, t int32, rows int) int {
	if t < 0 || int(t) >= rows {
		panic(fmt.Sprintf("cpu: %s: token %d at position %d outside the %d-row table", op, t, i, rows))
	}
	return int(t)
}
