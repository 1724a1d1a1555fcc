package cpu

import (
	"fmt"
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
