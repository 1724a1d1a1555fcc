// Package memplan estimates the memory one rank of a training job needs
// before anything is allocated, so that a run that cannot fit is refused
// with the reason and a layout that would fit, instead of being killed by
// the kernel half-way through its first step.
//
// The estimate is computed from the model's shapes alone (float32
// everywhere, as the CPU backend stores it): parameters, gradients and the
// two AdamW moments (sharded over dp_shard, tp and the pipeline stages),
// the transient FSDP unit buffers, the activations that the activation
// checkpointing policy keeps, and the communication buffers of the
// parallel dimensions. The activations are those internal/model/llama
// plans (llama.ActivationBytesFor: pure arithmetic, nothing of that size
// is allocated), so the estimate and the model cannot drift apart; a
// layout the model cannot be built for (tp not dividing the heads, cp not
// dividing the sequence) is an error.
package memplan

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/bytesize"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/parallel"
	"github.com/titan-go/titan/internal/parallel/fsdp"
)

// bytesPerFloat is the size of one stored element: titan keeps
// parameters, gradients, moments and activations in float32.
const bytesPerFloat = 4

// Precision is the size in bytes of the stored elements. The zero value
// is titan's CPU backend: float32 everywhere. A mixed-precision device
// keeps the master state in float32 (State 4) and computes in bfloat16
// (Compute 2): gathered FSDP units, activations and communication
// buffers at Compute bytes per element.
type Precision struct {
	State, Compute int
	// ParamBF16 and ReduceBF16 are titan's own mixed precision on the CPU
	// backend (training.mixed_precision_param and mixed_precision_reduce
	// "bfloat16", with State and Compute zero): the activations only
	// bfloat16 products read (norm outputs, the SwiGLU product) and the
	// logits are bfloat16 as the model lays them out (llama.Model.halfAct), every
	// other buffer stays float32, and FSDP adds its bfloat16 copies (fsdp.Runtime.BufferBytes): the
	// bfloat16 rounding of the parameter shards; without sharding the
	// float32 copy of those roundings the model is bound to; with it the
	// bfloat16 receive buffer of every gathered-unit buffer, and with
	// ReduceBF16 that of every unit gradient buffer.
	ParamBF16, ReduceBF16 bool
	// Float8 is the float8 linear layers (model.converters "float8" and
	// [float8]; nil: none). With its FSDP all-gather under sharding, fsdp
	// pairs each gathered-unit buffer that serves a float8 unit with a
	// receive buffer for the e4m3 all-gather (fsdp.Float8ReceiveBytes).
	Float8 *float8.Config
}

func (p Precision) state() int64   { return int64(cmp0(p.State, bytesPerFloat)) }
func (p Precision) compute() int64 { return int64(cmp0(p.Compute, bytesPerFloat)) }

