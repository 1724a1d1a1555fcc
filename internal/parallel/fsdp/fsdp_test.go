package fsdp

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/mesh"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/modelfile"
)

// small is a model small enough for many in-process ranks; its units have
// sizes that do not divide evenly by 3 or 4.
func small() llama.Config {
	return llama.Config{Dim: 32, NLayers: 2, NHeads: 2, VocabSize: 67, MultipleOf: 16,
		NormEps: 1e-5, RoPETheta: 10000, MaxSeqLen: 64}
}

// TestLayout: the units tile the flat buffer, and for every shard count
// the ranks' shards tile each unit, in rank order, differing in length by
// at most one element.
func TestLayout(t *testing.T) {
	cfg := small()
	units := cfg.Units()
	if len(units) != cfg.NLayers+2 || units[0].Lo != 0 || units[len(units)-1].Hi != int(cfg.NumParams()) {
		t.Fatalf("units %v do not span the %d parameters", units, cfg.NumParams())
	}
	for i := 1; i < len(units); i++ {
		if units[i].Lo != units[i-1].Hi {
			t.Fatalf("units %d and %d are not adjacent: %v", i-1, i, units)
		}
	}
	for _, parts := range []int{1, 2, 3, 4, 7} {
		t.Run(fmt.Sprint(parts), func(t *testing.T) {
			total := 0
			lays := make([]Layout, parts)
			for r := range parts {
				l, err := NewLayout(unitRanges(cfg.ShardLayout(1)), parts, r)
				if err != nil {
					t.Fatal(err)
				}
				lays[r] = l
				total += l.Len
				off := 0
				for u, s := range l.Shards {
					if l.Local[u] != off {
						t.Errorf("rank %d unit %d: local offset %d, want %d", r, u, l.Local[u], off)
					}
					off += s.Len()
				}
				if off != l.Len {
					t.Errorf("rank %d: Len %d, shards sum to %d", r, l.Len, off)
				}
			}
			if total != int(cfg.NumParams()) {
				t.Errorf("shards hold %d elements, the model %d", total, cfg.NumParams())
			}
			for u, unit := range units {
				next, minLen, maxLen := unit.Lo, math.MaxInt, 0
				for r := range parts {
					s := lays[r].Shards[u]
					if s.Lo != next {
						t.Errorf("unit %d rank %d starts at %d, want %d", u, r, s.Lo, next)
					}
					next = s.Hi
					minLen, maxLen = min(minLen, s.Len()), max(maxLen, s.Len())
				}
				if next != unit.Hi || maxLen-minLen > 1 {
					t.Errorf("unit %d %v: shards end at %d, lengths %d..%d", u, unit, next, minLen, maxLen)
				}
			}
		})
	}
	if _, err := NewLayout(unitRanges(cfg.ShardLayout(1)), 2, 2); err == nil {
		t.Error("rank 2 of 2 shards was accepted")
	}
	for _, s := range []string{"", "default", "always", "never"} {
		if _, err := ParseReshard(s); err != nil {
			t.Errorf("ParseReshard(%q): %v", s, err)
		}
	}
	if _, err := ParseReshard("sometimes"); err == nil {
		t.Error("ParseReshard accepted sometimes")
	}
}

