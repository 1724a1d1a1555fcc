package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/atomicfile"
	"github.com/titan-go/titan/internal/cluster"
	"github.com/titan-go/titan/internal/plan"
)

// thisMachine is the --cluster name of the host titan runs on: the CPU
// description its calibration was made with.
const thisMachine = "this"

func newPlanCmd() *cobra.Command {
	var rf recipeFlags
	var clusterRef, calPath, plotPath string
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
its collectives and a short training step; the file goes under the user's cache
folder, or --calibration / $TITAN_PLAN_CALIBRATION). GPU clusters are
calibrated from one published configuration only (torchtitan's Llama 3.1 8B
on 8 H100 with FSDP); --reference predicts every other published row.

--search enumerates dp_replicate, dp_shard, tp, pp with each schedule and
microbatch size, cp and activation checkpointing, keeping the recipe's global
batch, and ranks by predicted tokens/s the layouts that fit with --headroom of
each device's memory free.`,
		Example: `  titan plan --calibrate
  titan plan --recipe recipes/llama3_debug.toml --cluster this --world 2 --set parallelism.tensor_parallel_degree=2
  titan plan --recipe recipes/llama3_8b.toml --cluster h100-sxm --world 8
  titan plan --recipe recipes/llama3_70b.toml --cluster h100-grandteton --world 256 --compile --float8 --search
  titan plan --reference
  titan plan --reference --plot bench/plan/published.png`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if calibrate {
				return runCalibrate(cmd, clusterRef, calPath, calNProcs)
			}
			if plotPath != "" && !reference {
				return errors.New("plan: --plot draws the published rows and goes with --reference")
			}
			if reference {
				if rf.recipe != "" || len(rf.sets) > 0 || clusterRef != "" || search || world != 0 {
					return errors.New("plan: --reference predicts torchtitan's published rows on their own cluster (" + plan.ReferenceCluster + "); it takes no --recipe, --set, --cluster, --world or --search")
				}
				rs, cal, err := plan.CompareReference()
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
			if err := checkSearchFlags(top, maxTP, maxCP); err != nil {
				return err
			}
			c, cal, err := planCluster(clusterRef, calPath)
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
			if world > c.World() {
				return fmt.Errorf("plan: --world %d: cluster %s has %d devices (%d per node × %d)", world, c.Name, c.World(), c.DevicesPerNode, c.Nodes)
			}
			asked := world
			if world == 0 {
				world = recipeWorld(job.Parallelism.DataParallelShardDegree, c)
			}
			j, err := plan.FromRecipe(job, world)
			if err != nil {
				return err
			}
			if world = j.Layout.World(); asked > 0 && world != asked {
				return fmt.Errorf("plan: --world %d, but the recipe's degrees (%s) make %d ranks: set parallelism.data_parallel_shard_degree = -1 to fill --world, or give --world %d", asked, j.Layout.Degrees, world, world)
			}
			j.Layout.Compile = compile
			j.Layout.AsyncTP = j.Layout.AsyncTP || asyncTP
			if j.Layout.AsyncTP && !search && j.Layout.Degrees.TP < 2 {
				return fmt.Errorf("plan: --async-tp overlaps tensor-parallel collectives, and the layout (%s) has none: set parallelism.tensor_parallel_degree", j.Layout.Degrees)
			}
			if search {
				r, err := plan.Search(j, c, cal, plan.SearchOptions{World: world, Top: top, MaxTP: maxTP, MaxCP: maxCP, Headroom: headroom})
				if err != nil {
					return err
				}
				var top []plan.Prediction
				for _, t := range r.Top {
					top = append(top, t.Prediction)
				}
				caveats, err := plan.Caveats(top...)
				if err != nil {
					return err
				}
				if asJSON {
					var rows []plan.JSONPrediction
					for _, t := range r.Top {
						p := t.Prediction.JSON()
						p.Why = t.Why
						rows = append(rows, p)
					}
					doc := map[string]any{"tried": r.Tried, "fit": r.Fit, "global_batch": r.GlobalBatch, "headroom": r.Headroom, "calibration": cal, "top": rows, "caveats": caveats}
					if r.Given.Prediction.Step.Step > 0 {
						// The recipe's own layout: its rank among those that fit (0:
						// it does not fit) and why it loses to the best.
						g := r.Given.Prediction.JSON()
						g.Why = r.Given.Why
						doc["given"] = map[string]any{"rank": r.GivenRank, "prediction": g}
					}
					return plan.WriteJSON(out, doc)
				}
				plan.WriteSearch(out, r, cal)
				plan.WriteCaveats(out, caveats)
				return nil
			}
			p, err := plan.Predict(j, c, cal)
			if err != nil {
				return err
			}
			caveats, err := plan.Caveats(p)
			if err != nil {
				return err
			}
			if asJSON {
				return plan.WriteJSON(out, map[string]any{"prediction": p.JSON(), "calibration": cal, "caveats": caveats})
			}
			plan.WriteTable(out, p, cal)
			plan.WriteCaveats(out, caveats)
			return nil
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
	f.StringVar(&plotPath, "plot", "", "with --reference: also draw predicted against published (tokens/s and memory) into this PNG file")
	f.BoolVar(&compile, "compile", false, "GPU: fused element-wise kernels (torch.compile)")
	f.BoolVar(&float8, "float8", false, "GPU: float8 linear layers (the same as --set model.converters=float8; the float8.* keys apply)")
	f.BoolVar(&asyncTP, "async-tp", false, "GPU: async tensor parallelism, torchtitan's parallelism.enable_async_tensor_parallel (needs --compile; titan train does not run it, so the recipe key is refused)")
	return cmd
}

