package train

import (
	"errors"
	"fmt"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/mesh"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/modelfile"
	"github.com/titan-go/titan/internal/optim"
	"github.com/titan-go/titan/internal/parallel/tp"
)

// sharded runs tensor parallel (with sequence and loss parallel) and
// context parallel training: every rank holds its tp shards of the
// parameters (llama.Sharded), the tp ranks of a group read the same rows
// and the cp ranks of a group the same rows' head and tail chunks.
// Gradients are summed over the data-parallel and cp ranks.
//
// With dp_shard > 1 the rank's tp shards are further sharded, as
// torchtitan does, over dp_shard × cp (FSDP): this rank keeps only its
// chunk of the parameters, gradients and optimizer moments between
// steps; the whole tp shard is all-gathered once before the step's first
// forward pass and its gradients reduce-scattered after the last backward
// pass (one FSDP unit per model: no per-layer gathering or prefetching).
type sharded struct {
	m *llama.Sharded
	// tpG, cpG are the tp and cp groups of this rank; gradG the
	// dp_replicate × dp_shard × cp group without FSDP; fsdpG the
	// dp_shard × cp group and replG the dp_replicate group with FSDP
	// (each nil when not used or of size 1).
	tpG, cpG, gradG, fsdpG, replG comm.Group
	cpRank                        int
	dataRank, dataSize            int
	// params and grads are this rank's state: m.Params and m.Grads
	// without FSDP, their [lo, hi) chunks with it.
	params, grads backend.Tensor
	lo, hi        int
	// dup is how many ranks hold each element of params (the norm of
	// the gradients sums over all ranks and divides by it).
	dup int
}

// checkSharded refuses the tp/cp layouts the trainer cannot run. The
// cross-entropy is always loss parallel (parallelism.disable_loss_parallel
// would give the same numbers with more memory) and the key/value blocks
// always travel around the cp ring point to point, whatever
// parallelism.context_parallel_rotate_method says.
func checkSharded(job *config.Job, m *mesh.Mesh) error {
	p := job.Parallelism
	if p.TensorParallelDegree == 1 && p.ContextParallelDegree == 1 {
		return nil
	}
	if p.EnableAsyncTensorParallel {
		return errors.New("parallelism.enable_async_tensor_parallel: not implemented yet (set it to false)")
	}
	cfg, err := ModelConfig(job)
	if err != nil {
		return err
	}
	return llama.CheckParallel(cfg, job.Training.SeqLen, m.TP, m.CP)
}

// newSharded creates this rank's tp, cp and gradient groups (in that
// order on every rank) and its part of the model.
func (tr *Trainer) newSharded(be backend.Backend) error {
	ms, rank := tr.mesh, tr.dist.Rank
	s := &sharded{}
	type groupSpec struct {
		name string
		dims []string
		g    *comm.Group
	}
	specs := []groupSpec{{"tp", []string{"tp"}, &s.tpG}, {"cp", []string{"cp"}, &s.cpG}}
	if ms.DPShard > 1 {
		specs = append(specs, groupSpec{"dp_shard_cp", []string{"dp_shard", "cp"}, &s.fsdpG}, groupSpec{"dp_replicate", []string{"dp_replicate"}, &s.replG})
	} else {
		specs = append(specs, groupSpec{"dp_cp", []string{"dp_replicate", "dp_shard", "cp"}, &s.gradG})
	}
	for _, d := range specs {
		ranks, err := ms.Group(rank, d.dims...)
		if err != nil {
			return err
		}
		if len(ranks) == 1 {
			continue
		}
		if *d.g, err = comm.NewGroup(commCtx, tr.dist.Group, ranks, d.name); err != nil {
			return fmt.Errorf("%s group %v: %w", d.name, ranks, err)
		}
	}
	c := ms.Coords(rank) // pp, dp_replicate, dp_shard, cp, tp
	s.cpRank = c[3]
	s.dataRank, s.dataSize = c[1]*ms.DPShard+c[2], ms.DPReplicate*ms.DPShard
	job := tr.Job
	var err error
	s.m, err = llama.NewSharded(be, tr.Cfg, job.Training.LocalBatchSize, job.Training.SeqLen, llama.ShardPlan{TP: ms.TP, TPRank: c[4], CP: ms.CP, CPRank: c[3], Checkpoint: tr.acPolicy()}, &tp.Comm{TP: s.tpG, CP: s.cpG, Ctx: commCtx})
	if err != nil {
		return err
	}
	s.params, s.grads, s.lo, s.hi = s.m.Params, s.m.Grads, 0, s.m.Params.Len
	s.dup = tr.dist.World / ms.TP
	if s.fsdpG != nil {
		s.lo, s.hi = comm.ChunkBounds(s.m.Params.Len, s.fsdpG.Size(), s.fsdpG.Rank())
		s.params, s.grads = be.Alloc(backend.Float32, s.hi-s.lo), be.Alloc(backend.Float32, s.hi-s.lo)
		s.dup = ms.DPReplicate
	}
	tr.sh = s
	return nil
}

