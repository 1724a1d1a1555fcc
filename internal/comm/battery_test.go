package comm

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
)

// Test data: every rank can compute every rank's input, so each rank checks
// its results against references computed locally.

func mix(seed uint64, rank, i int) uint64 {
	x := seed ^ uint64(rank+1)*0x9e3779b97f4a7c15 ^ uint64(i+1)*0xbf58476d1ce4e5b9
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// hval is a float in ±[2^-9, 2^7): values of different magnitudes, so
// that the summation order shows in the rounding.
func hval(h uint64) float64 {
	m := float64(h>>11)/(1<<53)*2 - 1
	return math.Ldexp(m, int(h&15)-8)
}

// tbuf is a buffer of any dtype, for tests.
type tbuf struct {
	dt  DType
	n   int
	f32 []float32
	f64 []float64
	bf  []uint16
	i32 []int32
	i64 []int64
}

func newT(dt DType, n int) tbuf {
	b := tbuf{dt: dt, n: n}
	switch dt {
	case Float32:
		b.f32 = make([]float32, n)
	case Float64:
		b.f64 = make([]float64, n)
	case BFloat16:
		b.bf = make([]uint16, n)
	case Int32:
		b.i32 = make([]int32, n)
	case Int64:
		b.i64 = make([]int64, n)
	}
	return b
}

func (b tbuf) buf() Buffer {
	switch b.dt {
	case Float32:
		return F32(b.f32)
	case Float64:
		return F64(b.f64)
	case BFloat16:
		return BF16(b.bf)
	case Int32:
		return I32(b.i32)
	}
	return I64(b.i64)
}

func (b tbuf) slice(lo, hi int) tbuf {
	s := tbuf{dt: b.dt, n: hi - lo}
	switch b.dt {
	case Float32:
		s.f32 = b.f32[lo:hi]
	case Float64:
		s.f64 = b.f64[lo:hi]
	case BFloat16:
		s.bf = b.bf[lo:hi]
	case Int32:
		s.i32 = b.i32[lo:hi]
	case Int64:
		s.i64 = b.i64[lo:hi]
	}
	return s
}

func (b tbuf) bits(i int) uint64 {
	switch b.dt {
	case Float32:
		return uint64(math.Float32bits(b.f32[i]))
	case Float64:
		return math.Float64bits(b.f64[i])
	case BFloat16:
		return uint64(b.bf[i])
	case Int32:
		return uint64(uint32(b.i32[i]))
	}
	return uint64(b.i64[i])
}

func (b tbuf) str(i int) string {
	switch b.dt {
	case Float32:
		return fmt.Sprint(b.f32[i])
	case Float64:
		return fmt.Sprint(b.f64[i])
	case BFloat16:
		return fmt.Sprint(BF16ToFloat32(b.bf[i]))
	case Int32:
		return fmt.Sprint(b.i32[i])
	}
	return fmt.Sprint(b.i64[i])
}

// f64 returns element i as a float64 (exactly, for float types).
func (b tbuf) f64at(i int) float64 {
	switch b.dt {
	case Float32:
		return float64(b.f32[i])
	case Float64:
		return b.f64[i]
	case BFloat16:
		return float64(BF16ToFloat32(b.bf[i]))
	case Int32:
		return float64(b.i32[i])
	}
	return float64(b.i64[i])
}

// input is rank's input for a test case: n elements, element i of the
// whole logical buffer starting at global index off.
func input(dt DType, op ReduceOp, seed uint64, rank, n, off int) tbuf {
	b := newT(dt, n)
	for i := range n {
		h := mix(seed, rank, off+i)
		v := hval(h)
		if op == Prod {
			v = 1 + v/256 // stay finite
		}
		switch dt {
		case Float32:
			b.f32[i] = float32(v)
		case Float64:
			b.f64[i] = v
		case BFloat16:
			b.bf[i] = Float32ToBF16(float32(v))
		case Int32:
			b.i32[i] = int32(h)
			if op == Prod {
				b.i32[i] = int32(h%7) - 3
			}
		case Int64:
			b.i64[i] = int64(h)
			if op == Prod {
				b.i64[i] = int64(h%7) - 3
			}
		}
	}
	return b
}

func op32[T float32 | float64 | int32 | int64](op ReduceOp, a, b T) T {
	switch op {
	case Sum, Avg:
		return a + b
	case Prod:
		return a * b
	case Max:
		return max(a, b)
	}
	return min(a, b)
}

// refFold is the documented reduction: a left fold over ins (group rank
// order) in the accumulation type, written plainly.
func refFold(op ReduceOp, ins []tbuf) tbuf {
	dt, n := ins[0].dt, ins[0].n
	out := newT(dt, n)
	k := len(ins)
	for i := range n {
		switch dt {
		case Float32:
			acc := ins[0].f32[i]
			for _, in := range ins[1:] {
				acc = op32(op, acc, in.f32[i])
			}
			if op == Avg {
				acc /= float32(k)
			}
			out.f32[i] = acc
		case Float64:
			acc := ins[0].f64[i]
			for _, in := range ins[1:] {
				acc = op32(op, acc, in.f64[i])
			}
			if op == Avg {
				acc /= float64(k)
			}
			out.f64[i] = acc
		case BFloat16:
			acc := BF16ToFloat32(ins[0].bf[i])
			for _, in := range ins[1:] {
				acc = op32(op, acc, BF16ToFloat32(in.bf[i]))
			}
			if op == Avg {
				acc /= float32(k)
			}
			out.bf[i] = Float32ToBF16(acc)
		case Int32:
			acc := ins[0].i32[i]
			for _, in := range ins[1:] {
				acc = op32(op, acc, in.i32[i])
			}
			out.i32[i] = acc
		case Int64:
			acc := ins[0].i64[i]
			for _, in := range ins[1:] {
				acc = op32(op, acc, in.i64[i])
			}
			out.i64[i] = acc
		}
	}
	return out
}

// checkEqual compares got with want bitwise.
func checkEqual(what string, got, want tbuf) error {
	if got.n != want.n {
		return fmt.Errorf("%s: %d elements, want %d", what, got.n, want.n)
	}
	for i := range got.n {
		if got.bits(i) != want.bits(i) {
			return fmt.Errorf("%s: element %d = %s, want %s (bitwise)", what, i, got.str(i), want.str(i))
		}
	}
	return nil
}

// checkSum64 compares a float sum with the float64 sum of the inputs.
func checkSum64(what string, got tbuf, ins []tbuf, avg bool) error {
	if !got.dt.isFloat() {
		return nil
	}
	eps := map[DType]float64{Float32: 0x1p-23, Float64: 0x1p-52, BFloat16: 0x1p-7}[got.dt]
	for i := range got.n {
		var s, abs float64
		for _, in := range ins {
			s += in.f64at(i)
			abs += math.Abs(in.f64at(i))
		}
		if avg {
			s /= float64(len(ins))
			abs /= float64(len(ins))
		}
		tol := eps*abs*float64(len(ins)+1) + 1e-300
		if d := math.Abs(got.f64at(i) - s); d > tol {
			return fmt.Errorf("%s: element %d = %v, float64 sum %v (diff %g > %g)", what, i, got.f64at(i), s, d, tol)
		}
	}
	return nil
}

var allDTypes = []DType{Float32, Float64, BFloat16, Int32, Int64}

// battery runs every collective on g for every dtype and several sizes,
// checking each result against references computed locally. sizes should
// include 0 and sizes not divisible by the group size.
func battery(ctx context.Context, g Group, sizes []int) error {
	n, me := g.Size(), g.Rank()
	h := fnv.New64a()
	record := func(b tbuf) {
		for i := range b.n {
			var x [8]byte
			v := b.bits(i)
			for k := range x {
				x[k] = byte(v >> (8 * k))
			}
			h.Write(x[:])
		}
	}
	var seed uint64 = 1
	for _, dt := range allDTypes {
		for _, N := range sizes {
			// AllReduce with every reduction.
			for _, op := range []ReduceOp{Sum, Prod, Max, Min, Avg} {
				if op == Avg && !dt.isFloat() {
					continue
				}
				seed++
				ins := make([]tbuf, n)
				for r := range n {
					ins[r] = input(dt, op, seed, r, N, 0)
				}
				x := input(dt, op, seed, me, N, 0)
				what := fmt.Sprintf("allreduce %s %s n=%d", dt, op, N)
				if err := g.AllReduce(ctx, x.buf(), op); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if err := checkEqual(what, x, refFold(op, ins)); err != nil {
					return err
				}
				if op == Sum || op == Avg {
					if err := checkSum64(what, x, ins, op == Avg); err != nil {
						return err
					}
				}
				record(x)
			}

			// ReduceScatter, out of place (sum) and in place (max).
			for _, inPlace := range []bool{false, true} {
				seed++
				op := Sum
				if inPlace {
					op = Max
				}
				ins := make([]tbuf, n)
				for r := range n {
					ins[r] = input(dt, op, seed, r, N, 0)
				}
				lo, hi := ChunkBounds(N, n, me)
				x := input(dt, op, seed, me, N, 0)
				out := newT(dt, hi-lo)
				if inPlace {
					out = x.slice(lo, hi)
				}
				what := fmt.Sprintf("reduce_scatter %s %s n=%d in-place=%v", dt, op, N, inPlace)
				if err := g.ReduceScatter(ctx, x.buf(), out.buf(), op); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if err := checkEqual(what, out, refFold(op, ins).slice(lo, hi)); err != nil {
					return err
				}
			}

			// AllGather, out of place and in place.
			for _, inPlace := range []bool{false, true} {
				seed++
				want := input(dt, Sum, seed, 99, N, 0)
				lo, hi := ChunkBounds(N, n, me)
				full := newT(dt, N)
				send := input(dt, Sum, seed, 99, hi-lo, lo)
				if inPlace {
					copy(full.buf().b[lo*dt.Size():], send.buf().b)
					send = full.slice(lo, hi)
				}
				what := fmt.Sprintf("all_gather %s n=%d in-place=%v", dt, N, inPlace)
				if err := g.AllGather(ctx, send.buf(), full.buf()); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if err := checkEqual(what, full, want); err != nil {
					return err
				}
				record(full)
			}

			// Broadcast.
			seed++
			root := N % n
			x := newT(dt, N)
			if me == root {
				x = input(dt, Sum, seed, root, N, 0)
			}
			what := fmt.Sprintf("broadcast %s n=%d root=%d", dt, N, root)
			if err := g.Broadcast(ctx, x.buf(), root); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			if err := checkEqual(what, x, input(dt, Sum, seed, root, N, 0)); err != nil {
				return err
			}
			record(x)

			// AllToAll with the default split and with uneven counts.
			for _, uneven := range []bool{false, true} {
				seed++
				cnt := func(from, to int) int {
					if uneven {
						return (from*7 + to*3 + N) % (N/n + 3)
					}
					return N / n
				}
				sc, rc := make([]int, n), make([]int, n)
				for j := range n {
					sc[j], rc[j] = cnt(me, j), cnt(j, me)
				}
				var sendC, recvC []int
				if uneven {
					sendC, recvC = sc, rc
				}
				send := input(dt, Sum, seed, me, sum(sc), 0)
				recv := newT(dt, sum(rc))
				what := fmt.Sprintf("all_to_all %s n=%d uneven=%v", dt, N, uneven)
				if err := g.AllToAll(ctx, send.buf(), recv.buf(), sendC, recvC); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				off := 0
				for i := range n {
					// Rank i sent us its chunk me: elements after its
					// chunks for ranks < me.
					iOff := 0
					for j := range me {
						iOff += cnt(i, j)
					}
					want := input(dt, Sum, seed, i, iOff+rc[i], 0).slice(iOff, iOff+rc[i])
					if err := checkEqual(fmt.Sprintf("%s from rank %d", what, i), recv.slice(off, off+rc[i]), want); err != nil {
						return err
					}
					off += rc[i]
				}
			}

			// Send/Recv around the ring (and both ways on 2 ranks).
			if n > 1 {
				seed++
				next, prev := (me+1)%n, (me-1+n)%n
				out := input(dt, Sum, seed, me, N, 0)
				in := newT(dt, N)
				w := g.SendAsync(ctx, out.buf(), next)
				what := fmt.Sprintf("send/recv %s n=%d", dt, N)
				if err := g.Recv(ctx, in.buf(), prev); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if err := w.Wait(); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if err := checkEqual(what, in, input(dt, Sum, seed, prev, N, 0)); err != nil {
					return err
				}
			}
		}
	}
	if err := g.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	if err := asyncOverlap(ctx, g); err != nil {
		return err
	}
	// Every rank must have recorded bitwise the same results.
	hs := make([]int64, n)
	mine := []int64{int64(h.Sum64())}
	if err := g.AllGather(ctx, I64(mine), I64(hs)); err != nil {
		return fmt.Errorf("gather result hashes: %w", err)
	}
	for r, v := range hs {
		if v != hs[0] {
			return fmt.Errorf("results differ across ranks: rank %d hash %x, rank 0 %x", r, v, hs[0])
		}
	}
	return nil
}

func sum(x []int) int {
	s := 0
	for _, v := range x {
		s += v
	}
	return s
}

// asyncOverlap issues several operations without waiting, computes
// meanwhile, and checks them all.
func asyncOverlap(ctx context.Context, g Group) error {
	n, me := g.Size(), g.Rank()
	const N = 5003
	type pending struct {
		w     *Work
		check func() error
	}
	var ps []pending
	for k := range 4 {
		seed := uint64(1000 + k)
		ins := make([]tbuf, n)
		for r := range n {
			ins[r] = input(Float32, Sum, seed, r, N, 0)
		}
		x := input(Float32, Sum, seed, me, N, 0)
		ps = append(ps, pending{g.AllReduceAsync(ctx, x.buf(), Sum), func() error {
			return checkEqual(fmt.Sprintf("async allreduce %d", k), x, refFold(Sum, ins))
		}})
	}
	full := newT(Int64, N)
	lo, hi := ChunkBounds(N, n, me)
	part := input(Int64, Sum, 77, 0, hi-lo, lo)
	ps = append(ps, pending{g.AllGatherAsync(ctx, part.buf(), full.buf()), func() error {
		return checkEqual("async all_gather", full, input(Int64, Sum, 77, 0, N, 0))
	}})
	b := newT(BFloat16, N)
	if me == n-1 {
		b = input(BFloat16, Sum, 78, 0, N, 0)
	}
	ps = append(ps, pending{g.BroadcastAsync(ctx, b.buf(), n-1), func() error {
		return checkEqual("async broadcast", b, input(BFloat16, Sum, 78, 0, N, 0))
	}})
	// Compute while the operations run.
	acc := 0.0
	for i := range 200000 {
		acc += math.Sqrt(float64(i))
	}
	_ = acc
	var errs []error
	for _, p := range ps {
		if err := p.w.Wait(); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := p.check(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// meshTest builds the row and column groups of a 2x2 mesh (rows {0,1},
// {2,3}; columns {0,2}, {1,3}) and a reversed group, runs collectives on
// them, some concurrently, and checks the results.
func meshTest(ctx context.Context, world Group) error {
	if world.Size() != 4 {
		return fmt.Errorf("mesh test needs 4 ranks, have %d", world.Size())
	}
	me := world.Rank()
	row := []int{me / 2 * 2, me/2*2 + 1}
	col := []int{me % 2, me%2 + 2}
	rg, err := world.NewGroup(ctx, row, "row")
	if err != nil {
		return err
	}
	defer rg.Close()
	cg, err := NewGroup(ctx, world, col, "col")
	if err != nil {
		return err
	}
	defer cg.Close()
	rev, err := world.NewGroup(ctx, []int{3, 2, 1, 0}, "rev")
	if err != nil {
		return err
	}
	defer rev.Close()
	if !slices.Equal(rg.Ranks(), row) || !slices.Equal(cg.Ranks(), col) || rg.Rank() != me%2 || cg.Rank() != me/2 || rev.Rank() != 3-me {
		return fmt.Errorf("sub-group ranks: row %v (rank %d), col %v (rank %d), rev rank %d",
			rg.Ranks(), rg.Rank(), cg.Ranks(), cg.Rank(), rev.Rank())
	}
	const N = 1001
	for k, tc := range []struct {
		g       Group
		members []int
	}{{rg, row}, {cg, col}, {rev, []int{3, 2, 1, 0}}} {
		for _, dt := range allDTypes {
			seed := uint64(500 + 10*k + int(dt))
			ins := make([]tbuf, len(tc.members))
			for i, r := range tc.members {
				ins[i] = input(dt, Sum, seed, r, N, 0)
			}
			x := input(dt, Sum, seed, me, N, 0)
			what := fmt.Sprintf("allreduce %s on %s %v", dt, tc.g.Name(), tc.members)
			if err := tc.g.AllReduce(ctx, x.buf(), Sum); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			if err := checkEqual(what, x, refFold(Sum, ins)); err != nil {
				return err
			}
		}
	}
	// Rows and columns concurrently: a reduce-scatter on the row and an
	// all-gather on the column in flight at the same time.
	ins := [][]tbuf{}
	for _, r := range row {
		ins = append(ins, []tbuf{input(Float32, Sum, 900, r, N, 0)})
	}
	x := input(Float32, Sum, 900, me, N, 0)
	lo, hi := ChunkBounds(N, 2, rg.Rank())
	shard := newT(Float32, hi-lo)
	w1 := rg.ReduceScatterAsync(ctx, x.buf(), shard.buf(), Sum)
	clo, chi := ChunkBounds(N, 2, cg.Rank())
	full := newT(Int32, N)
	part := input(Int32, Sum, 901, 0, chi-clo, clo)
	w2 := cg.AllGatherAsync(ctx, part.buf(), full.buf())
	w3 := world.AllReduceAsync(ctx, F64([]float64{float64(me)}), Sum)
	if err := errors.Join(w1.Wait(), w2.Wait(), w3.Wait()); err != nil {
		return err
	}
	if err := checkEqual("row reduce_scatter", shard, refFold(Sum, []tbuf{ins[0][0], ins[1][0]}).slice(lo, hi)); err != nil {
		return err
	}
	if err := checkEqual("column all_gather", full, input(Int32, Sum, 901, 0, N, 0)); err != nil {
		return err
	}
	// Point-to-point inside a column.
	peer := 1 - cg.Rank()
	out := input(Int64, Sum, 902, me, N, 0)
	in := newT(Int64, N)
	ws := cg.SendAsync(ctx, out.buf(), peer)
	if err := errors.Join(cg.Recv(ctx, in.buf(), peer), ws.Wait()); err != nil {
		return err
	}
	return checkEqual("column send/recv", in, input(Int64, Sum, 902, col[peer], N, 0))
}
