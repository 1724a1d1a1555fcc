// Package longconv computes causal depthwise long convolutions, the
// sequence mixer of Hyena-style models, on host float32 data: the
// parallel form for training (Forward, Backward) and the online form for
// exact autoregressive generation (Online), including the quasilinear
// relaxed tiling of Flash Inference (Oncescu et al., ICLR 2025).
//
// # Layout
//
// Sequences are channel-major: x and y are [B][C][L] flattened, so each
// (batch row, channel) sequence is contiguous, and filters are [C][L]
// with h[c][0] multiplying the current input:
//
//	y[b,c,t] = Σ_{s≤t} h[c][t-s]·x[b,c,s]
//
// # Training: Forward and Backward
//
// Sequences up to DefaultDirectMax (120) are summed directly; longer ones
// are exact linear convolutions by FFT, zero-padded to the power of two ≥
// 2L-1 (the equivalent of safari's fftconv_ref), with the filter
// transformed once per channel and shared by the batch rows. Backward
// correlates in the frequency domain (DX = DY·conj H, DH = Σ_b DY·conj X).
// Transforms are package fft's, in float64 (see that package for why).
// Work is split over channels (and batch rows when channels are fewer
// than threads); each row is computed by one goroutine in a fixed order,
// so results do not depend on the thread count.
//
// The crossover comes from BenchmarkConvCrossover (one row, B=8, one
// goroutine, ns per row, development machine):
//
//	L        32    48    64    96   128   192   256
//	direct  237   454   732  1521  2582  5573  9768
//	FFT     542  1016  1086  2365  2348  4857  4723
//
// (L = 97..128 share the 256-point transform, hence the crossover at 120.)
//
// # Generation: Online
//
// Online holds M layers of C_ℓ channels for a batch of B and a capacity
// LMax. At each position the caller feeds layer 0's conv input, gets its
// output, computes the rest of the layer and layer 1's input, and so on
// (Step). Three modes compute the same thing:
//
//   - Lazy: y_i = dot(history, reversed filter), O(i) per step;
//   - Eager: x_i is pushed into the accumulators of all later positions,
//     O(LMax-i) per step;
//   - Flash: y_i = acc[i] + h[0]·x_i (the red cell); after the last layer
//     of step i, one tile per row for all layers at once: with U the
//     largest power of two dividing i+1 (counted from the latest prefill),
//     the inputs x[i-U+1..i] add their contributions to acc[i+1..i+U].
//     Every pair s < t is in exactly one tile, computed before step t
//     (TestScheduleCoverage). Tiles of side ≥ DefaultFFTTile (64) are
//     size-2U FFT products with the filter's cached spectrum, smaller ones
//     dot products: O(L log² L) per channel in all.
//
// The FFT tile crossover (BenchmarkTiles, one row, one goroutine):
//
//	side U      8     16     32     64    128    256     512
//	direct    50ns  123ns  390ns  1.4µs  7.5µs   25µs   102µs
//	FFT      136ns  203ns  440ns  0.85µs 2.0µs  3.9µs   9.0µs
//
// MeasureFFTTile repeats the measurement on the running machine and
// OnlineConfig.FFTTile sets the crossover.
//
// Prompts go through Prefill: one FFT convolution per row over the whole
// filter gives the prompt outputs and overwrites every later accumulator
// with the complete contribution of all inputs so far; the tiling then
// restarts at the position after the prompt, so any prompt length works
// and a prefill may also follow generated positions (TestModesAgree,
// TestChunkedPrefill).
//
// The state is one buffer [layer][batch][channel][LMax] of float32 in
// which each row keeps its input history below the current position and
// its accumulators above it (disjoint ranges). Per channel, the filters
// take 2·LMax float32 (forward and reversed) and the cached tile spectra
// about 8·LMax bytes, bounded by OnlineConfig.SpectrumBytes. Steps
// allocate nothing.
//
// Stats separates the mixer time (everything in Step and Prefill), the
// tile part of it, and the setup (filter copies and spectra).
//
// # Mixer time, lazy vs flash
//
// BenchmarkMixer generates L positions from an empty prompt through M=2
// layers of C=4 channels, B=1, one goroutine, with a trivial network in
// between; mixer time only (go test -run x -bench Mixer -benchtime 1x
// -longconv.lazymax 17). Development machine, one run:
//
//	L       lazy s    flash s   speedup   flash p50 / p99 / max per position
//	2^10    0.0020    0.00076      2.7×   0.58µs / 9.8µs / 0.09ms
//	2^11    0.0076    0.00146      5.2×   0.58µs / 8.5µs / 0.17ms
//	2^12    0.0302    0.00313      9.6×   0.58µs / 8.5µs / 0.33ms
//	2^13    0.123     0.00693     17.8×   0.58µs / 7.3µs / 0.71ms
//	2^14    0.456     0.0172      26.5×   0.59µs / 10µs  / 1.6ms
//	2^15    1.84      0.0362      50.8×   0.56µs / 7.5µs / 3.9ms
//	2^16    7.29      0.0897      81.3×   0.54µs / 7.5µs / 13ms
//	2^17   29.3       0.167      175×     0.50µs / 7.3µs / 16ms
//
// Repeated runs vary by about 10% on the shared machine (91× at 2^16 in
// another run). With two goroutines the ratios were much the same (51× at
// 2^15, 90× at 2^16) apart from runs hit by stalls of tens of
// milliseconds: the second core of the development VM is shared with
// other work, so the one-goroutine table is the reference.
//
// Operation counts predict about 28×, 85× and 150× at 2^14, 2^16 and
// 2^17. Lazy runs at 0.43 ns per multiply-add, the speed of the same
// pure-Go dot product in L1, so the baseline is not memory-starved. The
// maximum is the step that computes the largest tile, side L/2.
//
// Both modes are pure Go without SIMD assembly; a vectorised dot product
// would speed up lazy (and flash's direct tiles) but not the FFT.
//
// # Threads
//
// Step batches and tile batches run on new goroutines only above 2^18
// multiply-adds of work: waking an idle goroutine costs tens of
// microseconds on the shared development VM, more than most steps take.
package longconv
