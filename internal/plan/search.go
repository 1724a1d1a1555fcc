package plan

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/titan-go/titan/internal/bytesize"
	"github.com/titan-go/titan/internal/cluster"
	"github.com/titan-go/titan/internal/memplan"
	"github.com/titan-go/titan/internal/model/llama"
)

// SearchSchedules are the pipeline schedules a search tries.
var SearchSchedules = []string{"1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"}

// SearchCheckpoints are the activation checkpointing policies a search
// tries, least recomputation first.
var SearchCheckpoints = []memplan.Checkpoint{{Mode: "none"}, {Mode: "selective", Option: "op"}, {Mode: "selective", Option: "2"}, {Mode: "full"}}

// Candidate is one layout a search ranked.
type Candidate struct {
	Prediction Prediction
	// Why says what makes it slower than the best (empty for the best).
	Why string
}

// SearchResult is a search's outcome.
type SearchResult struct {
	// Top are the fastest layouts that fit, fastest first.
	Top []Candidate
	// Tried counts the layouts predicted, Fit those that fit.
	Tried, Fit int
	// GlobalBatch is the sequences per step every layout keeps.
	GlobalBatch int
	// Given is the searched job's own layout with why it loses to the
	// best (Why empty when it is the best), and GivenRank its place
	// among the layouts that fit (0 when it does not fit or was not
	// predicted).
	Given     Candidate
	GivenRank int
	// GivenLayout is the searched job's own layout, and GivenErr why it
	// cannot run (nil when it can; Given is empty when it cannot).
	GivenLayout Layout
	GivenErr    error
	// Headroom is the fraction of each device's memory a layout had to
	// leave free to count as fitting.
	Headroom float64
}

// SearchOptions bound a search.
type SearchOptions struct {
	// World is the number of ranks, Top how many layouts to return.
	World, Top int
	// MaxTP and MaxCP cap the tensor and context parallel degrees (0: a
	// node's devices and 8).
	MaxTP, MaxCP int
	// Headroom is the fraction of each device's memory a layout must
	// leave free to be proposed, against the memory prediction's own
	// error (0 ≤ Headroom < 1).
	Headroom float64
	// Progress, when not nil, receives a line every few seconds of a
	// long search.
	Progress io.Writer
}

// DefaultHeadroom is the search's default Headroom: the largest error of
// the GPU memory predictions against torchtitan's published rows is
// 9 % (bench/plan/README.md), and on this machine's layouts 10 %.
const DefaultHeadroom = 0.10

