package parallel

import (
	"errors"
	"fmt"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/parallel/fsdp"
	"github.com/titan-go/titan/internal/parallel/pipeline"
)

// Engine is one rank's share of the model under its mesh. The trainer
// drives only this interface; it knows nothing else of FSDP, TP, CP or PP.
type Engine interface {
	// ForwardBackward runs forward and backward over this data rank's
	// rows of the global batch (accum local batches of them, one after
	// the other) with loss scale scale, completes every gradient
	// reduction and returns the sum of the per-token losses over the
	// whole job (every rank gets the same value).
	ForwardBackward(inputs, labels []int32, accum int, scale float32) (lossSum float64, err error)
	// GradSumSquares is the squared norm of the whole model's gradient
	// (a collective).
	GradSumSquares() (float64, error)
	// Params and Grads are what the optimizer updates: this rank's
	// shards.
	Params() backend.Tensor
	Grads() backend.Tensor
	// Updated drops what was derived from the parameters (gathered
	// copies); call it after every optimizer step or load.
	Updated()
	// Evaluate returns the loss sum and the number of targets over the
	// whole job of one validation batch (this data rank's rows).
	Evaluate(inputs, labels []int32) (lossSum float64, targets int, err error)
	// Init fills this rank's parameters as a one-process Init(seed) would.
	Init(seed uint64)
	// GatherFull returns the whole flat tensor (one process's layout) of
	// which buf (Params or an optimizer moment) holds this rank's share,
	// on rank 0 (nil on some others). Every rank must call it. Saves do
	// not use it (see Shards); it is the tests' reference of the whole
	// state.
	GatherFull(buf backend.Tensor) ([]float32, error)
	// Load fills buf (Params or an optimizer moment) with this rank's
	// share of the whole tensors prefix+<parameter> of checkpoint r.
	Load(r *checkpoint.Reader, prefix string, buf backend.Tensor) error
	// Shards is the inverse of Load for a save: the ranges of the whole
	// tensors prefix+<parameter> that this rank writes, from local, a
	// host copy of buf (Params or an optimizer moment); their data
	// aliases local. A rank writes its FSDP shards of its stages' own
	// parameters (not the copies of tied ones), on the first replica of
	// the replicate group only, and tp rank 0 alone the parameters every
	// tp rank holds: the ranks of the job together write every element
	// of every tensor exactly once, and no rank gathers anything.
	Shards(local []float32, prefix string) []checkpoint.Shard
	// Memory reports this rank's memory.
	Memory() Memory
	// Gathers counts the FSDP parameter all-gathers of this rank so far.
	Gathers() fsdp.GatherStats
	// PipelineStep measures the last step's pipeline bubble over every
	// rank (nil without pipeline parallelism). Every rank must call it.
	PipelineStep() (*PipelineStep, error)
}

// PipelineStep is one step's pipeline bubble, over every rank.
type PipelineStep struct {
	Schedule       pipeline.Schedule
	MicrobatchRows int
	// Bubble is the measured bubble: 1 - compute time / elapsed time,
	// both summed over the ranks; BusyS and WallS are those sums.
	Bubble, BusyS, WallS float64
	// F, B and W are the mean times (seconds) of a forward, a backward
	// (or its input half) and a weight-gradient action.
	F, B, W float64
	// StageCosts are each stage's mean times (seconds) of a forward,
	// an input gradient (a whole backward when it does not split) and a
	// weight gradient.
	StageCosts []pipeline.Costs
	// Simulated is the schedule's simulated bubble with StageCosts, and
	// Theory the unit-cost formula's.
	Simulated, Theory float64
}

func (p PipelineStep) String() string {
	s := p.Schedule
	return fmt.Sprintf("pipeline %s pp %d × %d virtual, %d microbatches of %d: measured bubble %.3f (busy %.3fs of %.3fs over all ranks); simulated %.3f with each stage's mean costs (over all: F %.2f ms, B %.2f ms, W %.2f ms); theoretical %.3f",
		s.Name, s.PP, s.Virtual, s.Microbatches, p.MicrobatchRows, p.Bubble, p.BusyS, p.WallS, p.Simulated, p.F*1e3, p.B*1e3, p.W*1e3, p.Theory)
}

