package float8

import (
	"math"
	"math/rand/v2"
	"testing"
)

// castInputs are float32 patterns of every class: every 4099th pattern
// of both signs, runs around each format's boundaries (subnormal
// spacing, smallest normal, Max and its rounding midpoint, the largest
// float32, infinity), both zeros and NaNs with payloads.
func castInputs() []float32 {
	var in []float32
	for b := uint64(0); b < 1<<32; b += 4099 {
		in = append(in, math.Float32frombits(uint32(b)))
	}
	for _, v := range []float32{0x1p-6, 0x1p-9, 0x1p-10, 0x1p-14, 0x1p-16, 0x1p-17, 448, 464, 480, 57344, 61440, 65536, math.MaxFloat32, float32(math.Inf(1))} {
		b := math.Float32bits(v)
		for d := uint32(0); d < 300; d++ {
			in = append(in, math.Float32frombits(b-d), math.Float32frombits(b+d), -math.Float32frombits(b-d))
		}
	}
	for _, b := range []uint32{0, 0x80000000, 0x7fc00000, 0xffc00001, 0x7f800001, 0x7fbfffff} {
		in = append(in, math.Float32frombits(b))
	}
	return in
}

// scalar runs f with the vector paths off.
func scalar(f func()) {
	was := hasAVX512
	hasAVX512 = false
	defer func() { hasAVX512 = was }()
	f()
}

// TestVectorCastsMatchScalar: the AVX-512 casts (Cast, CastCols with
// its per-column scales from ColAmax, CastE4M3's bytes and WidenE4M3)
// give the scalar loop's bits,
// NaN payloads included, on every class of castInputs, for scales that
// move them across every boundary, on every length and alignment of a
// short slice (vector blocks and scalar tail); Amax likewise, NaNs and
// negative zeros included.
func TestVectorCastsMatchScalar(t *testing.T) {
	if !hasAVX512 {
		t.Skip("the CPU has no AVX-512: the casts run the scalar loops only")
	}
	in := castInputs()
	same := func(what string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: element %d (%#08x): %#08x, scalar %#08x", what, i, math.Float32bits(in[i%len(in)]), math.Float32bits(got[i]), math.Float32bits(want[i]))
			}
		}
	}
	got, want := make([]float32, len(in)), make([]float32, len(in))
	for _, f := range []Format{E4M3, E5M2} {
		for _, s := range []float32{1, 0.75, 3, 448.0 / 3, 0x1p-100, 0x1p100, 448 / 1e-12} {
			Cast(got, in, s, f)
			scalar(func() { Cast(want, in, s, f) })
			same(f.String()+" Cast", got, want)
		}
		// Per-column scales: one row of every input, columns scaled apart.
		cols := 4096
		src := in[:cols]
		scales := make([]float32, cols)
		for j := range scales {
			scales[j] = math.Float32frombits(0x20000000 + uint32(j)*0x7f1234%0x3f000000)
		}
		// CastCols: its column maxima and per-column scales, on rows of a
		// length that is not a multiple of 16.
		for _, cc := range []int{16, 37, 100} {
			// Finite values of every class, in random order, columns of
			// different magnitudes; one column holds a NaN.
			rows := 300
			r := rand.New(rand.NewPCG(5, uint64(cc)))
			x := make([]float32, rows*cc)
			for i := range x {
				v := in[r.IntN(len(in))]
				for math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 1e30 || math.Abs(float64(v)) < 1e-30 {
					v = in[r.IntN(len(in))]
				}
				x[i] = float32(math.Ldexp(float64(r.NormFloat64()), i%cc-cc/2)) + v*0x1p-100
			}
			x[cc+3] = float32(math.NaN())
			gs, ws := make([]float32, cc), make([]float32, cc)
			castCols := func(dst, scales []float32) {
				ColAmax(scales, x, rows, cc)
				Scales(scales, scales, f, true)
				CastCols(dst, x, rows, cc, f, scales)
			}
			castCols(got[:len(x)], gs)
			scalar(func() { castCols(want[:len(x)], ws) })
			same(f.String()+" CastCols scales", gs, ws)
			same(f.String()+" CastCols", got[:len(x)], want[:len(x)])
		}
		castScaled(got[:cols], src, 0, scales, f)
		scalar(func() { castScaled(want[:cols], src, 0, scales, f) })
		same(f.String()+" per-element scales", got[:cols], want[:cols])
		for off := 0; off < 3; off++ {
			for n := 0; n < 70; n++ {
				a, b := in[1000*n+off:1000*n+off+n], make([]float32, n)
				Cast(got[:n], a, 3, f)
				scalar(func() { Cast(b, a, 3, f) })
				same("short Cast", got[:n], b)
			}
		}
	}
	// The e4m3 bytes of the FSDP float8 all-gather, and their widening
	// (every pattern, several times over, and short tails).
	codes, wcodes := make([]byte, len(in)), make([]byte, len(in))
	for _, s := range []float32{1, 0.75, 3, 448.0 / 3, 0x1p-100, 0x1p100} {
		CastE4M3(codes, in, s)
		scalar(func() { CastE4M3(wcodes, in, s) })
		for i := range in {
			if codes[i] != wcodes[i] {
				t.Fatalf("CastE4M3 scale %v: element %d (%#08x): %#02x, scalar %#02x", s, i, math.Float32bits(in[i]), codes[i], wcodes[i])
			}
		}
	}
	for i := range codes {
		codes[i] = byte(i * 7)
	}
	for _, n := range []int{len(codes), 15, 17, 33} {
		WidenE4M3(got[:n], codes[:n])
		scalar(func() { WidenE4M3(want[:n], codes[:n]) })
		same("WidenE4M3", got[:n], want[:n])
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 63, 64, 65, 200, 1000, 4097} {
		x := make([]float32, n)
		for trial := 0; trial < 20; trial++ {
			for i := range x {
				x[i] = in[rng.IntN(len(in))]
			}
			if n > 0 && trial%2 == 0 {
				x[rng.IntN(n)] = -0.0
			}
			var w float32
			scalar(func() { w = Amax(x) })
			if g := Amax(x); math.Float32bits(g) != math.Float32bits(w) {
				t.Fatalf("Amax of %d elements: %#08x, scalar %#08x", n, math.Float32bits(g), math.Float32bits(w))
			}
		}
	}
}

