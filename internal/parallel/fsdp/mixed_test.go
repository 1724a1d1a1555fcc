package fsdp

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/numeric"
)

// dtypeGroup records the dtypes and bytes of the all-gathers and
// reduce-scatters issued on a group.
type dtypeGroup struct {
	comm.Group
	gathered           atomic.Int64 // bytes received by the all-gathers
	gatherDT, reduceDT atomic.Int32
}

func (g *dtypeGroup) AllGatherAsync(ctx context.Context, send, recv comm.Buffer) *comm.Work {
	g.gathered.Add(int64(recv.Len() * recv.DType().Size()))
	g.gatherDT.Store(int32(recv.DType()))
	return g.Group.AllGatherAsync(ctx, send, recv)
}

func (g *dtypeGroup) ReduceScatterAsync(ctx context.Context, send, recv comm.Buffer, op comm.ReduceOp) *comm.Work {
	g.reduceDT.Store(int32(send.DType()))
	return g.Group.ReduceScatterAsync(ctx, send, recv, op)
}

// TestMixedPrecision: with Param bfloat16 the model computes with the
// bfloat16 rounding of the master parameters, bit for bit, in every
// layout (sharded: gathered as bfloat16, half the bytes of a float32
// gather; unsharded: a rounded copy), rounded once per Invalidate; with
// Reduce bfloat16 the reduce-scatter sends bfloat16 and the reduced
// gradients are the bfloat16 sum (within a bfloat16 rounding of the
// float32 reduction's).
func TestMixedPrecision(t *testing.T) {
	cfg := small()
	const T = 8
	for _, c := range []struct{ replicate, shard int }{{1, 1}, {1, 2}, {1, 3}, {2, 1}} {
		t.Run(fmt.Sprintf("rep%d_shard%d", c.replicate, c.shard), func(t *testing.T) {
			bytes := map[backend.DType]int64{}
			grads := map[backend.DType][]float32{}
			for _, dt := range []backend.DType{backend.Float32, backend.BFloat16} {
				var gathered atomic.Int64
				world(t, c.replicate, c.shard, func(rank int, cc Config) error {
					var dg *dtypeGroup
					if cc.Shard != nil {
						dg = &dtypeGroup{Group: cc.Shard}
						cc.Shard = dg
					}
					cc.Param, cc.Reduce = dt, dt
					be := cpu.New(1)
					defer be.Close()
					m, err := llama.New(be, cfg, 1, T, llama.Plan{External: true, Precision: precisionOf(dt)})
					if err != nil {
						return err
					}
					// Record what each unit is bound to at its forward.
					views := make([]backend.Tensor, len(m.Units()))
					rt, err := New(be, unitRanges(m.Layout), func(u int, p, g backend.Tensor) {
						if p.Mem != nil {
							views[u] = p
						}
						m.BindUnit(u, p, g)
					}, cc)
					if err != nil {
						return err
					}
					bound := make([][]float32, len(views))
					hooks := &recordHooks{Runtime: rt, views: views, bound: bound}
					m.Hooks = hooks
					rt.Init(func(lo int, dst []float32) { m.InitLocal(5, dst, lo) })
					master, err := rt.GatherFull(rt.Params)
					if err != nil {
						return err
					}
					rt.ZeroGrad()
					tok, tgt := batch(cfg, c.replicate*c.shard, T, 0)
					lo, hi := rank*T, (rank+1)*T
					if _, err := m.Forward(tok[lo:hi], tgt[lo:hi]); err != nil {
						return err
					}
					if err := m.Backward(1 / float32(T*c.replicate*c.shard)); err != nil {
						return err
					}
					if err := rt.Finish(); err != nil {
						return err
					}
					for u, unit := range rt.Units {
						for i, v := range bound[u] {
							want := master[unit.Lo+i]
							if dt == backend.BFloat16 {
								want = numeric.RoundBF16(want)
							}
							if math.Float32bits(v) != math.Float32bits(want) {
								return fmt.Errorf("%v: unit %d element %d computed with %v, want %v", dt, u, i, v, want)
							}
						}
					}
					if dt == backend.BFloat16 && rt.Gathers() > 0 && dg.gatherDT.Load() != int32(comm.BFloat16) {
						return fmt.Errorf("all-gathers move %v", comm.DType(dg.gatherDT.Load()))
					}
					if dg != nil && rank == 0 {
						gathered.Store(dg.gathered.Load())
						if dt == backend.BFloat16 && dg.reduceDT.Load() != int32(comm.BFloat16) {
							return fmt.Errorf("reduce-scatters send %v", comm.DType(dg.reduceDT.Load()))
						}
					}
					g, err := rt.GatherFull(rt.Grads)
					if err != nil {
						return err
					}
					if rank == 0 {
						grads[dt] = g
					}
					return nil
				})
				bytes[dt] = gathered.Load()
				if c.shard > 1 && bytes[dt] == 0 {
					t.Fatalf("%v: no all-gather", dt)
				}
			}
			if c.shard > 1 && bytes[backend.BFloat16]*2 != bytes[backend.Float32] {
				t.Errorf("all-gathers moved %d bytes in bfloat16, %d in float32: want half", bytes[backend.BFloat16], bytes[backend.Float32])
			}
			if c.replicate*c.shard > 1 {
				f, b := grads[backend.Float32], grads[backend.BFloat16]
				differs := false
				for i := range f {
					differs = differs || f[i] != b[i]
				}
				if !differs {
					t.Error("bfloat16 computation and reductions gave the float32 gradients")
				}
			}
		})
	}
}

func precisionOf(dt backend.DType) model.Precision { return model.Precision{Param: dt} }

// recordHooks are the runtime's hooks, recording the parameters bound to
// each unit when its forward starts.
type recordHooks struct {
	*Runtime
	views []backend.Tensor
	bound [][]float32
}

func (h *recordHooks) BeforeForward(u int) error {
	if err := h.Runtime.BeforeForward(u); err != nil {
		return err
	}
	p, _ := h.views[u].HostFloat32()
	h.bound[u] = append([]float32(nil), p...)
	return nil
}
