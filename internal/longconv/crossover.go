package longconv

import (
	"math"
	"time"
)

// MeasureFFTTile times one row's flash tiles of sides 8..1024 computed
// directly and by FFT on the calling goroutine, and returns the smallest
// side from which the FFT was faster at every larger side measured (a
// power of two, 2048 if the FFT never won). The result can be passed as
// OnlineConfig.FFTTile. It takes a few tens of milliseconds.
func MeasureFFTTile() int {
	const maxU = 1024
	direct, viaFFT := measureTiles(maxU, 2*time.Millisecond)
	best := 2 * maxU
	for k := len(direct) - 1; k >= 0; k-- {
		if viaFFT[k] >= direct[k] {
			break
		}
		best = 8 << k
	}
	return best
}

// measureTiles returns the time per tile of sides 8, 16, ..., maxU,
// directly and by FFT, each timed for at least minTime.
func measureTiles(maxU int, minTime time.Duration) (direct, viaFFT []time.Duration) {
	L := 4 * maxU
	h := make([]float32, L)
	for k := range h {
		h[k] = float32(math.Cos(0.37*float64(k)) * math.Exp(-float64(k)/float64(L)))
	}
	o, err := NewOnline(OnlineConfig{Mode: Flash, B: 1, LMax: L, Channels: []int{1}, Filters: [][]float32{h}, Threads: 1, FFTTile: 8})
	if err != nil {
		panic(err) // the configuration above is valid
	}
	for t := range o.buf {
		o.buf[t] = float32(math.Sin(0.11 * float64(t)))
	}
	s := o.tileWork[0]
	for u, k := 8, 3; u <= maxU; u, k = 2*u, k+1 {
		tl := tile{step: 2*u - 1, lo: u, hi: 3*u - 1, u: u, level: k}
		direct = append(direct, timePer(minTime, func() { o.directTile(0, tl) }))
		viaFFT = append(viaFFT, timePer(minTime, func() { o.fftTile1(s, 0, tl) }))
	}
	return direct, viaFFT
}

// timePer returns the time of one call of fn, the best of three batches
// each lasting at least minTime/3.
func timePer(minTime time.Duration, fn func()) time.Duration {
	best := time.Duration(math.MaxInt64)
	for range 3 {
		n := 0
		start := time.Now()
		for time.Since(start) < minTime/3 {
			for range 8 {
				fn()
			}
			n += 8
		}
		if d := time.Since(start) / time.Duration(n); d < best {
			best = d
		}
	}
	return best
}
