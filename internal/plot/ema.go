package plot

// EMA is the exponential moving average of ys with weight beta of the
// past: out[0] = ys[0], out[i] = beta·out[i-1] + (1−beta)·ys[i]. It is
// the smoothing of every smoothed line titan draws (titan plot, loss.svg).
func EMA(ys []float64, beta float64) []float64 {
	out := make([]float64, len(ys))
	for i, y := range ys {
		if i == 0 {
			out[i] = y
			continue
		}
		out[i] = beta*out[i-1] + (1-beta)*y
	}
	return out
}
