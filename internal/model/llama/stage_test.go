package llama

import (
	"math"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
)

// TestStagesChainLikeTheModel: the model cut into stages, hidden states
// and their gradients handed from stage to stage, gives the whole
// model's loss and gradients bitwise, for several cuts, checkpointing
// policies and logit chunks, with the backward whole or split into
// BackwardInput and a deferred BackwardWeight.
func TestStagesChainLikeTheModel(t *testing.T) {
	cfg := Config{Dim: 32, NLayers: 4, NHeads: 4, NKVHeads: 2, VocabSize: 61, MultipleOf: 16, NormEps: 1e-5, RoPETheta: 10000, MaxSeqLen: 16}
	const B, T = 2, 8
	be := cpu.New(2)
	defer be.Close()
	master := make([]float32, cfg.NumParams())
	InitParams(cfg, 3, master, 0)
	tokens, targets := acBatch(cfg, B*T, 4)

	// whole runs the whole model with logit chunk chunk.
	whole := func(t *testing.T, chunk int) (loss, scale float32, grads []float32) {
		ref, err := New(be, cfg, B, T, Plan{LogitChunk: chunk})
		if err != nil {
			t.Fatal(err)
		}
		be.Upload(ref.Params, master)
		ref.ZeroGrad()
		if loss, err = ref.Forward(tokens, targets); err != nil {
			t.Fatal(err)
		}
		scale = 1 / float32(ref.NumTargets())
		if err := ref.Backward(scale); err != nil {
			t.Fatal(err)
		}
		grads = make([]float32, cfg.NumParams())
		be.Download(grads, ref.Grads)
		return loss, scale, grads
	}

	for _, c := range []struct {
		name  string
		cuts  []int // layers per stage
		ac    ActivationCheckpoint
		split bool // BackwardInput, then BackwardWeight once every stage ran
		chunk int  // logit chunk (0: whole vocabulary)
	}{
		{"2+2", []int{2, 2}, ActivationCheckpoint{}, false, 0},
		{"1+1+1+1", []int{1, 1, 1, 1}, ActivationCheckpoint{}, false, 0},
		{"3+1 full AC", []int{3, 1}, ActivationCheckpoint{Mode: "full"}, false, 0},
		{"1+3 op AC", []int{1, 3}, ActivationCheckpoint{Mode: "selective", SelectiveOption: "op"}, false, 0},
		{"2+2 split", []int{2, 2}, ActivationCheckpoint{}, true, 0},
		{"1+1+2 split chunked", []int{1, 1, 2}, ActivationCheckpoint{}, true, 20},
		{"2+2 split full AC", []int{2, 2}, ActivationCheckpoint{Mode: "full"}, true, 0},
		{"1+3 split op AC chunked", []int{1, 3}, ActivationCheckpoint{Mode: "selective", SelectiveOption: "op"}, true, 20},
		{"3+1 split every 2nd layer", []int{3, 1}, ActivationCheckpoint{Mode: "selective", SelectiveOption: "2"}, true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			refLoss, scale, want := whole(t, c.chunk)
			params := be.Alloc(backend.Float32, len(master))
			grads := be.Alloc(backend.Float32, len(master))
			be.Upload(params, master)
			be.Zero(grads)
			var stages []*Model
			first := 0
			for i, n := range c.cuts {
				spec := StageSpec{FirstLayer: first, NumLayers: n, Embedding: i == 0, Head: i == len(c.cuts)-1}
				first += n
				s, err := New(be, cfg, B, T, Plan{Stage: &spec, External: true, Checkpoint: c.ac, LogitChunk: c.chunk})
				if err != nil {
					t.Fatal(err)
				}
				lo, hi := spec.Range(cfg)
				s.Bind(params.Slice(lo, hi-lo), grads.Slice(lo, hi-lo))
				stages = append(stages, s)
			}
			var sum float64
			var n int
			var err error
			for i, s := range stages {
				if i > 0 {
					be.Copy(s.Input(), stages[i-1].Output())
				}
				if _, err = s.Forward(tokens, targets); err != nil {
					t.Fatal(err)
				}
				sum, n = s.LossSum(), s.NumTargets()
			}
			if got := float32(sum / float64(n)); got != refLoss {
				t.Errorf("loss %v, whole model %v", got, refLoss)
			}
			for i := len(stages) - 1; i >= 0; i-- {
				if i < len(stages)-1 {
					be.Copy(stages[i].GradOutput(), stages[i+1].GradInput())
				}
				backward := stages[i].Backward
				if c.split {
					backward = stages[i].BackwardInput
				}
				if err := backward(scale); err != nil {
					t.Fatal(err)
				}
			}
			if !stages[0].CanSplit() {
				t.Errorf("CanSplit() = false under activation checkpointing %q", c.ac.Mode)
			}
			for _, s := range stages {
				if err := s.BackwardWeight(); err != nil {
					t.Fatal(err)
				}
			}
			got := make([]float32, len(master))
			be.Download(got, grads)
			for i := range got {
				if got[i] != want[i] && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
					t.Fatalf("gradient %d: %v, whole model %v", i, got[i], want[i])
				}
			}
		})
	}
}

// TestStageRange: stage ranges tile the flat layout.
func TestStageRange(t *testing.T) {
	cfg := Config{Dim: 32, NLayers: 4, NHeads: 4, VocabSize: 61, MultipleOf: 16, NormEps: 1e-5, RoPETheta: 10000, MaxSeqLen: 16}
	next := 0
	for i := range 4 {
		lo, hi := StageSpec{FirstLayer: i, NumLayers: 1, Embedding: i == 0, Head: i == 3}.Range(cfg)
		if lo != next || hi <= lo {
			t.Fatalf("stage %d: range [%d, %d), want it to start at %d", i, lo, hi, next)
		}
		next = hi
	}
	if next != int(cfg.NumParams()) {
		t.Fatalf("stages end at %d, the layout has %d elements", next, cfg.NumParams())
	}
}