// TestReadRangeReshards: a checkpoint of whole tensors loads into the
// shards of any layout bit for bit, reading each rank's ranges only.
func TestReadRangeReshards(t *testing.T) {
	cfg := small()
	full := make([]float32, cfg.NumParams())
	llama.InitParams(cfg, 7, full, 0)
	folder := t.TempDir()
	if err := checkpoint.Save(folder, 1, modelfile.PrefixedShards("model/", llama.Family{Cfg: cfg}.Tensors(), full), nil); err != nil {
		t.Fatal(err)
	}
	r, err := checkpoint.Open(checkpoint.StepDir(folder, 1))
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range []int{1, 2} {
		for tr := range tp {
			lay := cfg.ShardLayout(tp)
			want := llama.ShardFlat(cfg, tp, tr, full)
			for _, parts := range []int{1, 2, 3, 4} {
				for rank := range parts {
					l, _ := NewLayout(unitRanges(cfg.LocalLayout(tp, llama.StageSpec{NumLayers: cfg.NLayers, Embedding: true, Head: true})), parts, rank)
					loc := make([]float32, l.Len)
					for u, s := range l.Shards {
						if err := llama.ReadLocal(r, "model/", lay, tp, tr, s.Lo, loc[l.Local[u]:l.Local[u]+s.Len()]); err != nil {
							t.Fatal(err)
						}
						for i := 0; i < s.Len(); i++ {
							if math.Float32bits(loc[l.Local[u]+i]) != math.Float32bits(want[s.Lo+i]) {
								t.Fatalf("tp %d rank %d, %d shards, rank %d, unit %d, element %d: read %v, saved %v", tp, tr, parts, rank, u, s.Lo+i, loc[l.Local[u]+i], want[s.Lo+i])
							}
						}
					}
				}
			}
		}
	}
	if err := llama.ReadLocal(r, "optimizer/exp_avg/", cfg.ShardLayout(1), 1, 0, 0, make([]float32, 4)); err == nil {
		t.Error("reading a missing tensor succeeded")
	}
}

