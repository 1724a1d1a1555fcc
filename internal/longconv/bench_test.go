package longconv

import (
	"flag"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

var (
	benchLazyMax = flag.Int("longconv.lazymax", 16, "BenchmarkMixer: largest log2(L) at which the lazy mode runs")
	benchMaxLog  = flag.Int("longconv.maxlog", 17, "BenchmarkMixer: largest log2(L)")
	benchThreads = flag.Int("longconv.threads", 1, "BenchmarkMixer: goroutines per Online")
	benchC       = flag.Int("longconv.c", 4, "BenchmarkMixer: channels per layer")
	benchM       = flag.Int("longconv.m", 2, "BenchmarkMixer: layers")
)

// mixerRun is the outcome of generating L positions.
type mixerRun struct {
	stats    Stats
	total    time.Duration
	p50, p99 time.Duration // per-position latency (all layers)
	max      time.Duration
}

// runMixer generates L positions from an empty prompt through M layers of
// C channels (B=1) with a trivial network between the convolutions, so
// that nearly all time is mixer time; Stats separates it anyway.
func runMixer(tb testing.TB, mode Mode, L, M, C, threads int) mixerRun {
	r := newRand(99)
	filt := make([][]float32, M)
	ch := make([]int, M)
	for l := range M {
		filt[l] = decayingFilter(r, C, L, float64(L)/8)
		ch[l] = C
	}
	o, err := NewOnline(OnlineConfig{Mode: mode, B: 1, LMax: L, Channels: ch, Filters: filt, Threads: threads})
	if err != nil {
		tb.Fatal(err)
	}
	x := randF32(r, C)
	y := make([]float32, C)
	lat := make([]time.Duration, L)
	start := time.Now()
	for i := range L {
		t0 := time.Now()
		for l := range M {
			if err := o.Step(l, y, x); err != nil {
				tb.Fatal(err)
			}
			for c := range C {
				x[c] = float32(math.Tanh(float64(y[c])))
			}
		}
		lat[i] = time.Since(t0)
	}
	run := mixerRun{stats: o.Stats(), total: time.Since(start)}
	slices.Sort(lat)
	run.p50, run.p99, run.max = lat[L/2], lat[min(L-1, L*99/100)], lat[L-1]
	return run
}

// BenchmarkMixer is must-show (d): mixer time of lazy and flash
// generation for L = 2^10 .. 2^17 (lazy up to -longconv.lazymax), and
// their ratio. Run it once: go test -run x -bench Mixer -benchtime 1x.
func BenchmarkMixer(b *testing.B) {
	M, C, threads := *benchM, *benchC, *benchThreads
	for lg := 10; lg <= *benchMaxLog; lg++ {
		L := 1 << lg
		b.Run(fmt.Sprintf("L=2^%d", lg), func(b *testing.B) {
			var flash, lazy time.Duration
			var fr mixerRun
			for b.Loop() {
				fr = runMixer(b, Flash, L, M, C, threads)
				flash += fr.stats.Mixer
				if lg <= *benchLazyMax {
					lazy += runMixer(b, Lazy, L, M, C, threads).stats.Mixer
				}
			}
			n := float64(b.N)
			b.ReportMetric(flash.Seconds()/n, "flash-s")
			b.ReportMetric(fr.stats.Tiles.Seconds(), "tiles-s")
			b.ReportMetric(float64(fr.p50.Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(fr.p99.Nanoseconds())/1e3, "p99-µs")
			b.ReportMetric(float64(fr.max.Nanoseconds())/1e3, "max-µs")
			if lazy > 0 {
				b.ReportMetric(lazy.Seconds()/n, "lazy-s")
				b.ReportMetric(lazy.Seconds()/flash.Seconds(), "speedup")
			}
		})
	}
}

// BenchmarkTiles times one tile of each side directly and by FFT (the
// measurement behind DefaultFFTTile).
func BenchmarkTiles(b *testing.B) {
	for b.Loop() {
		direct, viaFFT := measureTiles(1024, 20*time.Millisecond)
		for k := range direct {
			b.Logf("u=%5d direct %9v fft %9v", 8<<k, direct[k], viaFFT[k])
		}
	}
}
