package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/generate/hyenagen"
	"github.com/titan-go/titan/internal/launch"
	"github.com/titan-go/titan/internal/longconv"
	"github.com/titan-go/titan/internal/model/hyena"
	"github.com/titan-go/titan/internal/modelfile"
	"github.com/titan-go/titan/internal/recipebench"
	"github.com/titan-go/titan/internal/train"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks of titan's building blocks",
		Example: `  titan bench comm --op allreduce --size 64MiB --nproc 2
  titan bench generate --recipe recipes/hyena_debug.toml --length 1024 --mode lazy,flash`,
	}
	cmd.AddCommand(newBenchCommCmd(), newBenchGenerateCmd(), newBenchRecipesCmd())
	return cmd
}

func newBenchRecipesCmd() *cobra.Command {
	var steps, nproc int
	var sets []string
	var asJSON bool
	var plotPath, dir string
	cmd := &cobra.Command{
		Use:   "recipes RECIPE.toml...",
		Short: "Train recipes side by side and compare them",
		Long: `Train each recipe for --steps steps, each as its own titan train run, and
compare tokens/s, TFLOP/s, MFU, peak memory, final loss, the loss at equal
tokens (the most every run reached) and the time to the first checkpoint.
Progress goes to stderr; --plot writes throughput bars and loss curves.`,
		Example: `  titan bench recipes recipes/llama3_debug.toml recipes/hyena_debug.toml --steps 20
  titan bench recipes a.toml b.toml --steps 50 --nproc 2 --json --plot cmp.png`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, recipes []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			kept := dir != ""
			if !kept {
				if dir, err = os.MkdirTemp("", "titan-bench-recipes-"); err != nil {
					return err
				}
				defer os.RemoveAll(dir)
			}
			rs, err := recipebench.Run(cmd.Context(), recipebench.Options{
				Exe: exe, Recipes: recipes, Steps: steps, NProc: nproc, Sets: sets, Dir: dir, Progress: cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			if !kept {
				for i := range rs {
					rs[i].Dump = "" // removed on return: --out keeps them
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := recipebench.WriteJSON(out, rs); err != nil {
					return err
				}
			} else {
				recipebench.WriteTable(out, rs)
			}
			if plotPath != "" {
				files, err := recipebench.Plot(plotPath, rs)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "titan: plots %s\n", strings.Join(files, ", "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&steps, "steps", 20, "training steps of every run")
	f.IntVar(&nproc, "nproc", 1, "worker processes per run")
	f.StringArrayVar(&sets, "set", nil, "override a recipe key in every run, section.key=value (repeatable)")
	f.BoolVar(&asJSON, "json", false, `print one JSON line per recipe ({"recipe", "tokens_per_sec", "mfu", "mem_gib", "final_loss", ...})`)
	f.StringVar(&plotPath, "plot", "", "write FILE-throughput.png and FILE-loss.png")
	f.StringVar(&dir, "out", "", "keep the runs' dump folders here (default: a temporary folder, removed)")
	return cmd
}

func newBenchCommCmd() *cobra.Command {
	var lf launchFlags
	var op, size, transport, resultFile string
	var iters, warmup int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "comm",
		Short: "Collective bandwidth across worker processes (nccl-tests style)",
		Long: `Time a collective on float32 buffers across --nproc worker processes and
print the algorithm and bus bandwidth as nccl-tests defines them (busbw =
algbw × 2(n-1)/n for allreduce, × (n-1)/n for reduce_scatter, all_gather and
all_to_all).`,
		Example: `  titan bench comm --op allreduce --size 64MiB --nproc 2
  titan bench comm --op reduce_scatter --size 256MiB --nproc 4 --transport tcp --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bytes, err := comm.ParseSize(size)
			if err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			if _, err := comm.BusFactor(op, 2); err != nil {
				return fmt.Errorf("--op: %w", err)
			}
			f, err := lf.flags()
			if err != nil {
				return err
			}
			spec, err := launch.Detect(os.Environ(), f)
			if err != nil {
				return err
			}
			if spec.Mode == launch.ModeStandalone {
				return fmt.Errorf("bench comm needs at least 2 processes: add --nproc N")
			}
			if spec.Mode == launch.ModeLauncher {
				dir, err := os.MkdirTemp("", "titan-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				resultFile = filepath.Join(dir, "result.json")
				saved := commandArgs
				commandArgs = append(append([]string{}, commandArgs...), "--result-file", resultFile)
				defer func() { commandArgs = saved }()
			}
			err = lf.distributed(cmd.Context(), os.Stderr, commSettings{Timeout: 5 * time.Minute}, func(w *launch.Worker) error {
				g := w.World
				if transport != "auto" && transport != g.Transport() {
					sub, err := comm.NewWorld(cmd.Context(), w.Control, w.Rank, w.WorldSize, comm.Options{Transport: transport, StorePrefix: "bench-" + transport, Secret: w.Spec.Secret})
					if err != nil {
						return err
					}
					defer sub.Close()
					g = sub
				}
				res, err := comm.BenchCollective(cmd.Context(), g, op, bytes, iters, warmup)
				if err != nil {
					return err
				}
				if w.Rank == 0 && resultFile != "" {
					b, _ := json.Marshal(res)
					return os.WriteFile(resultFile, b, 0o644)
				}
				return nil
			})
			if err != nil || spec.Mode != launch.ModeLauncher {
				return err
			}
			raw, err := os.ReadFile(resultFile)
			if err != nil {
				return fmt.Errorf("bench comm: rank 0 wrote no result: %w", err)
			}
			var res comm.BenchResult
			if err := json.Unmarshal(raw, &res); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(res)
			}
			fmt.Fprintf(out, "#%15s %12s %6s %9s %12s %12s %12s\n", "op", "size(B)", "nproc", "transport", "time(us)", "algbw(GB/s)", "busbw(GB/s)")
			fmt.Fprintf(out, " %15s %12d %6d %9s %12.1f %12.3f %12.3f\n", res.Op, res.SizeBytes, res.NProc, res.Transport, res.TimeS*1e6, res.AlgBW, res.BusBW)
			return nil
		},
	}
	f := cmd.Flags()
	lf.register(cmd)
	f.StringVar(&op, "op", "allreduce", "allreduce, reduce_scatter, all_gather, all_to_all, broadcast or sendrecv (each rank to the next)")
	f.StringVar(&size, "size", "64MiB", "buffer size (e.g. 1MiB, 64MiB, 1GiB)")
	f.StringVar(&transport, "transport", "auto", "auto (shared memory on one host), tcp or shm")
	f.IntVar(&iters, "iters", 10, "timed iterations")
	f.IntVar(&warmup, "warmup", 2, "untimed iterations first")
	f.BoolVar(&asJSON, "json", false, `print {"op", "size_bytes", "nproc", "time_s", "algbw_gbps", "busbw_gbps"}`)
	f.StringVar(&resultFile, "result-file", "", "where rank 0 writes its result (set by the launcher)")
	f.MarkHidden("result-file")
	return cmd
}

func newBenchGenerateCmd() *cobra.Command {
	var rf recipeFlags
	var ckpt, modes, lengths, plotFile string
	var length, batch, prompt, threads, fftTile, slowMax int
	var seed uint64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Time Hyena generation: lazy, eager and flash long convolutions",
		Long: `Generate --length positions per sequence greedily with a Hyena model in each
--mode and report, per mode, the position-mixing (mixer) time of the online
long convolutions, the rest of the model, the total, per-token latency (p50,
p99) and tokens per second, with flash's FFT tile crossover, measured on this
machine unless --fft-tile is given. The model is the recipe's, randomly
initialised from its training.seed (no checkpoint needed), or --checkpoint.

--lengths (or --plot alone: powers of two from 2^10 up to --length) sweeps
several lengths; lazy and eager are skipped above --slow-max. --plot writes
time against length on log-log axes as a PNG.`,
		Example: `  titan bench generate --recipe recipes/hyena_debug.toml --length 1024 --mode lazy,eager,flash
  titan bench generate --recipe recipes/hyena_debug.toml --set model.flavor=long --length 131072 --mode lazy,flash --threads 1 --plot bench/generate/time.png
  titan bench generate --checkpoint outputs/hyena_debug/checkpoint --length 1024 --batch 4 --prompt 64 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ms []longconv.Mode
			for _, m := range strings.Split(modes, ",") {
				mode, err := hyenagen.ParseMode(m)
				if err != nil {
					return fmt.Errorf("--mode: %w", err)
				}
				ms = append(ms, mode)
			}
			if length < 0 || cmd.Flags().Changed("length") && length == 0 {
				return fmt.Errorf("--length %d must be positive", length)
			}
			if batch < 1 {
				return fmt.Errorf("--batch %d must be positive", batch)
			}
			cfg, flat, name, err := benchModel(&rf, ckpt)
			if err != nil {
				return err
			}
			if length == 0 {
				length = cfg.LMax // the whole of the model's filters
			}
			if prompt < 0 || prompt >= length {
				return fmt.Errorf("--prompt %d must be in [0, --length %d)", prompt, length)
			}
			ls, err := benchLengths(lengths, length, plotFile != "")
			if err != nil {
				return err
			}
			if ls[len(ls)-1] > cfg.LMax {
				return fmt.Errorf("--length %d exceeds the model's l_max %d (the length of its filters; a longer flavor such as long has more)", ls[len(ls)-1], cfg.LMax)
			}
			be := cpu.New(threads)
			defer be.Close()
			params := be.Alloc(backend.Float32, len(flat))
			be.Upload(params, flat)
			stderr := cmd.ErrOrStderr()
			if fftTile == 0 {
				fftTile = longconv.MeasureFFTTile()
				fmt.Fprintf(stderr, "bench generate: measured FFT tile crossover: %d (flash tiles of this side and more by FFT)\n", fftTile)
			}
			out := cmd.OutOrStdout()
			if !asJSON {
				fmt.Fprintf(out, "%s: %s, batch %d, prompt %d, %d threads, flash FFT tiles from side %d\n", name, cfg, batch, prompt, be.Threads(), fftTile)
				fmt.Fprintf(out, "%-6s %8s %10s %10s %10s %7s %9s %9s %11s\n", "mode", "length", "mixer_s", "other_s", "total_s", "mixer%", "p50_ms", "p99_ms", "tokens/s")
			}
			enc := json.NewEncoder(out)
			emit := func(r hyenagen.BenchResult) {
				if asJSON {
					enc.Encode(r)
					return
				}
				fmt.Fprintf(out, "%-6s %8d %10.4f %10.4f %10.4f %6.1f%% %9.4f %9.4f %11.1f\n", r.Mode, r.Length, r.MixerS, r.OtherS, r.TotalS, 100*r.MixerFraction(), r.P50Ms, r.P99Ms, r.TokensPerS)
			}
			results, skipped, err := hyenagen.Bench(be, cfg, params, hyenagen.BenchOptions{
				Modes: ms, Lengths: ls, Batch: batch, Prompt: prompt, Threads: be.Threads(),
				FFTTile: fftTile, SlowMax: slowMax, Seed: seed, Progress: stderr,
			}, emit)
			if err != nil {
				return err
			}
			if !asJSON {
				printSpeedups(out, results)
			}
			var cut int
			if len(skipped) > 0 {
				cut = slowMax
				fmt.Fprintf(stderr, "bench generate: %d runs skipped above --slow-max %d\n", len(skipped), slowMax)
			}
			if plotFile != "" {
				notes := benchNotes(cfg, name, batch, prompt, be.Threads(), fftTile, cut)
				f, err := os.Create(plotFile)
				if err != nil {
					return fmt.Errorf("--plot: %w", err)
				}
				err = hyenagen.Chart("hyena generation: time against length", results, notes).WritePNG(f)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return fmt.Errorf("--plot %s: %w", plotFile, err)
				}
				fmt.Fprintf(stderr, "bench generate: wrote %s\n", plotFile)
			}
			return nil
		},
	}
	rf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&ckpt, "checkpoint", "", "time this hyena checkpoint instead of the recipe's random model")
	f.IntVar(&length, "length", 0, "positions per sequence (prompt included); the largest of a --plot sweep (default: the model's l_max)")
	f.StringVar(&lengths, "lengths", "", "comma-separated lengths to sweep, e.g. 2^10,2^12,5000 (default: --length; with --plot, powers of two from 2^10 to --length)")
	f.StringVar(&modes, "mode", "lazy,eager,flash", "comma-separated modes: lazy, eager, flash")
	f.IntVar(&batch, "batch", 1, "sequences generated together")
	f.IntVar(&prompt, "prompt", 0, "random prompt positions per sequence, prefilled in one pass (0: start from token 0)")
	f.IntVar(&threads, "threads", 0, "CPU threads for the model and the long convolutions (0: all)")
	f.IntVar(&fftTile, "fft-tile", 0, "smallest flash tile side computed by FFT (0: measure on this machine; -1: never)")
	f.IntVar(&slowMax, "slow-max", 1<<16, "skip lazy and eager above this length (0: never)")
	f.Uint64Var(&seed, "seed", 0, "seed of the random prompt tokens")
	f.BoolVar(&asJSON, "json", false, `print one line per mode and length: {"mode", "length", "mixer_s", "other_s", "total_s", "p50_ms", "p99_ms", "tokens_per_s", ...}`)
	f.StringVar(&plotFile, "plot", "", "write time against length (log-log) for each mode to this PNG")
	return cmd
}

// benchLengths parses --lengths ("2^10,4096"), or gives --length alone,
// or with a plot the powers of two from 2^10 up to --length (and
// --length itself).
func benchLengths(list string, length int, sweep bool) ([]int, error) {
	var out []int
	if list != "" {
		for _, f := range strings.Split(list, ",") {
			f = strings.TrimSpace(f)
			var n int
			var err error
			if base, exp, ok := strings.Cut(f, "^"); ok {
				var k int
				if base != "2" {
					err = fmt.Errorf("only powers of two are written with ^")
				} else if k, err = strconv.Atoi(exp); err == nil && (k < 0 || k > 30) {
					err = fmt.Errorf("exponent out of range")
				}
				n = 1 << k
			} else {
				n, err = strconv.Atoi(f)
			}
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--lengths: %q is not a positive length (write 4096 or 2^12)", f)
			}
			out = append(out, n)
		}
		slices.Sort(out)
		return slices.Compact(out), nil
	}
	if !sweep {
		return []int{length}, nil
	}
	for p := 1 << 10; p <= length; p *= 2 {
		out = append(out, p)
	}
	if len(out) == 0 || out[len(out)-1] != length {
		out = append(out, length)
	}
	return out, nil
}

