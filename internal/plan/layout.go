// Package plan predicts what a training job costs on a cluster before
// any machine is booked: each rank's memory (memplan's estimate, the one
// the trainer refuses jobs with) and the step time from the model's
// shapes, the layout's communication with the overlap it gets, and the
// pipeline bubble of the chosen schedule (simulated with the schedule
// code titan trains with), giving tokens/s per device and MFU; and it
// searches the layouts that fit for the fastest.
//
// Compute is timed per kind of operation — matrix products, attention,
// element-wise passes over memory — at efficiencies a Calibration gives:
// measured from titan's own kernels and collectives on this machine, or
// derived for GPUs from one published configuration (see Reference).
package plan

import (
	"errors"
	"fmt"
	"strings"

	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/memplan"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/parallel"
)

// Layout is how a job runs: the mesh, the pipeline, the batch, the
// activation checkpointing and the kernel options.
type Layout struct {
	Degrees memplan.Degrees
	// Schedule and MicrobatchRows are the pipeline schedule and the
	// rows of a microbatch (used when Degrees.PP > 1).
	Schedule       string
	MicrobatchRows int
	// FirstLessLayers and LastLessLayers count the embedding and the head
	// as layers when the stages are cut (the recipe's
	// pipeline_parallel_first/last_stage_less_layers), and LayersPerStage
	// is pipeline_parallel_layers_per_stage (nil: titan's planner
	// chooses the stages).
	FirstLessLayers, LastLessLayers int
	LayersPerStage                  *int
	// LocalBatch is the sequences per data-parallel rank and local
	// batch, SeqLen their length; a step accumulates Accum local batches
	// (training.global_batch_size or gradient_accumulation_steps; 0 and 1
	// mean none).
	LocalBatch, SeqLen, Accum int
	// Checkpoint is the activation checkpointing policy.
	Checkpoint memplan.Checkpoint
	// Reshard is parallelism.fsdp_reshard_after_forward.
	Reshard string
	// Compile fuses the element-wise operations (torch.compile on a GPU);
	// Float8 runs the linear layers' products in float8; AsyncTP
	// overlaps tensor-parallel communication with the products next to
	// it.
	Compile, Float8, AsyncTP bool
	// ParamBF16 and ReduceBF16 are training.mixed_precision_param and
	// mixed_precision_reduce "bfloat16": on a CPU host bfloat16 products,
	// gathers and reductions and the copies FSDP keeps (RuntimeOf,
	// memplan.Precision). A GPU cluster's runtime computes in bfloat16 and
	// reduces in float32, and takes only that (checkOptions).
	ParamBF16, ReduceBF16 bool
	// Eval is the recipe's validation batch when validation is enabled
	// (its activation sets count when its shape is not the step's).
	Eval memplan.EvalShape
}

// Job is a model and its layout.
type Job struct {
	Flavor string
	Model  llama.Config
	Layout Layout
}

// String writes the layout as its degrees and options.
func (l Layout) String() string {
	d := l.Degrees
	var parts []string
	add := func(name string, v int) {
		if v > 1 {
			parts = append(parts, fmt.Sprintf("%s%d", name, v))
		}
	}
	add("dp_rep", d.DPReplicate)
	add("fsdp", d.DPShard)
	add("tp", d.TP)
	add("cp", d.CP)
	add("pp", d.PP)
	s := strings.Join(parts, "×")
	if s == "" {
		s = "1 rank"
	}
	return s + " " + l.options()
}

// options writes the layout without its degrees: the pipeline's
// schedule and microbatch, the local batch, accumulation, activation
// checkpointing and the kernel options.
func (l Layout) options() string {
	var s string
	if l.Degrees.PP > 1 {
		s = fmt.Sprintf("%s mb%d ", l.Schedule, l.MicrobatchRows)
	}
	s += fmt.Sprintf("lbs%d", l.LocalBatch)
	if l.accum() > 1 {
		s += fmt.Sprintf(" accum%d", l.accum())
	}
	s += fmt.Sprintf(" ac:%s", strings.ReplaceAll(l.Checkpoint.String(), " ", "-"))
	for _, o := range []struct {
		on   bool
		name string
	}{{l.Compile, "compile"}, {l.Float8, "float8"}, {l.AsyncTP, "asyncTP"}} {
		if o.on {
			s += " +" + o.name
		}
	}
	return s
}

// accum is the local batches a step accumulates (at least 1).
func (l Layout) accum() int { return max(l.Accum, 1) }

// World is the number of ranks the layout uses.
func (l Layout) World() int { return l.Degrees.World() }

