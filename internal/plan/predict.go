package plan

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/titan-go/titan/internal/cluster"
	"github.com/titan-go/titan/internal/memplan"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/parallel"
	"github.com/titan-go/titan/internal/parallel/pipeline"
)

// Breakdown is one step of the busiest rank, in seconds, by part.
type Breakdown struct {
	// Matmul, Attention and Elementwise are the compute of every
	// microbatch's forward and backward; Float8 casts count as
	// element-wise. Recompute is what activation checkpointing computes
	// again.
	Matmul, Attention, Elementwise, Recompute float64 `json:"-"`
	// TP and CP are the tensor- and context-parallel communication on
	// the critical path (after the overlap they get), PP the
	// point-to-point transfers' latency within the pipeline makespan.
	TP, CP float64 `json:"-"`
	// Bubble is the pipeline's idle time on the busiest rank (the
	// schedule's simulation).
	Bubble float64 `json:"-"`
	// FSDP and DP are the exposed FSDP all-gathers/reduce-scatters and
	// data-parallel (replicate) all-reduces; FSDPTotal and DPTotal their
	// whole time before overlap.
	FSDP, DP, FSDPTotal, DPTotal float64 `json:"-"`
	// Optimizer is the AdamW update and gradient clipping.
	Optimizer float64 `json:"-"`
	// Step is the whole step.
	Step float64 `json:"-"`
}

// idle is the busiest pipeline rank's idle share of its step (the
// "pipeline bubble" line of the breakdown).
func (b Breakdown) idle() float64 {
	if b.Step <= 0 {
		return 0
	}
	return b.Bubble / b.Step
}

// accumulated is the breakdown of a step that accumulates n local
// batches: each runs the whole schedule with its gathers and reductions
// (as the engine does: ForwardBackward runs the pipeline schedule once
// per accumulated batch), the optimizer steps once.
func (b Breakdown) accumulated(n int) Breakdown {
	if n <= 1 {
		return b
	}
	f := float64(n)
	opt := b.Optimizer
	b.Matmul, b.Attention, b.Elementwise, b.Recompute = f*b.Matmul, f*b.Attention, f*b.Elementwise, f*b.Recompute
	b.TP, b.CP, b.Bubble = f*b.TP, f*b.CP, f*b.Bubble
	b.FSDP, b.DP, b.FSDPTotal, b.DPTotal = f*b.FSDP, f*b.DP, f*b.FSDPTotal, f*b.DPTotal
	b.Step = f*(b.Step-opt) + opt
	return b
}

// parts lists the breakdown's named parts (Step excluded).
func (b Breakdown) parts() []namedTime {
	return []namedTime{
		{"matmul", b.Matmul}, {"attention", b.Attention}, {"elementwise", b.Elementwise}, {"recompute (activation checkpointing)", b.Recompute},
		{"tp comm (exposed)", b.TP}, {"cp comm (exposed)", b.CP}, {"pipeline bubble", b.Bubble},
		{"fsdp comm (exposed)", b.FSDP}, {"dp all-reduce (exposed)", b.DP}, {"optimizer", b.Optimizer},
	}
}

type namedTime struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// Prediction is the predicted memory and speed of a job on a cluster.
type Prediction struct {
	Job     Job
	Cluster cluster.Cluster
	Runtime Runtime
	// Memory is memplan's estimate of the busiest rank (with the
	// runtime's transients); MemoryBytes the
	// device memory predicted from it and LossBytes (× the calibration's
	// factor, plus its base), Capacity the device's memory.
	Memory      memplan.Report
	MemoryBytes float64
	Capacity    float64
	// RankMemoryBytes is the device memory predicted for each pipeline
	// rank, in rank order (nil without pipeline parallelism: every rank
	// holds the same); MemoryBytes is their largest.
	RankMemoryBytes []float64
	// LossBytes is what PyTorch's loss holds beyond the logits memplan
	// counts (lossTransient; 0 for titan's chunked loss); at a PyTorch
	// pipeline rank's peak, PipelineGradBytes are the unsharded gradients
	// its stages accumulate over their microbatches and PipelineSetBytes
	// (zero or negative) the activation sets memplan counts that are not
	// alive then (pipelineGradHold; both 0 on titan's executor). All are
	// added to the estimate before the calibration's factor.
	LossBytes, PipelineGradBytes, PipelineSetBytes float64
	// SACBytes are the products' outputs PyTorch's per-operation
	// checkpointing saves that titan's does not (sacSaved; 0 on titan's
	// runtime), also added before the factor.
	SACBytes float64
	// Step is the step's breakdown.
	Step Breakdown
	// Microbatches and BubbleFraction describe the pipeline (1 and 0
	// without one); BubbleFraction is the simulated schedule's.
	Microbatches   int
	BubbleFraction float64
	// RankCompute is each pipeline rank's compute in the step (its
	// stages' passes, all accumulated local batches), in rank order; nil
	// without pipeline parallelism.
	RankCompute []float64
	// TokensPerDevice is tokens/s per rank, MFU the model FLOPs
	// (torchtitan's count, llama.Config.FLOPsPerToken) per second as a
	// fraction of the device's peak (bf16; fp32 on a CPU).
	TokensPerDevice, MFU float64
}

// Fits reports whether the predicted memory fits the device.
func (p Prediction) Fits() bool { return p.fitsWithin(0) }

// fitsWithin reports whether the predicted memory leaves headroom (a
// fraction) of the device free.
func (p Prediction) fitsWithin(headroom float64) bool {
	return p.MemoryBytes <= (1-headroom)*p.Capacity
}

// Element-wise traffic, in elements per token and layer of the forward
// pass (the backward moves twice as much), counted from the operations
// of a Llama layer: fused kernels read and write each operand once (an
// RMSNorm reads x and writes y, the residual adds read two and write
// one, RoPE rewrites q and k, SwiGLU reads the two projections and
// writes their product); PyTorch eager runs each primitive of those as
// its own kernel (RMSNorm's cast, square, mean, rsqrt, two products and
// cast back; RoPE's complex view, product and cast; SiLU then product;
// the transposes around attention).
func ewElements(c llama.Config, fused bool) float64 {
	D, F := float64(c.Dim), float64(c.FFNHidden())
	Q, KV := float64(c.NHeads*c.HeadDim()), float64(c.KVHeads()*c.HeadDim())
	if fused {
		return 4*D + 6*D + 2*(Q+KV) + 3*F
	}
	return 20*D + 6*D + 6*(Q+KV) + 2*(Q+2*KV) + 5*F
}

