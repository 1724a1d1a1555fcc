package train

import (
	"errors"
	"fmt"
	"time"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/modelfile"
	"github.com/titan-go/titan/internal/optim"
	"github.com/titan-go/titan/internal/parallel/pipeline"
)

// ppPlan is a pipeline-parallel layout: the schedule, every stage's part
// of the model and the microbatch size.
type ppPlan struct {
	sched  pipeline.Schedule
	specs  []llama.StageSpec
	mbRows int // sequences per microbatch
}

// virtualStages is the number of stages per rank: from
// parallelism.pipeline_parallel_layers_per_stage when set, otherwise 1
// for the single-stage schedules (GPipe, 1F1B) and 2 for the others, as
// torchtitan does.
func virtualStages(job *config.Job, cfg llama.Config, schedule string) (int, error) {
	p := job.Parallelism
	pp := p.PipelineParallelDegree
	if lps := p.PipelineParallelLayersPerStage; lps != nil {
		if *lps < 1 || cfg.NLayers%*lps != 0 {
			return 0, fmt.Errorf("parallelism: n_layers %d is not divisible by pipeline_parallel_layers_per_stage %d", cfg.NLayers, *lps)
		}
		stages := cfg.NLayers / *lps
		if stages%pp != 0 {
			return 0, fmt.Errorf("parallelism.pipeline_parallel_layers_per_stage %d gives %d stages, not divisible by pipeline_parallel_degree %d", *lps, stages, pp)
		}
		return stages / pp, nil
	}
	if schedule == "GPipe" || schedule == "1F1B" {
		return 1, nil
	}
	return 2, nil
}

// planPipeline checks the recipe's pipeline-parallel settings against the
// model and builds the plan: pp × v stages of equally many layers, the
// first with the embedding and the last with the head, and microbatches
// of pipeline_parallel_microbatch_size sequences of the local batch.
// pipeline_parallel_first_stage_less_layers and
// pipeline_parallel_last_stage_less_layers are not applied.
func planPipeline(job *config.Job, cfg llama.Config) (*ppPlan, error) {
	p := job.Parallelism
	pp := p.PipelineParallelDegree
	name, err := pipeline.Canonical(p.PipelineParallelSchedule)
	if err != nil {
		return nil, fmt.Errorf("parallelism.pipeline_parallel_schedule: %w", err)
	}
	v, err := virtualStages(job, cfg, name)
	if err != nil {
		return nil, err
	}
	S := pp * v
	if cfg.NLayers%S != 0 {
		return nil, fmt.Errorf("parallelism: n_layers %d is not divisible by %d stages (pp %d × %d virtual)", cfg.NLayers, S, pp, v)
	}
	mbs, B := p.PipelineParallelMicrobatchSize, job.Training.LocalBatchSize
	if mbs < 1 || B%mbs != 0 {
		return nil, fmt.Errorf("parallelism.pipeline_parallel_microbatch_size %d does not divide training.local_batch_size %d", mbs, B)
	}
	sched, err := pipeline.Build(name, pp, v, B/mbs)
	if err != nil {
		return nil, fmt.Errorf("parallelism: %w (local batch %d in microbatches of %d)", err, B, mbs)
	}
	per := cfg.NLayers / S
	specs := make([]llama.StageSpec, S)
	for s := range specs {
		specs[s] = llama.StageSpec{FirstLayer: s * per, NumLayers: per, Embedding: s == 0, Head: s == S-1}
	}
	return &ppPlan{sched: sched, specs: specs, mbRows: mbs}, nil
}

// checkPipeline refuses pipeline-parallel layouts the trainer cannot run.
// Pipeline parallel composes with data parallel (DDP, FSDP, HSDP) and with
// tensor and context parallel, whose own limits checkSharded applies.
func checkPipeline(job *config.Job) error {
	p := job.Parallelism
	if p.PipelineParallelDegree == 1 {
		return nil
	}
	cfg, err := ModelConfig(job)
	if err != nil {
		return err
	}
	_, err = planPipeline(job, cfg)
	return err
}

