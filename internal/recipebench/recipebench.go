// Package recipebench compares training recipes side by side: it trains
// each recipe for the same number of steps as its own `titan train`
// process (as a user would run it; each run is recorded in the run store
// like any other), reads the run's metrics.jsonl and checkpoints, and
// reports throughput, MFU, memory, final loss, loss at
// equal tokens and the time to the first checkpoint, as a table, JSON
// lines and plots.
package recipebench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/plot"
)

// Options say what to run.
type Options struct {
	// Exe is the titan binary to run.
	Exe string
	// Recipes are the recipe files, compared in this order.
	Recipes []string
	// Steps is the number of training steps of every run.
	Steps int
	// NProc is the number of worker processes per run (0 or 1: one).
	NProc int
	// Sets are extra --set overrides applied to every run.
	Sets []string
	// Dir holds each run's dump folder (run-<i>).
	Dir string
	// Progress receives one line per logged step of each run.
	Progress io.Writer
}

// Result is one recipe's run.
type Result struct {
	Recipe string `json:"recipe"`
	// RunID is the run's id in the run store ("" when it was not
	// recorded; see metrics.enable_db).
	RunID string `json:"run_id"`
	Dump  string `json:"dump_folder,omitempty"`
	Steps int    `json:"steps"`
	// TokensPerSec, TFLOPs and MFU are means over the logged steps after
	// the first (which holds start-up).
	TokensPerSec float64 `json:"tokens_per_sec"`
	TFLOPs       float64 `json:"tflops"`
	MFU          float64 `json:"mfu"`
	// MemGiB is the peak resident memory of the largest worker.
	MemGiB    float64 `json:"mem_gib"`
	FinalLoss float64 `json:"final_loss"`
	// LossAtEqualTokens is the loss (interpolated in tokens) at
	// EqualTokens, the most tokens every compared run reached.
	LossAtEqualTokens float64 `json:"loss_at_equal_tokens"`
	EqualTokens       int64   `json:"equal_tokens"`
	Tokens            int64   `json:"tokens"`
	// FirstCheckpointS is the time from the run's start to its first
	// checkpoint on disk (-1: none written).
	FirstCheckpointS float64 `json:"first_checkpoint_s"`
	WallS            float64 `json:"wall_s"`
	// Curve is the loss per logged step, against tokens.
	Curve []Point `json:"-"`
}

// Point is one logged step.
type Point struct {
	Tokens int64
	Loss   float64
}

// Run trains every recipe in turn and returns their results, with the
// loss at equal tokens filled in across them. A run that fails stops the
// comparison with its error and output.
func Run(ctx context.Context, o Options) ([]Result, error) {
	if len(o.Recipes) == 0 {
		return nil, errors.New("recipebench: no recipes")
	}
	if o.Steps < 2 {
		return nil, fmt.Errorf("recipebench: --steps %d: need at least 2 steps (the first holds start-up)", o.Steps)
	}
	// Every recipe is checked, on the comparison's workers, before any
	// trains: a mistake in the last one should not cost the others' runs.
	for _, r := range o.Recipes {
		if _, err := os.Stat(r); err != nil {
			return nil, fmt.Errorf("recipebench: recipe %s: %w", r, err)
		}
		args := []string{"config", "validate", "--recipe", r, "--world", strconv.Itoa(max(o.NProc, 1)), "--set", "training.steps=" + strconv.Itoa(o.Steps)}
		for _, s := range o.Sets {
			args = append(args, "--set", s)
		}
		if out, err := exec.CommandContext(ctx, o.Exe, args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("recipebench: recipe %s: %s", r, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "titan: ")))
		}
	}
	var out []Result
	for i, recipe := range o.Recipes {
		dump := filepath.Join(o.Dir, fmt.Sprintf("run-%d", i))
		if err := os.RemoveAll(dump); err != nil {
			return nil, err
		}
		res, err := runOne(ctx, o, i, recipe, dump)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	equalize(out)
	return out, nil
}

