package cpu

import (
	"fmt"
	"math"

	"github.com/titan-go/titan/internal/backend"
)

// AdamW performs one step t (1-based) of PyTorch's torch.optim.AdamW on
// params with gradients grads*gradScale and moment buffers m and v.
//
// The arithmetic follows PyTorch's single-tensor float32 path operation by
// operation, with scalars formed in float64 and rounded to float32 where
// PyTorch passes Python floats to float32 kernels:
//
//	g  = grad * gradScale
//	p *= 1 - lr*weightDecay
//	m  = m*beta1 + (1-beta1)*g         (fused multiply-add, as ATen's vectorised add)
//	v  = v*beta2 + (1-beta2)*g*g
//	p += -(lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
//
// with bc1 = 1 - beta1^t and bc2 = 1 - beta2^t. Elements are independent,
// so the result does not depend on the thread count. On amd64 with AVX2
// and FMA a vector kernel does the same operations eight lanes at a time;
// it rounds the first moment once (a true fused multiply-add) where the
// scalar loop may round twice, so the two can differ by one ulp there.
func (b *Backend) AdamW(params, grads, m, v backend.Tensor, lr, beta1, beta2, eps, weightDecay, gradScale float32, t int) {
	const op = "AdamW"
	if t < 1 {
		panic(fmt.Sprintf("cpu: %s: step %d, want >= 1", op, t))
	}
	n := params.Len
	if grads.Len != n || m.Len != n || v.Len != n {
		panic(fmt.Sprintf("cpu: %s: lengths differ (params %d, grads %d, m %d, v %d)", op, n, grads.Len, m.Len, v.Len))
	}
	ps := f32(op, "params", params)
	gs := f32(op, "grads", grads)
	ms := f32(op, "m", m)
	vs := f32(op, "v", v)

	decay := float32(1 - float64(lr)*float64(weightDecay))
	b1, b2 := beta1, beta2
	omb1 := float64(float32(1 - float64(beta1)))
	omb2 := float32(1 - float64(beta2))
	bc1 := 1 - math.Pow(float64(beta1), float64(t))
	bc2 := 1 - math.Pow(float64(beta2), float64(t))
	negStep := float32(-(float64(lr) / bc1))
	bc2Sqrt := float32(math.Sqrt(bc2))

	var k [adamwConsts][8]float32
	for r, c := range [adamwConsts]float32{gradScale, decay, b1, float32(omb1), b2, omb2, bc2Sqrt, eps, negStep} {
		for j := range k[r] {
			k[r][j] = c
		}
	}
	b.pool.For(n, elemGrain/2, func(lo, hi int) {
		lo += adamwBlocks(ps[lo:hi], gs[lo:hi], ms[lo:hi], vs[lo:hi], &k)
		ps := ps[lo:hi]
		gs := gs[lo:hi][:len(ps)]
		ms := ms[lo:hi][:len(ps)]
		vs := vs[lo:hi][:len(ps)]
		for i := range ps {
			g := gs[i] * gradScale
			p := ps[i] * decay
			// m*beta1 rounds to float32; g*(1-beta1) is exact in float64,
			// so the float64 add rounds once, like a fused multiply-add.
			mi := float32(float64(g)*omb1 + float64(ms[i]*b1))
			vi := vs[i]*b2 + omb2*g*g
			denom := float32(math.Sqrt(float64(vi)))/bc2Sqrt + eps
			ps[i] = p + negStep*mi/denom
			ms[i] = mi
			vs[i] = vi
		}
	})
}
