package longconv

// dot returns Σ a[j]·b[j] over len(a) elements (b must be at least as
// long). Eight partial sums keep the loads independent and shorten the
// rounding chain; the order is fixed by len(a) alone.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3, s4, s5, s6, s7 float32
	j := 0
	for ; j+8 <= len(a); j += 8 {
		x := a[j : j+8 : j+8]
		y := b[j : j+8 : j+8]
		s0 += x[0] * y[0]
		s1 += x[1] * y[1]
		s2 += x[2] * y[2]
		s3 += x[3] * y[3]
		s4 += x[4] * y[4]
		s5 += x[5] * y[5]
		s6 += x[6] * y[6]
		s7 += x[7] * y[7]
	}
	for ; j < len(a); j++ {
		s0 += a[j] * b[j]
	}
	return ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))
}

// axpy adds alpha·x to y over len(y) elements (x must be at least as long).
func axpy(y []float32, alpha float32, x []float32) {
	x = x[:len(y)]
	j := 0
	for ; j+4 <= len(y); j += 4 {
		d := y[j : j+4 : j+4]
		s := x[j : j+4 : j+4]
		d[0] += alpha * s[0]
		d[1] += alpha * s[1]
		d[2] += alpha * s[2]
		d[3] += alpha * s[3]
	}
	for ; j < len(y); j++ {
		y[j] += alpha * x[j]
	}
}

// cmulInto sets a[k] *= b[k] for interleaved complex vectors (len(a)/2
// values); b holds float32 or float64 values.
func cmulInto[F float32 | float64](a []float64, b []F) {
	b = b[:len(a)]
	for k := 0; k+2 <= len(a); k += 2 {
		x := a[k : k+2 : k+2]
		y := b[k : k+2 : k+2]
		xr, xi := x[0], x[1]
		yr, yi := float64(y[0]), float64(y[1])
		x[0], x[1] = xr*yr-xi*yi, xr*yi+xi*yr
	}
}

// cmulConjInto sets a[k] *= conj(b[k]) for interleaved complex vectors.
func cmulConjInto(a, b []float64) {
	b = b[:len(a)]
	for k := 0; k+2 <= len(a); k += 2 {
		x := a[k : k+2 : k+2]
		y := b[k : k+2 : k+2]
		xr, xi := x[0], x[1]
		yr, yi := y[0], y[1]
		x[0], x[1] = xr*yr+xi*yi, xi*yr-xr*yi
	}
}

// cmulConjAdd adds a[k]·conj(b[k]) to acc[k] for interleaved complex
// vectors.
func cmulConjAdd(acc, a, b []float64) {
	a = a[:len(acc)]
	b = b[:len(acc)]
	for k := 0; k+2 <= len(acc); k += 2 {
		x := a[k : k+2 : k+2]
		y := b[k : k+2 : k+2]
		d := acc[k : k+2 : k+2]
		d[0] += x[0]*y[0] + x[1]*y[1]
		d[1] += x[1]*y[0] - x[0]*y[1]
	}
}

// widen copies src into dst[:len(src)] as float64 and zeroes the rest of dst.
func widen(dst []float64, src []float32) {
	d := dst[:len(src)]
	for j, v := range src {
		d[j] = float64(v)
	}
	clear(dst[len(src):])
}
