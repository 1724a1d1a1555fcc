package cpu

import (
	"math"
	"testing"
)

// ulpDiff is the distance in units in the last place between two
// non-negative finite float32 values.
func ulpDiff(a, b float32) int64 {
	d := int64(math.Float32bits(a)) - int64(math.Float32bits(b))
	if d < 0 {
		d = -d
	}
	return d
}

func TestExpAccuracy(t *testing.T) {
	const lo, hi = -100.0, 100.0
	const steps = 400000
	xs := make([]float32, 0, steps+64)
	for i := 0; i <= steps; i++ {
		xs = append(xs, float32(lo+(hi-lo)*float64(i)/steps))
	}
	// Points around the thresholds and small arguments.
	for _, x := range []float32{expMin, expMax, 0, 1e-8, -1e-8, 1e-30, 0.3465, -0.3466, 88.3762626, 88.72, -87.3, -87.4} {
		xs = append(xs, x, math.Nextafter32(x, 1000), math.Nextafter32(x, -1000))
	}
	batch := make([]float32, len(xs))
	expAffine(batch, xs, 1, 0)
	var worst int64
	var worstX float32
	for i, x := range xs {
		got := expf(x)
		if b := batch[i]; math.Float32bits(b) != math.Float32bits(got) {
			t.Errorf("expAffine(%v) = %v, expf = %v", x, b, got)
		}
		want := float32(math.Exp(float64(x)))
		switch {
		case x < expMin:
			if got != 0 {
				t.Errorf("expf(%v) = %v, want 0 below the normal range", x, got)
			}
		case x > expMax:
			if !math.IsInf(float64(got), 1) {
				t.Errorf("expf(%v) = %v, want +Inf", x, got)
			}
		default:
			if math.IsInf(float64(want), 1) {
				// math.Exp rounds to +Inf just below expMax; allow MaxFloat32.
				if got != math.MaxFloat32 && !math.IsInf(float64(got), 1) {
					t.Errorf("expf(%v) = %v, want about MaxFloat32", x, got)
				}
				continue
			}
			if u := ulpDiff(got, want); u > worst {
				worst, worstX = u, x
			}
		}
	}
	if worst > 2 {
		t.Errorf("largest error %d ulp at x = %v", worst, worstX)
	}
	t.Logf("largest error %d ulp (at x = %v)", worst, worstX)
}

func TestExpSpecialValues(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, tc := range []struct {
		x, want float32
	}{
		{0, 1},
		{-inf, 0},
		{inf, inf},
		{-88, 0},
		{-1000, 0},
		{-3.4e38, 0},
		{89, inf},
		{3.4e38, inf},
		{1, float32(math.E)},
	} {
		if got := expf(tc.x); got != tc.want {
			t.Errorf("expf(%v) = %v, want %v", tc.x, got, tc.want)
		}
		var out [1]float32
		expAffine(out[:], []float32{tc.x}, 1, 0)
		if out[0] != tc.want {
			t.Errorf("expAffine(%v) = %v, want %v", tc.x, out[0], tc.want)
		}
	}
	if got := expf(nan); !math.IsNaN(float64(got)) {
		t.Errorf("expf(NaN) = %v", got)
	}
	var out [1]float32
	expAffine(out[:], []float32{nan}, 1, 0)
	if !math.IsNaN(float64(out[0])) {
		t.Errorf("expAffine(NaN) = %v", out[0])
	}
}

func TestExpAffineSum(t *testing.T) {
	x := randF32(newRand(1), 1000, 5)
	dst := make([]float32, len(x))
	sum := expAffine(dst, x, -2, 0.5)
	var want float64
	for i, v := range x {
		e := math.Exp(float64(-2*v + 0.5))
		want += e
		if ulpDiff(dst[i], float32(e)) > 2 {
			t.Fatalf("exp(-2*%v+0.5) = %v, want %v", v, dst[i], e)
		}
	}
	if math.Abs(float64(sum)-want) > 1e-5*want {
		t.Errorf("sum = %v, want %v", sum, want)
	}
	if got := sumExpShift(x, 3); math.Abs(float64(got)-sumShift64(x, 3)) > 1e-5*sumShift64(x, 3) {
		t.Errorf("sumExpShift = %v, want %v", got, sumShift64(x, 3))
	}
}