// Memory is one rank's memory as the engine accounts it.
type Memory struct {
	// StateBytes is the parameters and gradients this rank keeps
	// between steps (shards under FSDP); the optimizer adds its moments.
	StateBytes int64
	// ActivationBytes is the planned activation memory.
	ActivationBytes int64
	// GatheredUnits is the most units whose gathered parameters were
	// alive at once (0 without FSDP); UnitBufferBytes the memory of the
	// FSDP unit buffers allocated so far (gathered parameters and unit
	// gradients).
	GatheredUnits   int
	UnitBufferBytes int64
}

// Options are the layout-independent settings of an engine.
type Options struct {
	// Pipeline is the resolved pipeline plan: stages, schedule and
	// microbatch rows (see PlanPipeline; one stage without pipeline
	// parallelism).
	Pipeline PipelinePlan
	// T is the sequence length.
	T int
	// EvalRows and EvalT are the rows per data rank and the sequence
	// length of a validation batch; 0 means the training ones.
	EvalRows, EvalT int
	// Reshard is the FSDP reshard-after-forward policy.
	Reshard fsdp.Reshard
	// Precision is how the model computes (mixed precision, float8);
	// under bfloat16 the FSDP all-gathers move bfloat16 (see fsdp).
	Precision model.Precision
	// Reduce is the dtype of the data-parallel gradient reductions
	// (training.mixed_precision_reduce): backend.Float32 or BFloat16.
	Reduce backend.DType
}

// engine is the one Engine of every layout. A rank holds its pipeline
// stages (one stage, the whole depth, without pipeline parallelism) as
// the model family's parts — tensor- and context-parallel shards when tp
// and cp are > 1 — and runs the schedule's actions on them (a
// pipeline.Executor); their parameters are laid end to end in one local
// buffer, sharded over dp_shard × cp unit by unit (FSDP) or replicated
// (DDP) by one fsdp.Runtime whose hooks every part calls.
type engine struct {
	fam    model.Family
	g      *Groups
	be     backend.Backend
	o      Options
	pl     model.Placement
	x      *pipeline.Executor // training
	eval   *pipeline.Executor // validation; x when the shapes agree
	evalMB int                // rows of a validation microbatch
	stages []*stage           // this rank's stages, increasing
	// scratch is the activation scratch of each executor's stage, shared
	// by its sets (counted once in Memory).
	scratch []*model.ActivationScratch
	// splits are the split-backward pools of each executor's stages,
	// shared by the stage's sets (counted once in Memory).
	splits []*model.SplitPool
	rt     *fsdp.Runtime
	repl   []model.Range // replicated ranges of the local buffer
	// ties are the model's copies this rank keeps in step (see
	// reduceCopies) and copyGrads the gradient shards of its own copies.
	ties      []tie
	copyGrads []backend.Tensor
	// bubble holds the last report's inputs.
	stats pipeline.Stats
}

// stage is one of this rank's pipeline stages.
type stage struct {
	index int
	flat  model.Range // its part of the tp rank's flat buffer
	off   int         // its offset in the local buffer
	n     int         // its length in the local buffer: flat and copies
	// copies are the stage's copies of other stages' parameters (see
	// model.Copy), Local relative to the stage's part buffer.
	copies []model.Copy
	unit0  int          // its first unit in the runtime's numbering
	parts  []model.Part // every activation set (training and validation)
}

// newStage describes stage index of spec on a tp rank (its offset in the
// local buffer unset).
func newStage(fam model.Family, index int, spec model.StageSpec, tp int) *stage {
	st := &stage{index: index, flat: fam.StageRange(spec, tp), copies: model.StageCopies(fam, spec, tp)}
	st.n = st.flat.Len()
	for _, c := range st.copies {
		st.n += c.Local.Len()
	}
	return st
}

// toFlat maps element i of the stage's part buffer to the tp rank's flat
// buffer: a copy's elements to its source, the others in order onto the
// stage's range.
func (st *stage) toFlat(i int) int {
	shift := 0
	for _, c := range st.copies {
		if i >= c.Local.Lo && i < c.Local.Hi {
			return c.Source.Lo + i - c.Local.Lo
		}
		if c.Local.Hi <= i {
			shift += c.Local.Len()
		}
	}
	return st.flat.Lo + i - shift
}

