package fsdp

import (
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/optim"
)

// BenchmarkFSDPStep times one training step (forward, backward, gradient
// reduction, AdamW on the shards) of the tiny_bench model under FSDP over
// 2 in-process ranks of one thread each, with communication overlapped
// (prefetched gathers, reduce-scatters behind the backward) and with every
// collective waited for as soon as it is issued.
func BenchmarkFSDPStep(b *testing.B) {
	cfg, err := llama.Flavor("tiny_bench")
	if err != nil {
		b.Fatal(err)
	}
	const ranks, B, T = 2, 2, 64
	for _, mode := range []struct {
		name     string
		blocking bool
	}{{"overlap", false}, {"blocking", true}} {
		b.Run(mode.name, func(b *testing.B) {
			var ready sync.WaitGroup
			ready.Add(ranks)
			start := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				world(b, 1, ranks, func(rank int, c Config) error {
					c.Blocking = mode.blocking
					be := cpu.New(1)
					defer be.Close()
					m, err := llama.New(be, cfg, B, T, llama.Plan{External: true})
					if err != nil {
						ready.Done()
						return err
					}
					rt, err := shard(be, m, c, 1)
					if err != nil {
						ready.Done()
						return err
					}
					opt := optim.NewAdamW(be, rt.Len, optim.AdamWConfig{LR: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8})
					tok, tgt := batch(cfg, B, T, rank)
					ready.Done()
					<-start
					for i := 0; i < b.N; i++ {
						rt.ZeroGrad()
						if _, err := m.Forward(tok, tgt); err != nil {
							return err
						}
						if err := m.Backward(1 / float32(B*T*ranks)); err != nil {
							return err
						}
						if err := rt.Finish(); err != nil {
							return err
						}
						if err := opt.Update(rt.Params, rt.Grads, 1e-4, 1); err != nil {
							return err
						}
						rt.Invalidate()
					}
					return nil
				})
			}()
			ready.Wait()
			b.ResetTimer()
			close(start)
			<-done
		})
	}
}