// runOne trains one recipe into dump.
func runOne(ctx context.Context, o Options, i int, recipe, dump string) (Result, error) {
	args := []string{"train", "--recipe", recipe,
		"--set", "training.steps=" + strconv.Itoa(o.Steps),
		"--set", "metrics.log_freq=1",
		"--set", "job.dump_folder=" + dump}
	for _, s := range o.Sets {
		args = append(args, "--set", s)
	}
	if o.NProc > 1 {
		args = append(args, "--nproc", strconv.Itoa(o.NProc))
	}
	cmd := exec.CommandContext(ctx, o.Exe, args...)
	logPath := filepath.Join(o.Dir, fmt.Sprintf("run-%d.log", i))
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return Result{}, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return Result{}, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Result{}, fmt.Errorf("recipebench: starting %s: %w", o.Exe, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	seen := 0
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var werr error
	for running := true; running; {
		select {
		case werr = <-done:
			running = false
		case <-tick.C:
		}
		recs, _ := readMetrics(filepath.Join(dump, "metrics.jsonl"))
		for ; seen < len(recs) && o.Progress != nil; seen++ {
			r := recs[seen]
			fmt.Fprintf(o.Progress, "[%d/%d %s] step %d/%d  loss %.4f  tokens/s %.0f\n", i+1, len(o.Recipes), filepath.Base(recipe), r.Step, o.Steps, r.Loss, r.TokensPerSec)
		}
	}
	wall := time.Since(start).Seconds()
	if werr != nil {
		tail, _ := os.ReadFile(logPath)
		return Result{}, fmt.Errorf("recipebench: %s failed: %w\n%s", recipe, werr, lastLines(string(tail), 20))
	}
	recs, err := readMetrics(filepath.Join(dump, "metrics.jsonl"))
	if err != nil {
		return Result{}, fmt.Errorf("recipebench: %s: %w", recipe, err)
	}
	res := summarize(recs)
	res.Recipe, res.Dump, res.WallS = recipe, dump, wall
	if log, err := os.ReadFile(logPath); err == nil {
		res.RunID = runID(string(log))
	}
	res.FirstCheckpointS = firstCheckpoint(dump, start)
	return res, nil
}

// readMetrics reads a metrics.jsonl (missing: none yet).
func readMetrics(path string) ([]metrics.Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []metrics.Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r metrics.Record
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			out = append(out, r)
		}
	}
	return out, sc.Err()
}

// summarize computes a run's figures from its records (one per step).
func summarize(recs []metrics.Record) Result {
	var res Result
	if len(recs) == 0 {
		return res
	}
	last := recs[len(recs)-1]
	res.Steps, res.FinalLoss, res.Tokens = last.Step, last.Loss, last.Tokens
	steady := recs
	if len(recs) > 1 {
		steady = recs[1:]
	}
	for _, r := range steady {
		res.TokensPerSec += r.TokensPerSec / float64(len(steady))
		res.TFLOPs += r.TFLOPs / float64(len(steady))
		res.MFU += r.MFU / float64(len(steady))
	}
	for _, r := range recs {
		res.MemGiB = math.Max(res.MemGiB, r.MemGiB)
		res.Curve = append(res.Curve, Point{Tokens: r.Tokens, Loss: r.Loss})
	}
	return res
}

// equalize sets every result's loss at the most tokens all runs reached.
func equalize(rs []Result) {
	var common int64 = math.MaxInt64
	for _, r := range rs {
		common = min(common, r.Tokens)
	}
	for i := range rs {
		rs[i].EqualTokens = common
		rs[i].LossAtEqualTokens = lossAt(rs[i].Curve, common)
	}
}

// lossAt interpolates a curve's loss linearly in tokens.
func lossAt(c []Point, tokens int64) float64 {
	if len(c) == 0 {
		return math.NaN()
	}
	for i, p := range c {
		if p.Tokens >= tokens {
			if i == 0 || p.Tokens == tokens {
				return p.Loss
			}
			q := c[i-1]
			f := float64(tokens-q.Tokens) / float64(p.Tokens-q.Tokens)
			return q.Loss + f*(p.Loss-q.Loss)
		}
	}
	return c[len(c)-1].Loss
}