// ppStage is one of this rank's stages with its pool of per-microbatch
// activation sets.
type ppStage struct {
	spec   llama.StageSpec
	lo, hi int // elements of the full flat layout
	off    int // offset in the rank's parameter buffer
	pool   []*llama.Model
	live   map[int]*llama.Model // by microbatch
	all    []*llama.Model       // every activation set created
}

// msgKey names a transfer: the input (activation) or the output gradient
// of a stage for a microbatch, as the receiving stage sees it.
type msgKey struct {
	grad      bool
	stage, mb int
}

// ppPeer is the receive side of one neighbouring pipeline rank: the
// messages it sends this rank in its order, with one receive posted ahead.
type ppPeer struct {
	rank  int
	queue []msgKey
	pos   int
	work  *comm.Work
	buf   []float32
}

// pipe is the pipeline-parallel executor of one rank.
type pipe struct {
	*ppPlan
	tr          *Trainer
	be          backend.Backend
	group       comm.Group
	rank        int // pipeline rank: the group rank
	dpRank, dpN int // this rank's data-parallel rank and their number
	// shard and replicate are the dp_shard and dp_replicate groups of this
	// rank's stages (nil for one rank); shardLo, shardHi this rank's
	// chunk of the stages' buffer.
	shard, replicate comm.Group
	shardLo, shardHi int
	// tpcp is the tensor- and context-parallel part (nil without them):
	// the stages are then llama.Sharded models and every buffer holds
	// this rank's tp shards (Config.ShardLayout).
	tpcp   *ppShard
	stages map[int]*ppStage
	local  []int // this rank's stages, increasing
	// work and workGrads hold the whole parameters and gradients of this
	// rank's stages, laid end to end, which the stages compute with;
	// params and grads are what the optimizer updates and checkpoints
	// hold: the same buffers, or this rank's dp_shard chunk of them
	// (FSDP: gathered at the start of a step, reduce-scattered at its end).
	work, workGrads backend.Tensor
	params, grads   backend.Tensor
	mail            map[msgKey][]float32
	sends           []*comm.Work
	hidden          int // elements of one microbatch's hidden states
	busy, wall      time.Duration
	kindTime        [4]time.Duration // compute time per action kind (pipeline.Kind)
	kindCount       [4]int
	bubble          float64 // measured bubble of the last step, over all ranks
	simulated       float64 // the schedule's simulated bubble with the last step's mean action costs
	theory          float64
}

// newPipeline builds this rank's stages and creates the pipeline group,
// then its data-parallel groups and, under tensor or context parallelism,
// its tp and cp groups. Under tp and cp each stage is a llama.Sharded
// restricted to the stage's layers: the hidden states sent between stages
// are this rank's sequence-parallel rows of its cp chunks, exchanged with
// the pipeline peers of equal (dp, cp, tp) coordinates.
func (tr *Trainer) newPipeline(be backend.Backend) error {
	plan, err := planPipeline(tr.Job, tr.Cfg)
	if err != nil {
		return err
	}
	gs := tr.groups
	p := &pipe{ppPlan: plan, tr: tr, be: be, group: gs.PP, rank: gs.PP.Rank(), stages: map[int]*ppStage{}, mail: map[msgKey][]float32{}}
	p.dpN, p.dpRank = gs.DataRanks(), gs.DataRank()
	p.shard, p.replicate = gs.Shard, gs.Replicate
	p.hidden = plan.mbRows * tr.Job.Training.SeqLen * tr.Cfg.Dim
	p.tpcp = tr.newPPShard()
	p.hidden /= tr.mesh.TP * tr.mesh.CP
	n := 0
	for _, s := range plan.sched.Stages(p.rank) {
		lo, hi := p.rangeOf(s)
		p.stages[s] = &ppStage{spec: plan.specs[s], lo: lo, hi: hi, off: n, live: map[int]*llama.Model{}}
		p.local = append(p.local, s)
		n += hi - lo
	}
	p.work = be.Alloc(backend.Float32, n)
	p.workGrads = be.Alloc(backend.Float32, n)
	p.params, p.grads, p.shardLo, p.shardHi = p.work, p.workGrads, 0, n
	if p.shard != nil {
		p.shardLo, p.shardHi = comm.ChunkBounds(n, p.shard.Size(), p.shard.Rank())
		p.params = be.Alloc(backend.Float32, p.shardHi-p.shardLo)
		p.grads = be.Alloc(backend.Float32, p.shardHi-p.shardLo)
	}
	p.theory, _, _ = pipeline.Theoretical(plan.sched.Name, plan.sched.PP, plan.sched.Virtual, plan.sched.Microbatches)
	tr.pp = p
	// One activation set per microbatch in flight, as many as the
	// schedule keeps at its peak on each stage.
	live, peak, split := map[int]int{}, map[int]int{}, false
	for _, a := range plan.sched.Actions[p.rank] {
		switch a.Kind {
		case pipeline.BackwardInput:
			split = true
		case pipeline.Forward:
			live[a.Stage]++
			peak[a.Stage] = max(peak[a.Stage], live[a.Stage])
		case pipeline.Backward, pipeline.BackwardWeight:
			live[a.Stage]--
		}
	}
	for s, k := range peak {
		for i := 0; i < k; i++ {
			x, err := p.acquire(s, -1-i)
			if err != nil {
				return err
			}
			if split {
				x.ReserveSplit()
			}
		}
		for i := 0; i < k; i++ {
			p.release(s, -1-i)
		}
	}
	return nil
}

