package parallel

import (
	"errors"
	"fmt"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/modelfile"
	"github.com/titan-go/titan/internal/parallel/fsdp"
	"github.com/titan-go/titan/internal/parallel/tp"
)

// Engine is one rank's share of the model under its mesh. The trainer
// drives only this interface; it knows nothing else of FSDP, TP, CP or PP.
type Engine interface {
	// ForwardBackward runs forward and backward over this rank's part of
	// the global batch (rows: this data rank's rows, accum microbatches
	// of them) with loss scale 1/scaleDen, completes every gradient
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
	// whole job of one batch (this data rank's rows).
	Evaluate(inputs, labels []int32) (lossSum float64, targets int, err error)
	// Init fills this rank's parameters as a one-process Init(seed) would.
	Init(seed uint64)
	// GatherFull returns the whole flat tensor (Config.Layout order) of
	// which buf (Params or an optimizer moment) holds this rank's share,
	// on rank 0 (nil on the others). Every rank must call it.
	GatherFull(buf backend.Tensor) ([]float32, error)
	// Load fills buf (Params or an optimizer moment) with this rank's
	// share of the whole tensors prefix+<parameter> of checkpoint r.
	Load(r *checkpoint.Reader, prefix string, buf backend.Tensor) error
	// Memory reports this rank's memory.
	Memory() Memory
}

// Memory is one rank's memory as the engine accounts it.
type Memory struct {
	// StateBytes is the parameters and gradients this rank keeps
	// between steps (shards under FSDP); the optimizer adds its moments.
	StateBytes int64
	// ActivationBytes is the planned activation memory.
	ActivationBytes int64
	// GatheredUnits is the most units whose gathered parameters were
	// alive at once (0 without FSDP).
	GatheredUnits int
}

// Options are the layout-independent settings of an engine.
type Options struct {
	// B and T are the rows per microbatch and the sequence length.
	B, T int
	// Checkpoint is the activation checkpointing policy.
	Checkpoint llama.ActivationCheckpoint
	// Reshard is the FSDP reshard-after-forward policy.
	Reshard fsdp.Reshard
}

// spmd is the engine without pipeline parallelism: every rank holds the
// whole depth of the model, tensor- and context-parallel shards of it
// (llama.Plan), sharded further over dp_shard × cp unit by unit (FSDP) or
// replicated (DDP), through one fsdp.Runtime whose hooks the model calls.
type spmd struct {
	g  *Groups
	be backend.Backend
	m  *llama.Model
	rt *fsdp.Runtime
	o  Options
}

// NewSPMD builds the engine of a layout without pipeline parallelism.
func NewSPMD(be backend.Backend, cfg llama.Config, g *Groups, o Options) (Engine, error) {
	if g.Mesh.PP > 1 {
		return nil, errors.New("parallel: NewSPMD with pipeline_parallel_degree > 1")
	}
	plan := llama.Plan{
		TP: g.Mesh.TP, TPRank: g.TPRank(), CP: g.Mesh.CP, CPRank: g.CPRank(),
		External: true, Checkpoint: o.Checkpoint,
	}
	if g.Mesh.TP*g.Mesh.CP > 1 {
		plan.Comm = &tp.Comm{TP: g.TP, CP: g.CP, Ctx: commCtx}
	}
	m, err := llama.New(be, cfg, o.B, o.T, plan)
	if err != nil {
		return nil, err
	}
	var units []fsdp.Range
	for _, u := range m.Units() {
		units = append(units, fsdp.Range{Lo: u.Lo, Hi: u.Hi})
	}
	rt, err := fsdp.New(be, units, m.BindUnit, fsdp.Config{Shard: g.Shard, Replicate: g.Replicate, Reshard: o.Reshard})
	if err != nil {
		return nil, err
	}
	m.Hooks = rt
	return &spmd{g: g, be: be, m: m, rt: rt, o: o}, nil
}

func (e *spmd) Params() backend.Tensor { return e.rt.Params }
func (e *spmd) Grads() backend.Tensor  { return e.rt.Grads }
func (e *spmd) Updated()               { e.rt.Invalidate() }

func (e *spmd) Init(seed uint64) {
	e.rt.Init(func(lo int, dst []float32) { e.m.InitLocal(seed, dst, lo) })
}