// firstCheckpoint is the seconds from start to the first checkpoint
// step folder's metadata (-1: none).
func firstCheckpoint(dump string, start time.Time) float64 {
	matches, _ := filepath.Glob(filepath.Join(dump, "*", "step-*", "metadata.json"))
	best := -1.0
	for _, m := range matches {
		fi, err := os.Stat(m)
		if err != nil {
			continue
		}
		if s := fi.ModTime().Sub(start).Seconds(); best < 0 || s < best {
			best = s
		}
	}
	return best
}

// runID finds the run store's id in a training log ("titan: run ID,
// recording to ...").
func runID(log string) string {
	for _, l := range strings.Split(log, "\n") {
		if i := strings.Index(l, "titan: run "); i >= 0 && strings.Contains(l, ", recording to ") {
			f := strings.Fields(l[i+len("titan: run "):])
			if len(f) > 0 {
				return strings.TrimSuffix(f[0], ",")
			}
		}
	}
	return ""
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WriteTable prints the comparison, one row per recipe.
func WriteTable(w io.Writer, rs []Result) {
	fmt.Fprintf(w, "%-32s %10s %8s %7s %8s %10s %12s %10s  %s\n", "recipe", "tokens/s", "TFLOP/s", "MFU %", "mem GiB", "final loss", "loss@tokens", "1st ckpt s", "run")
	for _, r := range rs {
		ck := "-"
		if r.FirstCheckpointS >= 0 {
			ck = fmt.Sprintf("%.1f", r.FirstCheckpointS)
		}
		fmt.Fprintf(w, "%-32s %10.0f %8.4f %7.2f %8.3f %10.4f %12.4f %10s  %s\n", filepath.Base(r.Recipe), r.TokensPerSec, r.TFLOPs, r.MFU, r.MemGiB, r.FinalLoss, r.LossAtEqualTokens, ck, r.RunID)
	}
	if len(rs) > 0 {
		fmt.Fprintf(w, "loss@tokens: the loss at %d tokens, the most every run reached\n", rs[0].EqualTokens)
	}
}

// WriteJSON prints one JSON object per recipe.
func WriteJSON(w io.Writer, rs []Result) error {
	enc := json.NewEncoder(w)
	for _, r := range rs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// Plot writes two PNGs next to path (path with "-throughput" and "-loss"
// before its extension): tokens/s bars and loss curves against tokens.
func Plot(path string, rs []Result) ([]string, error) {
	ext := filepath.Ext(path)
	base := strings.TrimSuffix(path, ext)
	if ext == "" {
		ext = ".png"
	}
	bars := plot.Bars{Title: "throughput", YLabel: "tokens/s"}
	chart := plot.Chart{Title: "loss against tokens", XLabel: "tokens", YLabel: "loss"}
	for i, r := range rs {
		name := strings.TrimSuffix(filepath.Base(r.Recipe), ".toml")
		bars.Labels = append(bars.Labels, name)
		bars.Values = append(bars.Values, r.TokensPerSec)
		s := plot.Series{Label: name, Color: plot.Palette[i%len(plot.Palette)]}
		for _, p := range r.Curve {
			if p.Tokens > 0 && p.Loss > 0 {
				s.X, s.Y = append(s.X, float64(p.Tokens)), append(s.Y, p.Loss)
			}
		}
		chart.Series = append(chart.Series, s)
	}
	var written []string
	for _, f := range []struct {
		name string
		w    func(io.Writer) error
	}{{base + "-throughput" + ext, bars.WritePNG}, {base + "-loss" + ext, chart.WritePNG}} {
		out, err := os.Create(f.name)
		if err != nil {
			return written, err
		}
		err = f.w(out)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return written, fmt.Errorf("recipebench: plot %s: %w", f.name, err)
		}
		written = append(written, f.name)
	}
	return written, nil
}
