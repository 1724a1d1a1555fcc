package gemm

import (
	"flag"
	"math"
	"runtime"
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/numeric"
)

var exhaustive = flag.Bool("exhaustive", false, "TestVCVTNEPS2BF16: check all 2^32 float32 patterns (about 10 s of CPU) instead of every 16th plus the rounding boundaries")

// TestVCVTNEPS2BF16 pins down the hardware conversion the AVX512_BF16
// packing uses, over every float32 sign and exponent and, for each of
// the 2^16 upper halves, the lower halves at every rounding boundary
// (0, 1, around the tie 0x8000, 0xffff) and every 16th other one, or all
// 2^32 patterns with -exhaustive: it is
// numeric.Float32ToBF16DAZ, that is IEEE round-to-nearest-even
// (numeric.Float32ToBF16, as PyTorch) except that subnormal inputs give
// zeros of their sign; NaNs keep their sign and leading payload bits and
// become quiet. The fallback kernels round with the same function, so
// every kernel multiplies the same operands.
func TestVCVTNEPS2BF16(t *testing.T) {
	if !hasBF16 {
		t.Skip("the CPU lacks AVX512_BF16")
	}
	const chunk = 1 << 16
	workers := runtime.GOMAXPROCS(0)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		bad      []uint32
		differ   int // patterns where the hardware and plain RNE differ
		expect   int // subnormals that plain RNE rounds to nonzero
		differMu sync.Mutex
	)
	stride := 16
	if *exhaustive {
		stride = 1
	}
	var lows []uint32
	for lo := uint32(0); lo < chunk; lo++ {
		switch {
		case lo%uint32(stride) == 0, lo <= 1, lo >= 0x7ffe && lo <= 0x8002, lo == 0xffff:
			lows = append(lows, lo)
		}
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			src := make([]float32, 0, chunk)
			dst := make([]uint16, chunk)
			nd, ne := 0, 0
			for hi := uint32(w); hi < 1<<16; hi += uint32(workers) {
				src = src[:0]
				for _, lo := range lows {
					src = append(src, math.Float32frombits(hi<<16|lo))
				}
				for len(src)%16 != 0 {
					src = append(src, 0)
				}
				cvtBF16(&dst[0], &src[0], len(src))
				for i, x := range src {
					want := numeric.Float32ToBF16DAZ(x)
					if dst[i] != want {
						mu.Lock()
						if len(bad) < 10 {
							bad = append(bad, math.Float32bits(x))
						}
						mu.Unlock()
					}
					if u := math.Float32bits(x); u&0x7f800000 == 0 {
						if dst[i] != numeric.Float32ToBF16(x) {
							nd++
						}
						if u&0x7fffff > 0x8000 {
							ne++
						}
					}
				}
			}
			differMu.Lock()
			differ += nd
			expect += ne
			differMu.Unlock()
		}(w)
	}
	wg.Wait()
	for _, u := range bad {
		src := []float32{math.Float32frombits(u)}
		src = append(src, make([]float32, 15)...)
		dst := make([]uint16, 16)
		cvtBF16(&dst[0], &src[0], 16)
		t.Errorf("VCVTNEPS2BF16(%#08x) = %#04x, Float32ToBF16DAZ %#04x", u, dst[0], numeric.Float32ToBF16DAZ(src[0]))
	}
	// The two differ exactly on the subnormals that IEEE rounding keeps
	// nonzero: mantissas above the tie 0x8000 (2·(2^23 - 2^15 - 1) of
	// all 2^32 patterns).
	if differ != expect || differ == 0 {
		t.Errorf("hardware and IEEE rounding differ on %d patterns, want %d (the subnormals that round to nonzero)", differ, expect)
	}
	t.Logf("checked every %d-th pattern and the boundaries; hardware and IEEE rounding differ on %d subnormals", stride, differ)
}
