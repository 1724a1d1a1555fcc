package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/titan-go/titan/internal/atomicfile"
	"github.com/titan-go/titan/internal/cluster"
	"github.com/titan-go/titan/internal/plan"
)

func newPlanCmd() *cobra.Command {
	var rf recipeFlags
	var clusterRef, calPath, plotPath, priorsPath string
	var world, top, maxCP, maxTP int
	var calNProcs []int
	var headroom float64
	var asJSON, search, calibrate, reference, compile, float8, asyncTP bool
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Predict a recipe's memory and speed on a cluster, or search the fastest layout",
		Long: `Predict, per rank, the memory (memplan's estimate, the one titan train refuses
jobs with) and the step time of a recipe on a cluster, with their breakdowns,
tokens/s per device and MFU. Compute is timed per kind of operation at a
calibrated efficiency, each parallelism's communication with the overlap it
gets, and the pipeline bubble by simulating the schedule.

Clusters are configs/clusters/*.toml (` + "`titan plan --cluster x`" + ` lists them) or a
path to such a file; "this" is this machine, calibrated by --calibrate
(titan's own kernels — GEMMs, attention over whole rows and as one rank's
ring attention at each measured process count, the element-wise passes —
its collectives, a short training step, the same step under per-operation and
full activation checkpointing (which run faster here than the rates without
it predict: the recomputed activations are read back from the CPU's caches;
CPU hosts only), and that step run side by side by as
many processes as ranks would share the host (up to its cores); the file goes
under the user's cache folder, or --calibration / $TITAN_PLAN_CALIBRATION). GPU clusters are
calibrated from one published configuration only (torchtitan's Llama 3.1 8B
on 8 H100 with FSDP), with the efficiencies that row cannot separate from the
matmul's (attention, float8, element-wise, communication) set by priors:
assumed, or measured on a GPU by bench/plan/gpu_priors.py (--priors, its
JSON); --reference predicts every other published row.

--search enumerates dp_replicate, dp_shard, tp, pp with each schedule and
microbatch size, cp and activation checkpointing, keeping the recipe's global
batch, and ranks by predicted tokens/s the layouts that fit with --headroom of
each device's memory free.

A recipe whose own layout does not fit the device is predicted all the
same, and the command then fails (exit status 1) saying how much it
needs; --search instead proposes layouts that fit.`,
		Example: `  titan plan --calibrate
  titan plan --recipe recipes/llama3_debug.toml --cluster this --world 2 --set parallelism.tensor_parallel_degree=2
  titan plan --recipe recipes/llama3_8b.toml --cluster h100-sxm --world 16
  titan plan --recipe recipes/llama3_70b.toml --cluster h100-grandteton --world 256 --compile --float8 --search
  titan plan --reference
  titan plan --reference --plot bench/plan/published.png
  python3 bench/plan/gpu_priors.py > priors.json   # on a GPU
  titan plan --reference --priors priors.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			// Each mode takes its own flags: any other would be ignored.
			switch {
			case calibrate:
				if err := onlyFlags(cmd, "calibrate", "--calibrate measures this machine and", "cluster", "calibration", "calibrate-nproc"); err != nil {
					return err
				}
				return runCalibrate(cmd, clusterRef, calPath, calNProcs)
			case reference:
				if cmd.Flags().Changed("plot") && plotPath == "" {
					return errors.New("plan: --plot: give the PNG file to draw into")
				}
				if err := onlyFlags(cmd, "reference", "--reference predicts torchtitan's published rows on their own cluster ("+plan.ReferenceCluster+"), and", "json", "plot", "priors"); err != nil {
					return err
				}
				pr, err := loadPriors(cmd, priorsPath)
				if err != nil {
					return err
				}
				return runReference(out, plotPath, asJSON, pr)
			}
			for _, f := range []struct{ name, mode string }{{"plot", "--reference"}, {"calibrate-nproc", "--calibrate"},
				{"top", "--search"}, {"max-tp", "--search"}, {"max-cp", "--search"}, {"headroom", "--search"}} {
				if cmd.Flags().Changed(f.name) && !(f.mode == "--search" && search) {
					return fmt.Errorf("plan: --%s goes with %s", f.name, f.mode)
				}
			}
			pr, err := loadPriors(cmd, priorsPath)
			if err != nil {
				return err
			}
			c, cal, err := plan.LoadCluster(clusterRef, calPath, pr)
			if err != nil {
				return err
			}
			if float8 {
				// The flag is the recipe's converter, so the float8.*
				// keys are checked as they are with it.
				rf.sets = append(rf.sets, "model.converters=float8")
			}
			job, err := rf.load()
			if err != nil {
				return err
			}
			return plan.Answer(out, job, c, cal, plan.Query{
				World: world, Compile: compile, AsyncTP: asyncTP, JSON: asJSON, Search: search,
				Options: plan.SearchOptions{Top: top, MaxTP: maxTP, MaxCP: maxCP, Headroom: headroom, Progress: cmd.ErrOrStderr()},
			})
		},
	}
	rf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&clusterRef, "cluster", "", `cluster: a name from configs/clusters, a .toml path, or "this" (this machine, calibrated)`)
	f.StringVar(&calPath, "calibration", "", "this machine's calibration file (default: $TITAN_PLAN_CALIBRATION or the user's cache folder)")
	f.IntVar(&world, "world", 0, "ranks (default: the recipe's degrees, or the whole cluster when data_parallel_shard_degree is -1)")
	f.BoolVar(&asJSON, "json", false, "write JSON")
	f.BoolVar(&search, "search", false, "search the layouts that fit and rank them by predicted tokens/s")
	f.IntVar(&top, "top", 8, "layouts --search shows")
	f.IntVar(&maxTP, "max-tp", 0, "largest tensor parallel degree --search tries (0: a node's devices)")
	f.IntVar(&maxCP, "max-cp", 0, "largest context parallel degree --search tries (0: 8)")
	f.Float64Var(&headroom, "headroom", plan.DefaultHeadroom, "fraction of each device's memory a layout --search proposes must leave free (the memory prediction's error)")
	f.BoolVar(&calibrate, "calibrate", false, "benchmark this machine's kernels and collectives and write the calibration")
	f.IntSliceVar(&calNProcs, "calibrate-nproc", []int{2, 4}, "process counts --calibrate measures the collectives (and ring attention at that cp) of")
	f.BoolVar(&reference, "reference", false, "predict torchtitan's published H100 rows from the calibration row and compare")
	f.StringVar(&priorsPath, "priors", "", "GPU priors measured by bench/plan/gpu_priors.py (its JSON) in place of the assumed attention, float8 and element-wise ones (communication, and any the file lacks, stay assumed), for a GPU cluster or --reference")
	f.StringVar(&plotPath, "plot", "", "with --reference: also draw predicted against published (tokens/s and memory) into this PNG file")
	f.BoolVar(&compile, "compile", false, "GPU: fused element-wise kernels (torch.compile)")
	f.BoolVar(&float8, "float8", false, "GPU: float8 linear layers (the same as --set model.converters=float8; the float8.* keys apply)")
	f.BoolVar(&asyncTP, "async-tp", false, "GPU: async tensor parallelism, torchtitan's parallelism.enable_async_tensor_parallel (needs --compile; titan train does not run it, so the recipe key is refused)")
	return cmd
}

// loadPriors reads the GPU priors of --priors (AssumedPriors without it).
func loadPriors(cmd *cobra.Command, path string) (plan.Priors, error) {
	if !cmd.Flags().Changed("priors") {
		return plan.AssumedPriors, nil
	}
	if path == "" {
		return plan.Priors{}, errors.New("plan: --priors: give the JSON file bench/plan/gpu_priors.py wrote")
	}
	return plan.LoadPriors(path)
}

// runReference predicts torchtitan's published rows under priors pr and
// writes them against their published figures, as a table or JSON, and
// as a plot into plotPath when it is set.
func runReference(out io.Writer, plotPath string, asJSON bool, pr plan.Priors) error {
	rs, cal, err := plan.CompareReference(pr)
	if err != nil {
		return err
	}
	if plotPath != "" {
		if err := atomicfile.Write(plotPath, func(w io.Writer) error { return plan.WriteReferencePlot(w, rs) }); err != nil {
			return fmt.Errorf("plan: --plot: %w", err)
		}
	}
	if asJSON {
		return plan.WriteJSON(out, map[string]any{"calibration": cal, "rows": plan.ReferenceJSON(rs)})
	}
	plan.WriteReference(out, rs, cal)
	return nil
}

// runCalibrate measures this machine and writes its calibration.
func runCalibrate(cmd *cobra.Command, ref, calPath string, nprocs []int) error {
	if ref == "" || ref == plan.ThisMachine {
		ref = "cpu-2core"
	}
	c, err := cluster.Load(ref)
	if err != nil {
		return err
	}
	path, err := plan.CalibrationPath(calPath) // before a minute of measuring
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cal, err := plan.CalibrateCPU(cmd.Context(), c, plan.CalibrateOptions{Exe: exe, NProcs: nprocs, Log: cmd.ErrOrStderr()})
	if err != nil {
		return err
	}
	if err := cal.Save(path); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "calibration of %s written to %s\n", c.Name, path)
	return nil
}

// onlyFlags refuses every flag given to cmd but the mode's own: its flag
// (self) and those it takes (allowed); what says what the mode does.
func onlyFlags(cmd *cobra.Command, self, what string, allowed ...string) error {
	var err error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if err == nil && f.Name != self && !slices.Contains(allowed, f.Name) {
			err = fmt.Errorf("plan: %s takes no --%s", what, f.Name)
		}
	})
	return err
}