// rangeOf is the part of the full flat layout (of the rank's tp shard
// layout under tensor parallelism) that stage s's parameters occupy.
func (p *pipe) rangeOf(s int) (lo, hi int) {
	return p.specs[s].ShardRange(p.tr.Cfg, p.tpcp.tp)
}

// init fills this rank's parameters as a whole-model initialisation would.
func (p *pipe) init(seed uint64) {
	host := make([]float32, p.work.Len)
	full := make([]float32, p.tr.Cfg.NumParams())
	llama.InitParams(p.tr.Cfg, seed, full, 0)
	shard := llama.ShardFlat(p.tr.Cfg, p.tpcp.tp, p.tpcp.tpRank, full)
	for _, st := range p.stages {
		copy(host[st.off:st.off+st.hi-st.lo], shard[st.lo:st.hi])
	}
	p.be.Upload(p.params, host[p.shardLo:p.shardHi])
}

// acquire returns an activation set of stage s for microbatch mb.
func (p *pipe) acquire(s, mb int) (*llama.Model, error) {
	st := p.stages[s]
	var x *llama.Model
	if k := len(st.pool); k > 0 {
		x, st.pool = st.pool[k-1], st.pool[:k-1]
	} else {
		n := st.hi - st.lo
		m, err := p.tpcp.newStage(p, st.spec)
		if err != nil {
			return nil, fmt.Errorf("pipeline stage %d: %w", s, err)
		}
		m.Bind(p.work.Slice(st.off, n), p.workGrads.Slice(st.off, n))
		x = m
		st.all = append(st.all, x)
	}
	st.live[mb] = x
	return x, nil
}

func (p *pipe) release(s, mb int) {
	st := p.stages[s]
	st.pool = append(st.pool, st.live[mb])
	delete(st.live, mb)
}

// activationBytes is the activation memory: one set per microbatch in
// flight at the schedule's peak, per stage.
func (p *pipe) activationBytes() int64 {
	var n int64
	for _, st := range p.stages {
		for _, x := range st.all {
			n += x.ActivationBytes()
		}
	}
	return n
}

// peers lists, for every other rank that sends this rank something while
// running actions (each rank's list), the messages in the sender's order.
func (p *pipe) peers(actions [][]pipeline.Action) map[int]*ppPeer {
	sr := p.sched.StageRank
	S := len(sr)
	out := map[int]*ppPeer{}
	for q, list := range actions {
		if q == p.rank {
			continue
		}
		for _, a := range list {
			var k msgKey
			switch {
			case a.Kind == pipeline.Forward && a.Stage < S-1 && sr[a.Stage+1] == p.rank:
				k = msgKey{false, a.Stage + 1, a.Microbatch}
			case (a.Kind == pipeline.Backward || a.Kind == pipeline.BackwardInput) && a.Stage > 0 && sr[a.Stage-1] == p.rank:
				k = msgKey{true, a.Stage - 1, a.Microbatch}
			default:
				continue
			}
			if out[q] == nil {
				out[q] = &ppPeer{rank: q}
			}
			out[q].queue = append(out[q].queue, k)
		}
	}
	return out
}