// world runs f on n ranks that are goroutines of this process, each with
// the mesh's dp_shard and dp_replicate groups (nil when of size one).
func world(t testing.TB, replicate, shard int, f func(rank int, c Config) error) {
	t.Helper()
	n := replicate * shard
	msh, err := mesh.New(n, mesh.Degrees{PP: 1, DPReplicate: replicate, DPShard: shard, CP: 1, TP: 1})
	if err != nil {
		t.Fatal(err)
	}
	st := comm.NewMemStore()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			g, err := comm.NewWorld(ctx, st, r, n, comm.Options{})
			if err != nil {
				errs[r] = err
				return
			}
			defer g.Close()
			var c Config
			for _, d := range []struct {
				dim string
				g   *comm.Group
			}{{"dp_shard", &c.Shard}, {"dp_replicate", &c.Replicate}} {
				ranks, _ := msh.Group(r, d.dim)
				if len(ranks) > 1 {
					if *d.g, err = g.NewGroup(ctx, ranks, d.dim); err != nil {
						errs[r] = err
						return
					}
				}
			}
			errs[r] = f(r, c)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// batch returns rows B×T tokens and targets derived from a seed.
func batch(cfg llama.Config, rows, T int, seed int) (tokens, targets []int32) {
	tokens, targets = make([]int32, rows*T), make([]int32, rows*T)
	for i := range tokens {
		tokens[i] = int32((i*7 + seed*13 + i*i) % cfg.VocabSize)
		targets[i] = int32((i*5 + seed*3 + 1) % cfg.VocabSize)
	}
	return tokens, targets
}

// TestGradientsMatchOneModel: under FSDP, HSDP and DDP layouts, with both
// reshard policies, overlapped or blocking, and four microbatches (every
// other one without gradient sync, as a pipeline runs a stage's
// microbatches in two accumulated passes, or all with), the sharded
// gradients gathered back equal (within float32 rounding) the gradient
// of one unsharded model over the whole batch; the global sum of squares
// matches a float64 sum over that gradient; GatherFull returns the
// initial parameters bit for bit. Without sync before each pair's second
// microbatch and without resharding after the forward, every unit is
// gathered and reduced once a pair.
func TestGradientsMatchOneModel(t *testing.T) {
	cfg := small()
	const T, rowsPerRank, accum = 8, 1, 4
	for _, c := range []struct {
		replicate, shard int
		reshard          Reshard
		blocking         bool
		nosync           bool // the first microbatch's backward without gradient sync
	}{
		{1, 2, ReshardDefault, false, false},
		{1, 3, ReshardNever, false, false},
		{1, 4, ReshardAlways, true, false},
		{2, 1, ReshardDefault, false, false},
		{2, 2, ReshardNever, false, false},
		{2, 2, ReshardAlways, true, false},
		{1, 2, ReshardNever, false, true},
		{1, 3, ReshardAlways, false, true},
		{2, 1, ReshardDefault, false, true},
		{2, 2, ReshardNever, true, true},
	} {
		name := fmt.Sprintf("rep%d_shard%d_reshard%d_blocking%v_nosync%v", c.replicate, c.shard, c.reshard, c.blocking, c.nosync)
		t.Run(name, func(t *testing.T) {
			n := c.replicate * c.shard
			rows := n * rowsPerRank
			// The reference: one model over every row, microbatch by
			// microbatch, gradients of the mean loss over all targets.
			be := cpu.New(1)
			defer be.Close()
			ref, err := llama.New(be, cfg, rows, T, llama.Plan{})
			if err != nil {
				t.Fatal(err)
			}
			ref.Init(3)
			ref.ZeroGrad()
			total := float32(rows * T * accum)
			for a := range accum {
				tok, tgt := batch(cfg, rows, T, a)
				if _, err := ref.Forward(tok, tgt); err != nil {
					t.Fatal(err)
				}
				if err := ref.Backward(1 / total); err != nil {
					t.Fatal(err)
				}
			}
			want := make([]float32, ref.Grads.Len)
			be.Download(want, ref.Grads)
			wantParams := make([]float32, ref.Params.Len)
			be.Download(wantParams, ref.Params)

			world(t, c.replicate, c.shard, func(rank int, cc Config) error {
				cc.Reshard, cc.Blocking = c.reshard, c.blocking
				be := cpu.New(1)
				defer be.Close()
				m, err := llama.New(be, cfg, rowsPerRank, T, llama.Plan{External: true})
				if err != nil {
					return err
				}
				rt, err := shard(be, m, cc, 3)
				if err != nil {
					return err
				}
				rt.ZeroGrad()
				for a := range accum {
					tok, tgt := batch(cfg, rows, T, a)
					lo, hi := rank*rowsPerRank*T, (rank+1)*rowsPerRank*T
					if _, err := m.Forward(tok[lo:hi], tgt[lo:hi]); err != nil {
						return err
					}
					rt.SetGradientSync(!c.nosync || a%2 == 1)
					if err := m.Backward(1 / total); err != nil {
						return err
					}
				}
				if err := rt.Finish(); err != nil {
					return err
				}
				if units := len(rt.Units); c.nosync && c.reshard == ReshardNever {
					if rt.Gathers() != 2*units*min(c.shard-1, 1) || rt.Reductions() != 2*units {
						return fmt.Errorf("%d gathers and %d reductions of %d units, want each unit gathered (when sharded) and reduced once a pair of microbatches", rt.Gathers(), rt.Reductions(), units)
					}
				}
				got, err := rt.GatherFull(rt.Grads)
				if err != nil {
					return err
				}
				var d2, n2 float64
				for i := range want {
					d := float64(got[i] - want[i])
					d2 += d * d
					n2 += float64(want[i]) * float64(want[i])
				}
				if rel := math.Sqrt(d2 / n2); rel > 1e-5 || math.IsNaN(rel) {
					return fmt.Errorf("gradients differ from the whole model's by %.3g (L2 relative)", rel)
				}
				ss, err := rt.SumSquares()
				if err != nil {
					return err
				}
				if math.Abs(ss-n2) > 1e-4*n2 {
					return fmt.Errorf("sum of squares %v, want %v", ss, n2)
				}
				params, err := rt.GatherFull(rt.Params)
				if err != nil {
					return err
				}
				for i := range params {
					if math.Float32bits(params[i]) != math.Float32bits(wantParams[i]) {
						return fmt.Errorf("gathered parameter %d is %v, want %v", i, params[i], wantParams[i])
					}
				}
				if got, want := rt.StateBytes(), 8*int64(rt.Len); got != want {
					return fmt.Errorf("state bytes %d, want %d", got, want)
				}
				return nil
			})
		})
	}
}

// unitRanges are the FSDP units of a local layout.
func unitRanges(lay []llama.ShardParam) []Range {
	var rs []Range
	for _, u := range llama.LayoutUnits(lay) {
		rs = append(rs, Range{u.Lo, u.Hi})
	}
	return rs
}

// shard installs a Runtime on model m (built External) and initialises it.
func shard(be backend.Backend, m *llama.Model, c Config, seed uint64) (*Runtime, error) {
	rt, err := New(be, unitRanges(m.Layout), m.BindUnit, c)
	if err != nil {
		return nil, err
	}
	m.Hooks = rt
	rt.Init(func(lo int, dst []float32) { m.InitLocal(seed, dst, lo) })
	return rt, nil
}