// lossBytes is the traffic of the loss per token and vocabulary column,
// forward and backward together: fused (titan's chunked cross entropy, a
// compiled loss) reads the logits twice and writes their gradient in
// float32; eager PyTorch also casts them to float32, takes the log-softmax
// in separate passes and casts the gradient back.
func lossBytes(fused bool) float64 {
	if fused {
		return 12
	}
	return 40
}

// attentionFLOPs is the forward FLOPs of causal attention for n query
// tokens of a sequence of T: the scores and the weighted sum, each 2·T·q
// per token over the half of the keys causality leaves.
func attentionFLOPs(c llama.Config, n, T float64) float64 {
	return 2 * n * T * float64(c.NHeads*c.HeadDim())
}

// attentionBackward is the backward's cost relative to the forward
// (flash attention's five products against two).
const attentionBackward = 2.5

// optimizerAccesses is the float32 elements AdamW and gradient clipping
// read and write per parameter of the shard: p, g, m, v read and p, m, v
// written by the update, the gradient read for its norm and rewritten
// when clipped.
const optimizerAccesses = 10

// torchRing is one layer of ring attention as PyTorch's context_parallel
// runs it under torchtitan (torch.distributed.tensor.experimental.
// _attention, rotate method allgather, load balancing on): the model
// repeats the key/value heads to every query head before SDPA
// (repeat_kv), so the rotated shards are as wide as the queries (o
// elements each of k and v per rank: the rank's tokens times its query
// width). The forward all-gathers the shards once, after the first
// (diagonal) block, and waits before the second; the backward gathers
// them again and passes the float32 key/value gradients around the ring
// (all-to-all), one pass behind each block. It returns the exposed
// communication of the forward and the backward (seconds) and the
// element-wise traffic (bytes) of each, which runs eagerly outside any
// compiled region: the forward concatenates k and v for each exchange
// (cp-1 copies) and merges each later block's output into a float32
// running output (cast, difference, scaled difference, update, and a
// rebuild by concatenation for the half-query blocks); the backward
// zero-fills float32 q/k/v gradients, and for each block concatenates k
// and v, adds the block's gradients into the float32 accumulators
// (rebuilt by concatenation for the half blocks), concatenates the
// key/value gradients for the pass, and casts the three back at the end.
func torchRing(c cluster.Cluster, cal Calibration, rt Runtime, link cluster.Link, cp int, o, cb, perF, perB float64) (fwd, bwd, ewF, ewB float64) {
	n := float64(cp)
	kv := 2 * o * cb
	gather := ringTime(c, cal, rt, "all_gather", cp, link, n*kv)
	fwd = math.Max(0, gather-perF/n)
	pass := p2pTime(c, cal, rt, link, cp, 2*o*4)
	bwd = math.Max(0, gather-perB/n) + (n-1)*math.Max(0, pass-perB/n)
	// Bytes per element of o: a bf16 k/v copy reads and writes 2·cb per
	// tensor; a float32 merge step reads the block (cb) and writes and
	// reads the running output (4 each) over four passes.
	copyKV := 2 * 2 * cb
	merge := (cb + 4) + 3*4 + 2*4 + 3*4 + 4 // cast, difference, scale, update, half-block rebuild
	ewF = o * ((n-1)*(copyKV+merge) + 2*(cb+4))
	accum := 3 * (4 + cb + 4) // q, k, v: read the accumulator and the block, write
	ewB = o * (3*4 + n*(copyKV+accum+2*4+2*2*4) + 3*(4+cb))
	return fwd, bwd, ewF, ewB
}

// rates are one rank's throughputs.
type rates struct {
	mm, fp8, attn, ew float64 // FLOP/s, FLOP/s, FLOP/s, bytes/s
}

// ratesOf is one rank's throughputs on c with cp context-parallel ranks
// under activation checkpointing policy ac: attention at titan's
// measured ring-attention rate when the calibration has one for cp
// (Calibration.RingAttention; not under PyTorch's ring, rt.TorchRing),
// and on a CPU host every rate at the policy's measured speedup
// (Calibration.ACSpeedup).
func ratesOf(c cluster.Cluster, cal Calibration, rt Runtime, cp int, ac memplan.Checkpoint) rates {
	peak := c.Device.PeakBF16
	if c.CPU() {
		peak = c.Device.PeakFP32
	}
	// Ranks sharing a host each get 1/share of it, at the speedup
	// measured for that many side by side (Calibration.Shared); ring
	// attention's rate was measured on a rank's own threads already.
	share := float64(max(rt.Shared, 1))
	speedup, _ := cal.sharedSpeedup(max(rt.Shared, 1))
	each := speedup / share
	bf16 := rt.Precision.ParamBF16 && cal.MatmulBF16 > 0 && cal.AttentionBF16 > 0
	mm, attn := cal.Matmul, cal.Attention
	if bf16 {
		mm, attn = cal.MatmulBF16, cal.AttentionBF16
	}
	attnShare := each
	if e, ok := cal.ring(cp, bf16); ok && cp > 1 && !rt.TorchRing {
		attn, attnShare = e, 1/share
	}
	acs := 1.0
	if c.CPU() {
		acs = cal.acSpeedup(ac)
	}
	return rates{
		mm:   mm * peak * each * acs,
		fp8:  cal.MatmulFP8 * c.Device.PeakFP8 * each * acs,
		attn: attn * peak * attnShare * acs,
		ew:   cal.Elementwise * c.Device.MemoryBandwidth * each * acs,
	}
}

// Predict returns the predicted memory and step of job on cluster c (of
// as many ranks as the job's layout) under calibration cal.
func Predict(job Job, c cluster.Cluster, cal Calibration) (Prediction, error) {
	return predict(job, c, cal, false)
}