func cmp0(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// Degrees are the sizes of the parallel dimensions of a job's mesh.
type Degrees struct {
	PP, DPReplicate, DPShard, CP, TP int
}

// World is the number of ranks the degrees lay out.
func (d Degrees) World() int { return d.PP * d.DPReplicate * d.DPShard * d.CP * d.TP }

// ShardGroup is the size of the group parameters are sharded over:
// dp_shard × cp, as parallel.NewGroups and torchtitan's dp_shard_cp mesh.
func (d Degrees) ShardGroup() int { return max(d.DPShard, 1) * max(d.CP, 1) }

// ReplicateGroup is the size of the group gradients are all-reduced
// over: dp_replicate.
func (d Degrees) ReplicateGroup() int { return max(d.DPReplicate, 1) }

// String writes the degrees as the recipe's keys.
func (d Degrees) String() string {
	return fmt.Sprintf("pp %d × dp_replicate %d × dp_shard %d × cp %d × tp %d", d.PP, d.DPReplicate, d.DPShard, d.CP, d.TP)
}

// Checkpoint is the [activation_checkpoint] policy: Mode "none" (or ""),
// "full" or "selective" with Option a positive integer N (recompute every
// N-th layer) or "op" (keep the matmul and attention outputs, recompute the
// element-wise operations).
type Checkpoint struct {
	Mode, Option string
}

// String spells the policy as the recipe does.
func (c Checkpoint) String() string {
	switch c.Mode {
	case "", "none":
		return "none"
	case "selective":
		return "selective " + c.Option
	}
	return c.Mode
}

// Plan is what one rank of a job will hold.
type Plan struct {
	// Model is the model's shape.
	Model llama.Config
	// Flavor names the model for messages (optional).
	Flavor string
	// Batch is the local batch size B (sequences per data-parallel rank
	// and microstep), SeqLen the sequence length T.
	Batch, SeqLen int
	// MicrobatchRows is the number of sequences of a pipeline microbatch
	// (0: the whole local batch); used only when Degrees.PP > 1.
	MicrobatchRows int
	// Degrees is the mesh. A zero degree counts as 1.
	Degrees Degrees
	// Reshard is parallelism.fsdp_reshard_after_forward: "default",
	// "always" or "never".
	Reshard string
	// Checkpoint is the activation checkpointing policy.
	Checkpoint Checkpoint
	// Pipeline, when set (and Degrees.PP > 1), are the recipe's pipeline
	// settings (parallelism.pipeline_parallel_*; the degree is Degrees.PP
	// and the batch Batch, so a changed plan re-resolves): every rank's
	// stages are then counted with the activation sets its schedule keeps
	// at its peak (pipeline.Schedule.ActivationSets, what the executor
	// allocates). Without it the stages are taken as even and the
	// schedule as 1F1B.
	Pipeline *parallel.PipelineSettings
	// Precision is the element size of each kind of buffer (zero:
	// float32 throughout).
	Precision Precision
	// LogitChunk is the model's logits chunk in vocabulary columns (0:
	// the model's default; the vocabulary shard: whole logits).
	LogitChunk int
	// Eval is validation's shape when it runs (validation.enable); the
	// zero EvalShape: no validation.
	Eval EvalShape
}

// EvalShape is validation's batch: Rows sequences per data rank of
// SeqLen tokens. When it differs from the training step's, the engine
// gives validation activation sets of its own (forward only, one per
// stage, with their own scratch), which the estimate counts.
type EvalShape struct{ Rows, SeqLen int }

// evalSets reports whether validation has its own activation sets under
// plan, and the rows of each (a pipeline's microbatch size, or all of
// them); mbRows is the training microbatch's rows.
func (p Plan) evalSets(mbRows int) (rows int, own bool, err error) {
	e := p.Eval
	if e.Rows == 0 && e.SeqLen == 0 {
		return 0, false, nil
	}
	if e.Rows < 1 || e.SeqLen < 1 {
		return 0, false, fmt.Errorf("memplan: validation batch %d × seq %d must be positive", e.Rows, e.SeqLen)
	}
	if e.Rows == p.Batch && e.SeqLen == p.SeqLen {
		return 0, false, nil // validation runs on the training step's sets
	}
	if p.Degrees.PP > 1 {
		if e.Rows%mbRows != 0 {
			return 0, false, fmt.Errorf("memplan: validation.local_batch_size %d is not a multiple of parallelism.pipeline_parallel_microbatch_size %d", e.Rows, mbRows)
		}
		return mbRows, true, nil
	}
	return e.Rows, true, nil
}

// FromJob returns the plan of one rank of job on world ranks; a
// data_parallel_shard_degree of -1 takes the ranks the other degrees leave.
func FromJob(job *config.Job, world int) (Plan, error) {
	cfg, err := llama.Flavor(job.Model.Flavor)
	if err != nil {
		return Plan{}, fmt.Errorf("memplan: model.flavor: %w", err)
	}
	p := job.Parallelism
	d := Degrees{PP: p.PipelineParallelDegree, DPReplicate: p.DataParallelReplicateDegree, DPShard: p.DataParallelShardDegree, CP: p.ContextParallelDegree, TP: p.TensorParallelDegree}
	if d.DPShard == -1 {
		others := max(1, d.PP) * max(1, d.DPReplicate) * max(1, d.CP) * max(1, d.TP)
		if world%others != 0 {
			return Plan{}, fmt.Errorf("memplan: %d ranks cannot be split over pp %d × dp_replicate %d × cp %d × tp %d (data_parallel_shard_degree = -1)", world, d.PP, d.DPReplicate, d.CP, d.TP)
		}
		d.DPShard = world / others
	}
	plan := Plan{
		Model: cfg.Covering(job.SeqLens()...), Flavor: job.Model.Flavor,
		Batch: job.Training.LocalBatchSize, SeqLen: job.Training.SeqLen,
		MicrobatchRows: p.PipelineParallelMicrobatchSize,
		Degrees:        d, Reshard: p.FSDPReshardAfterForward,
		Checkpoint: Checkpoint{Mode: job.ActivationCheckpoint.Mode, Option: job.ActivationCheckpoint.SelectiveACOption},
		Precision:  Precision{ParamBF16: job.Training.MixedPrecisionParam == "bfloat16", ReduceBF16: job.Training.MixedPrecisionReduce == "bfloat16"},
	}
	if v := job.Validation; v.Enable {
		plan.Eval = EvalShape{Rows: v.LocalBatchSize, SeqLen: v.SeqLen}
	}
	if plan.Precision.Float8, err = job.Float8Config(); err != nil {
		return Plan{}, fmt.Errorf("memplan: float8.recipe_name: %w", err)
	}
	if d.PP > 1 {
		plan.Pipeline = &parallel.PipelineSettings{
			Schedule: p.PipelineParallelSchedule, LayersPerStage: p.PipelineParallelLayersPerStage,
			FirstLessLayers: p.PipelineParallelFirstStageLessLayers, LastLessLayers: p.PipelineParallelLastStageLessLayers,
			MicrobatchSize: p.PipelineParallelMicrobatchSize,
		}
	}
	return plan, plan.normalize()
}

// normalize turns zero degrees into 1 and checks the plan's numbers.
func (p *Plan) normalize() error {
	for _, d := range []*int{&p.Degrees.PP, &p.Degrees.DPReplicate, &p.Degrees.DPShard, &p.Degrees.CP, &p.Degrees.TP} {
		if *d == 0 {
			*d = 1
		}
		if *d < 1 {
			return fmt.Errorf("memplan: parallel degrees must be positive (got %s)", p.Degrees)
		}
	}
	if p.Batch < 1 || p.SeqLen < 1 {
		return fmt.Errorf("memplan: local batch %d and sequence length %d must be positive", p.Batch, p.SeqLen)
	}
	if p.Model.NLayers < 1 || p.Model.Dim < 1 || p.Model.NHeads < 1 {
		return fmt.Errorf("memplan: model shape dim %d, n_layers %d, n_heads %d is not valid", p.Model.Dim, p.Model.NLayers, p.Model.NHeads)
	}
	// The step's sequence, then validation's (whose errors name its
	// key: the shapes' checks passed with the step's).
	if p.SeqLen > p.Model.MaxSeqLen {
		return fmt.Errorf("memplan: training.seq_len %d exceeds the model's max_seq_len %d", p.SeqLen, p.Model.MaxSeqLen)
	}
	if err := llama.CheckParallel(p.Model, p.SeqLen, p.Degrees.TP, p.Degrees.CP); err != nil {
		return fmt.Errorf("memplan: %w", err)
	}
	if e := p.Eval.SeqLen; e > 0 {
		if e > p.Model.MaxSeqLen {
			return fmt.Errorf("memplan: validation.seq_len %d exceeds the model's max_seq_len %d", e, p.Model.MaxSeqLen)
		}
		if err := llama.CheckParallel(p.Model, e, p.Degrees.TP, p.Degrees.CP); err != nil {
			return fmt.Errorf("memplan: validation.seq_len %d: %w", e, err)
		}
	}
	if _, err := p.Checkpoint.every(); err != nil {
		return err
	}
	return nil
}

// every returns how the policy treats layers: 0 keeps every layer, N > 0
// recomputes layers l with (l+1)%N == 0 (1: all of them), -1 is the
// per-operation policy.
func (c Checkpoint) every() (int, error) {
	switch c.Mode {
	case "", "none":
		return 0, nil
	case "full":
		return 1, nil
	case "selective":
		if c.Option == "op" {
			return -1, nil
		}
		n, err := strconv.Atoi(c.Option)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("memplan: activation_checkpoint.selective_ac_option %q: want \"op\" or a positive integer", c.Option)
		}
		return n, nil
	}
	return 0, fmt.Errorf("memplan: activation_checkpoint.mode %q: want none, full or selective", c.Mode)
}