// benchModel is the model bench generate times: --checkpoint's, or the
// recipe's initialised from training.seed; name says which.
func benchModel(rf *recipeFlags, ckpt string) (cfg hyena.Config, flat []float32, name string, err error) {
	if ckpt != "" {
		m, err := modelfile.Load(ckpt)
		if err != nil {
			return cfg, nil, "", fmt.Errorf("--checkpoint: %w", err)
		}
		if m.Desc.Name != "hyena" {
			return cfg, nil, "", fmt.Errorf("--checkpoint %s holds a %s model: bench generate times hyena models", ckpt, m.Desc.Name)
		}
		return *m.Desc.Hyena, m.Params, "checkpoint " + m.Dir, nil
	}
	job, err := rf.load()
	if err != nil {
		return cfg, nil, "", err
	}
	if job.Model.Name != "hyena" {
		return cfg, nil, "", fmt.Errorf("model.name %q: bench generate times hyena models (use a hyena recipe or --checkpoint)", job.Model.Name)
	}
	fam, err := train.ModelFamily(job)
	if err != nil {
		return cfg, nil, "", err
	}
	cfg = fam.(hyena.Family).Cfg
	var s uint64
	if job.Training.Seed != nil {
		s = uint64(*job.Training.Seed)
	}
	flat = make([]float32, cfg.NumParams())
	hyena.InitParams(cfg, s, flat, 0)
	return cfg, flat, "flavor " + job.Model.Flavor, nil
}