// own calls fn with each run [lo, hi) of the stage's part buffer that is
// not a copy, in order.
func (st *stage) own(fn func(lo, hi int)) {
	at := 0
	for _, c := range st.copies {
		if at < c.Local.Lo {
			fn(at, c.Local.Lo)
		}
		at = c.Local.Hi
	}
	if at < st.n {
		fn(at, st.n)
	}
}

// stageHooks numbers a stage's units as the runtime does.
type stageHooks struct {
	rt   *fsdp.Runtime
	base int
}

func (h stageHooks) BeforeForward(u int) error  { return h.rt.BeforeForward(h.base + u) }
func (h stageHooks) AfterForward(u int) error   { return h.rt.AfterForward(h.base + u) }
func (h stageHooks) BeforeBackward(u int) error { return h.rt.BeforeBackward(h.base + u) }
func (h stageHooks) AfterBackward(u int) error  { return h.rt.AfterBackward(h.base + u) }

// New builds rank g.Rank's engine for model fam on the mesh of g.
func New(be backend.Backend, fam model.Family, g *Groups, o Options) (Engine, error) {
	pp := o.Pipeline
	if len(pp.Stages) != pp.Schedule.NumStages() || pp.Schedule.PP != g.Mesh.PP {
		return nil, fmt.Errorf("parallel: a pipeline plan of %d stages on %d ranks for pipeline_parallel_degree %d", len(pp.Stages), pp.Schedule.PP, g.Mesh.PP)
	}
	e := &engine{fam: fam, g: g, be: be, o: o}
	e.pl = model.Placement{TP: g.Mesh.TP, TPRank: g.TPRank(), CP: g.Mesh.CP, CPRank: g.CPRank(), TPGroup: g.TP, CPGroup: g.CP, Precision: o.Precision, Host: &model.HostScratch{}}
	ppRank := g.coord(0)
	byIndex := map[int]*stage{}
	off := 0
	for _, s := range pp.Schedule.Stages(ppRank) {
		st := newStage(fam, s, pp.Stages[s], g.Mesh.TP)
		st.off = off
		off += st.n
		e.stages = append(e.stages, st)
		byIndex[s] = st
	}
	// newSet makes an executor's activation sets. They share one scratch
	// (the executor runs one pass at a time): the rank's, sized for its
	// largest stage, when the family can size it before any part exists
	// (model.ScratchSizer); otherwise each stage's sets share their own.
	// A stage's sets share one pool of split-backward memory.
	newSet := func(rows, T int) func(s int) (pipeline.Stage, error) {
		scratch := map[int]*model.ActivationScratch{}
		splits := map[int]*model.SplitPool{}
		sizer, rankWide := fam.(model.ScratchSizer)
		return func(s int) (pipeline.Stage, error) {
			pl := e.pl
			pl.Stage = pp.Stages[s]
			key := s
			if rankWide {
				key = -1
			}
			if scratch[key] == nil {
				sc := &model.ActivationScratch{}
				if rankWide {
					for _, o := range pp.Schedule.Stages(ppRank) {
						ol := e.pl
						ol.Stage = pp.Stages[o]
						n, nh, err := sizer.ScratchLen(rows, T, ol)
						if err != nil {
							return nil, fmt.Errorf("pipeline stage %d: %w", o, err)
						}
						sc.Reserve(n, nh)
					}
				}
				scratch[key] = sc
				e.scratch = append(e.scratch, sc)
			}
			pl.Scratch = scratch[key]
			if splits[s] == nil {
				splits[s] = &model.SplitPool{}
				e.splits = append(e.splits, splits[s])
			}
			pl.Split = splits[s]
			p, err := fam.NewPart(be, rows, T, pl)
			if err != nil {
				return nil, err
			}
			byIndex[s].parts = append(byIndex[s].parts, p)
			return p, nil
		}
	}
	var err error
	if e.x, err = pipeline.NewExecutor(be, pp.Schedule, g.PP, ppRank, newSet(pp.MicrobatchRows, o.T)); err != nil {
		return nil, err
	}
	// A stage's backwards accumulate its units' gradients until its last
	// of the pass, which reduces them (and frees the gathered units).
	e.x.GradientSync = func(_ int, sync bool) { e.rt.SetGradientSync(sync) }
	e.eval, e.evalMB = e.x, pp.MicrobatchRows
	if rows, T := o.evalShape(); rows != pp.Schedule.Microbatches*pp.MicrobatchRows || T != o.T {
		// Validation has its own activation sets (forward only: one per
		// stage), bound to the same parameters: one microbatch of all
		// the rows without a pipeline, microbatches of the training
		// size with one.
		es := pp.Schedule
		es.Microbatches, es.Actions, e.evalMB = 1, make([][]pipeline.Action, es.PP), rows
		if g.Mesh.PP > 1 {
			if rows%pp.MicrobatchRows != 0 {
				return nil, fmt.Errorf("validation.local_batch_size %d is not a multiple of parallelism.pipeline_parallel_microbatch_size %d", rows, pp.MicrobatchRows)
			}
			es.Microbatches, e.evalMB = rows/pp.MicrobatchRows, pp.MicrobatchRows
		}
		if e.eval, err = pipeline.NewExecutor(be, es, g.PP, ppRank, newSet(e.evalMB, T)); err != nil {
			return nil, fmt.Errorf("validation: %w", err)
		}
	}
	// The runtime's units: every stage's, end to end.
	var units []fsdp.Range
	var segments []int
	for _, st := range e.stages {
		st.unit0 = len(units)
		segments = append(segments, st.unit0)
		p := st.parts[0]
		for _, u := range p.Units() {
			units = append(units, fsdp.Range{Lo: st.off + u.Lo, Hi: st.off + u.Hi})
		}
		for _, r := range p.Replicated() {
			e.repl = append(e.repl, model.Range{Lo: st.off + r.Lo, Hi: st.off + r.Hi})
		}
	}
	owner := make([]*stage, len(units))
	for _, st := range e.stages {
		for u := st.unit0; u < st.unit0+len(st.parts[0].Units()); u++ {
			owner[u] = st
		}
	}
	bind := func(u int, params, grads backend.Tensor) {
		st := owner[u]
		for _, p := range st.parts {
			p.BindUnit(u-st.unit0, params, grads)
		}
	}
	f8, bindScales := e.float8Units(owner)
	last := len(pp.Stages) - 1
	e.rt, err = fsdp.New(be, units, bind, fsdp.Config{
		Shard: g.Shard, Replicate: g.Replicate,
		Reshard:  o.Reshard.Resolve(g.Mesh.PP > 1),
		Segments: segments,
		KeepLast: e.stages[len(e.stages)-1].index == last,
		Param:    o.Precision.Param, Reduce: o.Reduce,
		Float8: f8, BindScales: bindScales, Float8Peers: g.TP,
		Float8AllGather:  o.Precision.Float8 != nil && o.Precision.Float8.FSDPAllGather,
		PrecomputeScales: o.Precision.Float8 != nil && o.Precision.Float8.PrecomputeScales,
	})
	if err != nil {
		return nil, err
	}
	for _, st := range e.stages {
		for _, p := range st.parts {
			p.SetHooks(stageHooks{rt: e.rt, base: st.unit0})
		}
	}
	if err := e.planTies(); err != nil {
		return nil, err
	}
	return e, nil
}