// checkSearchFlags refuses --search bounds that cannot mean anything.
func checkSearchFlags(top, maxTP, maxCP int) error {
	switch {
	case top < 1:
		return fmt.Errorf("plan: --top %d: show at least one layout", top)
	case maxTP < 0 || maxCP < 0:
		return fmt.Errorf("plan: --max-tp %d, --max-cp %d: want a degree, or 0 for the default", maxTP, maxCP)
	}
	return nil
}

// recipeWorld is the ranks of a recipe whose degrees leave none open,
// else the cluster's.
func recipeWorld(shard int, c cluster.Cluster) int {
	if shard == -1 {
		return c.World()
	}
	return 0 // FromRecipe then takes the product of the degrees
}

// planCluster loads the cluster and its calibration: the calibration
// file for this machine (or a CPU cluster), the published reference row
// for GPUs.
func planCluster(ref, calPath string) (cluster.Cluster, plan.Calibration, error) {
	if ref == "" {
		return cluster.Cluster{}, plan.Calibration{}, fmt.Errorf("--cluster: give one of %v, \"this\" or a .toml path", cluster.Names())
	}
	if ref == thisMachine || func() bool { c, err := cluster.Load(ref); return err == nil && c.CPU() }() {
		path, err := calibrationPath(calPath)
		if err != nil {
			return cluster.Cluster{}, plan.Calibration{}, err
		}
		cal, err := plan.LoadCalibration(path)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return cluster.Cluster{}, plan.Calibration{}, fmt.Errorf("%w: run `titan plan --calibrate` first", err)
			}
			return cluster.Cluster{}, plan.Calibration{}, err
		}
		if ref == thisMachine {
			ref = cal.Cluster
		}
		c, err := cluster.Load(ref)
		if err != nil {
			return cluster.Cluster{}, plan.Calibration{}, err
		}
		if !c.CPU() {
			return cluster.Cluster{}, plan.Calibration{}, fmt.Errorf("plan: the calibration %s names cluster %q, which is not a CPU host: run `titan plan --calibrate` again", path, c.Name)
		}
		if err := cal.ValidateHost(); err != nil {
			return cluster.Cluster{}, plan.Calibration{}, fmt.Errorf("%s: %w", path, err)
		}
		if cal.Cluster != c.Name {
			return cluster.Cluster{}, plan.Calibration{}, fmt.Errorf("plan: the calibration %s was made on cluster %q, not %q", path, cal.Cluster, c.Name)
		}
		return cal.OnHost(c), cal, nil
	}
	c, err := cluster.Load(ref)
	if err != nil {
		return cluster.Cluster{}, plan.Calibration{}, err
	}
	cal, err := plan.CalibrateGPU(c)
	return c, cal, err
}

func calibrationPath(p string) (string, error) {
	if p != "" {
		return p, nil
	}
	return plan.DefaultCalibrationPath()
}

// runCalibrate measures this machine and writes its calibration.
func runCalibrate(cmd *cobra.Command, ref, calPath string, nprocs []int) error {
	if ref == "" || ref == thisMachine {
		ref = "cpu-2core"
	}
	c, err := cluster.Load(ref)
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
	path, err := calibrationPath(calPath)
	if err != nil {
		return err
	}
	if err := cal.Save(path); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "calibration of %s written to %s\n", c.Name, path)
	return nil
}