// rows returns this rank's tokens of microbatch a: the cp rank's head
// and tail chunks of each of its rows.
func (e *spmd) rows(x []int32, a int) []int32 {
	n := e.o.B * e.o.T
	return llama.CPSlice(x[a*n:(a+1)*n], e.o.T, e.g.Mesh.CP, e.g.CPRank())
}

func (e *spmd) ForwardBackward(inputs, labels []int32, accum int, scale float32) (float64, error) {
	e.rt.ZeroGrad()
	sum := []float64{0}
	for a := 0; a < accum; a++ {
		if _, err := e.m.Forward(e.rows(inputs, a), e.rows(labels, a)); err != nil {
			return 0, err
		}
		if e.g.TPRank() == 0 { // the tp ranks of a group compute the same loss
			sum[0] += e.m.LossSum()
		}
		if err := e.m.Backward(scale); err != nil {
			return 0, err
		}
	}
	// The last unit reductions overlapped the backward; wait for them.
	if err := e.rt.Finish(); err != nil {
		return 0, err
	}
	if err := e.reduceReplicated(); err != nil {
		return 0, err
	}
	if err := e.g.SumWorld(sum); err != nil {
		return 0, err
	}
	return sum[0], nil
}

// replicatedShard calls fn with the parts of this rank's gradient shard
// that hold replicated (norm) parameters.
func (e *spmd) replicatedShard(fn func(t backend.Tensor)) {
	rt := e.rt
	for u, s := range rt.Shards {
		for _, r := range e.m.Replicated() {
			lo, hi := max(s.Lo, r.Lo), min(s.Hi, r.Hi)
			if lo < hi {
				fn(rt.Grads.Slice(rt.Local[u]+lo-s.Lo, hi-lo))
			}
		}
	}
}

// reduceReplicated sums the replicated parameters' gradients (each tp
// rank's from its sequence rows) over the tp group.
func (e *spmd) reduceReplicated() error {
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

func (e *spmd) GradSumSquares() (float64, error) {
	s := e.be.SumSquares(e.rt.Grads)
	if e.g.TPRank() != 0 {
		// The replicated parameters count once per tp group.
		e.replicatedShard(func(t backend.Tensor) { s -= e.be.SumSquares(t) })
	}
	v := []float64{s}
	if err := e.g.SumWorld(v); err != nil {
		return 0, err
	}
	// Every element of a shard is held by each replica.
	return v[0] / float64(size(e.g.Replicate)), nil
}

func (e *spmd) Evaluate(inputs, labels []int32) (float64, int, error) {
	defer e.rt.Invalidate()
	if _, err := e.m.Forward(e.rows(inputs, 0), e.rows(labels, 0)); err != nil {
		return 0, 0, err
	}
	acc := []float64{0, 0}
	if e.g.TPRank() == 0 {
		acc[0], acc[1] = e.m.LossSum(), float64(e.m.NumTargets())
	}
	if err := e.g.SumWorld(acc); err != nil {
		return 0, 0, err
	}
	return acc[0], int(acc[1]), nil
}

func (e *spmd) GatherFull(buf backend.Tensor) ([]float32, error) {
	local, err := e.rt.GatherFull(buf)
	if err != nil {
		return nil, err
	}
	if e.g.TP == nil {
		return local, nil
	}
	n, tpn := len(local), e.g.TP.Size()
	all := make([]float32, n*tpn)
	r := e.g.TPRank()
	copy(all[r*n:], local)
	if err := e.g.TP.AllGather(commCtx, comm.F32(all[r*n:(r+1)*n]), comm.F32(all)); err != nil {
		return nil, fmt.Errorf("gathering the tp shards: %w", err)
	}
	locals := make([][]float32, tpn)
	for i := range locals {
		locals[i] = all[i*n : (i+1)*n]
	}
	return llama.UnshardFlat(e.m.Cfg, locals), nil
}

func (e *spmd) Load(r *checkpoint.Reader, prefix string, buf backend.Tensor) error {
	return e.rt.Load(buf, func(lo int, dst []float32) error {
		return modelfile.ReadLocal(r, prefix, e.m.Layout, max(e.m.TP, 1), e.m.TPRank, lo, dst)
	})
}

func (e *spmd) Memory() Memory {
	return Memory{StateBytes: e.rt.StateBytes(), ActivationBytes: e.m.ActivationBytes(), GatheredUnits: e.rt.GatheredBuffers()}
}