// float8Units are the float8 weights of every unit (nil without any) and
// the BindScales hook that hands their scales to every part of the unit's
// stage.
func (e *engine) float8Units(owner []*stage) ([][]fsdp.Range, func(u int, scales []float32)) {
	if e.pl.Precision.Float8 == nil {
		return nil, nil
	}
	f8 := make([][]fsdp.Range, len(owner))
	for u, st := range owner {
		p, ok := st.parts[0].(model.Float8Part)
		if !ok {
			return nil, nil
		}
		for _, w := range p.Float8Weights(u - st.unit0) {
			f8[u] = append(f8[u], fsdp.Range{Lo: st.off + w.Lo, Hi: st.off + w.Hi})
		}
	}
	return f8, func(u int, scales []float32) {
		st := owner[u]
		for _, p := range st.parts {
			p.(model.Float8Part).BindFloat8Scales(u-st.unit0, scales)
		}
	}
}

// evalShape is the validation rows per data rank and sequence length.
func (o Options) evalShape() (rows, T int) {
	rows, T = o.EvalRows, o.EvalT
	if rows == 0 {
		rows = o.Pipeline.Schedule.Microbatches * o.Pipeline.MicrobatchRows
	}
	if T == 0 {
		T = o.T
	}
	return rows, T
}