func BenchmarkAmax(b *testing.B) {
	x := make([]float32, 1<<20)
	for i := range x {
		x[i] = float32(i%1000-500) * 0.37
	}
	for _, vec := range []bool{false, true} {
		name := "scalar"
		if vec {
			name = "avx512"
		}
		b.Run(name, func(b *testing.B) {
			was := hasAVX512
			hasAVX512 = vec && was
			defer func() { hasAVX512 = was }()
			for i := 0; i < b.N; i++ {
				Amax(x)
			}
			b.ReportMetric(float64(len(x)*b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
		})
	}
}

// BenchmarkCastVector times Cast with the vector path and the scalar loop.
func BenchmarkCastVector(b *testing.B) {
	src := make([]float32, 1<<20)
	for i := range src {
		src[i] = float32(i%1000-500) * 0.37
	}
	dst := make([]float32, len(src))
	for _, vec := range []bool{false, true} {
		name := "scalar"
		if vec {
			name = "avx512"
		}
		b.Run(name, func(b *testing.B) {
			was := hasAVX512
			hasAVX512 = vec && was
			defer func() { hasAVX512 = was }()
			for i := 0; i < b.N; i++ {
				Cast(dst, src, 0.5, E4M3)
			}
			b.ReportMetric(float64(len(src)*b.N)/b.Elapsed().Seconds()/1e9, "Gelem/s")
		})
	}
}

// TestVectorUnscaleMatchesScalar: Unscale's vector rows give the scalar
// loop's bits, for per-row, per-column and tensorwise scales, with and
// without accumulation, on rows whose length is not a multiple of 16 and
// a leading dimension wider than the rows.
func TestVectorUnscaleMatchesScalar(t *testing.T) {
	if !hasAVX512 {
		t.Skip("the CPU has no AVX-512: Unscale runs the scalar loop only")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, sh := range []struct{ rows, cols, ldc int }{{3, 37, 40}, {17, 64, 64}, {5, 15, 15}, {64, 130, 131}} {
		c := make([]float32, sh.rows*sh.cols)
		for i := range c {
			c[i] = float32(rng.NormFloat64()) * 1e4
		}
		scales := func(n int) []float32 {
			s := make([]float32, n)
			for i := range s {
				s[i] = float32(math.Ldexp(1+rng.Float64(), rng.IntN(20)-5))
			}
			return s
		}
		init := make([]float32, sh.rows*sh.ldc)
		for i := range init {
			init[i] = float32(rng.NormFloat64())
		}
		for _, rs := range [][]float32{scales(1), scales(sh.rows)} {
			for _, cs := range [][]float32{scales(1), scales(sh.cols)} {
				for _, beta := range []float32{0, 1, 0.5} {
					got, want := append([]float32(nil), init...), append([]float32(nil), init...)
					Unscale(got, sh.ldc, c, sh.rows, sh.cols, rs, cs, beta)
					scalar(func() { Unscale(want, sh.ldc, c, sh.rows, sh.cols, rs, cs, beta) })
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%+v beta %v: element %d = %v, scalar %v", sh, beta, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}
