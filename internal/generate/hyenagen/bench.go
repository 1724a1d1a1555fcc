package hyenagen

import (
	"fmt"
	"image/color"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/longconv"
	"github.com/titan-go/titan/internal/model/hyena"
	"github.com/titan-go/titan/internal/plot"
)

// BenchOptions describe a generation benchmark (titan bench generate).
type BenchOptions struct {
	// Modes are run in order at every length.
	Modes []longconv.Mode
	// Lengths are the positions per row (prompt included) to time.
	Lengths []int
	// Batch is the number of rows generated together (0: 1).
	Batch int
	// Prompt is the number of prompt positions per row (random tokens,
	// prefilled in one pass); generation then starts greedily from the
	// prompt's logits. With 0 the first position is fed token 0.
	Prompt int
	// Threads is the online convolution's goroutines (below 1:
	// GOMAXPROCS); the caller sizes the backend's the same.
	Threads int
	// FFTTile is Flash's FFT tile crossover (see longconv.OnlineConfig).
	FFTTile int
	// SlowMax, when positive, skips lazy and eager at lengths above it
	// (their cost grows as L²).
	SlowMax int
	// Seed draws the prompt tokens.
	Seed uint64
	// Progress, when set, receives a line per run and, for runs longer
	// than a few seconds, progress lines.
	Progress io.Writer
}

// BenchResult is one mode at one length.
type BenchResult struct {
	Mode   string `json:"mode"`
	Length int    `json:"length"`
	Batch  int    `json:"batch"`
	Prompt int    `json:"prompt"`
	// MixerS is the position-mixing time (the online long convolutions,
	// prefill included), OtherS the rest of the model, TotalS their sum
	// (prefill and steps; greedy sampling and setup excluded).
	MixerS float64 `json:"mixer_s"`
	OtherS float64 `json:"other_s"`
	TotalS float64 `json:"total_s"`
	// TilesS is the part of MixerS spent in flash tiles, PrefillS the
	// prefill's total time and SetupS the filter materialisation and
	// online setup (not in TotalS).
	TilesS   float64 `json:"tiles_s"`
	PrefillS float64 `json:"prefill_s"`
	SetupS   float64 `json:"setup_s"`
	// P50Ms, P99Ms and MaxMs are per-token step latencies (all rows).
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
	// TokensPerS is Batch × generated positions / TotalS.
	TokensPerS float64 `json:"tokens_per_s"`
	// FFTTile is Flash's smallest FFT tile side (0 for the others).
	FFTTile int `json:"fft_tile"`
	Threads int `json:"threads"`
}

// MixerFraction is MixerS / TotalS.
func (r BenchResult) MixerFraction() float64 {
	if r.TotalS == 0 {
		return 0
	}
	return r.MixerS / r.TotalS
}

// Skipped names a (mode, length) the benchmark did not run.
type Skipped struct {
	Mode   string `json:"mode"`
	Length int    `json:"length"`
	Reason string `json:"reason"`
}

// Bench runs every mode at every length of o on the model (cfg, flat
// parameters params on be) and calls emit with each result as it comes.
// It returns the results and the runs skipped above SlowMax. Each mode
// runs once untimed at a short length first (warm-up).
func Bench(be backend.Backend, cfg hyena.Config, params backend.Tensor, o BenchOptions, emit func(BenchResult)) ([]BenchResult, []Skipped, error) {
	if o.Batch == 0 {
		o.Batch = 1
	}
	if len(o.Modes) == 0 || len(o.Lengths) == 0 {
		return nil, nil, fmt.Errorf("hyenagen: bench needs at least one mode and one length")
	}
	for _, L := range o.Lengths {
		if L < 1 || L > cfg.LMax {
			return nil, nil, fmt.Errorf("hyenagen: bench length %d outside [1, l_max %d]", L, cfg.LMax)
		}
		if o.Prompt >= L {
			return nil, nil, fmt.Errorf("hyenagen: bench prompt of %d positions leaves nothing to generate in %d", o.Prompt, L)
		}
	}
	var results []BenchResult
	var skipped []Skipped
	warm := map[longconv.Mode]bool{}
	for _, L := range o.Lengths {
		for _, mode := range o.Modes {
			if o.SlowMax > 0 && L > o.SlowMax && mode != longconv.Flash {
				skipped = append(skipped, Skipped{mode.String(), L, fmt.Sprintf("above the cutoff %d for the O(L²) modes", o.SlowMax)})
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "bench generate: %s L=%d skipped (above the cutoff %d)\n", mode, L, o.SlowMax)
				}
				continue
			}
			if !warm[mode] {
				if _, err := benchOne(be, cfg, params, mode, min(L, 1024, cfg.LMax), min(o.Prompt, min(L, 1024)-1), o, nil); err != nil {
					return results, skipped, err
				}
				warm[mode] = true
			}
			r, err := benchOne(be, cfg, params, mode, L, o.Prompt, o, o.Progress)
			if err != nil {
				return results, skipped, err
			}
			results = append(results, r)
			if emit != nil {
				emit(r)
			}
		}
	}
	return results, skipped, nil
}