// predict is Predict; onlyFitting skips the step of a job that does
// not fit (its Step is then zero).
func predict(job Job, c cluster.Cluster, cal Calibration, onlyFitting bool) (Prediction, error) {
	if err := cal.Validate(); err != nil {
		return Prediction{}, err
	}
	l := job.Layout
	c, err := c.WithWorld(l.World())
	if err != nil {
		return Prediction{}, err
	}
	if err := checkOptions(l, c, cal); err != nil {
		return Prediction{}, err
	}
	rt := RuntimeOf(c, l)
	mp, err := job.MemPlan(rt)
	if err != nil {
		return Prediction{}, err
	}
	ranks, err := memplan.EstimateRanks(mp)
	if err != nil {
		return Prediction{}, err
	}
	var pp parallel.PipelinePlan // the pipeline every rank's transients walk
	if l.Degrees.PP > 1 {
		if pp, err = mp.ResolvePipeline(); err != nil {
			return Prediction{}, err
		}
	}
	// The busiest rank with the runtime's transients: a pipeline's loss
	// is on its last rank only.
	var pred Prediction
	perRank := make([]float64, len(ranks))
	for i, mem := range ranks {
		p := Prediction{Job: job, Cluster: c, Runtime: rt, Memory: mem, Capacity: c.Device.MemoryBytes}
		if p.PipelineGradBytes, p.PipelineSetBytes, err = pipelineGradHold(job, mp, mem, rt); err != nil {
			return Prediction{}, err
		}
		if mem.Head {
			p.LossBytes = lossTransient(job, rt)
		}
		p.SACBytes = sacSaved(job, pp, mem, rt)
		perRank[i] = cal.MemoryFactor*p.needed() + cal.MemoryBase
		if i == 0 || p.needed() > pred.needed() {
			pred = p
		}
	}
	pred.MemoryBytes = cal.MemoryFactor*pred.needed() + cal.MemoryBase
	if len(perRank) > 1 {
		pred.RankMemoryBytes = perRank
	}
	if onlyFitting && !pred.Fits() {
		return pred, nil
	}
	step, sim, err := stepTime(job, mp, c, cal, rt)
	if err != nil {
		return Prediction{}, err
	}
	step = step.accumulated(l.accum())
	pred.Step = step
	pred.Microbatches, pred.BubbleFraction = sim.Schedule.Microbatches, sim.Bubble
	if l.Degrees.PP > 1 {
		pred.RankCompute = make([]float64, len(sim.Busy))
		for r, b := range sim.Busy {
			pred.RankCompute[r] = b * float64(l.accum())
		}
	}
	d := l.Degrees
	tokens := float64(l.accum()*l.LocalBatch*l.SeqLen) / float64(d.TP*d.CP*d.PP)
	pred.TokensPerDevice = tokens / step.Step
	// MFU against the peak of the precision the products run in: a CPU
	// host's float32 peak unless mixed precision runs them in bfloat16,
	// each of the ranks that share the host holding its share (so that
	// it reads as titan train's MFU, the job's against the host's peak).
	peak := c.Device.PeakBF16
	if c.CPU() && !(l.ParamBF16 && peak > 0) {
		peak = c.Device.PeakFP32
	}
	peak /= float64(max(1, rt.Shared))
	pred.MFU = job.Model.FLOPsPerToken(l.SeqLen) * pred.TokensPerDevice / peak
	return pred, nil
}

// checkOptions refuses kernel options the cluster or its calibration
// cannot predict, whatever the layout.
func checkOptions(l Layout, c cluster.Cluster, cal Calibration) error {
	switch {
	case c.CPU() && l.Float8:
		return fmt.Errorf("plan: float8 linear layers (model.converters = [\"float8\"], or --float8) are not modelled on a CPU host (cluster %s): the calibration times no float8 products", c.Name)
	case c.CPU() && (l.Compile || l.AsyncTP):
		return fmt.Errorf("plan: compile and async TP (parallelism.enable_async_tensor_parallel) are GPU options (cluster %s is a CPU host)", c.Name)
	case !c.CPU() && !l.ParamBF16:
		return fmt.Errorf("plan: training.mixed_precision_param \"float32\" is not modelled on GPU cluster %s: its runtime computes in bfloat16 (set training.mixed_precision_param = \"bfloat16\")", c.Name)
	case !c.CPU() && l.ReduceBF16:
		return fmt.Errorf("plan: training.mixed_precision_reduce \"bfloat16\" is not modelled on GPU cluster %s: its runtime reduces gradients in float32", c.Name)
	case l.AsyncTP && !l.Compile:
		return errors.New("plan: async TP (--async-tp) needs compile (--compile): it is inductor's micro-pipeline pass, and torchtitan refuses it without torch.compile")
	case l.Float8 && (c.Device.PeakFP8 <= 0 || cal.MatmulFP8 <= 0):
		return fmt.Errorf("plan: float8 on %s: the device has no float8 peak (peak_fp8_flops) or the calibration no matmul_fp8_efficiency", c.Name)
	}
	return nil
}

// lossTransient is the memory PyTorch's cross entropy holds at its peak
// beyond the compute-precision logits memplan counts, on a runtime that
// keeps the whole logits. torchtitan's loss (eager, not compiled) is
// cross_entropy(pred.float(), labels): in the forward the bf16 logits,
// their float32 upcast and log-softmax's float32 output are live (10
// bytes an element); the training loop then drops the bf16 logits (`del
// pred` before the backward; the upcast's backward does not keep its
// input), and log-softmax's backward writes its float32 input gradient
// while its saved output and the NLL's float32 gradient are live: three
// float32 copies, 12 bytes an element, the loss's peak. Elements are this
// rank's tokens times its vocabulary shard (loss parallel under tp).
func lossTransient(job Job, rt Runtime) float64 {
	if !rt.WholeLogits {
		return 0
	}
	l := job.Layout
	d := l.Degrees
	rows := l.LocalBatch
	if d.PP > 1 {
		rows = max(l.MicrobatchRows, 1)
	}
	cb := float64(rt.Precision.Compute)
	if cb == 0 {
		cb = 4
	}
	return (3*4 - cb) * float64(rows*l.SeqLen/max(d.CP, 1)) * float64(job.Model.VocabSize/max(d.TP, 1))
}

