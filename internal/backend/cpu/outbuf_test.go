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