// Report is the estimated memory of one rank, in bytes, by part.
type Report struct {
	Plan Plan
	// Params, Grads and Optimizer are this rank's share of the
	// parameters, their gradients and the two AdamW moments.
	Params, Grads, Optimizer int64
	// FSDPBuffers are the gathered parameter units and the unit gradient
	// buffers of sharded data parallelism (0 when dp_shard × cp is 1).
	FSDPBuffers int64
	// HeldGrads is the part of FSDPBuffers that holds gradients between
	// a pipeline's backwards: every unit's gradient buffer beyond the two
	// a reduction needs (0 without a pipeline of several microbatches).
	HeldGrads int64
	// Activations are the kept activations, the residual streams, the
	// recomputation scratch, the logits chunk and the activation
	// gradients, for every microbatch in flight.
	Activations int64
	// Comm are the host communication buffers of tensor, context and
	// pipeline parallelism (those in the model's own buffers are part of
	// Activations).
	Comm int64
	// Head: the rank computes the output projection and the loss.
	Head bool
	// Rank is the pipeline rank, and Stages its stages in increasing
	// order (none without pipeline parallelism).
	Rank   int
	Stages []StageReport
}

// StageReport is what one pipeline stage of a rank holds.
type StageReport struct {
	Stage int
	// Elements are the stage's parameters on the rank (its units'
	// elements, tp-sharded, before FSDP shards them).
	Elements int64
	// Kept are the bytes one activation set of the stage keeps from a
	// microbatch's forward to its backward (of Activations, with the
	// schedule's activation sets of the stage: ActivationSets).
	Kept int64
}