// benchNotes are the lines under a bench generate chart's legend: the
// model, the run's settings and, when cut > 0, the cutoff of the slow
// modes.
func benchNotes(cfg hyena.Config, name string, batch, prompt, threads, fftTile, cut int) []string {
	notes := []string{
		name,
		fmt.Sprintf("d_model %d, %d layers, order %d, vocab %d", cfg.DModel, cfg.NLayer, cfg.Order, cfg.VocabSize),
		fmt.Sprintf("batch %d, prompt %d, threads %d, FFT tiles from %d", batch, prompt, threads, fftTile),
		"solid: total, dashed: mixer",
	}
	if cut > 0 {
		notes = append(notes, fmt.Sprintf("lazy and eager skipped above L=%d", cut))
	}
	return notes
}

// printSpeedups prints flash's speedup over the other modes at every
// length where both ran.
func printSpeedups(w io.Writer, results []hyenagen.BenchResult) {
	flash := map[int]hyenagen.BenchResult{}
	for _, r := range results {
		if r.Mode == "flash" {
			flash[r.Length] = r
		}
	}
	for _, r := range results {
		f, ok := flash[r.Length]
		if !ok || r.Mode == "flash" || f.MixerS == 0 || f.TotalS == 0 {
			continue
		}
		fmt.Fprintf(w, "flash vs %s at L=%d: mixer %.1f×, end to end %.2f×\n", r.Mode, r.Length, r.MixerS/f.MixerS, r.TotalS/f.TotalS)
	}
}

func newDebugCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "debug",
		Short:   "Post-mortem tools for distributed runs",
		Example: "  titan debug flight outputs/llama3_debug/comm_traces",
	}
	var asJSON bool
	flight := &cobra.Command{
		Use:   "flight DIR",
		Short: "Name the ranks that never entered the collective the others wait in",
		Long: `Read the flight-recorder dumps (flight-rank*.json) that workers write on a
collective timeout or on SIGUSR1 (kill -USR1 <worker pid>), by default into
<job.dump_folder>/<comm.save_traces_folder>, and report for each process group
the first collective that some ranks entered and others never reached.`,
		Example: `  titan debug flight outputs/llama3_debug/comm_traces`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := comm.AnalyzeFlight(args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
			}
			fmt.Fprintln(cmd.OutOrStdout(), strings.TrimSpace(rep.Summary))
			return nil
		},
	}
	flight.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.AddCommand(flight)
	return cmd
}