// post starts the receive of peer's next message, if any.
func (p *pipe) post(peer *ppPeer) {
	if peer.pos >= len(peer.queue) {
		peer.work = nil
		return
	}
	peer.buf = make([]float32, p.hidden)
	peer.work = p.group.RecvAsync(commCtx, comm.F32(peer.buf), peer.rank)
}

// recv returns the message k, receiving (in each sender's order) until it
// arrives.
func (p *pipe) recv(peers map[int]*ppPeer, k msgKey) ([]float32, error) {
	if b, ok := p.mail[k]; ok {
		delete(p.mail, k)
		return b, nil
	}
	from := k.stage - 1
	if k.grad {
		from = k.stage + 1
	}
	peer := peers[p.sched.StageRank[from]]
	for peer != nil && peer.work != nil {
		if err := peer.work.Wait(); err != nil {
			return nil, fmt.Errorf("pipeline: receiving from rank %d: %w", peer.rank, err)
		}
		got, b := peer.queue[peer.pos], peer.buf
		peer.pos++
		p.post(peer)
		if got == k {
			return b, nil
		}
		p.mail[got] = b
	}
	return nil, fmt.Errorf("pipeline: rank %d never receives %+v", p.rank, k)
}

// send hands data to the stage of k, on this rank or another.
func (p *pipe) send(k msgKey, data []float32) {
	to := p.sched.StageRank[k.stage]
	if to == p.rank {
		p.mail[k] = data
		return
	}
	p.sends = append(p.sends, p.group.SendAsync(commCtx, comm.F32(data), to))
}

// run executes one rank's action list on the microbatches of one pass
// (inputs and labels hold mbRows×T tokens per microbatch) and returns the
// sum of the losses of the microbatches whose last stage runs here. With
// train unset only forwards run (evaluation): each activation set is
// released right after its forward.
func (p *pipe) run(actions [][]pipeline.Action, inputs, labels []int32, scale float32, train bool) (float64, error) {
	peers := p.peers(actions)
	for _, peer := range peers {
		p.post(peer)
	}
	n := p.mbRows * p.tr.Job.Training.SeqLen
	n /= p.tpcp.cp
	S := len(p.specs)
	var lossSum float64
	start := time.Now()
	var busy time.Duration
	timed := func(k pipeline.Kind, t0 time.Time) {
		dt := time.Since(t0)
		busy += dt
		p.kindTime[k] += dt
		p.kindCount[k]++
	}
	for _, a := range actions[p.rank] {
		s, mb := a.Stage, a.Microbatch
		switch a.Kind {
		case pipeline.Forward:
			x, err := p.acquire(s, mb)
			if err != nil {
				return 0, err
			}
			if s > 0 {
				in, err := p.recv(peers, msgKey{false, s, mb})
				if err != nil {
					return 0, err
				}
				p.be.Upload(x.Input(), in)
			}
			t0 := time.Now()
			_, err = x.Forward(inputs[mb*n:(mb+1)*n], labels[mb*n:(mb+1)*n])
			timed(a.Kind, t0)
			if err != nil {
				return 0, err
			}
			if s == S-1 {
				if p.tpcp.tpRank == 0 { // the tp ranks compute the same loss
					lossSum += x.LossSum()
				}
			} else {
				out := make([]float32, p.hidden)
				p.be.Download(out, x.Output())
				p.send(msgKey{false, s + 1, mb}, out)
			}
			if !train {
				p.release(s, mb)
			}
		case pipeline.Backward, pipeline.BackwardInput:
			x := p.stages[s].live[mb]
			if s < S-1 {
				g, err := p.recv(peers, msgKey{true, s, mb})
				if err != nil {
					return 0, err
				}
				p.be.Upload(x.GradOutput(), g)
			}
			t0 := time.Now()
			var err error
			if a.Kind == pipeline.Backward {
				err = x.Backward(scale)
			} else {
				// The weight gradients wait for BackwardWeight
				// (without activation checkpointing; with it the
				// whole backward runs here).
				err = x.BackwardInput(scale)
			}
			timed(a.Kind, t0)
			if err != nil {
				return 0, err
			}
			if s > 0 {
				g := make([]float32, p.hidden)
				p.be.Download(g, x.GradInput())
				p.send(msgKey{true, s - 1, mb}, g)
			}
			if a.Kind == pipeline.Backward {
				p.release(s, mb)
			}
		case pipeline.BackwardWeight:
			t0 := time.Now()
			err := p.stages[s].live[mb].BackwardWeight()
			timed(a.Kind, t0)
			if err != nil {
				return 0, err
			}
			p.release(s, mb)
		}
	}
	var err error
	for _, w := range p.sends {
		err = errors.Join(err, w.Wait())
	}
	p.sends = p.sends[:0]
	if len(p.mail) != 0 {
		err = errors.Join(err, fmt.Errorf("pipeline: rank %d has %d undelivered messages", p.rank, len(p.mail)))
	}
	p.busy += busy
	p.wall += time.Since(start)
	return lossSum, err
}

