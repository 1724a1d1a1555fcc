package fsdp

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/numeric"
)

// countGroup counts the bytes the all-gathers receive and the
// all-reduces issued on a group.
type countGroup struct {
	comm.Group
	gathered   atomic.Int64
	allReduces atomic.Int32
}

func (g *countGroup) AllGatherAsync(ctx context.Context, send, recv comm.Buffer) *comm.Work {
	g.gathered.Add(int64(recv.Len() * recv.DType().Size()))
	return g.Group.AllGatherAsync(ctx, send, recv)
}

func (g *countGroup) AllReduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp) error {
	g.allReduces.Add(1)
	return g.Group.AllReduce(ctx, buf, op)
}

func (g *countGroup) AllReduceAsync(ctx context.Context, buf comm.Buffer, op comm.ReduceOp) *comm.Work {
	g.allReduces.Add(1)
	return g.Group.AllReduceAsync(ctx, buf, op)
}

// f8run is what one float8 FSDP run of TestFloat8AllGather saw on rank 0.
type f8run struct {
	losses        []float32
	grads         []float32
	stats         GatherStats
	wire          int64 // bytes the all-gathers received (comm layer)
	allReduces    int32
	boundWq       []float32 // layer 0's wq as bound at the last forward
	masterWq      []float32 // its master values then (the compute dtype's)
	boundScaleSet bool
}