func sumShift64(x []float32, s float64) float64 {
	var sum float64
	for _, v := range x {
		sum += math.Exp(float64(v) - s)
	}
	return sum
}

func BenchmarkExpAffine(b *testing.B) {
	x := randF32(newRand(1), 4096, 10)
	dst := make([]float32, len(x))
	b.SetBytes(int64(4 * len(x)))
	for b.Loop() {
		expAffine(dst, x, 1, -10)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(x)), "ns/elem")
}

// TestExpVectorMatchesScalar checks that the vector kernel, where the
// machine has one, gives exactly the scalar code's values and sums.
func TestExpVectorMatchesScalar(t *testing.T) {
	r := newRand(2)
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, n := range []int{0, 1, 7, 8, 9, 64, 250, 1003} {
		for _, spread := range []float64{1, 30, 120} {
			x := randF32(r, n, spread)
			if n > 20 {
				x[3], x[11], x[17] = inf, nan, -inf
			}
			vec := make([]float32, n)
			sv := expAffine(vec, x, 1.5, -0.25)
			saved := useAVX2
			useAVX2 = false
			scal := make([]float32, n)
			ss := expAffine(scal, x, 1.5, -0.25)
			useAVX2 = saved
			if math.Float32bits(sv) != math.Float32bits(ss) && !(math.IsNaN(float64(sv)) && math.IsNaN(float64(ss))) {
				t.Errorf("n=%d spread=%v: sum %v, scalar %v", n, spread, sv, ss)
			}
			for i := range vec {
				if math.Float32bits(vec[i]) != math.Float32bits(scal[i]) && !(math.IsNaN(float64(vec[i])) && math.IsNaN(float64(scal[i]))) {
					t.Fatalf("n=%d spread=%v: exp(1.5*%v-0.25) = %v, scalar %v", n, spread, x[i], vec[i], scal[i])
				}
			}
		}
	}
}

func TestSigmoid(t *testing.T) {
	r := newRand(3)
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, n := range []int{0, 3, 8, 17, 300} {
		x := randF32(r, n, 100)
		if n > 10 {
			x[2], x[5], x[9] = inf, -inf, nan
		}
		got := make([]float32, n)
		sigmoid(got, x)
		saved := useAVX2
		useAVX2 = false
		scal := make([]float32, n)
		sigmoid(scal, x)
		useAVX2 = saved
		for i, v := range x {
			want := 1 / (1 + math.Exp(-float64(v)))
			if math.IsNaN(float64(v)) {
				if !math.IsNaN(float64(got[i])) || !math.IsNaN(float64(scal[i])) {
					t.Errorf("sigmoid(NaN) = %v, scalar %v", got[i], scal[i])
				}
				continue
			}
			if math.Float32bits(got[i]) != math.Float32bits(scal[i]) {
				t.Errorf("sigmoid(%v) = %v, scalar %v", v, got[i], scal[i])
			}
			if math.Abs(float64(got[i])-want) > 3e-7*want+1.2e-38 { // tiny results flush to 0
				t.Errorf("sigmoid(%v) = %v, want %v", v, got[i], want)
			}
		}
	}
}

func TestRowMax(t *testing.T) {
	r := newRand(4)
	for _, n := range []int{0, 1, 7, 8, 9, 16, 23, 24, 100} {
		for trial := 0; trial < 5; trial++ {
			x := randF32(r, n, 10)
			want := float32(math.Inf(-1))
			if n > 0 {
				p := r.IntN(n)
				x[p] = 11 + float32(trial)
				want = x[p]
			}
			if got := rowMax(x); got != want {
				t.Errorf("n=%d: rowMax = %v, want %v", n, got, want)
			}
		}
	}
}
