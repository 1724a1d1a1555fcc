package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/backend/cpu/gemm"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/launch"
	"github.com/titan-go/titan/internal/livemetrics"
	"github.com/titan-go/titan/internal/train"
)

// recipeFlags are the flags every recipe-driven command shares.
type recipeFlags struct {
	recipe string
	sets   []string
}

func (f *recipeFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.recipe, "recipe", "", "TOML recipe (e.g. recipes/llama3_debug.toml); built-in defaults when empty")
	cmd.Flags().StringArrayVar(&f.sets, "set", nil, "override a recipe key, section.key=value (repeatable)")
}

// load layers defaults < recipe < TITAN_* environment < --set, and validates.
func (f *recipeFlags) load() (*config.Job, error) {
	job, err := config.Load(f.recipe, f.sets, os.Environ())
	if err != nil {
		return nil, err
	}
	if err := job.Validate(); err != nil {
		return nil, err
	}
	return job, nil
}

func newTrainCmd() *cobra.Command {
	var rf recipeFlags
	var lf launchFlags
	cmd := &cobra.Command{
		Use:   "train",
		Short: "Train a model from a recipe",
		Long: `Train a model from a TOML recipe.

A run whose dump folder already holds checkpoints resumes from the newest
one. Ctrl-C stops after the current step and saves a checkpoint.

With --nproc N, titan starts N worker processes that split the CPU cores
and train data parallel; --nnodes, --node-rank and --rdzv-endpoint span
several machines as with torchrun. Under Slurm (srun) or with the env://
variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) every process is a
worker and no flag is needed.

Elastic jobs, as with torchrun: --max-restarts K stops every worker when
one dies or stops answering (heartbeats) and restarts them all from the
latest checkpoint, at most K times; --nnodes MIN:MAX lets nodes leave and
join (a new rendezvous round with the new world size, resuming resharded
from the latest checkpoint; the recipe's global batch and data order stay,
so set training.global_batch_size and data_parallel_shard_degree = -1).
--rdzv-backend c10d (default) hosts the rendezvous in the first launcher on
--rdzv-endpoint; --rdzv-backend etcd --rdzv-endpoint HOST:2379 keeps it in
an etcd cluster, so that it survives the loss of any node. Elastic
launchers of several nodes need the same TITANRUN_SECRET.

--metrics-addr serves the job's live figures (steps/s, loss, tokens/s,
MFU, each rank's step time, compute time and memory) in the Prometheus
text format at http://ADDR/metrics while it runs; --pprof has every worker
serve net/http/pprof on a loopback port it logs. Rank 0's log names a
straggler: a rank whose compute time per step is over 1.5x the median
for 3 steps in a row.`,
		Example: `  titan train --recipe recipes/llama3_debug.toml
  titan train --recipe recipes/llama3_debug.toml --set training.steps=50 --set job.dump_folder=/tmp/run1
  TITAN_TRAINING_SEED=7 titan train --recipe recipes/llama3_tiny_bench.toml
  titan train --recipe recipes/llama3_debug.toml --nproc 2
  titan train --recipe recipes/llama3_debug.toml --nproc 4 --metrics-addr 127.0.0.1:9400 --pprof
  titan train --recipe r.toml --nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.1:29500 --nproc 8
  titan train --recipe recipes/llama3_debug.toml --nproc 4 --max-restarts 3
  TITANRUN_SECRET=... titan train --recipe r.toml --nnodes 1:4 --nproc 8 --max-restarts 3 --rdzv-backend etcd --rdzv-endpoint etcd0:2379
  srun -n 4 titan train --recipe recipes/llama3_debug.toml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			job, err := rf.load()
			if err != nil {
				return err
			}
			if job.Job.PrintConfig {
				s, err := job.TOML()
				if err != nil {
					return err
				}
				fmt.Fprint(cmd.OutOrStdout(), s)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			seen := make(chan os.Signal, 1) // the first signal, for the exit status
			signal.Notify(seen, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(seen)
			cs := commSettingsOf(job)
			lf.checkWorld = func(world int) error {
				// Checked before any worker starts, so the error names the
				// key once (every worker would fail on it).
				if err := os.MkdirAll(job.Job.DumpFolder, 0o755); err != nil {
					return fmt.Errorf("job.dump_folder: %w", err)
				}
				return train.CheckWorld(job, world)
			}
			err = lf.distributed(ctx, cmd.OutOrStdout(), cs, func(w *launch.Worker) error {
				if w == nil || w.Rank == 0 {
					if err := job.SaveConfigFile(); err != nil { // job.save_config_file
						return err
					}
				}
				if addr, err := livemetrics.StartPprof(); err != nil {
					return err
				} else if addr != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "titan: pprof on http://%s/debug/pprof/\n", addr)
				}
				var dist *train.Dist
				threads := job.Training.Threads
				if w != nil {
					dist = &train.Dist{Rank: w.Rank, World: w.WorldSize, Group: w.World, Hosts: w.Hosts()}
					if threads == 0 {
						threads = w.Threads
					}
				}
				dev, err := trainDevice(job, threads, dist != nil)
				if err != nil {
					return err
				}
				tr, err := train.New(job, dev, cmd.OutOrStdout(), dist)
				if err != nil {
					if dev.Backend.Name() == "cuda" {
						err = fmt.Errorf("training.device = \"cuda\": %w", err)
					}
					return err
				}
				defer tr.Close()
				tr.RecipePath = rf.recipe
				return tr.Run(ctx)
			})
			if errors.Is(err, context.Canceled) || errors.Is(err, launch.ErrInterrupted) {
				if !train.SavesCheckpoints(job) {
					return interruptedBy(fmt.Errorf("%w (checkpoint.enable is off, so nothing was saved: the same command starts again from step 1)", errInterruptedUnsaved), seen)
				}
				return interruptedBy(errInterrupted, seen)
			}
			return err
		},
	}
	rf.register(cmd)
	lf.register(cmd)
	lf.registerObservability(cmd)
	return cmd
}

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Show or validate a resolved recipe",
		Example: `  titan config show --recipe recipes/llama3_8b.toml
  titan config validate --recipe recipes/llama3_405b.toml`,
	}
	var show, validate recipeFlags
	showCmd := &cobra.Command{
		Use:   "show",
		Short: "Print the fully resolved recipe as TOML",
		Long:  "Print the recipe after layering built-in defaults < recipe file < TITAN_* environment < --set.",
		Example: `  titan config show --recipe recipes/llama3_8b.toml
  titan config show --recipe recipes/llama3_debug.toml --set training.steps=5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			job, err := show.load()
			if err != nil {
				return err
			}
			s, err := job.TOML()
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), s)
			return nil
		},
	}
	show.register(showCmd)
	var world int
	validateCmd := &cobra.Command{
		Use:   "validate",
		Short: "Check a recipe: keys, types, values and the parallel layout",
		Example: `  titan config validate --recipe recipes/llama3_405b.toml
  titan config validate --recipe recipes/llama3_debug.toml --world 4 --set parallelism.tensor_parallel_degree=2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			job, err := validate.load()
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("world") {
				if world < 1 {
					return fmt.Errorf("--world %d: want the job's number of workers (--nproc × nodes)", world)
				}
				if err := train.CheckWorld(job, world); err != nil {
					return err
				}
			} else {
				fam, err := train.ModelFamily(job)
				if err != nil {
					return err
				}
				if err := train.CheckLayout(job, fam); err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", validate.recipe)
			return nil
		},
	}
	validate.register(validateCmd)
	validateCmd.Flags().IntVar(&world, "world", 0, "also check the layout on this many workers (--nproc × nodes; data_parallel_shard_degree = -1 takes what the others leave)")
	cmd.AddCommand(showCmd, validateCmd)
	return cmd
}

// cpuDevice is the CPU backend with threads workers (0: every core) as a
// training device.
// With bf16 parameters the MFU reference is the bfloat16 GEMM's peak
// (gemm.BF16PeakRatio times the float32 one).
func cpuDevice(threads int, bf16 bool) train.Device {
	be := cpu.New(threads)
	d := train.Device{
		Backend:   be,
		Name:      fmt.Sprintf("cpu (gemm %s), %d threads", gemm.Kernel(), be.Threads()),
		PeakFLOPS: cpu.HostPeakFLOPS(),
	}
	if bf16 {
		d.Name = fmt.Sprintf("cpu (gemm %s, bf16 %s), %d threads", gemm.Kernel(), gemm.BF16Kernel(), be.Threads())
		d.PeakFLOPS *= gemm.BF16PeakRatio()
	}
	return d
}