// TestFloat8AllGather: under FSDP (2 and 3 shards, float32 and bfloat16
// parameters) the float8 all-gather gives bitwise the losses and gradients
// of the float8 run that gathers the parameter dtype, over two steps with
// an update between; the gathered wq is bitwise float8.Cast of the whole
// master wq with its tensorwise scale; the float8 weights' all-gather
// bytes are exactly half of the bfloat16 gather's (a quarter of
// float32's), the other parameters' unchanged, and the comm layer saw the
// bytes GatherStats counts. Without precomputed scales every gather
// all-reduces one amax per float8 weight; with them, one all-reduce per
// step, and the same numbers bitwise.
func TestFloat8AllGather(t *testing.T) {
	cfg := small()
	const T, steps = 8, 2
	type mode struct{ gather8, pre bool }
	for _, shards := range []int{2, 3} {
		for _, dt := range []backend.DType{backend.Float32, backend.BFloat16} {
			t.Run(fmt.Sprintf("shard%d_%v", shards, dt), func(t *testing.T) {
				runs := map[mode]*f8run{}
				for _, md := range []mode{{false, false}, {true, false}, {true, true}} {
					var res f8run
					var mu sync.Mutex
					world(t, 1, shards, func(rank int, cc Config) error {
						cg := &countGroup{Group: cc.Shard}
						cc.Shard = cg
						be := cpu.New(1)
						defer be.Close()
						f8 := &float8.Config{Recipe: float8.Tensorwise}
						m, err := llama.New(be, cfg, 1, T, llama.Plan{External: true, Precision: model.Precision{Param: dt, Float8: f8}})
						if err != nil {
							return err
						}
						cc.Param, cc.Reduce = dt, backend.Float32
						for u := range m.Units() {
							var ws []Range
							for _, w := range m.Float8Weights(u) {
								ws = append(ws, Range{w.Lo, w.Hi})
							}
							cc.Float8 = append(cc.Float8, ws)
						}
						scaleSet := false
						cc.Float8AllGather, cc.PrecomputeScales = md.gather8, md.pre
						if md.gather8 {
							cc.BindScales = func(u int, s []float32) {
								scaleSet = true
								m.BindFloat8Scales(u, s)
							}
						}
						rt, err := shard(be, m, cc, 9)
						if err != nil {
							return err
						}
						var losses []float32
						for step := 0; step < steps; step++ {
							rt.ZeroGrad()
							tok, tgt := batch(cfg, shards, T, step)
							loss, err := m.Forward(tok[rank*T:(rank+1)*T], tgt[rank*T:(rank+1)*T])
							if err != nil {
								return err
							}
							losses = append(losses, loss)
							if step == steps-1 {
								// Layer 0's wq as the forward computed with it: unit 1
								// stays gathered only under ReshardNever, so every rank
								// gathers it once more.
								if err := rt.BeforeForward(1); err != nil {
									return err
								}
								if rank == 0 {
									w, _ := m.P.Layers[0].Wq.HostFloat32()
									res.boundWq = append([]float32(nil), w...)
									res.boundScaleSet = scaleSet
								}
								if err := rt.AfterForward(1); err != nil {
									return err
								}
							}
							if err := m.Backward(1 / float32(T*shards)); err != nil {
								return err
							}
							if err := rt.Finish(); err != nil {
								return err
							}
							if step == steps-1 {
								break
							}
							// An update: p -= 0.01·g (every rank its shard).
							p, _ := rt.Params.HostFloat32()
							g, _ := rt.Grads.HostFloat32()
							for i := range p {
								p[i] -= 0.01 * g[i]
							}
							rt.Invalidate()
						}
						grads, err := rt.GatherFull(rt.Grads)
						if err != nil {
							return err
						}
						master, err := rt.GatherFull(rt.Params)
						if err != nil {
							return err
						}
						if rank == 0 {
							mu.Lock()
							defer mu.Unlock()
							res.losses, res.grads, res.stats = losses, grads, rt.GatherStats()
							res.wire, res.allReduces = cg.gathered.Load(), cg.allReduces.Load()
							for _, p := range m.Layout {
								if p.Name == "layers.0.attention.wq.weight" {
									res.masterWq = master[p.Offset : p.Offset+p.Size]
								}
							}
							if dt == backend.BFloat16 {
								for i, v := range res.masterWq {
									res.masterWq[i] = numeric.RoundBF16(v)
								}
							}
						}
						return nil
					})
					runs[md] = &res
				}
				plain, g8, pre := runs[mode{}], runs[mode{true, false}], runs[mode{true, true}]
				if plain.grads == nil || g8.grads == nil || pre.grads == nil {
					t.Fatal("a run failed")
				}
				for name, r := range map[string]*f8run{"float8 all-gather": g8, "precomputed scales": pre} {
					for i := range plain.losses {
						if math.Float32bits(r.losses[i]) != math.Float32bits(plain.losses[i]) {
							t.Errorf("%s: step %d loss %v, gathering %v gives %v", name, i+1, r.losses[i], dt, plain.losses[i])
						}
					}
					for i := range plain.grads {
						if math.Float32bits(r.grads[i]) != math.Float32bits(plain.grads[i]) {
							t.Fatalf("%s: gradient %d is %v, gathering %v gives %v", name, i, r.grads[i], dt, plain.grads[i])
						}
					}
					if !r.boundScaleSet {
						t.Errorf("%s: no scales bound", name)
					}
					// The bound wq is the float8 cast of the whole master wq.
					s := float8.Scale(float8.Amax(r.masterWq), float8.E4M3, false)
					want := make([]float32, len(r.masterWq))
					float8.Cast(want, r.masterWq, s, float8.E4M3)
					for i := range want {
						if math.Float32bits(r.boundWq[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s: gathered wq[%d] = %v, the float8 cast of the master is %v", name, i, r.boundWq[i], want[i])
						}
					}
					if r.wire != r.stats.Bytes() || plain.wire != plain.stats.Bytes() {
						t.Errorf("%s: comm received %d bytes (plain %d), GatherStats counts %d (%d)", name, r.wire, plain.wire, r.stats.Bytes(), plain.stats.Bytes())
					}
					if r.stats.Gathers != plain.stats.Gathers || r.stats.Gathers == 0 {
						t.Errorf("%s: %d gathers, plain %d", name, r.stats.Gathers, plain.stats.Gathers)
					}
					ratio := int64(2)
					if dt == backend.Float32 {
						ratio = 4
					}
					if r.stats.Float8Weights*ratio != plain.stats.Float8Weights || r.stats.Float8Weights == 0 {
						t.Errorf("%s: float8 weights gathered in %d bytes, in %v %d: want 1/%d", name, r.stats.Float8Weights, dt, plain.stats.Float8Weights, ratio)
					}
					if r.stats.Other != plain.stats.Other {
						t.Errorf("%s: other parameters gathered in %d bytes, in %v %d", name, r.stats.Other, dt, plain.stats.Other)
					}
					t.Logf("%s: all-gathers moved %d bytes (float8 weights %d, other %d, padding %d); gathering %v: %d (float8 weights %d); %d amax all-reduces",
						name, r.stats.Bytes(), r.stats.Float8Weights, r.stats.Other, r.stats.Padding, dt, plain.stats.Bytes(), plain.stats.Float8Weights, r.allReduces)
				}
				if plain.allReduces != 0 {
					t.Errorf("plain float8 run: %d all-reduces", plain.allReduces)
				}
				// Each step gathers each layer unit (7 float8 weights) and
				// the head (the output projection) for the forward and again
				// for the backward; the test gathers unit 1 once more.
				want := int32(7*(steps*2*cfg.NLayers+1) + steps*2)
				if g8.allReduces != want || int(g8.allReduces) != g8.stats.ScaleReductions {
					t.Errorf("per-weight scales: %d all-reduces (stats %d), want %d", g8.allReduces, g8.stats.ScaleReductions, want)
				}
				if pre.allReduces != steps || pre.stats.ScaleReductions != steps {
					t.Errorf("precomputed scales: %d all-reduces (stats %d), want one per step, %d", pre.allReduces, pre.stats.ScaleReductions, steps)
				}
			})
		}
	}
}
