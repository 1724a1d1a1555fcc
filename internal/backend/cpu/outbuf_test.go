package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/numeric"
)

// TestBF16Outputs checks the bfloat16 outputs of RMSNormForward and
// SwiGLUForward: each element is the float32 output rounded to nearest
// even, bit for bit, over lengths around the bfloat16 runs (bf16Run) and
// the vector blocks, on 1 to 3 threads; rstd is the same either way.
func TestBF16Outputs(t *testing.T) {
	for _, threads := range []int{1, 2, 3} {
		be := newTestBackend(t, threads)
		r := newRand(uint64(threads))
		for _, C := range []int{1, 15, 16, 17, 255, 256, 257, 700} {
			t.Run(fmt.Sprintf("threads=%d/C=%d", threads, C), func(t *testing.T) {
				N := 5
				x, w := upload(be, randF32(r, N*C, 3)), upload(be, randF32(r, C, 1))
				out, rstd := be.Alloc(backend.Float32, N*C), be.Alloc(backend.Float32, N)
				outH, rstdH := be.Alloc(backend.BFloat16, N*C), be.Alloc(backend.Float32, N)
				be.RMSNormForward(out, rstd, x, w, N, C, 1e-5)
				be.RMSNormForward(outH, rstdH, x, w, N, C, 1e-5)
				sameRounding(t, "RMSNormForward", be, outH, download(be, out))
				sameBits(t, "rstd", download(be, rstdH), download(be, rstd))

				n := N*C + 3
				g, u := upload(be, randF32(r, n, 4)), upload(be, randF32(r, n, 1))
				h, hH := be.Alloc(backend.Float32, n), be.Alloc(backend.BFloat16, n)
				be.SwiGLUForward(h, g, u, n)
				be.SwiGLUForward(hH, g, u, n)
				sameRounding(t, "SwiGLUForward", be, hH, download(be, h))
			})
		}
	}
}

// sameRounding fails the test unless the bfloat16 tensor got holds
// numeric.Float32ToBF16 of every element of want.
func sameRounding(t *testing.T, name string, be *Backend, got backend.Tensor, want []float32) {
	t.Helper()
	h := make([]uint16, got.Len)
	be.Download(h, got)
	for i, v := range want {
		if w := numeric.Float32ToBF16(v); h[i] != w {
			t.Fatalf("%s[%d] = %#04x, want %#04x (the rounding of %v)", name, i, h[i], w, v)
		}
	}
}

// TestBF16QKV checks attention with bfloat16 queries, keys and values
// against the same call on their float32 values: the products round
// float32 operands to bfloat16 anyway, so the outputs, log-sum-exps and
// gradients are bit for bit the same, tiny (subnormal after rounding)
// inputs included; RoPEForward's and Copy's bfloat16 outputs are the
// roundings of their float32 ones.
func TestBF16QKV(t *testing.T) {
	be := newTestBackend(t, 2)
	be.attnTile = 16 // several tiles at this size
	r := newRand(9)
	d := backend.AttentionDims{B: 2, Tq: 40, Tk: 40, NH: 4, NKV: 2, HD: 16, BF16: true}
	nq, nk := d.B*d.Tq*d.NH*d.HD, d.B*d.Tk*d.NKV*d.HD
	qf, kf, vf := randF32(r, nq, 1), randF32(r, nk, 1), randF32(r, nk, 1)
	qf[3], kf[5], vf[7] = 1e-39, -3e-40, 1e-41 // below bfloat16's normals
	half := func(x []float32) backend.Tensor {
		t := be.Alloc(backend.BFloat16, len(x))
		be.Copy(t, upload(be, x))
		return t
	}
	q, k, v := upload(be, qf), upload(be, kf), upload(be, vf)
	qh, kh, vh := half(qf), half(kf), half(vf)
	sameRounding(t, "Copy", be, qh, qf)
	run := func(q, k, v backend.Tensor) [5][]float32 {
		out, lse := be.Alloc(backend.Float32, nq), be.Alloc(backend.Float32, d.B*d.NH*d.Tq)
		be.AttentionForward(out, lse, q, k, v, d)
		dout := upload(be, randF32(newRand(10), nq, 1))
		dq, dk, dv := be.Alloc(backend.Float32, nq), be.Alloc(backend.Float32, nk), be.Alloc(backend.Float32, nk)
		be.AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, d)
		return [5][]float32{download(be, out), download(be, lse), download(be, dq), download(be, dk), download(be, dv)}
	}
	want, got := run(q, k, v), run(qh, kh, vh)
	for i, name := range []string{"out", "lse", "dq", "dk", "dv"} {
		sameBits(t, name, got[i], want[i])
	}

	B, T, NH, HD := 2, 5, 3, 8
	n := B * T * NH * HD
	x := upload(be, randF32(r, n, 2))
	cs, sn := upload(be, randF32(r, T*HD/2, 1)), upload(be, randF32(r, T*HD/2, 1))
	o, oh := be.Alloc(backend.Float32, n), be.Alloc(backend.BFloat16, n)
	be.RoPEForward(o, x, cs, sn, B, T, NH, HD)
	be.RoPEForward(oh, x, cs, sn, B, T, NH, HD)
	sameRounding(t, "RoPEForward", be, oh, download(be, o))
}