// stateBytes is the memory of this rank's parameters and gradients: its
// stages' whole buffers, which stay allocated between steps, and under
// dp_shard its chunks of them too.
func (p *pipe) stateBytes() int64 {
	n := p.work.Len + p.workGrads.Len
	if p.shard != nil {
		n += p.params.Len + p.grads.Len
	}
	return int64(n) * 4
}

// ppTrainStep is TrainStep under pipeline parallelism: the rank's
// parameters are gathered over dp_shard, every microbatch runs the
// schedule's actions, and the gradients are reduce-scattered over dp_shard
// and all-reduced over dp_replicate before the optimizer step.
func (tr *Trainer) ppTrainStep() (loss, gradNorm, lr float64, err error) {
	p := tr.pp
	batch, err := tr.Data.Next()
	if err != nil {
		return 0, 0, 0, err
	}
	targets := 0
	for _, l := range batch.Labels {
		if l >= 0 {
			targets++
		}
	}
	if targets == 0 {
		return 0, 0, 0, errors.New("the batch has no targets")
	}
	mine, err := batch.Shard(p.dpRank, p.dpN)
	if err != nil {
		return 0, 0, 0, err
	}
	if p.shard != nil {
		if err := p.shard.AllGather(commCtx, comm.F32(hostF32(p.params)), comm.F32(hostF32(p.work))); err != nil {
			return 0, 0, 0, fmt.Errorf("pipeline: gathering the dp_shard parameters: %w", err)
		}
	}
	p.be.Zero(p.workGrads)
	p.busy, p.wall = 0, 0
	p.kindTime, p.kindCount = [4]time.Duration{}, [4]int{}
	n := tr.Job.Training.LocalBatchSize * tr.Job.Training.SeqLen
	mine.Inputs, mine.Labels = p.tpcp.rows(mine.Inputs, tr.Job.Training.SeqLen), p.tpcp.rows(mine.Labels, tr.Job.Training.SeqLen)
	n /= p.tpcp.cp
	var lossSum float64
	for a := 0; a < tr.accum; a++ {
		l, err := p.run(p.sched.Actions, mine.Inputs[a*n:(a+1)*n], mine.Labels[a*n:(a+1)*n], 1/float32(targets), true)
		if err != nil {
			return 0, 0, 0, err
		}
		lossSum += l
	}
	if err := p.tpcp.reduceReplicated(p); err != nil {
		return 0, 0, 0, err
	}
	if p.shard != nil {
		if err := p.shard.ReduceScatter(commCtx, comm.F32(hostF32(p.workGrads)), comm.F32(hostF32(p.grads)), comm.Sum); err != nil {
			return 0, 0, 0, fmt.Errorf("pipeline: dp_shard gradient reduction: %w", err)
		}
	}
	nRep := 1
	if p.replicate != nil {
		if err := p.replicate.AllReduce(commCtx, comm.F32(hostF32(p.grads)), comm.Sum); err != nil {
			return 0, 0, 0, fmt.Errorf("pipeline: dp_replicate gradient reduction: %w", err)
		}
		nRep = p.replicate.Size()
	}
	// Over every rank: the replicas hold the same gradient shards, so
	// each contributes its share of their sum of squares.
	sq := p.tpcp.gradSumSquares(p)
	v := []float64{sq / float64(nRep), lossSum, p.busy.Seconds(), p.wall.Seconds()}
	for k := range p.kindTime {
		v = append(v, p.kindTime[k].Seconds(), float64(p.kindCount[k]))
	}
	if err := tr.dist.Group.AllReduce(commCtx, comm.F64(v), comm.Sum); err != nil {
		return 0, 0, 0, err
	}
	p.bubble = 1 - v[2]/max(v[3], 1e-12)
	mean := func(k pipeline.Kind) float64 { return v[4+2*int(k)] / max(v[5+2*int(k)], 1) }
	cf, cb, cw := mean(pipeline.Forward), mean(pipeline.Backward), 0.0
	if v[5+2*int(pipeline.BackwardInput)] > 0 {
		cb, cw = mean(pipeline.BackwardInput), mean(pipeline.BackwardWeight)
	}
	p.simulated = p.sched.Simulate(cf, cb, cw, 0).Bubble
	norm, scale := optim.ClipScale(v[0], float32(tr.Job.Training.MaxNorm))
	lr = tr.Sched.LR(tr.Step - tr.schedStart)
	if err := tr.Opt.Update(p.params, p.grads, float32(lr), scale); err != nil {
		return 0, 0, 0, err
	}
	tr.Step++
	if tr.log != nil && (tr.Step == 1 || tr.Step%max(1, tr.Job.Metrics.LogFreq) == 0 || tr.Step == tr.Job.Training.Steps) {
		tr.log.Printf("titan: pipeline %s pp %d × %d virtual, %d microbatches of %d: measured bubble %.3f (busy %.3fs of %.3fs over all ranks); simulated %.3f with the mean costs F %.2f ms, B %.2f ms, W %.2f ms; theoretical %.3f",
			p.sched.Name, p.sched.PP, p.sched.Virtual, p.sched.Microbatches, p.mbRows, p.bubble, v[2], v[3], p.simulated, cf*1e3, cb*1e3, cw*1e3, p.theory)
	}
	return v[1] / float64(targets), norm, lr, nil
}