// needed is the memory the job needs before the calibration: memplan's
// estimate and the runtime's transients beyond it.
func (p Prediction) needed() float64 {
	return float64(p.Memory.Total()) + p.LossBytes + p.PipelineGradBytes + p.PipelineSetBytes + p.SACBytes
}

// sacSaved is what PyTorch's per-operation checkpointing keeps beyond
// titan's policy of the same name on a rank (memplan's report mem),
// with every activation set memplan counts (pp: the job's resolved
// pipeline under pipeline parallelism): torchtitan's policy saves
// the output of every other matrix product, w2's included, which no
// backward reads (titan's w2 product accumulates onto the residual
// stream, the next layer's input, and keeps nothing). Under pipeline
// parallelism pipelineGradHold corrects it, with the rest of a set, for
// the sets not alive at the rank's peak.
func sacSaved(job Job, pp parallel.PipelinePlan, mem memplan.Report, rt Runtime) float64 {
	l := job.Layout
	if l.Degrees.PP <= 1 {
		return sacPerSet(job, rt, job.Model.NLayers, l.LocalBatch)
	}
	sets, _ := pp.Schedule.ActivationSets(mem.Rank)
	var b float64
	for s, n := range sets {
		b += float64(n) * sacPerSet(job, rt, pp.Stages[s].NumLayers, pp.MicrobatchRows)
	}
	return b
}

// sacPerSet is sacSaved's part of one activation set of layers layers
// and rows rows: one w2 output a layer, [tokens, dim] in the compute
// precision (under tensor parallelism the whole partial sum before its
// reduce-scatter); 0 unless the runtime is PyTorch's and the policy
// per-operation.
func sacPerSet(job Job, rt Runtime, layers, rows int) float64 {
	l := job.Layout
	if !rt.TorchSAC || l.Checkpoint.Mode != "selective" || l.Checkpoint.Option != "op" {
		return 0
	}
	return float64(layers) * float64(rows*l.SeqLen) / float64(max(l.Degrees.CP, 1)) * float64(job.Model.Dim) * rt.computeBytes()
}

// pipelineGradHold is what a rank of a PyTorch pipeline holds beyond
// memplan's estimate when FSDP shards its parameters, at the rank's peak
// along its action list. torch.distributed.pipelining runs every
// backward of a stage but its last without gradient sync, so FSDP2
// accumulates the stage's gradients unsharded, in the reduce precision
// (each microbatch's bf16 gradient is upcast into a float32 accumulator
// when the reduce dtype is float32), from the stage's first backward
// until its last, whose post-backward reduce-scatters them and frees
// them: grads is the sum of the holds of the stages between their first
// and last backward at the peak. PyTorch allocates activations as a
// microbatch's forward runs, where titan's executor (and memplan) holds
// every stage's peak number of sets at once: sets (zero or negative) is
// the kept activations alive at the peak (with what PyTorch's
// checkpointing keeps beyond titan's, sacPerSet) less memplan's and
// sacSaved's. memplan counts
// the unsharded bf16 parameters already (torchtitan does not reshard
// after the forward under pipeline parallelism, nor does titan), two
// unit gradient buffers, which stand for a unit's bf16 gradient before
// its upcast, and titan's held unit gradients (HeldGrads), which the
// float32 accumulators replace.
func pipelineGradHold(job Job, mp memplan.Plan, mem memplan.Report, rt Runtime) (grads, sets float64, err error) {
	d := job.Layout.Degrees
	if !rt.PipelineNoSync || d.PP <= 1 || d.ShardGroup() <= 1 {
		return 0, 0, nil
	}
	pp, err := mp.ResolvePipeline()
	if err != nil {
		return 0, 0, err
	}
	reduce := 4.0
	if rt.Precision.ReduceBF16 {
		reduce = 2
	}
	kept, hold := map[int]float64{}, map[int]float64{}
	for _, st := range mem.Stages {
		kept[st.Stage], hold[st.Stage] = float64(st.Kept), float64(st.Elements)*reduce
		kept[st.Stage] += sacPerSet(job, rt, pp.Stages[st.Stage].NumLayers, pp.MicrobatchRows)
	}
	acts := pp.Schedule.Actions[mem.Rank]
	first, last := map[int]int{}, map[int]int{}
	for i, a := range acts {
		if a.Kind == pipeline.Forward {
			continue
		}
		if _, ok := first[a.Stage]; !ok {
			first[a.Stage] = i
		}
		last[a.Stage] = i
	}
	peakSets, _ := pp.Schedule.ActivationSets(mem.Rank)
	var static float64
	for s, n := range peakSets {
		static += float64(n) * kept[s]
	}
	live := map[int]int{}
	peak := -1.0
	for i, a := range acts {
		if a.Kind == pipeline.Forward {
			live[a.Stage]++
		}
		var k, g float64
		for s, n := range live {
			k += float64(n) * kept[s]
		}
		for s, h := range hold {
			if f, ok := first[s]; ok && f <= i && i <= last[s] {
				g += h
			}
		}
		if k+g > peak {
			peak, grads, sets = k+g, g, k-static
		}
		if a.Kind == pipeline.Backward || a.Kind == pipeline.BackwardWeight {
			live[a.Stage]--
		}
	}
	// titan's units hold their gradients over the step in buffers of
	// the compute precision, which memplan counts (HeldGrads); PyTorch's
	// accumulators take their place.
	return grads - float64(mem.HeldGrads), sets, nil
}

