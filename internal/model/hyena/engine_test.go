package hyena_test

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/mesh"
	"github.com/titan-go/titan/internal/model/hyena"
	"github.com/titan-go/titan/internal/parallel"
	"github.com/titan-go/titan/internal/parallel/fsdp"
)

// TestEngineLayouts: titan's one engine (internal/parallel) runs the
// Hyena family unchanged under DDP, FSDP (both reshard policies) and
// HSDP on in-process ranks, and gives the job's loss and the gradient of
// the one-process model on the whole global batch. Under FSDP the
// embedding's unit is gathered and reduced twice per step (lookup and
// tied head); the two reductions add up.
func TestEngineLayouts(t *testing.T) {
	cfg, err := hyena.Flavor("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Order = 3
	const B, T, seed = 1, 12, 5 // rows per data rank
	for _, tc := range []struct {
		name    string
		deg     mesh.Degrees
		reshard string
	}{
		{"DDP", mesh.Degrees{PP: 1, DPReplicate: 2, DPShard: 1, CP: 1, TP: 1}, "default"},
		{"FSDP reshard always", mesh.Degrees{PP: 1, DPReplicate: 1, DPShard: 2, CP: 1, TP: 1}, "always"},
		{"FSDP reshard never", mesh.Degrees{PP: 1, DPReplicate: 1, DPShard: 2, CP: 1, TP: 1}, "never"},
		{"HSDP", mesh.Degrees{PP: 1, DPReplicate: 2, DPShard: 2, CP: 1, TP: 1}, "always"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ranks := tc.deg.DPReplicate * tc.deg.DPShard
			rows := ranks * B
			inputs, labels := make([]int32, rows*T), make([]int32, rows*T)
			for i := range inputs {
				inputs[i] = int32((i*7 + i*i) % cfg.VocabSize)
				labels[i] = int32((i*5 + 3) % cfg.VocabSize)
			}
			labels[4] = -1
			targets := 0
			for _, l := range labels {
				if l >= 0 {
					targets++
				}
			}
			scale := 1 / float32(targets)

			// The one-process model on every row.
			be := cpu.New(1)
			defer be.Close()
			ref, err := hyena.New(be, cfg, rows, T, hyena.Options{})
			if err != nil {
				t.Fatal(err)
			}
			ref.Init(seed)
			ref.ZeroGrad()
			if _, err := ref.Forward(inputs, labels); err != nil {
				t.Fatal(err)
			}
			if err := ref.Backward(scale); err != nil {
				t.Fatal(err)
			}
			want := make([]float32, ref.LocalSize())
			be.Download(want, ref.Grads)

			reshard, err := fsdp.ParseReshard(tc.reshard)
			if err != nil {
				t.Fatal(err)
			}
			st := comm.NewMemStore()
			var wg sync.WaitGroup
			errs := make([]error, ranks)
			losses := make([]float64, ranks)
			var got []float32
			for r := range ranks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[r] = func() error {
						world, err := comm.NewWorld(context.Background(), st, r, ranks, comm.Options{})
						if err != nil {
							return err
						}
						defer world.Close()
						m, err := mesh.New(ranks, tc.deg)
						if err != nil {
							return err
						}
						g, err := parallel.NewGroups(world, m, r)
						if err != nil {
							return err
						}
						plan, err := parallel.PlanPipeline(cfg.NLayer, B, parallel.PipelineSettings{Degree: 1})
						if err != nil {
							return err
						}
						be := cpu.New(1)
						defer be.Close()
						eng, err := parallel.New(be, hyena.Family{Cfg: cfg}, g, parallel.Options{Pipeline: plan, T: T, Reshard: reshard})
						if err != nil {
							return err
						}
						eng.Init(seed)
						d := g.DataRank()
						in, lab := inputs[d*B*T:(d+1)*B*T], labels[d*B*T:(d+1)*B*T]
						if losses[r], err = eng.ForwardBackward(in, lab, 1, scale); err != nil {
							return err
						}
						full, err := eng.GatherFull(eng.Grads())
						if err != nil {
							return err
						}
						if r == 0 {
							got = full
						}
						return nil
					}()
				}()
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			if l := losses[0] * float64(scale); math.Abs(l-ref.LossSum()*float64(scale)) > 1e-6 {
				t.Errorf("job loss %.7f, one process %.7f", l, ref.LossSum()*float64(scale))
			}
			if len(got) != len(want) {
				t.Fatalf("gathered %d gradient elements, want %d", len(got), len(want))
			}
			for _, p := range cfg.Layout() {
				g, w := got[p.Offset:p.Offset+p.Size], want[p.Offset:p.Offset+p.Size]
				var d2, w2 float64
				for i := range w {
					d2 += math.Pow(float64(g[i])-float64(w[i]), 2)
					w2 += float64(w[i]) * float64(w[i])
				}
				if rel := math.Sqrt(d2 / math.Max(w2, 1e-30)); rel > 1e-5 || math.IsNaN(rel) {
					t.Errorf("%s: gradient relative error %.3g", p.Name, rel)
				}
			}
		})
	}
}
