package llama

import (
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
)

// TestStageShardRange: the stages' ranges of a tp rank's flat buffer
// tile it in order, their layouts agree with the whole layout, and with
// tp = 1 they are the full layout's ranges.
func TestStageShardRange(t *testing.T) {
	cfg := parallelTestConfig()
	cfg.NLayers = 4
	specs := []StageSpec{{0, 1, true, false}, {1, 2, false, false}, {3, 1, false, true}}
	for _, tp := range []int{1, 2, 4} {
		lay := cfg.ShardLayout(tp)
		total := lay[len(lay)-1].LocalOffset + lay[len(lay)-1].LocalSize
		next, idx := 0, 0
		for _, s := range specs {
			lo, hi := s.ShardRange(cfg, tp)
			if lo != next {
				t.Errorf("tp %d stage %+v starts at %d, want %d", tp, s, lo, next)
			}
			for _, p := range cfg.LocalLayout(tp, s) {
				w := lay[idx]
				if p.Name != w.Name || p.LocalOffset+lo != w.LocalOffset || p.LocalSize != w.LocalSize {
					t.Errorf("tp %d stage %+v: parameter %s at %d+%d, whole layout %s at %d", tp, s, p.Name, lo, p.LocalOffset, w.Name, w.LocalOffset)
				}
				idx++
			}
			if tp == 1 {
				if flo, fhi := s.Range(cfg); flo != lo || fhi != hi {
					t.Errorf("stage %+v: shard range [%d, %d), range [%d, %d)", s, lo, hi, flo, fhi)
				}
			}
			next = hi
		}
		if next != total || idx != len(lay) {
			t.Errorf("tp %d: stages end at %d after %d parameters, want %d and %d", tp, next, idx, total, len(lay))
		}
	}
}

// TestShardedStagesChainLikeSharded: a tensor- and context-parallel model
// cut into pipeline stages, each rank handing its sequence-parallel rows
// of the hidden states and their gradients from stage to stage, gives
// each rank the loss and the gradients of the uncut Sharded model,
// bitwise.
func TestShardedStagesChainLikeSharded(t *testing.T) {
	cfg := parallelTestConfig()
	cfg.NLayers = 3
	const B, T, seed = 2, 16, 7
	tokens, targets := make([]int32, B*T), make([]int32, B*T)
	for i := range tokens {
		tokens[i] = int32((i*37 + 11) % cfg.VocabSize)
		targets[i] = int32((i*53 + 5) % cfg.VocabSize)
	}
	targets[5] = -1
	full := make([]float32, cfg.NumParams())
	InitParams(cfg, seed, full, 0)
	specs := []StageSpec{{0, 1, true, false}, {1, 1, false, false}, {2, 1, false, true}}
	for _, c := range []struct{ tp, cp int }{{1, 1}, {2, 1}, {2, 2}} {
		// run trains rank (tr, cr) uncut (stages nil) or cut, and returns
		// its loss sum and flat gradients.
		run := func(stages bool) ([][]float64, [][][]float32, error) {
			tpGroups, cpGroups := make([]*fakeGroup, c.cp), make([]*fakeGroup, c.tp)
			for i := range tpGroups {
				tpGroups[i] = newFakeGroup(c.tp)
			}
			for i := range cpGroups {
				cpGroups[i] = newFakeGroup(c.cp)
			}
			losses := make([][]float64, c.cp)
			grads := make([][][]float32, c.cp)
			errs := make([]error, c.tp*c.cp)
			var wg sync.WaitGroup
			for cr := 0; cr < c.cp; cr++ {
				losses[cr], grads[cr] = make([]float64, c.tp), make([][]float32, c.tp)
				for tr := 0; tr < c.tp; tr++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						fc := &fakeComm{tp: tpGroups[cr], cp: cpGroups[tr], tpRank: tr, cpRank: cr}
						be := cpu.New(1)
						plan := Plan{TP: c.tp, TPRank: tr, CP: c.cp, CPRank: cr, Comm: fc}
						tok, tgt := CPSlice(tokens, T, c.cp, cr), CPSlice(targets, T, c.cp, cr)
						shard := ShardFlat(cfg, c.tp, tr, full)
						err := func() error {
							if !stages {
								m, err := New(be, cfg, B, T, plan)
								if err != nil {
									return err
								}
								be.Upload(m.Params, shard)
								if _, err := m.Forward(tok, tgt); err != nil {
									return err
								}
								if err := m.Backward(0.01); err != nil {
									return err
								}
								if err := reduceReplicated(m); err != nil {
									return err
								}
								losses[cr][tr] = m.LossSum()
								grads[cr][tr] = make([]float32, m.Grads.Len)
								be.Download(grads[cr][tr], m.Grads)
								return nil
							}
							grads[cr][tr] = make([]float32, len(shard))
							ms := make([]*Model, len(specs))
							gts := make([]backend.Tensor, len(specs))
							for i, s := range specs {
								plan.Stage = &s
								m, err := New(be, cfg, B, T, plan)
								if err != nil {
									return err
								}
								lo, hi := s.ShardRange(cfg, c.tp)
								p, g := be.Alloc(backend.Float32, hi-lo), be.Alloc(backend.Float32, hi-lo)
								be.Upload(p, shard[lo:hi])
								m.Bind(p, g)
								ms[i], gts[i] = m, g
							}
							h := make([]float32, ms[0].Output().Len)
							for i, m := range ms {
								if i > 0 {
									be.Download(h, ms[i-1].Output())
									be.Upload(m.Input(), h)
								}
								if _, err := m.Forward(tok, tgt); err != nil {
									return err
								}
							}
							for i := len(ms) - 1; i >= 0; i-- {
								m := ms[i]
								if i < len(ms)-1 {
									be.Download(h, ms[i+1].GradInput())
									be.Upload(m.GradOutput(), h)
								}
								if err := m.Backward(0.01); err != nil {
									return err
								}
								if err := reduceReplicated(m); err != nil {
									return err
								}
								lo, hi := specs[i].ShardRange(cfg, c.tp)
								be.Download(grads[cr][tr][lo:hi], gts[i])
							}
							losses[cr][tr] = ms[len(ms)-1].LossSum()
							return nil
						}()
						errs[cr*c.tp+tr] = err
					}()
				}
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					return nil, nil, err
				}
			}
			return losses, grads, nil
		}
		wantL, wantG, err := run(false)
		if err != nil {
			t.Fatalf("tp %d cp %d uncut: %v", c.tp, c.cp, err)
		}
		gotL, gotG, err := run(true)
		if err != nil {
			t.Fatalf("tp %d cp %d stages: %v", c.tp, c.cp, err)
		}
		for cr := range wantL {
			for tr := range wantL[cr] {
				if gotL[cr][tr] != wantL[cr][tr] {
					t.Errorf("tp %d cp %d rank (%d, %d): loss sum %.9g in stages, %.9g uncut", c.tp, c.cp, tr, cr, gotL[cr][tr], wantL[cr][tr])
				}
				for i, w := range wantG[cr][tr] {
					if gotG[cr][tr][i] != w {
						t.Errorf("tp %d cp %d rank (%d, %d): gradient %d is %g in stages, %g uncut", c.tp, c.cp, tr, cr, i, gotG[cr][tr][i], w)
						break
					}
				}
			}
		}
	}
}