// timeShared is the busiest rank's pipeline time over its compute when
// the pipeline ranks outnumber a CPU host's cores (1 otherwise, or
// without a pipeline). Each rank then computes on its share of the
// cores, and a rank idle in the bubble gives its share to the ranks
// still computing, up to a core each (one thread each): the host works
// through the ranks' mean compute, and the schedule cannot finish
// before its makespan at a core a rank. Measured on this host, FSDP2 ×
// PP2 (4 processes on 2 cores): the ranks' mean 621 ms against the
// busiest's 662 and a simulated bubble of 73 ms; the step took 641 ms
// (bench/plan/README.md).
func timeShared(c cluster.Cluster, rt Runtime, sim pipeline.Timeline, busy float64) float64 {
	cores := c.Device.Cores
	if !c.CPU() || cores < 1 || rt.Shared <= cores || len(sim.Busy) < 2 || busy <= 0 {
		return 1
	}
	mean := 0.0
	for _, b := range sim.Busy {
		mean += b
	}
	mean /= float64(len(sim.Busy))
	floor := sim.Makespan * float64(cores) / float64(rt.Shared)
	return max(mean, floor) / busy
}

// pipelineGathers is how many times a unit is all-gathered in one pass
// of sched's actions, the most over the ranks' stages: before a forward
// or backward that finds it freed; a forward frees it when reshard
// (fsdp_reshard_after_forward = "always"), a backward only when it is
// its stage's last (before it, backwards run without gradient sync and
// keep the unit gathered).
func pipelineGathers(sched pipeline.Schedule, reshard bool) float64 {
	most := 0
	for r := range sched.PP {
		last := pipeline.LastGradients(sched.Actions[r])
		gathered, n := map[int]bool{}, map[int]int{}
		for i, a := range sched.Actions[r] {
			if !gathered[a.Stage] {
				gathered[a.Stage] = true
				n[a.Stage]++
			}
			if a.Kind == pipeline.Forward && reshard || a.Kind != pipeline.Forward && i == last[a.Stage] {
				gathered[a.Stage] = false
			}
		}
		for _, k := range n {
			most = max(most, k)
		}
	}
	return float64(most)
}

// rankShare is what the busiest pipeline rank holds: its layers, whether
// it has the embedding and the head, its stages and its parameters.
type rankShare struct {
	layers      int
	embed, head bool
	stages      int
	params      float64 // elements of its (tp-sharded) units
	firstUnit   float64 // elements of its first unit
}