// Total is the sum of the parts.
func (r Report) Total() int64 {
	return r.Params + r.Grads + r.Optimizer + r.FSDPBuffers + r.Activations + r.Comm
}

// parts lists the named parts, in order.
func (r Report) parts() []struct {
	name string
	n    int64
} {
	return []struct {
		name string
		n    int64
	}{
		{"parameters", r.Params}, {"gradients", r.Grads}, {"optimizer state (AdamW, 2 moments)", r.Optimizer},
		{"FSDP unit buffers", r.FSDPBuffers}, {"activations", r.Activations}, {"communication buffers", r.Comm},
	}
}

// String lists every part and the total, one per line.
func (r Report) String() string {
	var b strings.Builder
	name := r.Plan.Flavor
	if name == "" {
		name = fmt.Sprintf("%d-layer dim-%d", r.Plan.Model.NLayers, r.Plan.Model.Dim)
	}
	fmt.Fprintf(&b, "memory per rank of llama3 %s (batch %d × seq %d, %s, activation checkpointing %s):\n",
		name, r.Plan.Batch, r.Plan.SeqLen, r.Plan.Degrees, r.Plan.Checkpoint)
	for _, p := range r.parts() {
		fmt.Fprintf(&b, "  %-36s %s\n", p.name, bytesize.Human(p.n))
	}
	fmt.Fprintf(&b, "  %-36s %s", "total", bytesize.Human(r.Total()))
	return b.String()
}

// ceilDiv is ⌈a/b⌉.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// Estimate returns the memory of the busiest rank of plan.
func Estimate(plan Plan) (Report, error) {
	rs, err := EstimateRanks(plan)
	if err != nil {
		return Report{}, err
	}
	best := rs[0]
	for _, r := range rs[1:] {
		if r.Total() > best.Total() {
			best = r
		}
	}
	return best, nil
}

// EstimateRanks returns the memory of each pipeline rank of plan (one
// report, the busiest rank's, without pipeline parallelism: the other
// ranks hold the same).
func EstimateRanks(plan Plan) ([]Report, error) {
	if err := plan.normalize(); err != nil {
		return nil, err
	}
	if plan.Pipeline != nil && plan.Degrees.PP > 1 {
		return estimatePipeline(plan)
	}
	r, err := estimateOne(plan)
	return []Report{r}, err
}

// estimateOne is Estimate without a pipeline schedule.
func estimateOne(plan Plan) (Report, error) {
	c := plan.Model
	d := plan.Degrees
	// The layers of the busiest pipeline stage: stages split the layers
	// evenly (the first holds the embedding, the last the head; both are
	// counted, which is the single stage when pp is 1).
	layers := ceilDiv(int64(c.NLayers), int64(d.PP))
	embed, layer, head := unitSizes(plan)
	var units []int64
	if d.PP == 1 {
		units = append(units, embed)
	}
	for range layers {
		units = append(units, layer)
	}
	if d.PP == 1 {
		units = append(units, head)
	} else {
		// The busiest stage is the first or the last: one of the two
		// vocabulary units.
		units = append(units, max(embed, head))
	}
	var f8 float8Gather
	if d.PP == 1 {
		var err error
		if f8, err = float8Gathers(plan, plan.Batch, []*llama.StageSpec{nil}); err != nil {
			return Report{}, err
		}
	}
	r := stateReport(plan, units, f8, d.PP > 1)
	act, comm, err := activations(plan, layers)
	if err != nil {
		return Report{}, err
	}
	r.Activations, r.Comm = act, comm
	r.Head = true
	return r, nil
}

// unitSizes returns the elements of one rank's units (FSDP gathers and
// reduces unit by unit): the embedding, one layer, and the final norm
// with the output projection. Tensor parallel splits the matrices (and
// the vocabulary); the norms are replicated.
func unitSizes(plan Plan) (embed, layer, head int64) {
	c := plan.Model
	D, F, V := int64(c.Dim), int64(c.FFNHidden()), int64(c.VocabSize)
	Q, KV := int64(c.NHeads*c.HeadDim()), int64(c.KVHeads()*c.HeadDim())
	tp := int64(plan.Degrees.TP)
	embed = ceilDiv(V*D, tp)
	layer = 2*D + ceilDiv(Q*D+2*KV*D+D*Q+3*F*D, tp)
	head = D + ceilDiv(V*D, tp)
	return embed, layer, head
}

// float8Gather is what the float8 all-gather adds to a rank's FSDP
// buffers: the bytes of one receive buffer and the units with float8
// weights (each gathered-unit buffer that serves one gets a receive
// buffer).
type float8Gather struct{ recv, units int64 }

