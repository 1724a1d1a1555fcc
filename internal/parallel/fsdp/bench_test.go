package fsdp

import (
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/optim"
)

// BenchmarkFSDPStep times one training step (forward, backward, gradient
// reduction, AdamW on the shards) of the tiny_bench model under FSDP over
// 2 in-process ranks of one thread each, with communication overlapped
// (prefetched gathers, reduce-scatters behind the backward) and with every
// collective waited for as soon as it is issued.
func BenchmarkFSDPStep(b *testing.B) {
	for _, mode := range []struct {
		name     string
		blocking bool
	}{{"overlap", false}, {"blocking", true}} {
		b.Run(mode.name, func(b *testing.B) {
			benchStep(b, llama.Plan{}, func(c *Config, m *llama.Model) { c.Blocking = mode.blocking })
		})
	}
}

// BenchmarkFSDPFloat8Step is BenchmarkFSDPStep (overlapped) with
// tensorwise float8 linear layers in bfloat16 mixed precision, gathering
// the float8 weights in bfloat16, in float8 with one amax all-reduce per
// weight and gather, and in float8 with the scales precomputed once per
// step.
func BenchmarkFSDPFloat8Step(b *testing.B) {
	plan := llama.Plan{Precision: model.Precision{Param: backend.BFloat16, Float8: &float8.Config{Recipe: float8.Tensorwise}}}
	for _, mode := range []struct {
		name         string
		gather8, pre bool
	}{{"bfloat16_gather", false, false}, {"float8_gather", true, false}, {"float8_precomputed", true, true}} {
		b.Run(mode.name, func(b *testing.B) {
			benchStep(b, plan, func(c *Config, m *llama.Model) {
				c.Param = backend.BFloat16
				for u := range m.Units() {
					var ws []Range
					for _, w := range m.Float8Weights(u) {
						ws = append(ws, Range{w.Lo, w.Hi})
					}
					c.Float8 = append(c.Float8, ws)
				}
				c.Float8AllGather, c.PrecomputeScales = mode.gather8, mode.pre
				c.BindScales = m.BindFloat8Scales
			})
		})
	}
}

// benchStep times training steps of tiny_bench built with plan (External
// set) over 2 in-process ranks of one thread each, the runtime configured
// by configure.
func benchStep(b *testing.B, plan llama.Plan, configure func(c *Config, m *llama.Model)) {
	cfg, err := llama.Flavor("tiny_bench")
	if err != nil {
		b.Fatal(err)
	}
	const ranks, B, T = 2, 2, 64
	plan.External = true
	var ready sync.WaitGroup
	ready.Add(ranks)
	start := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		world(b, 1, ranks, func(rank int, c Config) error {
			be := cpu.New(1)
			defer be.Close()
			m, err := llama.New(be, cfg, B, T, plan)
			if err != nil {
				ready.Done()
				return err
			}
			configure(&c, m)
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
}