// stepTime is the step's breakdown and the pipeline's simulation.
func stepTime(job Job, mp memplan.Plan, c cluster.Cluster, cal Calibration, rt Runtime) (Breakdown, pipeline.Timeline, error) {
	l := job.Layout
	cfg := job.Model
	d := l.Degrees
	r := ratesOf(c, cal, rt, d.CP, l.Checkpoint)
	cb := rt.computeBytes()
	D, V := float64(cfg.Dim), float64(cfg.VocabSize)
	F := float64(cfg.FFNHidden())
	Q, KV := float64(cfg.NHeads*cfg.HeadDim()), float64(cfg.KVHeads()*cfg.HeadDim())
	tp, cp := float64(d.TP), float64(d.CP)
	T := float64(l.SeqLen)
	layerW := Q*D + 2*KV*D + D*Q + 3*F*D

	// The pipeline: titan's planner and schedule, and each stage's share.
	sched, shares, err := stageShares(job, mp)
	if err != nil {
		return Breakdown{}, pipeline.Timeline{}, err
	}
	rows := l.LocalBatch
	if d.PP > 1 {
		rows = max(l.MicrobatchRows, 1)
	}
	N := float64(rows) * T / cp // tokens of a microbatch on this cp rank
	// Each layer's collectives of a microbatch, the same on every stage.
	// Tensor parallel: float8 layers gather their inputs already cast to
	// float8 (one byte an element), and the backward gathers the output
	// gradients of wo and w2 in float8 too: torchao's row-wise parallel
	// layer casts its output's gradient before the gather. The
	// reduce-scatters stay in bf16, and so do the gathers around the
	// embedding and the head, which are not float8 layers.
	var ag, agOuter, rs float64
	if d.TP > 1 {
		agb := cb
		if l.Float8 {
			agb = 1
		}
		link := groupLink(c, d, "tp")
		ag = ringTime(c, cal, rt, "all_gather", d.TP, link, N*D*agb)
		agOuter = ringTime(c, cal, rt, "all_gather", d.TP, link, N*D*cb)
		rs = ringTime(c, cal, rt, "reduce_scatter", d.TP, link, N*D*cb)
	}
	// Context parallel ring attention: cp blocks of attention, each 1/cp
	// of the layer's (load-balanced causal) work; a layer's exposed
	// communication, forward and backward, and element-wise traffic.
	var cpF, cpB, cpEWF, cpEWB float64
	if d.CP > 1 {
		link := groupLink(c, d, "cp")
		perF := attentionFLOPs(cfg, N, T) / tp / r.attn
		perB := attentionBackward * perF
		if rt.TorchRing {
			cpF, cpB, cpEWF, cpEWB = torchRing(c, cal, rt, link, d.CP, N*Q/tp, cb, perF, perB)
		} else {
			// cp-1 rotations of the key/value shards in the forward, of
			// them and their gradients in the backward; overlapped with the
			// attention blocks on a GPU.
			rot := float64(d.CP-1) * p2pTime(c, cal, rt, link, d.CP, 2*N*KV/tp*cb)
			cpF, cpB = rot, 2*rot
			if rt.Overlap {
				cpF, cpB = math.Max(0, cpF-perF), math.Max(0, cpB-perB)
			}
		}
	}
	// work is one microbatch's compute through a share of the model (a
	// stage), pass by pass.
	_, splitSets := sched.ActivationSets(0)
	splits := splitSets != nil
	work := func(share rankShare) passWork {
		L := float64(share.layers)

		// Compute of one microbatch through the share, forward.
		linear := 2 * N * L * layerW / tp
		headMM := 0.0
		if share.head {
			headMM = 2 * N * V * D / tp
		}
		attn := L * attentionFLOPs(cfg, N, T) / tp
		// The loss's traffic is a third forward, two thirds backward.
		ew := ewLayers(L, N, cfg, rt, cb, tp) + embedBwd(share, N, D, cb) + lossShare(share, N, V, tp, rt)
		mmTime := func(flops float64) float64 { return flops / r.mm }
		linTime := mmTime
		castBytes := 0.0
		if l.Float8 {
			linTime = func(flops float64) float64 { return flops / r.fp8 }
			per := cb + 1
			if !rt.Fused {
				per = 2*cb + 1
			}
			castBytes = L * N / tp * per
		}
		fwdCast := castBytes * (2*D + Q + F)
		bwdCast := castBytes * (2*D + Q + 2*KV + 2*F)
		fMM := linTime(linear) + mmTime(headMM)
		fAttn := attn / r.attn
		fEW := (ew + fwdCast) / r.ew
		// Backward: products twice the forward, half for the input gradient
		// and half for the weights; attention attentionBackward times;
		// element-wise twice (the loss's share above counts its backward).
		bMM := fMM // input half; the weight half is the same
		bAttn := attentionBackward * fAttn
		bEW := (2*ewLayers(L, N, cfg, rt, cb, tp) + embedBwd(share, N, D, cb) + lossBwd(share, N, V, tp, rt) + bwdCast) / r.ew
		// Recomputation in the backward.
		recomputed, ops := recompute(l.Checkpoint, share.layers)
		rMM := linTime(linear) * recomputed / max(L, 1)
		rAttn := fAttn * recomputed / max(L, 1)
		rEW := (ewLayers(L, N, cfg, rt, cb, tp) + fwdCast) / r.ew * recomputed / max(L, 1)
		if ops {
			// The per-operation policy reruns every layer's element-wise
			// operations and the products whose outputs it does not keep:
			// wk, wo and w3 (llama.ActivationCheckpoint), with their inputs'
			// float8 casts.
			rMM = linTime(2 * N * L * (KV*D + D*Q + F*D) / tp)
			rEW = (ewLayers(L, N, cfg, rt, cb, tp) + castBytes*(2*D+Q)) / r.ew
		}

		// Tensor-parallel communication (sequence parallel): per layer two
		// all-gathers and two reduce-scatters of the microbatch's hidden
		// states in the forward and in each recomputed forward; in the
		// backward each all-gather's gradient is a reduce-scatter and each
		// reduce-scatter's an all-gather; one more each way around the
		// embedding and the head.
		var tpF, tpB float64
		if d.TP > 1 {
			agGrad := ag // wo's and w2's output gradients: [N, D] like the inputs
			// exposed is what is left of a collective beside the products
			// it can overlap: all of it without async TP. Async TP
			// (inductor's micro-pipeline pass) fuses an all-gather with the
			// products whose left operand it is, and a reduce-scatter with
			// the one product that produces its input; each collective
			// then overlaps its own fused products only.
			exposed := func(comm, work float64) float64 { return comm }
			if l.AsyncTP && rt.Overlap {
				exposed = overlapped
			}
			prod := func(cols float64) float64 { return linTime(2 * N * D * cols / tp) }
			// A forward: the attention norm's gather feeds wq, wk and wv,
			// the ffn norm's w1 and w3; wo and w2 produce their
			// reduce-scatters' inputs. The head's gather feeds the head;
			// the embedding's reduce-scatter has no product.
			fwdLayer := exposed(ag, prod(Q+2*KV)) + exposed(ag, prod(2*F)) + exposed(rs, prod(Q)) + exposed(rs, prod(F))
			tpF = L * fwdLayer
			// The backward: the gathered output gradients of wo and w2 feed
			// their input gradients' products; the input gradients of
			// wq/wk/wv and of w1/w3 are sums of products, so their
			// reduce-scatters stay exposed; so do the embedding's gathered
			// gradient and the head's reduce-scatter.
			tpB = L * (exposed(agGrad, prod(Q)) + exposed(agGrad, prod(F)) + 2*rs)
			if share.embed {
				tpF, tpB = tpF+rs, tpB+agOuter
			}
			if share.head {
				tpF, tpB = tpF+exposed(agOuter, mmTime(headMM)), tpB+rs
			}
			// The recomputed forwards: a whole one a recomputed layer under
			// full (or per-layer) checkpointing; under the per-operation
			// policy only wk, wo and w3 are rerun, so the recomputation
			// gathers both norms' outputs, each beside one product (wk,
			// w3), and reduce-scatters wo's beside wo.
			tpB += recomputed * fwdLayer
			if ops {
				tpB += L * (exposed(ag, prod(KV)) + exposed(ag, prod(F)) + exposed(rs, prod(Q)))
			}
		}
		// Context parallel: every layer's forward, backward and
		// recomputed forward.
		var cpLF, cpLB float64
		if d.CP > 1 {
			cpLF, cpLB = L*cpF, L*cpB+recomputed*cpF
			fEW += L * cpEWF / r.ew
			bEW += L * cpEWB / r.ew
			rEW += recomputed * cpEWF / r.ew
		}
		w := passWork{
			fMM: fMM, fAttn: fAttn, fEW: fEW, bMM: bMM, bAttn: bAttn, bEW: bEW,
			rMM: rMM, rAttn: rAttn, rEW: rEW, tpF: tpF, tpB: tpB, cpF: cpLF, cpB: cpLB,
		}
		if splits && !rt.KeepsRecomputed {
			// titan's BackwardInput copies the weight-gradient products'
			// inputs out of the shared scratch set for each recomputed
			// layer: the gathered norm outputs and, whole-layer,
			// attention's output; the SwiGLU product.
			per := 2*N*D + N*F/tp
			copied := recomputed * (per + N*Q/tp)
			if ops {
				copied = L * per
			}
			w.copy = 2 * copied * cb / r.ew
		}
		return w
	}
	lat := 0.0
	if d.PP > 1 {
		lat = p2pTime(c, cal, rt, groupLink(c, d, "pp"), d.PP, N*D/tp*cb)
	}
	works := make([]passWork, len(shares))
	costs := make([]pipeline.Costs, len(shares))
	for st, sh := range shares {
		works[st] = work(sh)
		costs[st] = works[st].costs()
	}
	sim := sched.Simulate(costs, lat)
	if sim.Err != nil {
		return Breakdown{}, sim, sim.Err
	}
	// The breakdown is the busiest rank's: the most work over its stages.
	share, w := busiest(sched, shares, works)
	m := float64(sched.Microbatches)
	c0 := w.costs()
	busy := m * (c0.Forward + c0.Input + c0.Weight)
	var b Breakdown
	b.Matmul = m * (w.fMM + 2*w.bMM)
	b.Attention = m * (w.fAttn + w.bAttn)
	b.Elementwise = m * (w.fEW + w.bEW + w.copy)
	b.Recompute = m * (w.rMM + w.rAttn + w.rEW)
	b.TP = m * (w.tpF + w.tpB)
	b.CP = m * (w.cpF + w.cpB)
	// The simulated makespan less the work, floored at zero; without a
	// pipeline the two differ only by rounding.
	b.Bubble = sim.Makespan - busy
	if b.Bubble < 0 || d.PP == 1 {
		b.Bubble = 0
	}
	pipe := sim.Makespan // the schedule's time, compute and bubble
	if f := timeShared(c, rt, sim, busy); f != 1 {
		// More ranks than cores: a rank idle in the bubble leaves its
		// share of the cores to the others.
		pipe = f * busy
		b.Bubble = max(0, pipe-busy)
		if f < 1 {
			b.Matmul, b.Attention, b.Elementwise, b.Recompute = f*b.Matmul, f*b.Attention, f*b.Elementwise, f*b.Recompute
			b.TP, b.CP = f*b.TP, f*b.CP
		}
	}

	// FSDP: all-gather the rank's units (compute precision) in the
	// forward and, resharded after it, again in the backward;
	// reduce-scatter their gradients after the backward. Under a
	// pipeline, titan's executor as PyTorch's keeps a stage's units
	// gathered and their gradients unreduced from one backward to the
	// next until the step's last (fsdp.Runtime.SetGradientSync): one
	// reduction a step, beside the last microbatch's backward, and the
	// gathers the schedule's order leaves (pipelineGathers).
	gathers := 2.0
	switch {
	case d.PP == 1 && l.Reshard == "never":
		gathers = 1
	case d.PP > 1:
		gathers = pipelineGathers(sched, l.Reshard == "always")
	}
	window := c0.Input + c0.Weight // one reduction a step, beside the last microbatch's backward
	shard, repl := d.ShardGroup(), d.ReplicateGroup()
	// CPU mixed precision gathers and reduces bfloat16; rounding the
	// shards (and widening what arrives) are element-wise passes.
	agb, rsb, round := cb, 4.0, 0.0
	if p := rt.Precision; p.ParamBF16 {
		agb = 2
		round = share.params / float64(shard) * (4 + 2) // the shards to bfloat16
		if shard == 1 {
			round += share.params * (2 + 4) // the bound float32 copy
		} else {
			round += gathers * share.params * (2 + 4) // each gathered unit widened
		}
	}
	if rt.Precision.ReduceBF16 {
		rsb = 2
		round += share.params * (4 + 2) // the unit gradients rounded
	}
	first := share.firstUnit / share.params
	var fag, frs float64
	if shard > 1 {
		link := groupLink(c, d, "dp_shard")
		fag = ringTime(c, cal, rt, "all_gather", shard, link, share.params*agb)
		frs = ringTime(c, cal, rt, "reduce_scatter", shard, link, share.params*rsb)
		b.FSDPTotal = gathers*fag + frs
		b.FSDP = b.FSDPTotal
		if rt.Overlap {
			b.FSDP = exposedDP(first, gathers, fag, frs, busy, window)
		}
	}
	if repl > 1 {
		b.DPTotal = ringTime(c, cal, rt, "allreduce", repl, groupLink(c, d, "dp_replicate"), share.params/float64(shard)*rsb)
		b.DP = b.DPTotal
		if rt.Overlap {
			b.DP = exposedDP(first, gathers, fag, frs+b.DPTotal, busy, window) - b.FSDP
		}
	}
	b.Optimizer = share.params / float64(shard) * 4 * optimizerAccesses / r.ew
	b.Elementwise += round / r.ew
	b.Step = round/r.ew + pipe + b.FSDP + b.DP + b.Optimizer
	return b, sim, nil
}