// float8Gathers returns the float8 all-gather of a rank holding the
// parts planned for specs (nil: the whole model) with batches of rows:
// the zero value without it.
func float8Gathers(plan Plan, rows int, specs []*llama.StageSpec) (float8Gather, error) {
	f8 := plan.Precision.Float8
	parts := plan.Degrees.ShardGroup()
	if f8 == nil || !f8.FSDPAllGather || parts == 1 {
		return float8Gather{}, nil
	}
	lp := llamaPlan(plan, nil)
	lp.Precision.Float8 = f8
	var units []fsdp.Range
	var weights [][]fsdp.Range
	var g float8Gather
	for _, spec := range specs {
		lp.Stage = spec
		us, ws, err := llama.Float8UnitsFor(plan.Model, rows, plan.SeqLen, lp)
		if err != nil {
			return g, fmt.Errorf("memplan: %w", err)
		}
		for u, unit := range us {
			var w []fsdp.Range
			for _, r := range ws[u] {
				w = append(w, fsdp.Range{Lo: r.Lo, Hi: r.Hi})
			}
			if len(w) > 0 {
				g.units++
			}
			units, weights = append(units, fsdp.Range{Lo: unit.Lo, Hi: unit.Hi}), append(weights, w)
		}
	}
	param := backend.Float32
	if plan.Precision.ParamBF16 {
		param = backend.BFloat16
	}
	g.recv = fsdp.Float8ReceiveBytes(units, weights, parts, param)
	return g, nil
}

// stateReport returns the parameters, gradients, optimizer state and
// FSDP buffers of a rank holding units (elements each), f8 its float8
// all-gather; held: the units compute several microbatches a step (a
// pipeline), whose backwards keep them gathered and accumulate their
// gradients unreduced until the last (fsdp.Runtime.SetGradientSync).
func stateReport(plan Plan, units []int64, f8 float8Gather, held bool) Report {
	d := plan.Degrees
	// FSDP shards over dp_shard × cp (torchtitan's dp_shard_cp mesh, as
	// parallel.NewGroups builds it).
	shard := int64(d.ShardGroup())
	var state, largest int64
	for _, u := range units {
		state += ceilDiv(u, shard)
		largest = max(largest, u)
	}
	sb, cb := plan.Precision.state(), plan.Precision.compute()
	r := Report{Plan: plan}
	r.Params = state * sb
	r.Grads = state * sb
	r.Optimizer = 2 * state * sb
	// fsdp allocates every unit buffer at the largest unit's size.
	var paramBufs, gradBufs int64
	if shard > 1 {
		// Two gathered units (the one computing and the prefetched one);
		// without resharding after the forward, every unit stays
		// gathered until its backward.
		paramBufs = 2
		if plan.Reshard == "never" || plan.Reshard != "always" && d.PP > 1 || held {
			paramBufs = int64(len(units))
		}
	}
	if shard > 1 || d.ReplicateGroup() > 1 {
		// Two unit gradient buffers awaiting their reduction (the unit
		// computing and the one reducing); DDP reduces through them too.
		// A pipeline's units each hold theirs over the step.
		gradBufs = 2
		if held {
			gradBufs = int64(len(units))
		}
	}
	r.FSDPBuffers = (paramBufs + gradBufs) * largest * cb
	if p := plan.Precision; p.ParamBF16 {
		r.FSDPBuffers += state * 2 // the shards' bfloat16 rounding
		if shard == 1 {
			r.FSDPBuffers += state * 4 // the float32 copy the model is bound to
		} else {
			r.FSDPBuffers += paramBufs * largest * 2
		}
	}
	if plan.Precision.ReduceBF16 {
		r.FSDPBuffers += gradBufs * largest * 2
	}
	if held && gradBufs > 2 {
		r.HeldGrads = (gradBufs - 2) * largest * cb
		if plan.Precision.ReduceBF16 {
			r.HeldGrads += (gradBufs - 2) * largest * 2
		}
	}
	r.FSDPBuffers += min(paramBufs, f8.units) * f8.recv
	return r
}

