package train

import (
	"fmt"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/parallel/tp"
)

// ppShard is the tensor- and context-parallel part of a pipeline rank:
// its tp and cp groups (nil for degree 1) and places in them.
type ppShard struct {
	tp, tpRank, cp, cpRank int
	tpG                    comm.Group
	c                      *tp.Comm
}

// newPPShard places this rank in its tp and cp groups.
func (tr *Trainer) newPPShard() *ppShard {
	g := tr.groups
	q := &ppShard{tp: tr.mesh.TP, tpRank: g.TPRank(), cp: tr.mesh.CP, cpRank: g.CPRank(), tpG: g.TP}
	if q.tp*q.cp > 1 {
		q.c = &tp.Comm{TP: g.TP, CP: g.CP, Ctx: commCtx}
	}
	return q
}

// newStage creates one activation set of a stage (parameters unbound).
func (q *ppShard) newStage(p *pipe, spec llama.StageSpec) (*llama.Model, error) {
	plan := llama.Plan{TP: q.tp, TPRank: q.tpRank, CP: q.cp, CPRank: q.cpRank, Stage: &spec, External: true, Checkpoint: p.tr.acPolicy()}
	if q.c != nil {
		plan.Comm = q.c
	}
	return llama.New(p.be, p.tr.Cfg, p.mbRows, p.tr.Job.Training.SeqLen, plan)
}

// rows returns this rank's tokens of the rows x: the cp rank's head and
// tail chunks of each row.
func (q *ppShard) rows(x []int32, T int) []int32 {
	if q.cp == 1 {
		return x
	}
	return llama.CPSlice(x, T, q.cp, q.cpRank)
}

// reduceReplicated sums the norm gradients of every stage (each tp
// rank's from its sequence rows) over the tp group.
func (q *ppShard) reduceReplicated(p *pipe) error {
	if q.tp == 1 {
		return nil
	}
	for _, s := range p.local {
		st := p.stages[s]
		for _, r := range st.all[0].Replicated() {
			t := p.workGrads.Slice(st.off+r.Lo, r.Len())
			h := make([]float32, t.Len)
			p.be.Download(h, t)
			if err := q.tpG.AllReduce(commCtx, comm.F32(h), comm.Sum); err != nil {
				return fmt.Errorf("pipeline: norm gradients over tp: %w", err)
			}
			p.be.Upload(t, h)
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
		for _, sp := range p.tr.Cfg.LocalLayout(q.tp, st.spec) {
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