// init initialises this rank's parameters as a one-process Init would.
func (s *sharded) init(be backend.Backend, seed uint64) {
	s.m.Init(seed)
	if s.fsdpG != nil {
		be.Copy(s.params, s.m.Params.Slice(s.lo, s.hi-s.lo))
	}
}

// gatherParams all-gathers the tp shard's parameters from the FSDP chunks.
func (s *sharded) gatherParams(be backend.Backend) error {
	if s.fsdpG == nil {
		return nil
	}
	all := make([]float32, s.m.Params.Len)
	be.Download(all[s.lo:s.hi], s.params)
	if err := s.fsdpG.AllGather(commCtx, comm.F32(all[s.lo:s.hi]), comm.F32(all)); err != nil {
		return fmt.Errorf("fsdp parameter all-gather: %w", err)
	}
	be.Upload(s.m.Params, all)
	return nil
}

// reduceGrads sums the step's gradients over the ranks that saw other
// tokens: into m.Grads without FSDP, into this rank's chunk with it.
func (s *sharded) reduceGrads(be backend.Backend) error {
	m := s.m
	if err := m.ReduceReplicated(); err != nil {
		return err
	}
	h := make([]float32, m.Grads.Len)
	switch {
	case s.gradG != nil:
		be.Download(h, m.Grads)
		if err := s.gradG.AllReduce(commCtx, comm.F32(h), comm.Sum); err != nil {
			return fmt.Errorf("gradient all-reduce: %w", err)
		}
		be.Upload(m.Grads, h)
	case s.fsdpG != nil:
		be.Download(h, m.Grads)
		mine := make([]float32, s.hi-s.lo)
		if err := s.fsdpG.ReduceScatter(commCtx, comm.F32(h), comm.F32(mine), comm.Sum); err != nil {
			return fmt.Errorf("fsdp gradient reduce-scatter: %w", err)
		}
		if s.replG != nil {
			if err := s.replG.AllReduce(commCtx, comm.F32(mine), comm.Sum); err != nil {
				return fmt.Errorf("gradient all-reduce over dp_replicate: %w", err)
			}
		}
		be.Upload(s.grads, mine)
	}
	return nil
}

// gradSumSquares is this rank's share of the squared gradient norm: the
// elements of its state, the replicated (norm) parameters on tp rank 0
// only.
func (s *sharded) gradSumSquares(be backend.Backend) float64 {
	var sum float64
	for _, p := range s.m.Layout {
		if p.Kind == llama.Replicated && s.m.TPRank != 0 {
			continue
		}
		lo, hi := max(s.lo, p.LocalOffset), min(s.hi, p.LocalOffset+p.LocalSize)
		if lo < hi {
			sum += be.SumSquares(s.grads.Slice(lo-s.lo, hi-lo))
		}
	}
	return sum
}

// rows returns this rank's tokens of microbatch a of its data-parallel
// rows: the cp rank's head and tail chunks of each row.
func (s *sharded) rows(x []int32, a int) []int32 {
	n := s.m.B * s.m.T
	return llama.CPSlice(x[a*n:(a+1)*n], s.m.T, s.m.CP, s.cpRank)
}