func (e *engine) Params() backend.Tensor { return e.rt.Params }
func (e *engine) Grads() backend.Tensor  { return e.rt.Grads }
func (e *engine) Updated()               { e.rt.Invalidate() }

// stageAt returns the stage holding element i of the local buffer.
func (e *engine) stageAt(i int) *stage {
	for k := len(e.stages) - 1; k > 0; k-- {
		if i >= e.stages[k].off {
			return e.stages[k]
		}
	}
	return e.stages[0]
}

// flatAt maps element lo of the local buffer to the tp rank's flat
// buffer.
func (e *engine) flatAt(lo int) int {
	st := e.stageAt(lo)
	return st.toFlat(lo - st.off)
}

func (e *engine) Init(seed uint64) {
	e.rt.Init(func(lo int, dst []float32) { e.fam.Init(seed, e.pl.TP, e.pl.TPRank, e.flatAt(lo), dst) })
}

func (e *engine) Load(r *checkpoint.Reader, prefix string, buf backend.Tensor) error {
	return e.rt.Load(buf, func(lo int, dst []float32) error {
		return e.fam.Read(r, prefix, e.pl.TP, e.pl.TPRank, e.flatAt(lo), dst)
	})
}

func (e *engine) Shards(local []float32, prefix string) []checkpoint.Shard {
	if rank(e.g.Replicate) != 0 {
		return nil // the first replica writes the shards every replica holds
	}
	var out []checkpoint.Shard
	rt := e.rt
	for u, s := range rt.Shards {
		if s.Len() == 0 {
			continue
		}
		st := e.stageAt(s.Lo)
		rel := s.Lo - st.off
		if st.isCopy(rel) {
			continue // saved with its source
		}
		data := local[rt.Local[u] : rt.Local[u]+s.Len()]
		e.fam.Write(e.pl.TP, e.pl.TPRank, st.toFlat(rel), data, func(name string, shape []int, off int, d []float32) {
			out = append(out, checkpoint.Shard{Name: prefix + name, Shape: shape, Offset: off, Data: d})
		})
	}
	return out
}

// isCopy reports whether element i of the stage's part buffer belongs to
// a copy of another stage's parameters.
func (st *stage) isCopy(i int) bool {
	for _, c := range st.copies {
		if i >= c.Local.Lo && i < c.Local.Hi {
			return true
		}
	}
	return false
}

// rows returns this rank's tokens of the rows x: the cp rank's share.
func (e *engine) rows(x []int32, T int) []int32 { return e.fam.Rows(x, T, e.pl.CP, e.pl.CPRank) }

func (e *engine) ForwardBackward(inputs, labels []int32, accum int, scale float32) (float64, error) {
	pp, T := e.o.Pipeline, e.o.T
	n := pp.Schedule.Microbatches * pp.MicrobatchRows * T // tokens of one local batch
	if len(inputs) != accum*n || len(labels) != len(inputs) {
		return 0, fmt.Errorf("parallel: %d inputs and %d labels for %d local batches of %d tokens", len(inputs), len(labels), accum, n)
	}
	e.rt.ZeroGrad()
	e.x.ResetStats()
	per := pp.MicrobatchRows * T / e.pl.CP
	sum := []float64{0}
	for a := 0; a < accum; a++ {
		in, lab := e.rows(inputs[a*n:(a+1)*n], T), e.rows(labels[a*n:(a+1)*n], T)
		l, err := e.x.Run(pp.Schedule.Actions, in, lab, per, scale, true)
		if err != nil {
			return 0, err
		}
		if e.pl.TPRank == 0 { // the tp ranks of a group compute the same loss
			sum[0] += l
		}
	}
	// The last unit reductions overlapped the backward; wait for them.
	if err := e.rt.Finish(); err != nil {
		return 0, err
	}
	if err := e.reduceReplicated(); err != nil {
		return 0, err
	}
	if err := e.reduceCopies(); err != nil {
		return 0, err
	}
	e.stats = e.x.Stats()
	if err := e.g.SumWorld(sum); err != nil {
		return 0, err
	}
	return sum[0], nil
}

