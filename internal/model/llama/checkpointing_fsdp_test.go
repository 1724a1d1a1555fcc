package llama_test

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/parallel/fsdp"
)

// TestCheckpointingUnderFSDP: with parameters sharded over two in-process
// ranks and gathered unit by unit (both reshard policies), every
// activation checkpointing policy gives bitwise the losses and sharded
// gradients of keeping every activation.
func TestCheckpointingUnderFSDP(t *testing.T) {
	cfg, _ := llama.Flavor("tiny")
	cfg.NLayers = 4
	const ranks, B, T = 2, 1, 8
	type result struct {
		losses []float32
		grads  []float32
	}
	run := func(ac llama.ActivationCheckpoint, reshard fsdp.Reshard) [ranks]result {
		var out [ranks]result
		st := comm.NewMemStore()
		errs := make([]error, ranks)
		var wg sync.WaitGroup
		for r := range ranks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = func() error {
					g, err := comm.NewWorld(context.Background(), st, r, ranks, comm.Options{})
					if err != nil {
						return err
					}
					defer g.Close()
					be := cpu.New(1)
					defer be.Close()
					m, err := llama.New(be, cfg, B, T, llama.Plan{External: true, Checkpoint: ac})
					if err != nil {
						return err
					}
					var units []fsdp.Range
					for _, u := range m.Units() {
						units = append(units, fsdp.Range{Lo: u.Lo, Hi: u.Hi})
					}
					rt, err := fsdp.New(be, units, m.BindUnit, fsdp.Config{Shard: g, Reshard: reshard})
					if err != nil {
						return err
					}
					m.Hooks = rt
					rt.Init(func(lo int, dst []float32) { m.InitLocal(11, dst, lo) })
					rt.ZeroGrad()
					for mb := range 2 {
						tok, tgt := make([]int32, B*T), make([]int32, B*T)
						for i := range tok {
							tok[i] = int32((i*7 + r*13 + mb*5 + i*i) % cfg.VocabSize)
							tgt[i] = int32((i*5 + r*3 + mb + 1) % cfg.VocabSize)
						}
						loss, err := m.Forward(tok, tgt)
						if err != nil {
							return err
						}
						out[r].losses = append(out[r].losses, loss)
						if err := m.Backward(1 / float32(2*ranks*B*T)); err != nil {
							return err
						}
					}
					if err := rt.Finish(); err != nil {
						return err
					}
					out[r].grads = make([]float32, rt.Grads.Len)
					be.Download(out[r].grads, rt.Grads)
					return nil
				}()
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("%v: rank %d: %v", ac, r, err)
			}
		}
		return out
	}
	for _, policy := range []string{"always", "never"} {
		reshard, _ := fsdp.ParseReshard(policy)
		t.Run("reshard_"+policy, func(t *testing.T) {
			ref := run(llama.ActivationCheckpoint{Mode: "none"}, reshard)
			for _, ac := range []llama.ActivationCheckpoint{
				{Mode: "full"}, {Mode: "selective", SelectiveOption: "2"}, {Mode: "selective", SelectiveOption: "op"},
			} {
				got := run(ac, reshard)
				for r := range ranks {
					for i, l := range ref[r].losses {
						if math.Float32bits(got[r].losses[i]) != math.Float32bits(l) {
							t.Errorf("%v rank %d: microbatch %d loss %v, none %v", ac, r, i, got[r].losses[i], l)
						}
					}
					for i, g := range ref[r].grads {
						if math.Float32bits(got[r].grads[i]) != math.Float32bits(g) {
							t.Errorf("%v rank %d: gradient shard element %d is %v, none %v", ac, r, i, got[r].grads[i], g)
							break
						}
					}
				}
			}
		})
	}
}