// shardedStep is TrainStep under tensor or context parallelism.
func (tr *Trainer) shardedStep() (loss, gradNorm, lr float64, err error) {
	s := tr.sh
	m := s.m
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
	mine, err := batch.Shard(s.dataRank, s.dataSize)
	if err != nil {
		return 0, 0, 0, err
	}
	if err := s.gatherParams(tr.be); err != nil {
		return 0, 0, 0, err
	}
	m.ZeroGrad()
	sum := []float64{0}
	for a := 0; a < tr.accum; a++ {
		l, err := m.Forward(s.rows(mine.Inputs, a), s.rows(mine.Labels, a))
		if err != nil {
			return 0, 0, 0, err
		}
		if m.TPRank == 0 { // the tp ranks of a group compute the same loss
			sum[0] += float64(l) * float64(m.NumTargets())
		}
		if err := m.Backward(1 / float32(targets)); err != nil {
			return 0, 0, 0, err
		}
	}
	if err := s.reduceGrads(tr.be); err != nil {
		return 0, 0, 0, err
	}
	sum = append(sum, s.gradSumSquares(tr.be))
	if err := tr.sumOverRanks(sum); err != nil {
		return 0, 0, 0, err
	}
	norm, scale := optim.ClipScale(sum[1]/float64(s.dup), float32(tr.Job.Training.MaxNorm))
	lr = tr.Sched.LR(tr.Step)
	if err := tr.Opt.Update(s.params, s.grads, float32(lr), scale); err != nil {
		return 0, 0, 0, err
	}
	tr.Step++
	return sum[0] / float64(targets), norm, lr, nil
}

// shardedValidate is Validate under tensor or context parallelism.
func (tr *Trainer) shardedValidate(steps int) (float64, error) {
	s := tr.sh
	if err := s.gatherParams(tr.be); err != nil {
		return 0, err
	}
	acc := []float64{0, 0}
	for i := 0; i < steps; i++ {
		b, err := tr.Val.Next()
		if err != nil {
			return 0, fmt.Errorf("validation: %w", err)
		}
		mine, err := b.Shard(s.dataRank, s.dataSize)
		if err != nil {
			return 0, err
		}
		l, err := s.m.Forward(s.rows(mine.Inputs, 0), s.rows(mine.Labels, 0))
		if err != nil {
			return 0, err
		}
		if s.m.TPRank == 0 {
			acc[0] += float64(l) * float64(s.m.NumTargets())
			acc[1] += float64(s.m.NumTargets())
		}
	}
	if err := tr.sumOverRanks(acc); err != nil {
		return 0, err
	}
	return acc[0] / max(acc[1], 1), nil
}

// gather assembles the whole flat tensor (parameters or an optimizer
// moment) from this rank's state t (FSDP chunk or tp shard) and those of
// its fsdp and tp groups.
func (s *sharded) gather(be backend.Backend, t backend.Tensor) ([]float32, error) {
	n := s.m.Params.Len
	tpn := s.m.TP
	all := make([]float32, n*tpn)
	mine := all[s.m.TPRank*n : (s.m.TPRank+1)*n]
	be.Download(mine[s.lo:s.hi], t)
	if s.fsdpG != nil {
		if err := s.fsdpG.AllGather(commCtx, comm.F32(mine[s.lo:s.hi]), comm.F32(mine)); err != nil {
			return nil, err
		}
	}
	if s.tpG != nil {
		if err := s.tpG.AllGather(commCtx, comm.F32(all[s.m.TPRank*n:(s.m.TPRank+1)*n]), comm.F32(all)); err != nil {
			return nil, err
		}
	}
	locals := make([][]float32, tpn)
	for r := range locals {
		locals[r] = all[r*n : (r+1)*n]
	}
	return llama.UnshardFlat(s.m.Cfg, locals), nil
}

// fullState gathers the whole parameters (and moments unless modelOnly)
// over the tp group; every rank must call it.
func (s *sharded) fullState(tr *Trainer, modelOnly bool) (params, mv, vv []float32, err error) {
	if params, err = s.gather(tr.be, s.params); err != nil || modelOnly {
		return params, nil, nil, err
	}
	if mv, err = s.gather(tr.be, tr.Opt.M); err != nil {
		return nil, nil, nil, err
	}
	vv, err = s.gather(tr.be, tr.Opt.V)
	return params, mv, vv, err
}

// load reads the whole tensors prefix+<parameter> and keeps this rank's
// shards in dst.
func (s *sharded) load(r *checkpoint.Reader, prefix string, dst backend.Tensor) error {
	full := make([]float32, s.m.Cfg.NumParams())
	if err := modelfile.ReadPrefixed(r, prefix, s.m.Cfg, full); err != nil {
		return err
	}
	be := s.m.Backend()
	shard := llama.ShardFlat(s.m.Cfg, s.m.TP, s.m.TPRank, full)
	be.Upload(dst, shard[s.lo:s.hi])
	if s.fsdpG != nil && dst == s.params {
		// Keep the gathered copy current for a step that starts without
		// gathering (gatherParams runs at the start of every step anyway).
		be.Upload(s.m.Params, shard)
	}
	return nil
}