// replicatedShard calls fn with the parts of this rank's gradient shard
// that hold replicated (norm) parameters.
func (e *engine) replicatedShard(fn func(t backend.Tensor)) {
	rt := e.rt
	for u, s := range rt.Shards {
		for _, r := range e.repl {
			lo, hi := max(s.Lo, r.Lo), min(s.Hi, r.Hi)
			if lo < hi {
				fn(rt.Grads.Slice(rt.Local[u]+lo-s.Lo, hi-lo))
			}
		}
	}
}

// reduceReplicated sums the replicated parameters' gradients (each tp
// rank's from its sequence rows) over the tp group.
func (e *engine) reduceReplicated() error {
	if e.g.TP == nil {
		return nil
	}
	var parts []backend.Tensor
	n := 0
	e.replicatedShard(func(t backend.Tensor) { parts = append(parts, t); n += t.Len })
	h := make([]float32, n)
	off := 0
	for _, t := range parts {
		e.be.Download(h[off:off+t.Len], t)
		off += t.Len
	}
	if err := e.g.TP.AllReduce(commCtx, comm.F32(h), comm.Sum); err != nil {
		return fmt.Errorf("norm gradients over tp: %w", err)
	}
	off = 0
	for _, t := range parts {
		e.be.Upload(t, h[off:off+t.Len])
		off += t.Len
	}
	return nil
}

func (e *engine) GradSumSquares() (float64, error) {
	s := e.be.SumSquares(e.rt.Grads)
	if e.pl.TPRank != 0 {
		// The replicated parameters count once per tp group.
		e.replicatedShard(func(t backend.Tensor) { s -= e.be.SumSquares(t) })
	}
	// A copy's gradient is its source's, counted there.
	for _, g := range e.copyGrads {
		s -= e.be.SumSquares(g)
	}
	v := []float64{s}
	if err := e.g.SumWorld(v); err != nil {
		return 0, err
	}
	// Every element of a shard is held by each replica.
	return v[0] / float64(size(e.g.Replicate)), nil
}

// gradShard is this rank's gradient shard of the runtime's unit that is
// [lo, hi) of the local buffer (false: no such unit).
func (e *engine) gradShard(lo, hi int) (backend.Tensor, bool) {
	for u, r := range e.rt.Units {
		if r.Lo == lo && r.Hi == hi {
			return e.rt.Grads.Slice(e.rt.Local[u], e.rt.Shards[u].Len()), true
		}
	}
	return backend.Tensor{}, false
}

// tie is one copy of the model (model.Copy) as this rank takes part in
// keeping it equal to its source: the gradient shards it holds of either
// side (none on a rank that holds neither) and the length of one shard.
type tie struct {
	shards []backend.Tensor
	n      int
}

// planTies finds, once, every tie of the model in stage order and this
// rank's shards of it, and the gradient shards of its own copies.
func (e *engine) planTies() error {
	for s, spec := range e.o.Pipeline.Stages {
		for _, c := range model.StageCopies(e.fam, spec, e.pl.TP) {
			var t tie
			for _, st := range e.stages {
				// The copy itself, on the stage that holds it.
				if st.index == s {
					g, ok := e.gradShard(st.off+c.Local.Lo, st.off+c.Local.Hi)
					if !ok {
						return fmt.Errorf("parallel: the copy %v of stage %d is not one of its units", c.Local, s)
					}
					t.shards = append(t.shards, g)
					e.copyGrads = append(e.copyGrads, g)
				}
				// The source, on the stage whose range holds it.
				if c.Source.Lo >= st.flat.Lo && c.Source.Hi <= st.flat.Hi {
					lo := -1
					st.own(func(a, b int) {
						if lo < 0 && st.toFlat(a) <= c.Source.Lo && c.Source.Lo < st.toFlat(a)+b-a {
							lo = a + c.Source.Lo - st.toFlat(a)
						}
					})
					g, ok := e.gradShard(st.off+lo, st.off+lo+c.Source.Len())
					if !ok {
						return fmt.Errorf("parallel: the source %v of a tied copy is not a unit of stage %d", c.Source, st.index)
					}
					t.shards = append(t.shards, g)
				}
			}
			// Every rank's shard of the tied unit has the same length.
			lo, hi := comm.ChunkBounds(c.Local.Len(), size(e.g.Shard), rank(e.g.Shard))
			t.n = hi - lo
			e.ties = append(e.ties, t)
		}
	}
	return nil
}

