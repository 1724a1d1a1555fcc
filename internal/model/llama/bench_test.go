package llama

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/float8"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/optim"
)

// BenchmarkTrainStep times one full training step (forward, backward,
// gradient norm, AdamW) of the tiny_bench flavor at batch 8 × seq 256,
// the model PyTorch is compared against (bench/pytorch/train_step.py).
func BenchmarkTrainStep(b *testing.B) { benchTrainStep(b, Plan{}) }

// BenchmarkActivationCheckpointing times the same training step under
// each activation checkpointing policy and reports its activation memory.
func BenchmarkActivationCheckpointing(b *testing.B) {
	for _, ac := range []ActivationCheckpoint{
		{Mode: "none"}, {Mode: "full"},
		{Mode: "selective", SelectiveOption: "2"}, {Mode: "selective", SelectiveOption: "op"},
	} {
		b.Run(strings.ReplaceAll(ac.String(), " ", "_"), func(b *testing.B) {
			benchTrainStep(b, Plan{Checkpoint: ac})
		})
	}
}

// BenchmarkTrainStepPrecision times the training step in float32, in
// bfloat16 mixed precision and with each float8 recipe (bfloat16
// elsewhere). (The bfloat16 rounding of the parameters that the engine
// binds costs one conversion per step, not timed here.)
func BenchmarkTrainStepPrecision(b *testing.B) {
	b.Run("float32", func(b *testing.B) { benchTrainStep(b, Plan{}) })
	b.Run("bfloat16", func(b *testing.B) {
		benchTrainStep(b, Plan{Precision: model.Precision{Param: backend.BFloat16}})
	})
	for i, name := range float8.Recipes {
		b.Run("float8_"+name, func(b *testing.B) {
			benchTrainStep(b, Plan{Precision: model.Precision{Param: backend.BFloat16,
				Float8: &float8.Config{Recipe: float8.Recipe(i), FilterFQNs: []string{"output"}}}})
		})
	}
}

func benchTrainStep(b *testing.B, mopt Plan) {
	be := cpu.New(0)
	defer be.Close()
	step, m := newBenchStep(b, be, mopt)
	step() // warm-up
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		step()
	}
	sec := time.Since(start).Seconds() / float64(b.N)
	tokens := float64(m.B * m.T)
	b.ReportMetric(tokens/sec, "tokens/s")
	b.ReportMetric(m.Cfg.FLOPsPerToken(m.T)*tokens/sec/1e9, "GFLOP/s")
	b.ReportMetric(float64(m.ActivationBytes())/(1<<20), "act-MiB")
}

// BenchmarkTrainStepBF16Ratio times the tiny_bench training step in
// float32 and in bfloat16 mixed precision alternately, step by step on
// one backend, so that both see the same machine (a shared or throttled
// host moves absolute times by ±10% from run to run): bf16/f32 is the
// float32 steps' total time over the bfloat16 steps'.
func BenchmarkTrainStepBF16Ratio(b *testing.B) {
	be := cpu.New(0)
	defer be.Close()
	step32, m := newBenchStep(b, be, Plan{})
	step16, _ := newBenchStep(b, be, Plan{Precision: model.Precision{Param: backend.BFloat16}})
	step32()
	step16()
	var t32, t16 time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		step32()
		mid := time.Now()
		step16()
		t32, t16 = t32+mid.Sub(start), t16+time.Since(mid)
	}
	tokens := float64(m.B*m.T) * float64(b.N)
	b.ReportMetric(tokens/t32.Seconds(), "f32-tokens/s")
	b.ReportMetric(tokens/t16.Seconds(), "bf16-tokens/s")
	b.ReportMetric(t32.Seconds()/t16.Seconds(), "bf16/f32")
}

// newBenchStep builds the tiny_bench model (batch 8 × 256) on be under
// mopt with an AdamW optimizer and returns one training step on fixed
// random tokens.
func newBenchStep(b *testing.B, be *cpu.Backend, mopt Plan) (func(), *Model) {
	cfg, err := Flavor("tiny_bench")
	if err != nil {
		b.Fatal(err)
	}
	B, T := 8, 256
	m, err := New(be, cfg, B, T, mopt)
	if err != nil {
		b.Fatal(err)
	}
	m.Init(0)
	opt := optim.NewAdamW(be, m.Params.Len, optim.AdamWConfig{LR: 3e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1})
	r := rand.New(rand.NewPCG(0, 0))
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	for i := range tokens {
		tokens[i], targets[i] = int32(r.IntN(cfg.VocabSize)), int32(r.IntN(cfg.VocabSize))
	}
	return func() {
		if _, err := m.Forward(tokens, targets); err != nil {
			b.Fatal(err)
		}
		m.ZeroGrad()
		if err := m.Backward(1 / float32(m.NumTargets())); err != nil {
			b.Fatal(err)
		}
		_, scale := optim.ClipScale(be.SumSquares(m.Grads), 1)
		if err := opt.Update(m.Params, m.Grads, 3e-4, scale); err != nil {
			b.Fatal(err)
		}
	}, m
}