// ppValidate is Validate under pipeline parallelism: every microbatch
// runs forward through the stages in order.
func (tr *Trainer) ppValidate(steps int) (float64, error) {
	p := tr.pp
	m := p.sched.Microbatches
	actions := make([][]pipeline.Action, p.sched.PP)
	for mb := range m {
		for s, r := range p.sched.StageRank {
			actions[r] = append(actions[r], pipeline.Action{Kind: pipeline.Forward, Stage: s, Microbatch: mb})
		}
	}
	acc := []float64{0, 0}
	for i := 0; i < steps; i++ {
		b, err := tr.Val.Next()
		if err != nil {
			return 0, fmt.Errorf("validation: %w", err)
		}
		mine, err := b.Shard(p.dpRank, p.dpN)
		if err != nil {
			return 0, err
		}
		for _, t := range mine.Labels {
			if t >= 0 {
				acc[1]++
			}
		}
		T := tr.Job.Training.SeqLen
		mine.Inputs, mine.Labels = p.tpcp.rows(mine.Inputs, T), p.tpcp.rows(mine.Labels, T)
		l, err := p.run(actions, mine.Inputs, mine.Labels, 1, false)
		if err != nil {
			return 0, err
		}
		acc[0] += l
	}
	// Every rank of a pipeline (and of its tp and cp groups) counted the
	// targets.
	acc[1] /= float64(p.sched.PP * tr.mesh.TP * tr.mesh.CP)
	if err := p.tr.dist.Group.AllReduce(commCtx, comm.F64(acc), comm.Sum); err != nil {
		return 0, err
	}
	return acc[0] / max(acc[1], 1), nil
}

