package pipeline

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/comm"
)

// addStage is a stage of n elements per microbatch that adds its stage
// number plus one: the first stage starts from the tokens, the last
// stage's loss is the sum of its output. Its backward passes the output
// gradient through (the last stage's is 1).
type addStage struct {
	be                 backend.Backend
	stage, last        int
	in, out, gout, gin backend.Tensor
	loss               float64
}

func newAddStage(be backend.Backend, stage, last, n int) *addStage {
	return &addStage{be: be, stage: stage, last: last, in: be.Alloc(backend.Float32, n), out: be.Alloc(backend.Float32, n),
		gout: be.Alloc(backend.Float32, n), gin: be.Alloc(backend.Float32, n)}
}

func (s *addStage) Forward(tokens, targets []int32) error {
	x := make([]float32, s.in.Len)
	if s.stage == 0 {
		for i := range x {
			x[i] = float32(tokens[i])
		}
	} else {
		s.be.Download(x, s.in)
	}
	s.loss = 0
	for i := range x {
		x[i] += float32(s.stage + 1)
		s.loss += float64(x[i])
	}
	s.be.Upload(s.out, x)
	return nil
}

func (s *addStage) LossSum() float64 { return s.loss }
func (s *addStage) Backward(scale float32) error {
	g := make([]float32, s.in.Len)
	if s.stage == s.last {
		for i := range g {
			g[i] = scale
		}
	} else {
		s.be.Download(g, s.gout)
	}
	s.be.Upload(s.gin, g)
	return nil
}
func (s *addStage) BackwardInput(scale float32) error { return s.Backward(scale) }
func (s *addStage) BackwardWeight() error             { return nil }
func (s *addStage) ReserveSplit(int)                  {}
func (s *addStage) Input() backend.Tensor             { return s.in }
func (s *addStage) Output() backend.Tensor            { return s.out }
func (s *addStage) GradOutput() backend.Tensor        { return s.gout }
func (s *addStage) GradInput() backend.Tensor         { return s.gin }

// TestExecutorReusesTransferBuffers runs schedules on two in-process
// ranks over TCP and checks that the transfers deliver each microbatch
// (the loss is the direct sum), that the receiving side holds at most the
// buffers MessageBuffers plans (the figure memplan counts), that every
// buffer is back in the pool after a pass, and that later passes reuse
// them.
func TestExecutorReusesTransferBuffers(t *testing.T) {
	const n, per = 64, 64 // elements per transfer, tokens per microbatch
	for _, c := range []struct {
		name     string
		pp, v, m int
	}{{"GPipe", 2, 1, 4}, {"1F1B", 2, 1, 8}, {"Interleaved1F1B", 2, 2, 8}, {"ZBVZeroBubble", 2, 2, 4}, {"InterleavedZeroBubble", 2, 2, 4}} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Build(c.name, c.pp, c.v, c.m, nil)
			if err != nil {
				t.Fatal(err)
			}
			S := s.NumStages()
			tokens := make([]int32, c.m*per)
			var want float64
			for i := range tokens {
				tokens[i] = int32(i % 7)
				want += float64(tokens[i]) + float64(S*(S+1)/2)
			}
			st := comm.NewMemStore()
			var wg sync.WaitGroup
			loss := make([]float64, c.pp)
			errs := make([]error, c.pp)
			xs := make([]*Executor, c.pp)
			for r := range c.pp {
				wg.Add(1)
				go func() {
					defer wg.Done()
					g, err := comm.NewWorld(context.Background(), st, r, c.pp, comm.Options{Transport: "tcp", InitTimeout: 10 * time.Second})
					if err != nil {
						errs[r] = err
						return
					}
					defer g.Close()
					be := cpu.New(1)
					x, err := NewExecutor(be, s, g, r, func(stage int) (Stage, error) { return newAddStage(be, stage, S-1, n), nil })
					if err != nil {
						errs[r] = err
						return
					}
					xs[r] = x
					for range 3 {
						l, err := x.Run(s.Actions, tokens, tokens, per, 1, true)
						if err != nil {
							errs[r] = err
							return
						}
						loss[r] += l / 3
					}
				}()
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			if got := loss[0] + loss[1]; math.Abs(got-want) > 1e-9*want {
				t.Errorf("loss %g, want %g", got, want)
			}
			for r, x := range xs {
				alloc, held := x.Buffers()
				if plan := s.MessageBuffers(r); held != plan {
					t.Errorf("rank %d: held %d transfer buffers at most, MessageBuffers plans %d", r, held, plan)
				}
				if len(x.pool) != alloc || x.held != 0 {
					t.Errorf("rank %d: %d of %d buffers back in the pool, %d still held", r, len(x.pool), alloc, x.held)
				}
				// Every transfer of a pass (one per action that sends or
				// receives) would be an allocation without reuse.
				var transfers int
				for _, a := range s.Actions[r] {
					if _, ok := s.wants(a); ok {
						transfers++
					}
					if _, ok := s.outbound(a); ok {
						transfers++
					}
				}
				if alloc >= transfers {
					t.Errorf("rank %d: %d buffers allocated over 3 passes of %d transfers each", r, alloc, transfers)
				}
				t.Logf("rank %d: %d buffers allocated (%d held at most on the receiving side), %d transfers per pass", r, alloc, held, transfers)
			}
		})
	}
}