// lossShare is the loss's forward traffic (bytes) of a microbatch.
func lossShare(s rankShare, N, V, tp float64, rt Runtime) float64 {
	if !s.head {
		return 0
	}
	return N * V / tp * lossBytes(rt.Fused) / 3
}

// lossBwd is the loss's backward traffic (bytes) of a microbatch.
func lossBwd(s rankShare, N, V, tp float64, rt Runtime) float64 {
	return 2 * lossShare(s, N, V, tp, rt)
}

// embedBwd is the embedding's traffic, forward (the lookup) or backward
// (its gradient) alike.
func embedBwd(s rankShare, N, D, cb float64) float64 {
	if !s.embed {
		return 0
	}
	return 2 * N * D * cb
}

// ewLayers is the layers' forward element-wise traffic (bytes).
func ewLayers(L, N float64, c llama.Config, rt Runtime, cb, tp float64) float64 {
	return L * N * ewElements(c, rt.Fused) * cb / tp
}

// recompute returns how many of n layers the policy recomputes whole,
// and whether it recomputes the element-wise operations of every layer.
func recompute(ac memplan.Checkpoint, n int) (layers float64, ops bool) {
	switch ac.Mode {
	case "full":
		return float64(n), false
	case "selective":
		if ac.Option == "op" {
			return 0, true
		}
		if every, err := strconv.Atoi(ac.Option); err == nil && every > 0 {
			return float64(n / every), false
		}
	}
	return 0, false
}

// stageShares resolves the pipeline and returns its schedule and what
// each of its stages holds.
func stageShares(job Job, mp memplan.Plan) (pipeline.Schedule, []rankShare, error) {
	cfg := job.Model
	tp := int64(job.Layout.Degrees.TP)
	D, V := int64(cfg.Dim), int64(cfg.VocabSize)
	Q, KV, F := int64(cfg.NHeads*cfg.HeadDim()), int64(cfg.KVHeads()*cfg.HeadDim()), int64(cfg.FFNHidden())
	embed := (V*D + tp - 1) / tp
	layer := 2*D + (Q*D+2*KV*D+D*Q+3*F*D+tp-1)/tp
	head := D + embed
	pp, err := mp.ResolvePipeline()
	if err != nil {
		return pipeline.Schedule{}, nil, err
	}
	shares := make([]rankShare, len(pp.Stages))
	for st, spec := range pp.Stages {
		s := rankShare{layers: spec.NumLayers, embed: spec.Embedding, head: spec.Head, stages: 1}
		s.params = float64(int64(spec.NumLayers) * layer)
		s.firstUnit = float64(layer)
		if spec.Embedding {
			s.params += float64(embed)
			s.firstUnit = float64(embed)
		}
		if spec.Head {
			s.params += float64(head)
		}
		shares[st] = s
	}
	return pp.Schedule, shares, nil
}