// gather returns the whole flat tensor laid out like the model from every
// pipeline rank's local buffer t (params or an optimizer moment) on rank
// 0, and nil on the others.
func (p *pipe) gather(t backend.Tensor) ([]float32, error) {
	local := make([]float32, t.Len)
	p.be.Download(local, t)
	if p.rank != 0 {
		return nil, p.group.Send(commCtx, comm.F32(local), 0)
	}
	full := make([]float32, p.tpcp.shardTotal(p.tr.Cfg))
	place := func(r int, buf []float32) {
		off := 0
		for _, s := range p.sched.Stages(r) {
			lo, hi := p.rangeOf(s)
			copy(full[lo:hi], buf[off:off+hi-lo])
			off += hi - lo
		}
	}
	place(0, local)
	for r := 1; r < p.sched.PP; r++ {
		n := 0
		for _, s := range p.sched.Stages(r) {
			lo, hi := p.rangeOf(s)
			n += hi - lo
		}
		buf := make([]float32, n)
		if err := p.group.Recv(commCtx, comm.F32(buf), r); err != nil {
			return nil, fmt.Errorf("pipeline: gathering from rank %d: %w", r, err)
		}
		place(r, buf)
	}
	return p.tpcp.unshard(p.tr.Cfg, full)
}

// fullState is Trainer.fullState under pipeline parallelism: rank 0 gets
// the whole tensors, the other ranks nil.
func (p *pipe) fullState(modelOnly bool) (params, mv, vv []float32, err error) {
	if params, err = p.gatherAll(p.params); err != nil || modelOnly {
		return params, nil, nil, err
	}
	if mv, err = p.gatherAll(p.tr.Opt.M); err != nil {
		return nil, nil, nil, err
	}
	vv, err = p.gatherAll(p.tr.Opt.V)
	return params, mv, vv, err
}

// gatherAll is gather of t, laid out like params: under dp_shard its
// chunks are first all-gathered into the layout of work.
func (p *pipe) gatherAll(t backend.Tensor) ([]float32, error) {
	if p.shard == nil {
		return p.gather(t)
	}
	full := p.be.Alloc(backend.Float32, p.work.Len)
	if err := p.shard.AllGather(commCtx, comm.F32(hostF32(t)), comm.F32(hostF32(full))); err != nil {
		return nil, fmt.Errorf("pipeline: gathering the dp_shard chunks: %w", err)
	}
	return p.gather(full)
}

// load reads this rank's stages of the tensors prefix+<parameter> into
// dst, laid out like params (its dp_shard chunk under FSDP).
func (p *pipe) load(r *checkpoint.Reader, prefix string, dst backend.Tensor) error {
	host := make([]float32, p.work.Len)
	lay := p.tr.Cfg.ShardLayout(p.tpcp.tp)
	for _, st := range p.stages {
		if err := modelfile.ReadLocal(r, prefix, lay, p.tpcp.tp, p.tpcp.tpRank, st.lo, host[st.off:st.off+st.hi-st.lo]); err != nil {
			return err
		}
	}
	p.be.Upload(dst, host[p.shardLo:p.shardHi])
	return nil
}

// dataRanks is the number of data-parallel ranks, the ranks that read
// different rows of the global batch (every rank of a pipeline reads the
// same rows).
func (tr *Trainer) dataRanks() int {
	if tr.mesh != nil {
		// Pipeline stages, tp and cp ranks read the same rows.
		return tr.dist.World / (tr.mesh.PP * tr.mesh.TP * tr.mesh.CP)
	}
	return tr.dist.World
}

// activationBytes is this rank's planned activation memory.
func (tr *Trainer) activationBytes() int64 {
	if tr.pp != nil {
		return tr.pp.activationBytes()
	}
	return tr.eng.Memory().ActivationBytes
}

// hostF32 is the host memory of a CPU backend tensor.
func hostF32(t backend.Tensor) []float32 { return t.Mem.Host.([]float32)[t.Off : t.Off+t.Len] }
