package cpu

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
)

// ropeDims checks the RoPE dimensions and returns HD/2.
func ropeDims(op string, B, T, NH, HD int) int {
	if B < 0 || T < 0 || NH < 0 || HD < 0 || HD%2 != 0 {
		panic(fmt.Sprintf("cpu: %s: bad dimensions B=%d T=%d NH=%d HD=%d (HD must be even)", op, B, T, NH, HD))
	}
	return HD / 2
}

// RoPEForward rotates each pair (x[2i], x[2i+1]) of every head of inp
// [B, T, NH, HD] by the angle whose cosine and sine are cos[t, i] and
// sin[t, i] (tables [T, HD/2]), the interleaved complex-number layout of
// torchtitan and Meta's Llama:
//
//	out[2i]   = x[2i]*cos - x[2i+1]*sin
//	out[2i+1] = x[2i]*sin + x[2i+1]*cos
//
// out may alias inp; a bfloat16 out (mixed precision's queries and keys,
// read only by bfloat16 products) holds each result rounded to nearest
// even.
func (b *Backend) RoPEForward(out, inp, cos, sin backend.Tensor, B, T, NH, HD int) {
	const op = "RoPEForward"
	half := ropeDims(op, B, T, NH, HD)
	n := B * T * NH * HD
	o := outF32OrBF16(op, out, n)
	x := f32n(op, "inp", inp, n)
	cs := f32n(op, "cos", cos, T*half)
	sn := f32n(op, "sin", sin, T*half)
	row := NH * HD
	b.pool.For(B*T, rowGrain(row), func(lo, hi int) {
		var buf []float32 // whole heads, rounded into a bfloat16 out
		if o.h != nil && HD > 0 {
			buf = make([]float32, max(bf16Run/HD, 1)*HD)
		}
		for bt := lo; bt < hi; bt++ {
			t := bt % T
			c := cs[t*half : (t+1)*half]
			s := sn[t*half : (t+1)*half][:len(c)]
			xr := x[bt*row : (bt+1)*row]
			o.each(bt*row, row, buf, func(or []float32, j int) {
				xs, heads := xr[j:j+len(or)], len(or)/max(HD, 1)
				if !ropeFwdVec(or, xs, c, s, heads) {
					ropeFwdGo(or, xs, c, s, heads)
				}
			})
		}
	})
}

// RoPEBackward accumulates the inverse rotation of dout into dinp:
//
//	dinp[2i]   += d[2i]*cos + d[2i+1]*sin
//	dinp[2i+1] += d[2i+1]*cos - d[2i]*sin
//
// dinp must not alias dout.
func (b *Backend) RoPEBackward(dinp, dout, cos, sin backend.Tensor, B, T, NH, HD int) {
	const op = "RoPEBackward"
	half := ropeDims(op, B, T, NH, HD)
	n := B * T * NH * HD
	dx := f32n(op, "dinp", dinp, n)
	d := f32n(op, "dout", dout, n)
	cs := f32n(op, "cos", cos, T*half)
	sn := f32n(op, "sin", sin, T*half)
	row := NH * HD
	b.pool.For(B*T, rowGrain(row), func(lo, hi int) {
		for bt := lo; bt < hi; bt++ {
			t := bt % T
			c := cs[t*half : (t+1)*half]
			s := sn[t*half : (t+1)*half][:len(c)]
			dr, dxr := d[bt*row:(bt+1)*row], dx[bt*row:(bt+1)*row]
			if !ropeBwdVec(dxr, dr, c, s, NH) {
				ropeBwdGo(dxr, dr, c, s, NH)
			}
		}
	})
}

// ropeFwdGo is RoPEForward's scalar code for one row of nh heads of
// 2*len(c) elements. The float32 conversions keep the compiler from
// fusing a product into the addition (GOAMD64=v3 would), so that the
// vector kernel's separate multiplies and adds give the same bits.
func ropeFwdGo(o, x, c, s []float32, nh int) {
	hd := 2 * len(c)
	s = s[:len(c)]
	for h := 0; h < nh; h++ {
		xi := x[h*hd : (h+1)*hd]
		oi := o[h*hd : (h+1)*hd][:len(xi)]
		for i := range c {
			x0, x1 := xi[2*i], xi[2*i+1]
			oi[2*i] = float32(x0*c[i]) - float32(x1*s[i])
			oi[2*i+1] = float32(x0*s[i]) + float32(x1*c[i])
		}
	}
}

// ropeBwdGo is RoPEBackward's scalar code for one row of nh heads of
// 2*len(c) elements (float32 conversions as in ropeFwdGo).
func ropeBwdGo(dx, d, c, s []float32, nh int) {
	hd := 2 * len(c)
	s = s[:len(c)]
	for h := 0; h < nh; h++ {
		di := d[h*hd : (h+1)*hd]
		dxi := dx[h*hd : (h+1)*hd][:len(di)]
		for i := range c {
			d0, d1 := di[2*i], di[2*i+1]
			dxi[2*i] += float32(d0*c[i]) + float32(d1*s[i])
			dxi[2*i+1] += float32(d1*c[i]) - float32(d0*s[i])
		}
	}
}