// TestAttentionBF16Output checks attention with a bfloat16 output
// against the float32-output call: the forward's out is the rounding to
// nearest even of the float32 out and lse is the same, and the backward
// reading it gives the float32 path's dq, dk and dv bit for bit when
// that path is fed the widened bfloat16 out. Subnormal outputs (one
// value head scaled to float32's smallest normals), rows that see no key
// (QPos < KPos), float32 and bfloat16 products and both backward
// strategies are covered; the bfloat16 results are the same on 1 to 3
// threads.
func TestAttentionBF16Output(t *testing.T) {
	base := backend.AttentionDims{B: 2, Tq: 40, Tk: 37, NH: 4, NKV: 2, HD: 16, QPos: 3, KPos: 9}
	nq, nk := base.B*base.Tq*base.NH*base.HD, base.B*base.Tk*base.NKV*base.HD
	nl := base.B * base.NH * base.Tq
	r := newRand(11)
	qf, kf, vf, df := randF32(r, nq, 1), randF32(r, nk, 1), randF32(r, nk, 1), randF32(r, nq, 1)
	for i := base.HD; i < len(vf); i += 2 * base.HD {
		for j := i; j < i+base.HD; j++ {
			// Value head 1 near float32's smallest normals (the bfloat16
			// products flush subnormal operands): the averages query
			// heads 2 and 3 output are mostly subnormal.
			vf[j] *= 4e-38
		}
	}
	for _, bf16 := range []bool{false, true} {
		for _, fusedMin := range []int{1, 1 << 30} {
			d := base
			d.BF16 = bf16
			var first [4][]float32 // the bfloat16 path's out (widened), dq, dk, dv on one thread
			for _, threads := range []int{1, 2, 3} {
				t.Run(fmt.Sprintf("bf16=%v/fusedMin=%d/threads=%d", bf16, fusedMin, threads), func(t *testing.T) {
					be := newTestBackend(t, threads)
					be.attnTile, be.attnFusedMin = 16, fusedMin
					q, k, v, dout := upload(be, qf), upload(be, kf), upload(be, vf), upload(be, df)
					out, lse := be.Alloc(backend.Float32, nq), be.Alloc(backend.Float32, nl)
					outH, lseH := be.Alloc(backend.BFloat16, nq), be.Alloc(backend.Float32, nl)
					be.AttentionForward(out, lse, q, k, v, d)
					be.AttentionForward(outH, lseH, q, k, v, d)
					want := download(be, out)
					sameRounding(t, "out", be, outH, want)
					sameBits(t, "lse", download(be, lseH), download(be, lse))
					subnormal := 0
					for _, x := range want {
						if x != 0 && math.Abs(float64(x)) < 0x1p-126 {
							subnormal++
						}
					}
					if subnormal == 0 {
						t.Fatal("no subnormal output")
					}
					h := make([]uint16, nq)
					be.Download(h, outH)
					wide := make([]float32, nq)
					numeric.BF16sToFloat32(wide, h)
					grads := func(o backend.Tensor) [3][]float32 {
						dq, dk, dv := be.Alloc(backend.Float32, nq), be.Alloc(backend.Float32, nk), be.Alloc(backend.Float32, nk)
						be.AttentionBackward(dq, dk, dv, dout, q, k, v, o, lse, d)
						return [3][]float32{download(be, dq), download(be, dk), download(be, dv)}
					}
					g32, g16 := grads(upload(be, wide)), grads(outH)
					for i, name := range []string{"dq", "dk", "dv"} {
						sameBits(t, name, g16[i], g32[i])
					}
					got := [4][]float32{wide, g16[0], g16[1], g16[2]}
					if threads == 1 {
						first = got
						return
					}
					for i, name := range []string{"out", "dq", "dk", "dv"} {
						sameBits(t, name+" against one thread", got[i], first[i])
					}
				})
			}
		}
	}
}