// benchOne generates L positions per row greedily in one mode.
func benchOne(be backend.Backend, cfg hyena.Config, params backend.Tensor, mode longconv.Mode, L, P int, o BenchOptions, progress io.Writer) (BenchResult, error) {
	B := o.Batch
	g, err := New(be, cfg, params, Options{Mode: mode, B: B, L: L, Threads: o.Threads, FFTTile: o.FFTTile})
	if err != nil {
		return BenchResult{}, err
	}
	if progress != nil {
		fmt.Fprintf(progress, "bench generate: %s L=%d B=%d prompt %d (setup %.2fs)\n", mode, L, B, P, g.Stats().Setup.Seconds())
	}
	r := rand.New(rand.NewPCG(o.Seed, 0x9e3779b97f4a7c15))
	next := make([]int32, B)
	var logits []float32
	if P > 0 {
		prompt := make([]int32, B*P)
		for i := range prompt {
			prompt[i] = int32(r.IntN(cfg.VocabSize))
		}
		if logits, err = g.Prefill(prompt); err != nil {
			return BenchResult{}, err
		}
	}
	lat := make([]time.Duration, 0, L-P)
	start, lastReport := time.Now(), time.Now()
	V := g.V()
	for pos := P; pos < L; pos++ {
		if logits != nil {
			for b := range B {
				next[b] = int32(argmax(logits[b*V : (b+1)*V]))
			}
		}
		t0 := time.Now()
		if logits, err = g.Step(next); err != nil {
			return BenchResult{}, err
		}
		lat = append(lat, time.Since(t0))
		if progress != nil && time.Since(lastReport) > 10*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(progress, "bench generate: %s L=%d: %d/%d positions, %.0fs\n", mode, L, pos+1, L, time.Since(start).Seconds())
		}
	}
	s := g.Stats()
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 }
	res := BenchResult{
		Mode: mode.String(), Length: L, Batch: B, Prompt: P,
		MixerS: s.Mixer.Seconds(), OtherS: s.Other().Seconds(), TotalS: s.Total.Seconds(),
		TilesS: s.Tiles.Seconds(), PrefillS: s.Prefill.Seconds(), SetupS: s.Setup.Seconds(),
		P50Ms: ms(quantile(lat, 0.50)), P99Ms: ms(quantile(lat, 0.99)), MaxMs: ms(lat[len(lat)-1]),
		FFTTile: g.FFTTile(), Threads: o.Threads,
	}
	if s.Total > 0 {
		res.TokensPerS = float64(B*(L-P)) / s.Total.Seconds()
	}
	return res, nil
}

// quantile is the q-quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// modeColor gives each mode its color on charts.
func modeColor(mode string) color.RGBA {
	switch mode {
	case "lazy":
		return plot.Palette[0]
	case "eager":
		return plot.Palette[3]
	case "flash":
		return plot.Palette[2]
	}
	return plot.Palette[4]
}

// Chart is the log-log chart of total time (solid) and mixer time
// (dashed) against length for each mode of results; notes go under the
// legend.
func Chart(title string, results []BenchResult, notes []string) plot.Chart {
	var modes []string
	for _, r := range results {
		if !slices.Contains(modes, r.Mode) {
			modes = append(modes, r.Mode)
		}
	}
	p := plot.Chart{Title: title, XLabel: "positions per sequence L", YLabel: "time (s)", XBase2: true, Notes: notes}
	for _, m := range modes {
		total := plot.Series{Label: m + " total", Color: modeColor(m)}
		mixer := plot.Series{Label: m + " mixer", Color: modeColor(m), Dashed: true}
		for _, r := range results {
			if r.Mode != m {
				continue
			}
			total.X, total.Y = append(total.X, float64(r.Length)), append(total.Y, r.TotalS)
			if r.MixerS > 0 {
				mixer.X, mixer.Y = append(mixer.X, float64(r.Length)), append(mixer.Y, r.MixerS)
			}
		}
		p.Series = append(p.Series, total, mixer)
	}
	return p
}
