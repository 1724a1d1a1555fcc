package longconv

// tile is one block of the flash schedule: once the inputs up to position
// step are known, those at [lo, step] add their contributions to the
// accumulators of outputs [step+1, hi]. The block is the square Toeplitz
// slice of side u = step-lo+1 of the convolution matrix, clipped at the
// capacity; it reads filter taps h[1 .. 2u-1].
type tile struct {
	step, lo, hi, u int
	level           int // log2(u)
}

// tileAfter returns the tile computed after step i when the schedule
// started at position base (0, or the first position after the latest
// prefill) and the capacity is L. ok is false when the tile would write
// nothing (it falls past the capacity).
//
// The side is u = lowbit(i-base+1), the largest power of two dividing the
// number of positions generated since base. Shifted by base this is the
// relaxed tiling of Flash Inference (and FutureFill's continuous rule):
// every pair (s, t) with base ≤ s < t < L lies in exactly one tile, and
// that tile is computed at a step i with s ≤ i < t, so it reads only
// known inputs (≤ i) and writes only outputs not yet read (> i).
// Pairs with s < base are covered by the prefill (see Online.Prefill).
func tileAfter(i, base, L int) (t tile, ok bool) {
	r := i - base + 1
	u := r & -r
	t = tile{step: i, lo: i - u + 1, hi: min(i+u, L-1), u: u}
	for v := u; v > 1; v >>= 1 {
		t.level++
	}
	return t, t.hi > i
}