// busiest returns the share of the rank whose stages take the longest
// and its work: the sums over its stages (the first unit its first
// stage's).
func busiest(sched pipeline.Schedule, shares []rankShare, works []passWork) (rankShare, passWork) {
	var best rankShare
	var bestWork passWork
	longest := -1.0
	for r := range sched.PP {
		var s rankShare
		var w passWork
		for i, st := range sched.Stages(r) {
			sh := shares[st]
			if i == 0 {
				s.firstUnit = sh.firstUnit
			}
			s.layers += sh.layers
			s.embed = s.embed || sh.embed
			s.head = s.head || sh.head
			s.stages++
			s.params += sh.params
			w = w.add(works[st])
		}
		c := w.costs()
		if t := c.Forward + c.Input + c.Weight; t > longest {
			best, bestWork, longest = s, w, t
		}
	}
	return best, bestWork
}

// passWork is one microbatch's compute (seconds) through a share of the
// model: forward products, attention and element-wise work; the same of
// the backward (bMM the input gradient's products, which the weight
// gradient's equal); the recomputed forward; tensor- and
// context-parallel communication, forward and backward; and titan's
// copy of the split backward's inputs.
type passWork struct {
	fMM, fAttn, fEW, bMM, bAttn, bEW, rMM, rAttn, rEW, tpF, tpB, cpF, cpB, copy float64
}

// costs are the work's pipeline actions: the forward, the input gradient
// (with the recomputation) and the weight gradient.
func (w passWork) costs() pipeline.Costs {
	return pipeline.Costs{
		Forward: w.fMM + w.fAttn + w.fEW + w.tpF + w.cpF,
		Input:   w.bMM + w.bAttn + w.bEW + w.rMM + w.rAttn + w.rEW + w.tpB + w.cpB + w.copy,
		Weight:  w.bMM,
	}
}

func (w passWork) add(o passWork) passWork {
	return passWork{
		w.fMM + o.fMM, w.fAttn + o.fAttn, w.fEW + o.fEW, w.bMM + o.bMM, w.bAttn + o.bAttn, w.bEW + o.bEW,
		w.rMM + o.rMM, w.rAttn + o.rAttn, w.rEW + o.rEW, w.tpF + o.tpF, w.tpB + o.tpB, w.cpF + o.cpF, w.cpB + o.cpB, w.copy + o.copy,
	}
}

// groupLink is the link a parallel dimension's collectives cross: the
// mesh is [pp, dp_replicate, dp_shard, cp, tp] with tp innermost, so a
// dimension's group stays in a node when its span (its degree times the
// degrees inside it) fits a node's devices.
func groupLink(c cluster.Cluster, d memplan.Degrees, dim string) cluster.Link {
	// The outermost span each group reaches: FSDP's group is dp_shard ×
	// cp, the replicate group dp_replicate.
	span := map[string]int{
		"tp": d.TP, "cp": d.TP * d.CP, "dp_shard": d.TP * d.CP * d.DPShard,
		"dp_replicate": d.TP * d.CP * d.DPShard * d.DPReplicate, "pp": d.World(),
	}[dim]
	if span <= c.DevicesPerNode {
		return c.Intra
	}
	return c.Inter
}

// ringTime is the time of a collective of size bytes (nccl-tests size)
// over n ranks: measured fits on a CPU host, else the ring algorithm
// over link at the calibrated efficiency.
func ringTime(c cluster.Cluster, cal Calibration, rt Runtime, op string, n int, link cluster.Link, size float64) float64 {
	if n <= 1 {
		return 0
	}
	if t, ok := cal.collective(op, n, size); ok && c.CPU() {
		return t
	}
	steps := float64(n - 1)
	f := steps / float64(n)
	if op == "allreduce" {
		f, steps = 2*f, 2*steps
	}
	return f*size/(link.Bandwidth*cal.Comm) + steps*link.Latency
}

// p2pTime is the time of sending size bytes to one peer of a group of n
// (and receiving as many from another): on a CPU host titan's exchange
// with the next rank as the calibration timed it (sendrecv: a pipeline's
// transfers and the ring's rotations go through the point-to-point
// connections, not the collectives' shared memory; a calibration from
// before it has the all_gather of two processes of 2·size bytes, which
// moves the same); on a GPU, size over the link.
func p2pTime(c cluster.Cluster, cal Calibration, rt Runtime, link cluster.Link, n int, size float64) float64 {
	if c.CPU() {
		if t, ok := cal.collective("sendrecv", n, size); ok {
			return t
		}
		if t, ok := cal.collective("all_gather", 2, 2*size); ok {
			return t
		}
	}
	return size/(link.Bandwidth*cal.Comm) + link.Latency
}

// exposedDP is what is left exposed of a step's data-parallel
// communication on a device whose collectives run beside its compute:
// gathers of a whole pass's units each ag seconds, and reductions
// seconds of gradient reductions (reduce-scatters, all-reduces). The
// first unit's gather waits (nothing computes before it) and so does the
// reduction of the last gradients (nothing computes after them), each
// the first unit's share (first) of its collective; the gathers
// prefetch beside all busy seconds of compute, while the reductions can
// only run beside the window seconds of backward that produce their
// gradients.
func exposedDP(first, gathers, ag, reductions, busy, window float64) float64 {
	rest := (1 - first) * reductions
	return first*(ag+reductions) + math.Max(0, math.Max((gathers-first)*ag+rest-busy, rest-window))
}

// overlapped is what is left exposed of a collective of comm seconds that
// runs beside products of work seconds.
func overlapped(comm, work float64) float64 { return math.Max(0, comm-work) }