// Search enumerates the layouts of base's model on world ranks of c —
// dp_replicate, dp_shard, tp (within a node), pp with each schedule and
// microbatch size, cp, and the activation checkpointing policies — that
// keep base's global batch (local batch × data-parallel ranks) and
// sequence length, predicts each, and returns the top fastest that fit
// the device's memory with why each loses to the best. base's kernel
// options (compile, float8, async TP) apply to all.
func Search(base Job, c cluster.Cluster, cal Calibration, o SearchOptions) (SearchResult, error) {
	world, top := o.World, max(o.Top, 1)
	maxTP, maxCP := o.MaxTP, o.MaxCP
	if maxTP <= 0 {
		maxTP = c.DevicesPerNode
	}
	if maxCP <= 0 {
		maxCP = 8
	}
	if !(o.Headroom >= 0 && o.Headroom < 1) { // NaN too
		return SearchResult{}, fmt.Errorf("plan: search headroom (--headroom) %g: want a fraction of the device's memory in [0, 1)", o.Headroom)
	}
	c, err := c.WithWorld(world)
	if err != nil {
		return SearchResult{}, err
	}
	if err := cal.Validate(); err != nil {
		return SearchResult{}, err
	}
	if err := checkOptions(base.Layout, c, cal); err != nil {
		return SearchResult{}, err
	}
	bd := base.Layout.Degrees
	accum := base.Layout.accum() // every layout accumulates as the recipe does
	global := accum * base.Layout.LocalBatch * bd.DPReplicate * bd.DPShard
	res := SearchResult{GlobalBatch: global, Headroom: o.Headroom, GivenLayout: base.Layout}
	cfg := base.Model
	var jobs []Job
	for _, tp := range powers(min(maxTP, c.DevicesPerNode, world)) {
		for _, cp := range powers(min(maxCP, world/tp)) {
			// Every layout uses all world ranks: tp × cp must divide it.
			if world%(tp*cp) != 0 || llama.CheckParallel(cfg, base.Layout.SeqLen, tp, cp) != nil {
				continue
			}
			for _, pp := range divisors(world / (tp * cp)) {
				if pp > 1 && pp*2 > cfg.NLayers {
					continue
				}
				dp := world / (tp * cp * pp)
				if global%(dp*accum) != 0 {
					continue
				}
				lbs := global / (dp * accum)
				for _, rep := range divisors(dp) {
					d := memplan.Degrees{PP: pp, DPReplicate: rep, DPShard: dp / rep, CP: cp, TP: tp}
					for _, l := range pipelines(base.Layout, d, lbs) {
						for _, ac := range SearchCheckpoints {
							l.Checkpoint = ac
							j := base
							j.Layout = l
							jobs = append(jobs, j)
						}
					}
				}
			}
		}
	}
	preds := predictAll(jobs, c, cal, o.Progress)
	var fits []Prediction
	for _, p := range preds {
		if p == nil {
			continue
		}
		res.Tried++
		if p.fitsWithin(o.Headroom) {
			fits = append(fits, *p)
		}
	}
	res.Fit = len(fits)
	if len(fits) == 0 {
		return res, fmt.Errorf("plan: no layout of %s on %d ranks of %s fits in %s per device with %.0f%% of it free (tried %d)", base.Flavor, world, c.Name, bytesize.Human(int64(c.Device.MemoryBytes)), 100*o.Headroom, res.Tried)
	}
	// Layouts as fast to four figures (what the table prints): the one
	// needing less memory first.
	sort.SliceStable(fits, func(i, j int) bool {
		a, b := fourFigures(fits[i].TokensPerDevice), fourFigures(fits[j].TokensPerDevice)
		if a != b {
			return a > b
		}
		return fits[i].MemoryBytes < fits[j].MemoryBytes
	})
	if g, err := Predict(base, c, cal); err != nil {
		res.GivenErr = err
	} else {
		var why []string
		switch {
		case !g.Fits():
			why = append(why, fmt.Sprintf("needs %s, more than the device's %s", bytesize.Human(int64(g.MemoryBytes)), bytesize.Human(int64(g.Capacity))))
		case !g.fitsWithin(o.Headroom):
			why = append(why, fmt.Sprintf("needs %s, more than %.0f%% of the device's %s", bytesize.Human(int64(g.MemoryBytes)),
				100*(1-o.Headroom), bytesize.Human(int64(g.Capacity))))
		}
		if g.TokensPerDevice < fits[0].TokensPerDevice {
			why = append(why, WhySlower(g, fits[0]))
		}
		res.Given = Candidate{Prediction: g, Why: strings.Join(why, "; ")}
		if g.fitsWithin(o.Headroom) {
			res.GivenRank = 1
			for _, p := range fits {
				if p.TokensPerDevice > g.TokensPerDevice {
					res.GivenRank++
				}
			}
		}
	}
	for i, p := range fits {
		if i == top {
			break
		}
		cand := Candidate{Prediction: p}
		if i > 0 {
			cand.Why = WhySlower(p, fits[0])
		}
		res.Top = append(res.Top, cand)
	}
	return res, nil
}