// estimatePipeline is Estimate with the resolved pipeline layout: the
// report of the pipeline rank with the largest total, each rank holding
// its schedule's stages with the activation sets the schedule keeps.
func estimatePipeline(plan Plan) ([]Report, error) {
	pp, err := plan.ResolvePipeline()
	if err != nil {
		return nil, fmt.Errorf("memplan: %w", err)
	}
	sched := pp.Schedule
	embed, layer, head := unitSizes(plan)
	var out []Report
	for rank := range sched.PP {
		var units []int64
		peak, split := sched.ActivationSets(rank)
		var act, comm, staging int64
		var specs []*llama.StageSpec
		evalRows, evalOwn, err := plan.evalSets(pp.MicrobatchRows)
		if err != nil {
			return nil, err
		}
		// The rank's sets share one scratch, sized for its largest stage;
		// validation's sets (forward only: one a stage) share their own.
		var train, eval scratchSize
		var stages []StageReport
		for _, s := range sched.Stages(rank) {
			spec := pp.Stages[s]
			ls := llama.StageSpec(spec)
			specs = append(specs, &ls)
			first := len(units)
			if spec.Embedding {
				units = append(units, embed)
			}
			for range spec.NumLayers {
				units = append(units, layer)
			}
			if spec.Head {
				units = append(units, head)
			}
			st := StageReport{Stage: s}
			for _, u := range units[first:] {
				st.Elements += u
			}
			v := stageActivations(plan, pp.MicrobatchRows, spec)
			if v.err != nil {
				return nil, v.err
			}
			// Each set keeps its microbatch's activations; the stage's
			// sets share the memory of the split backwards between their
			// halves at once.
			a := v.act - v.shared
			act += int64(peak[s])*a + int64(split[s])*v.split
			st.Kept = a
			stages = append(stages, st)
			train.add(v)
			comm += int64(peak[s]) * v.own
			staging = max(staging, v.staging)
			if evalOwn {
				e := planned(plan.Model, evalRows, plan.Eval.SeqLen, llamaPlan(plan, &ls)).scale(plan.Precision)
				if e.err != nil {
					return nil, e.err
				}
				act += e.act - e.shared
				eval.add(e)
				comm += e.own
				staging = max(staging, e.staging)
			}
		}
		act += train.bytes(plan.Precision) + eval.bytes(plan.Precision)
		f8, err := float8Gathers(plan, pp.MicrobatchRows, specs)
		if err != nil {
			return nil, err
		}
		r := stateReport(plan, units, f8, sched.Microbatches > 1)
		for _, sp := range specs {
			r.Head = r.Head || sp.Head
		}
		r.Activations = act
		r.Rank, r.Stages = rank, stages
		// The executor's transfer buffers: its receiving side's peak and
		// the sends in flight.
		r.Comm = staging + comm + transferBytes(plan, pp.MicrobatchRows, int64(sched.MessageBuffers(rank)+sendsInFlight))
		out = append(out, r)
	}
	return out, nil
}

// pipelineKey identifies a resolved pipeline: the settings (less the
// costs function, which is not comparable) and what the stage costs
// derive from.
type pipelineKey struct {
	layers, batch  int
	degree         int
	schedule       string
	lps            int // *LayersPerStage, -1 when unset
	first, last    int
	microbatchRows int
	model          llama.Config
	ac             llama.ActivationCheckpoint
	seqLen         int
}

type pipelineVal struct {
	p   parallel.PipelinePlan
	err error
}

// pipelines memoizes ResolvePipeline: a search resolves the same few
// pipelines for many layouts, and the zero-bubble schedules take a while
// to build.
var pipelines sync.Map

// ResolvePipeline returns the plan's pipeline as the trainer lays it out
// (parallel.PlanPipeline with the plan's settings, degree and batch): one
// stage of the whole model without Pipeline or pipeline parallelism.
func (p Plan) ResolvePipeline() (parallel.PipelinePlan, error) {
	k := pipelineKey{layers: p.Model.NLayers, batch: p.Batch, lps: -1}
	if ps := p.Pipeline; ps != nil && p.Degrees.PP > 1 {
		k.degree, k.schedule, k.first, k.last, k.microbatchRows = p.Degrees.PP, ps.Schedule, ps.FirstLessLayers, ps.LastLessLayers, ps.MicrobatchSize
		if ps.LayersPerStage != nil {
			k.lps = *ps.LayersPerStage
		}
		k.model, k.ac, k.seqLen = p.Model, llamaPlan(p, nil).Checkpoint, p.SeqLen
	}
	if v, ok := pipelines.Load(k); ok {
		v := v.(pipelineVal)
		return v.p, v.err
	}
	var s parallel.PipelineSettings
	if k.degree > 1 {
		s = parallel.PipelineSettings{
			Degree: k.degree, Schedule: k.schedule, FirstLessLayers: k.first, LastLessLayers: k.last, MicrobatchSize: k.microbatchRows,
			Costs: parallel.PassCosts(llama.Family{Cfg: k.model, Checkpoint: k.ac}, k.seqLen),
		}
	}
	if k.lps >= 0 {
		lps := k.lps
		s.LayersPerStage = &lps
	}
	var v pipelineVal
	v.p, v.err = parallel.PlanPipeline(k.layers, k.batch, s)
	pipelines.Store(k, v)
	return v.p, v.err
}