// reduceCopies adds up the gradients of every copy and of its source
// over the pipeline group, so that both hold the model's gradient (and,
// updated alike, stay equal). Every pipeline rank takes part with each
// tie of the model, in stage order; a rank that holds neither side adds
// zeros.
func (e *engine) reduceCopies() error {
	if len(e.ties) == 0 {
		return nil
	}
	total := 0
	for _, t := range e.ties {
		total += t.n
	}
	h := make([]float32, total)
	tmp := make([]float32, 0, total)
	off := 0
	for _, t := range e.ties {
		for _, g := range t.shards {
			tmp = tmp[:g.Len]
			e.be.Download(tmp, g)
			for j, v := range tmp {
				h[off+j] += v
			}
		}
		off += t.n
	}
	if err := e.g.PP.AllReduce(commCtx, comm.F32(h), comm.Sum); err != nil {
		return fmt.Errorf("pipeline: tied gradients: %w", err)
	}
	off = 0
	for _, t := range e.ties {
		for _, g := range t.shards {
			e.be.Upload(g, h[off:off+g.Len])
		}
		off += t.n
	}
	return nil
}

// rank is this rank's place in g (0 for no group).
func rank(g comm.Group) int {
	if g == nil {
		return 0
	}
	return g.Rank()
}

func (e *engine) Evaluate(inputs, labels []int32) (float64, int, error) {
	defer e.rt.Invalidate()
	rows, T := e.o.evalShape()
	if len(inputs) != rows*T || len(labels) != len(inputs) {
		return 0, 0, fmt.Errorf("parallel: validation batch of %d tokens, want %d rows of %d", len(inputs), rows, T)
	}
	acc := []float64{0, 0}
	// One rank of each data rank's pipeline, tp and cp groups counts
	// the targets.
	if e.g.coord(0) == 0 && e.pl.TPRank == 0 && e.pl.CPRank == 0 {
		for _, l := range labels {
			if l >= 0 {
				acc[1]++
			}
		}
	}
	per := e.evalMB * T / e.pl.CP
	l, err := e.eval.Run(e.eval.ForwardOnly(), e.rows(inputs, T), e.rows(labels, T), per, 1, false)
	if err != nil {
		return 0, 0, err
	}
	if e.pl.TPRank == 0 {
		acc[0] = l
	}
	if err := e.g.SumWorld(acc); err != nil {
		return 0, 0, err
	}
	return acc[0], int(acc[1]), nil
}

func (e *engine) GatherFull(buf backend.Tensor) ([]float32, error) {
	local, err := e.rt.GatherFull(buf)
	if err != nil {
		return nil, err
	}
	flat, err := e.gatherStages(local)
	if err != nil || flat == nil {
		return nil, err
	}
	if e.g.TP == nil {
		return flat, nil
	}
	n, tpn := len(flat), e.g.TP.Size()
	all := make([]float32, n*tpn)
	r := e.pl.TPRank
	copy(all[r*n:], flat)
	if err := e.g.TP.AllGather(commCtx, comm.F32(all[r*n:(r+1)*n]), comm.F32(all)); err != nil {
		return nil, fmt.Errorf("gathering the tp shards: %w", err)
	}
	locals := make([][]float32, tpn)
	for i := range locals {
		locals[i] = all[i*n : (i+1)*n]
	}
	return e.fam.Unshard(locals), nil
}