// predictAll predicts jobs on all the host's cores (memplan's memos are
// safe for concurrent use), each that fits and whose layout is valid in
// its place, nil where not, writing a line to progress (when not nil)
// every few seconds.
func predictAll(jobs []Job, c cluster.Cluster, cal Calibration, progress io.Writer) []*Prediction {
	out := make([]*Prediction, len(jobs))
	var next, done atomic.Int64
	var wg sync.WaitGroup
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(jobs); i = int(next.Add(1) - 1) {
				if p, err := predict(jobs[i], c, cal, true); err == nil {
					out[i] = &p
				}
				done.Add(1)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	start := time.Now()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-finished:
			return out
		case <-tick.C:
			if progress != nil {
				fmt.Fprintf(progress, "search: %d of %d layouts predicted (%.0f s)\n", done.Load(), len(jobs), time.Since(start).Seconds())
			}
		}
	}
}

// pipelines returns base's layout with degrees d and local batch lbs,
// once without a pipeline, or with pp > 1 once per schedule and
// microbatch size the schedule can run.
func pipelines(base Layout, d memplan.Degrees, lbs int) []Layout {
	l := base
	l.Degrees, l.LocalBatch = d, lbs
	l.LayersPerStage = nil // the stages are the search's: titan's planner cuts them for each pp and schedule
	if d.PP == 1 {
		l.MicrobatchRows = 1
		return []Layout{l}
	}
	var out []Layout
	for _, s := range SearchSchedules {
		for _, mb := range divisors(lbs) {
			m := lbs / mb
			if m < d.PP || (s == "Interleaved1F1B" && m%d.PP != 0) {
				continue
			}
			l.Schedule, l.MicrobatchRows = s, mb
			out = append(out, l)
		}
	}
	return out
}

// WhySlower explains why p is slower than best: its tokens/s against
// best's, the time a token takes beyond best's, and every part of the
// step that adds to it (largest first) or saves (in parentheses) at
// least half a percent, each as a share of best's time a token, so that
// the parts named add up to the total but for the parts under half a
// percent.
func WhySlower(p, best Prediction) string {
	perTok := func(x Prediction, s float64) float64 {
		return s / (x.TokensPerDevice * x.Step.Step)
	}
	bt := 1 / best.TokensPerDevice
	type diff struct {
		name string
		d    float64
	}
	var ds []diff
	pp, bp := p.Step.parts(), best.Step.parts()
	for i := range pp {
		if d := perTok(p, pp[i].Seconds) - perTok(best, bp[i].Seconds); math.Abs(d) >= 0.005*bt {
			ds = append(ds, diff{pp[i].Name, d})
		}
	}
	sort.SliceStable(ds, func(i, j int) bool { return ds[i].d > ds[j].d })
	var why, saves []string
	for _, x := range ds {
		if x.d > 0 {
			why = append(why, fmt.Sprintf("%s +%.0f%%", x.name, 100*x.d/bt))
		} else {
			saves = append([]string{fmt.Sprintf("%s %.0f%%", x.name, -100*x.d/bt)}, saves...)
		}
	}
	if len(saves) > 0 {
		why = append(why, "(saves "+strings.Join(saves, ", ")+")")
	}
	s := fmt.Sprintf("%.1f%% fewer tokens/s, +%.1f%% time a token: ", 100*(1-p.TokensPerDevice/best.TokensPerDevice), 100*(best.TokensPerDevice/p.TokensPerDevice-1))
	if len(why) == 0 {
		return s + "within rounding of the best"
	}
	return s + strings.Join(why, ", ")
}

// powers returns 1, 2, 4, ... up to n.
func powers(n int) []int {
	var out []int
	for p := 1; p <= n; p *= 2 {
		out = append(out, p)
	}
	return out
}

// divisors returns the divisors of n in increasing order.
func divisors(n int) []int {
	var out []int
	for i := 1; i <= n; i++ {
		if n%i == 0 {
			out = append(out, i)
		}
	}
	return out
}

// fourFigures is x rounded to four significant figures.
func fourFigures(x float64) float64 {
	if x <= 0 || math.IsInf(x, 0) || math.IsNaN(x) {
		return x
	}
	p := math.Pow(10, 3-math.Floor(math.Log10(x)))
	return math.Round(x*p) / p
}