// llamaPlan is the model plan of one rank of plan computing stage (nil:
// the whole model).
func llamaPlan(plan Plan, stage *llama.StageSpec) llama.Plan {
	d := plan.Degrees
	lp := llama.Plan{TP: d.TP, CP: d.CP, Stage: stage, LogitChunk: plan.LogitChunk,
		Checkpoint: llama.ActivationCheckpoint{Mode: plan.Checkpoint.Mode, SelectiveOption: plan.Checkpoint.Option}}
	if plan.Precision.ParamBF16 && plan.Precision.Compute == 0 {
		// titan's CPU mixed precision lays some activations out in
		// bfloat16; a runtime's Compute scales them all instead (scale).
		lp.Precision = model.Precision{Param: backend.BFloat16}
	}
	if d.TP*d.CP > 1 {
		lp.Comm = planOnly{}
	}
	return lp
}

// stageActivations returns the activation bytes of one activation set of
// stage for microbatches of rows, what a split backward adds to it, and
// its host bytes (the staging the rank's sets share, the set's own), at
// the plan's compute precision.
func stageActivations(plan Plan, rows int, stage model.StageSpec) plannedVal {
	ls := llama.StageSpec(stage)
	return planned(plan.Model, rows, plan.SeqLen, llamaPlan(plan, &ls)).scale(plan.Precision)
}

// scale converts the model's float32 byte counts to the compute
// precision.
func (v plannedVal) scale(p Precision) plannedVal {
	f := p.scaleBytes
	v.act, v.split, v.staging, v.own, v.shared = f(v.act), f(v.split), f(v.staging), f(v.own), f(v.shared)
	return v
}

// activations returns the activation and communication bytes of one rank
// of plan whose stage holds the given number of layers. The activations
// are what the model plans for it (llama.ActivationBytesFor, the same
// arithmetic that lays out the model's buffers): what a microbatch keeps
// from its forward to its backward once per microbatch in flight, since a
// pipeline stage builds one model per microbatch, and the scratch its
// passes need only while they run once (llama.ScratchLen); under
// pipeline parallelism the busier of the first stage (the embedding and
// pp microbatches in flight, 1F1B) and the last (the head, one in flight).
// The communication buffers are the host buffers outside them
// (llama.HostBytesFor: the staging the rank's models share, each model's
// own) and a pipeline's transfers.
func activations(plan Plan, layers int64) (act, comm int64, err error) {
	c := plan.Model
	d := plan.Degrees
	rows := plan.Batch
	inFlight := int64(1)
	if d.PP > 1 {
		if plan.MicrobatchRows > 0 {
			rows = min(plan.MicrobatchRows, plan.Batch)
		}
		// 1F1B: the first stage holds up to pp microbatches' activations
		// before its first backward.
		inFlight = min(int64(d.PP), ceilDiv(int64(plan.Batch), int64(rows)))
	}
	model := func(stage *llama.StageSpec) plannedVal {
		return planned(c, rows, plan.SeqLen, llamaPlan(plan, stage)).scale(plan.Precision)
	}
	evalRows, evalOwn, err := plan.evalSets(rows)
	if err != nil {
		return 0, 0, err
	}
	if d.PP == 1 {
		v := model(nil)
		if !evalOwn || v.err != nil {
			return v.act, v.staging + v.own, v.err
		}
		// Validation's set beside the step's, with its own scratch; the
		// host staging is one for both.
		e := planned(c, evalRows, plan.Eval.SeqLen, llamaPlan(plan, nil)).scale(plan.Precision)
		return v.act + e.act, max(v.staging, e.staging) + v.own + e.own, e.err
	}
	n := int(layers)
	first := model(&llama.StageSpec{FirstLayer: 0, NumLayers: n, Embedding: true})
	last := model(&llama.StageSpec{FirstLayer: c.NLayers - n, NumLayers: n, Head: true})
	if err := errors.Join(first.err, last.err); err != nil {
		return 0, 0, err
	}
	firstAct, lastAct := inFlight*(first.act-first.shared)+first.shared, last.act
	firstOwn, lastOwn := inFlight*first.own, last.own
	staging := max(first.staging, last.staging)
	if evalOwn {
		fe := planned(c, evalRows, plan.Eval.SeqLen, llamaPlan(plan, &llama.StageSpec{FirstLayer: 0, NumLayers: n, Embedding: true})).scale(plan.Precision)
		le := planned(c, evalRows, plan.Eval.SeqLen, llamaPlan(plan, &llama.StageSpec{FirstLayer: c.NLayers - n, NumLayers: n, Head: true})).scale(plan.Precision)
		if err := errors.Join(fe.err, le.err); err != nil {
			return 0, 0, err
		}
		firstAct, lastAct, firstOwn, lastOwn = firstAct+fe.act, lastAct+le.act, firstOwn+fe.own, lastOwn+le.own
		staging = max(staging, fe.staging, le.staging)
	}
	comm = staging + max(firstOwn, lastOwn) + transferBytes(plan, rows, 2)
	return max(firstAct, lastAct), comm, nil
}

