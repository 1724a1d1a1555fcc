package train

import (
	"fmt"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/parallel/tp"
)

// stageModel is what the pipeline executor runs for one stage and one
// microbatch: a llama.Stage, or a tensor- and context-parallel
// llama.Sharded restricted to the stage (shardedStage).
type stageModel interface {
	Forward(tokens, targets []int32) (lossSum float64, numTargets int, err error)
	Backward(lossScale float32) error
	BackwardInput(lossScale float32) error
	BackwardWeight()
	ReserveSplit()
	Input() backend.Tensor
	Output() backend.Tensor
	GradOutput() backend.Tensor
	GradInput() backend.Tensor
	ActivationBytes() int64
}

// shardedStage runs a pipeline stage under tensor and context
// parallelism. Its backward is never split: BackwardInput runs the whole
// backward and BackwardWeight does nothing, as llama.Stage does under
// activation checkpointing.
type shardedStage struct{ m *llama.Sharded }

func (s shardedStage) Forward(tokens, targets []int32) (float64, int, error) {
	if _, err := s.m.Forward(tokens, targets); err != nil {
		return 0, 0, err
	}
	return s.m.LossSum(), s.m.NumTargets(), nil
}

func (s shardedStage) Backward(scale float32) error      { return s.m.Backward(scale) }
func (s shardedStage) BackwardInput(scale float32) error { return s.m.Backward(scale) }
func (s shardedStage) BackwardWeight()                   {}
func (s shardedStage) ReserveSplit()                     {}
func (s shardedStage) Input() backend.Tensor             { return s.m.StageInput() }
func (s shardedStage) Output() backend.Tensor            { return s.m.StageOutput() }
func (s shardedStage) GradOutput() backend.Tensor        { return s.m.StageGrad() }
func (s shardedStage) GradInput() backend.Tensor         { return s.m.StageGrad() }
func (s shardedStage) ActivationBytes() int64            { return s.m.ActivationBytes() }

// ppShard is the tensor- and context-parallel part of a pipeline rank:
// its tp and cp groups (nil for degree 1) and places in them.
type ppShard struct {
	tp, tpRank, cp, cpRank int
	tpG                    comm.Group
	c                      *tp.Comm
}

// newPPShard creates this rank's tp and cp groups, in that order.
func (tr *Trainer) newPPShard() (*ppShard, error) {
	ms, rank := tr.mesh, tr.dist.Rank
	gs := map[string]comm.Group{}
	for _, dim := range []string{"tp", "cp"} {
		ranks, err := ms.Group(rank, dim)
		if err != nil {
			return nil, err
		}
		if len(ranks) == 1 {
			continue
		}
		if gs[dim], err = comm.NewGroup(commCtx, tr.dist.Group, ranks, dim); err != nil {
			return nil, fmt.Errorf("%s group %v: %w", dim, ranks, err)
		}
	}
	c := ms.Coords(rank) // pp, dp_replicate, dp_shard, cp, tp
	return &ppShard{tp: ms.TP, tpRank: c[4], cp: ms.CP, cpRank: c[3], tpG: gs["tp"],
		c: &tp.Comm{TP: gs["tp"], CP: gs["cp"], Ctx: commCtx}}, nil
}

// newStage creates one activation set of a stage (parameters unbound).
func (q *ppShard) newStage(p *pipe, spec llama.StageSpec) (*llama.Sharded, error) {
	return llama.NewSharded(p.be, p.tr.Cfg, p.mbRows, p.tr.Job.Training.SeqLen,
		llama.ShardPlan{TP: q.tp, TPRank: q.tpRank, CP: q.cp, CPRank: q.cpRank, Stage: &spec, Checkpoint: p.tr.acPolicy()}, q.c)
}

// rows returns this rank's tokens of the rows x: the cp rank's head and
// tail chunks of each row.
func (q *ppShard) rows(x []int32, T int) []int32 {
	if q.cp == 1 {
		return x
	}
	return llama.CPSlice(x, T, q.cp, q.cpRank)
}

// reduceReplicated sums the norm gradients of every stage over the tp
// group.
func (q *ppShard) reduceReplicated(p *pipe) error {
	if q.tp == 1 {
		return nil
	}
	for _, s := range p.local {
		if err := p.stages[s].all[0].(shardedStage).m.ReduceReplicated(); err != nil {
			return err
		}
	}
	return nil
}

// gradSumSquares is this rank's share of the squared gradient norm: the
// elements of its gradient buffer, the replicated (norm) parameters on
// tp rank 0 only.
func (q *ppShard) gradSumSquares(p *pipe) float64 {
	var sum float64
	for _, s := range p.local {
		st := p.stages[s]
		for _, sp := range st.spec.ShardLayout(p.tr.Cfg, q.tp) {
			if sp.Kind == llama.Replicated && q.tpRank != 0 {
				continue
			}
			o := st.off + sp.LocalOffset
			lo, hi := max(p.shardLo, o), min(p.shardHi, o+sp.LocalSize)
			if lo < hi {
				sum += p.be.SumSquares(p.grads.Slice(lo-p.shardLo, hi-lo))
			}
		}
	}
	return sum
}

// shardTotal is the size of a tp rank's whole flat buffer.
func (q *ppShard) shardTotal(cfg llama.Config) int {
	lay := cfg.ShardLayout(q.tp)
	return lay[len(lay)-1].LocalOffset + lay[len(lay)-1].LocalSize
}

// unshard assembles the whole flat tensor from the tp ranks' buffers
// (every pipeline rank 0 of a tp group calls it with its own).
func (q *ppShard) unshard(cfg llama.Config, mine []float32) ([]float32, error) {
	if q.tp == 1 {
		return mine, nil
	}
	n := len(mine)
	all := make([]float32, n*q.tp)
	copy(all[q.tpRank*n:], mine)
	if err := q.tpG.AllGather(commCtx, comm.F32(all[q.tpRank*n:(q.tpRank+1)*n]), comm.F32(all)); err != nil {
		return nil, fmt.Errorf("pipeline: gathering the tp shards: %w", err)
	}
	locals := make([][]float32, q.tp)
	for r := range locals {
		locals[r] = all[r*n : (r+1)*n]
	}
	return llama.UnshardFlat(cfg, locals), nil
}
