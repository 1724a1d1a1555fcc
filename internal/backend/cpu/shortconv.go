package cpu

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// checkWidth panics unless the convolution width K is positive.
func checkWidth(op string, K int) {
	if K < 1 {
		panic(fmt.Sprintf("cpu: %s: convolution width %d", op, K))
	}
}

// ShortConvForward computes the causal depthwise convolution
// out[b,c,t] = bias[c] + Σ_{k<K} weight[c,k]·inp[b,c,t-K+1+k] over
// channel-major [B, C, L] buffers (inputs before t = 0 are zero). out
// must not alias inp.
func (b *Backend) ShortConvForward(out, inp, weight, bias backend.Tensor, B, C, L, K int) {
	const op = "ShortConvForward"
	checkWidth(op, K)
	n := B * C * L
	o := f32n(op, "out", out, n)
	x := f32n(op, "inp", inp, n)
	w := f32n(op, "weight", weight, C*K)
	bs := f32n(op, "bias", bias, C)
	b.pool.For(B*C, rowGrain(L*K), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			c := r % C
			wc := w[c*K : (c+1)*K]
			xi, oi := x[r*L:(r+1)*L], o[r*L:(r+1)*L]
			for t := range oi {
				s := bs[c]
				j0 := t - K + 1
				for k, wk := range wc {
					if j := j0 + k; j >= 0 {
						s += wk * xi[j]
					}
				}
				oi[t] = s
			}
		}
	})
}

// ShortConvBackward accumulates
//
//	dinp[b,c,j]  += Σ_k weight[c,k]·dout[b,c,j+K-1-k]   (j+K-1-k < L)
//	dweight[c,k] += Σ_{b,t} dout[b,c,t]·inp[b,c,t-K+1+k]
//	dbias[c]     += Σ_{b,t} dout[b,c,t]
//
// Each channel is one work item and sums over b then t in float64, so
// the result does not depend on the thread count.
func (b *Backend) ShortConvBackward(dinp, dweight, dbias, dout, inp, weight backend.Tensor, B, C, L, K int) {
	const op = "ShortConvBackward"
	checkWidth(op, K)
	n := B * C * L
	dx := f32n(op, "dinp", dinp, n)
	dw := f32n(op, "dweight", dweight, C*K)
	db := f32n(op, "dbias", dbias, C)
	d := f32n(op, "dout", dout, n)
	x := f32n(op, "inp", inp, n)
	w := f32n(op, "weight", weight, C*K)
	b.pool.For(C, max(1, rowGrain(B*L*K)), func(lo, hi int) {
		acc := make([]float64, K)
		for c := lo; c < hi; c++ {
			wc := w[c*K : (c+1)*K]
			clear(acc)
			var sb float64
			for bi := 0; bi < B; bi++ {
				r := (bi*C + c) * L
				di, xi, dxi := d[r:r+L], x[r:r+L], dx[r:r+L]
				for t, g := range di {
					sb += float64(g)
					for k := range K {
						if j := t - K + 1 + k; j >= 0 {
							acc[k] += float64(g) * float64(xi[j])
							dxi[j] += wc[k] * g
						}
					}
				}
			}
			db[c] += float32(sb)
			for k, v := range acc {
				dw[c*K+k] += float32(v)
			}
		}
	})
}

// ShortConvStep advances the convolution by one position: state
// [B, C, K-1] holds each channel's last K-1 inputs, oldest first, and inp
// [B, C] the new ones. It writes out[b,c] = bias[c] +
// Σ_{k<K-1} weight[c,k]·state[b,c,k] + weight[c,K-1]·inp[b,c] and shifts
// inp into the state. A fresh sequence starts from a zero state.
func (b *Backend) ShortConvStep(out, state, inp, weight, bias backend.Tensor, B, C, K int) {
	const op = "ShortConvStep"
	checkWidth(op, K)
	o := f32n(op, "out", out, B*C)
	st := f32n(op, "state", state, B*C*(K-1))
	x := f32n(op, "inp", inp, B*C)
	w := f32n(op, "weight", weight, C*K)
	bs := f32n(op, "bias", bias, C)
	b.pool.For(B*C, rowGrain(K), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			c := r % C
			wc := w[c*K : (c+1)*K]
			sr := st[r*(K-1) : (r+1)*(K-1)]
			// The same order of operations as ShortConvForward.
			s := bs[c]
			for k, v := range sr {
				s += wc[k] * v
			}
			o[r] = s + wc[K-1]*x[r]
			if K > 1 {
				copy(sr, sr[1:])
				sr[K-2] = x[r]
			}
		}
	})
}