// gatherStages assembles the tp rank's flat buffer from every pipeline
// rank's local buffer on pipeline rank 0 (nil on the others).
func (e *engine) gatherStages(local []float32) ([]float32, error) {
	sched, specs := e.o.Pipeline.Schedule, e.o.Pipeline.Stages
	if e.g.PP == nil {
		return local, nil
	}
	if r := e.g.PP.Rank(); r != 0 {
		if err := e.g.PP.Send(commCtx, comm.F32(local), 0); err != nil {
			return nil, fmt.Errorf("pipeline: sending the stages of rank %d: %w", r, err)
		}
		return nil, nil
	}
	flat := make([]float32, e.fam.ShardLen(e.pl.TP))
	for r := 0; r < sched.PP; r++ {
		var stages []*stage
		n := 0
		for _, s := range sched.Stages(r) {
			st := newStage(e.fam, s, specs[s], e.pl.TP)
			st.off = n
			n += st.n
			stages = append(stages, st)
		}
		buf := local
		if r != 0 {
			buf = make([]float32, n)
			if err := e.g.PP.Recv(commCtx, comm.F32(buf), r); err != nil {
				return nil, fmt.Errorf("pipeline: gathering the stages of rank %d: %w", r, err)
			}
		}
		for _, st := range stages {
			st.own(func(lo, hi int) {
				to := st.toFlat(lo)
				copy(flat[to:to+hi-lo], buf[st.off+lo:st.off+hi])
			})
		}
	}
	return flat, nil
}

func (e *engine) Memory() Memory {
	var act int64
	for _, st := range e.stages {
		for _, p := range st.parts {
			act += p.ActivationBytes()
		}
	}
	for _, s := range e.scratch {
		act += s.Bytes()
	}
	for _, s := range e.splits {
		act += s.Bytes()
	}
	return Memory{StateBytes: e.rt.StateBytes(), ActivationBytes: act, GatheredUnits: e.rt.GatheredBuffers(), UnitBufferBytes: e.rt.BufferBytes()}
}

func (e *engine) Gathers() fsdp.GatherStats { return e.rt.GatherStats() }

func (e *engine) PipelineStep() (*PipelineStep, error) {
	if e.g.Mesh.PP == 1 {
		return nil, nil
	}
	st := e.stats
	if len(st.Time) == 0 {
		return nil, errors.New("parallel: no pipeline step measured yet")
	}
	v := []float64{st.Busy.Seconds(), st.Wall.Seconds()}
	// Then, per stage and kind, the time and the count: every stage's
	// run on one rank, so the sums over the world are that rank's.
	for s := range st.Time {
		for k := range st.Time[s] {
			v = append(v, st.Time[s][k].Seconds(), float64(st.Count[s][k]))
		}
	}
	if err := e.g.SumWorld(v); err != nil {
		return nil, err
	}
	p := &PipelineStep{Schedule: e.o.Pipeline.Schedule, MicrobatchRows: e.o.Pipeline.MicrobatchRows, BusyS: v[0], WallS: v[1]}
	p.Bubble = 1 - v[0]/max(v[1], 1e-12)
	nk := len(st.Time[0])
	at := func(s int, k pipeline.Kind) (t, n float64) {
		i := 2 + 2*(s*nk+int(k))
		return v[i], v[i+1]
	}
	// mean is the mean time of stage s's actions of the kinds given
	// (s < 0: every stage's).
	mean := func(s int, kinds ...pipeline.Kind) float64 {
		var t, n float64
		for x := range len(st.Time) {
			if s >= 0 && x != s {
				continue
			}
			for _, k := range kinds {
				dt, dn := at(x, k)
				t, n = t+dt, n+dn
			}
		}
		return t / max(n, 1)
	}
	split := func(s int) bool { _, n := at(s, pipeline.BackwardInput); return n > 0 }
	costs := make([]pipeline.Costs, len(st.Time))
	for s := range costs {
		c := pipeline.Costs{Forward: mean(s, pipeline.Forward), Input: mean(s, pipeline.Backward)}
		if split(s) {
			c.Input, c.Weight = mean(s, pipeline.BackwardInput), mean(s, pipeline.BackwardWeight)
		}
		costs[s] = c
	}
	p.F, p.B = mean(-1, pipeline.Forward), mean(-1, pipeline.Backward)
	if split(0) {
		p.B, p.W = mean(-1, pipeline.BackwardInput), mean(-1, pipeline.BackwardWeight)
	}
	p.StageCosts = costs
	sched := p.Schedule
	sim := sched.Simulate(costs, 0)
	if sim.Err != nil {
		return nil, sim.Err
	}
	p.Simulated = sim.Bubble
	var err error
	if p.Theory, _, err = pipeline.Theoretical(sched.Name, sched.PP, sched.Virtual, sched.Microbatches); err != nil {
		return nil, err
	}
	return p, nil
}