// sendsInFlight is the number of the pipeline executor's sends counted
// as in flight at once beside its receiving side
// (pipeline.Schedule.MessageBuffers): it gives a send's buffer back once
// the send finished, which on a host is as soon as the bytes are in the
// socket, so a rank rarely has more than its latest send or two going.
const sendsInFlight = 2

// transferBytes returns the memory of n pipeline transfer buffers of a
// rank of plan with microbatches of rows: each holds one stage boundary's
// activation or its gradient (this rank's sequence-parallel rows).
func transferBytes(plan Plan, rows int, n int64) int64 {
	d := plan.Degrees
	tokens := int64(rows) * int64(plan.SeqLen) / int64(d.CP) / int64(d.TP)
	return n * tokens * int64(plan.Model.Dim) * plan.Precision.compute()
}

// plannedKey identifies one activation plan.
type plannedKey struct {
	cfg           llama.Config
	rows, T       int
	tp, cp, chunk int
	mode, option  string
	stage         llama.StageSpec
	staged        bool
	half          bool // bfloat16 activations (llamaPlan)
}

type plannedVal struct {
	act, split, staging, own int64
	shared                   int64 // of act, the scratch the rank's sets share
	scratchN, scratchHN      int   // its float32 and bfloat16 elements
	err                      error
}

// scratchSize is the scratch the parts of a rank share: the largest of
// their float32 and bfloat16 elements (model.ActivationScratch.Reserve).
type scratchSize struct{ n, nh int }

func (s *scratchSize) add(v plannedVal) {
	s.n, s.nh = max(s.n, v.scratchN), max(s.nh, v.scratchHN)
}

// bytes is the scratch's size in p's compute precision (see scale).
func (s scratchSize) bytes(p Precision) int64 {
	return p.scaleBytes(int64(s.n)*bytesPerFloat + int64(s.nh)*2)
}

// scaleBytes converts a byte count of the model's float32 activations to
// p's compute precision.
func (p Precision) scaleBytes(n int64) int64 { return n / bytesPerFloat * p.compute() }

// plans memoizes planned: searches (titan plan --search) estimate
// thousands of layouts of the same few stage shapes.
var plans sync.Map

// planned returns llama's activation bytes, split-backward bytes and
// host bytes (shared staging and the part's own) of one part
// (llama.ActivationBytesFor, llama.SplitBytesFor, llama.HostBytesFor),
// memoized.
func planned(c llama.Config, rows, T int, lp llama.Plan) (v plannedVal) {
	k := plannedKey{cfg: c, rows: rows, T: T, tp: lp.TP, cp: lp.CP, chunk: lp.LogitChunk, mode: lp.Checkpoint.Mode, option: lp.Checkpoint.SelectiveOption,
		half: lp.Precision.BF16()}
	if lp.Stage != nil {
		k.stage, k.staged = *lp.Stage, true
	}
	if v, ok := plans.Load(k); ok {
		return v.(plannedVal)
	}
	if v.act, v.err = llama.ActivationBytesFor(c, rows, T, lp); v.err == nil {
		v.scratchN, v.scratchHN, _ = llama.ScratchLen(c, rows, T, lp)
		v.shared = int64(v.scratchN)*bytesPerFloat + int64(v.scratchHN)*2
		if v.split, v.err = llama.SplitBytesFor(c, rows, T, lp); v.err == nil {
			v.staging, v.own, v.err = llama.HostBytesFor(c, rows, T, lp)
		}
	}
	if v.err != nil {
		v.err = fmt.Errorf("memplan: %w", v.err)
	}
	plans.Store(k, v)
	return v
}

// planOnly stands in for the peers of a tensor- or context-parallel
// model whose activations are only planned: llama.ActivationBytesFor
// wants a ParallelComm for tp × cp > 1 but never calls it.
type planOnly struct{}

var errPlanOnly = fmt.Errorf("memplan: planning only, no communication")

func (planOnly) AllGatherSeq(send, recv []float32) error     { return errPlanOnly }
func (planOnly) ReduceScatterSeq(send, recv []float32) error { return errPlanOnly }
func (planOnly) AllReduceTP(x []float32, max bool) error     { return errPlanOnly }
func (planOnly) RingShiftAsync(send, recv []float32) func() error {
	return func() error { return errPlanOnly }
}
