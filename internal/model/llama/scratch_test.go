package llama

import (
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/model"
)

// TestSetsShareTheScratch: two activation sets of one stage sharing a
// model.ActivationScratch, run as a pipeline rank interleaves them (both
// forwards, then both backwards, the backward whole or split), give the
// losses and gradients of two models with their own scratch run one
// after the other with their backward whole, bitwise, under every
// checkpointing policy and with the logits whole or chunked; a set whose recomputed layer another
// set's pass overwrote recomputes it. Each set allocates only what it
// keeps, the scratch ScratchLen once.
func TestSetsShareTheScratch(t *testing.T) {
	cfg := Config{Dim: 32, NLayers: 4, NHeads: 4, NKVHeads: 2, VocabSize: 61, MultipleOf: 16, NormEps: 1e-5, RoPETheta: 10000, MaxSeqLen: 16}
	const B, T = 2, 8
	be := cpu.New(2)
	defer be.Close()
	master := make([]float32, cfg.NumParams())
	InitParams(cfg, 5, master, 0)
	batch := [2][2][]int32{}
	for i := range batch {
		batch[i][0], batch[i][1] = acBatch(cfg, B*T, uint64(10+i))
	}
	type result struct {
		loss       [2]float32
		grads      []float32
		recomputed [2]int
	}
	run := func(t *testing.T, plan Plan, shared, split bool) result {
		params, grads := be.Alloc(backend.Float32, len(master)), be.Alloc(backend.Float32, len(master))
		be.Upload(params, master)
		be.Zero(grads)
		plan.External = true
		var sc *model.ActivationScratch
		if shared {
			sc = &model.ActivationScratch{}
			plan.Scratch = sc
		}
		var sets [2]*Model
		for i := range sets {
			m, err := New(be, cfg, B, T, plan)
			if err != nil {
				t.Fatal(err)
			}
			m.Bind(params, grads)
			sets[i] = m
		}
		if shared {
			total, _ := ActivationBytesFor(cfg, B, T, plan)
			n, nh, _ := ScratchLen(cfg, B, T, plan)
			sh := int64(n)*4 + int64(nh)*2
			got := sets[0].ActivationBytes() + sets[1].ActivationBytes() + sc.Bytes()
			if sc.Bytes() != sh || got != 2*total-sh || sh <= 0 {
				t.Errorf("sets %d + %d bytes and scratch %d, want 2×%d - %d shared", sets[0].ActivationBytes(), sets[1].ActivationBytes(), sc.Bytes(), total, sh)
			}
		}
		var r result
		fwd := func(i int) {
			var err error
			if r.loss[i], err = sets[i].Forward(batch[i][0], batch[i][1]); err != nil {
				t.Fatal(err)
			}
		}
		bwd := func(i int) {
			var err error
			if split {
				err = sets[i].BackwardInput(1.0 / 32)
			} else {
				err = sets[i].Backward(1.0 / 32)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if shared {
			fwd(0)
			fwd(1)
			bwd(0)
			bwd(1)
		} else {
			fwd(0)
			bwd(0)
			fwd(1)
			bwd(1)
		}
		for i := range sets {
			if err := sets[i].BackwardWeight(); err != nil {
				t.Fatal(err)
			}
			r.recomputed[i] = sets[i].recomputed
		}
		r.grads = make([]float32, len(master))
		be.Download(r.grads, grads)
		return r
	}
	for _, c := range []struct {
		name  string
		ac    ActivationCheckpoint
		chunk int
		split bool
		// recomputes is each set's recomputations when shared: every
		// checkpointed layer, the last one included (the other set's pass
		// overwrote it); alone, a model skips its last one.
		recomputes int
	}{
		{"none", ActivationCheckpoint{}, 0, false, 0},
		{"none split", ActivationCheckpoint{}, 0, true, 0},
		{"none chunked split", ActivationCheckpoint{}, 20, true, 0},
		{"full", ActivationCheckpoint{Mode: "full"}, 0, false, 4},
		{"full chunked", ActivationCheckpoint{Mode: "full"}, 20, false, 4},
		{"selective 2", ActivationCheckpoint{Mode: "selective", SelectiveOption: "2"}, 0, false, 2},
		{"selective op", ActivationCheckpoint{Mode: "selective", SelectiveOption: "op"}, 0, false, 4},
		{"full split", ActivationCheckpoint{Mode: "full"}, 0, true, 4},
		{"selective 2 chunked split", ActivationCheckpoint{Mode: "selective", SelectiveOption: "2"}, 20, true, 2},
		{"selective op split", ActivationCheckpoint{Mode: "selective", SelectiveOption: "op"}, 0, true, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan := Plan{Checkpoint: c.ac, LogitChunk: c.chunk}
			want := run(t, plan, false, false) // each set alone, backward whole
			got := run(t, plan, true, c.split)
			if got.loss != want.loss {
				t.Errorf("losses %v, want %v", got.loss, want.loss)
			}
			for i := range want.grads {
				if got.grads[i] != want.grads[i] {
					t.Fatalf("gradient %d: %g, want %g", i, got.grads[i], want.grads[i])
				}
			}
			if got.recomputed != [2]int{c.recomputes, c.recomputes} || want.recomputed[0] != max(c.recomputes-1, 0) {
				t.Errorf("recomputations %v shared, %v alone; want %d each shared, one fewer alone", got.recomputed, want.recomputed, c.recomputes)
			}
		})
	}
}