// FromRecipe returns the job of a recipe on world ranks (a
// data_parallel_shard_degree of -1 takes what the other degrees leave).
func FromRecipe(job *config.Job, world int) (Job, error) {
	if job.Model.Name != "" && job.Model.Name != "llama3" {
		return Job{}, fmt.Errorf("plan: model.name %q: only llama3 is modelled", job.Model.Name)
	}
	if t := job.Training.Threads; t != 0 {
		return Job{}, fmt.Errorf("plan: training.threads = %d is not modelled: a host's ranks are predicted with equal shares of all its cores (training.threads = 0)", t)
	}
	mp, err := memplan.FromJob(job, world)
	if err != nil {
		return Job{}, err
	}
	f8, err := job.Float8Config()
	if err != nil {
		return Job{}, err
	}
	if err := plannableFloat8(f8, mp.Model); err != nil {
		return Job{}, err
	}
	accum, err := job.AccumSteps(mp.Degrees.DPReplicate * mp.Degrees.DPShard)
	if err != nil {
		return Job{}, err
	}
	p := job.Parallelism
	l := Layout{
		Degrees: mp.Degrees, Schedule: p.PipelineParallelSchedule, MicrobatchRows: p.PipelineParallelMicrobatchSize,
		FirstLessLayers: p.PipelineParallelFirstStageLessLayers, LastLessLayers: p.PipelineParallelLastStageLessLayers,
		LayersPerStage: p.PipelineParallelLayersPerStage,
		LocalBatch:     job.Training.LocalBatchSize, SeqLen: job.Training.SeqLen, Accum: accum,
		Checkpoint: mp.Checkpoint, Reshard: p.FSDPReshardAfterForward, AsyncTP: p.EnableAsyncTensorParallel,
		ParamBF16: mp.Precision.ParamBF16, ReduceBF16: mp.Precision.ReduceBF16, Eval: mp.Eval,
		Float8: f8 != nil,
	}
	return Job{Flavor: job.Model.Flavor, Model: mp.Model, Layout: l}, nil
}

// plannableFloat8 refuses the float8 settings the step-time model does not
// count: it runs every block's linear layers in float8 with tensorwise
// scales and the output projection in bf16 (torchtitan's default
// filter_fqns = ["output"]), and counts FSDP's all-gathers in bf16.
func plannableFloat8(f *float8.Config, m llama.Config) error {
	if f == nil {
		return nil
	}
	switch {
	case f.Recipe != float8.Tensorwise:
		return fmt.Errorf("plan: float8.recipe_name %q is not modelled (the calibrated float8 products are tensorwise)", f.Recipe)
	case f.FSDPAllGather || f.PrecomputeScales:
		return errors.New("plan: float8.enable_fsdp_float8_all_gather and precompute_float8_dynamic_scale_for_fsdp are not modelled (FSDP's all-gathers are counted in bf16)")
	case f.Converts("output"):
		return fmt.Errorf("plan: float8.filter_fqns %q converts the output projection, which is not modelled (it is counted in bf16: filter_fqns = [\"output\"])", f.FilterFQNs)
	}
	for _, fqn := range llama.BlockLinearFQNs(m) {
		if !f.Converts(fqn) {
			return fmt.Errorf("plan: float8.filter_fqns %q leaves %s in high precision, which is not modelled (every block's linear layers are counted in float8)", f.FilterFQNs, fqn)
		}
	}
	return nil
}

// pipeline resolves the layout's pipeline with titan's own planner (as
// memplan does for the estimate).
func (j Job) pipeline() (parallel.PipelinePlan, error) {
	mp, err := j.MemPlan(Runtime{})
	if err != nil {
		return parallel.PipelinePlan{}, err
	}
	return mp.ResolvePipeline()
}

// MemPlan is the memplan plan of the job's busiest rank on a device of
// the given runtime (precision and logits): the same estimate the
// trainer checks a job against.
func (j Job) MemPlan(rt Runtime) (memplan.Plan, error) {
	l := j.Layout
	p := memplan.Plan{
		Model: j.Model, Flavor: j.Flavor, Batch: l.LocalBatch, SeqLen: l.SeqLen, MicrobatchRows: l.MicrobatchRows,
		Degrees: l.Degrees, Reshard: l.Reshard, Checkpoint: l.Checkpoint, Precision: rt.Precision, Eval: l.Eval,
	}
	if rt.WholeLogits {
		p.LogitChunk = j.Model.VocabSize / max(l.Degrees.TP, 1)
	}
	if l.Degrees.PP > 1 {
		p.Pipeline = &parallel.PipelineSettings{Schedule: l.Schedule, MicrobatchSize: max(l.MicrobatchRows, 1),
			LayersPerStage: l.LayersPerStage, FirstLessLayers: l.FirstLessLayers, LastLessLayers: l.LastLessLayers}
	}
	return p, nil
}
