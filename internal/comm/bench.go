package comm

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"
)

// BenchResult is one collective benchmark measurement, computed the way
// nccl-tests does. Bandwidths are in GB/s (1e9 bytes per second).
type BenchResult struct {
	Op        string  `json:"op"`
	SizeBytes int     `json:"size_bytes"`
	NProc     int     `json:"nproc"`
	Transport string  `json:"transport"`
	TimeS     float64 `json:"time_s"`     // mean time of one operation, the slowest rank's
	AlgBW     float64 `json:"algbw_gbps"` // SizeBytes / TimeS
	BusBW     float64 `json:"busbw_gbps"` // AlgBW times the op's bus factor
}

// BenchOps lists the operations BenchCollective measures.
var BenchOps = []string{"allreduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "sendrecv"}

// BusFactor returns the factor between algorithm and bus bandwidth of op
// on n ranks (nccl-tests): 2(n-1)/n for allreduce, (n-1)/n for
// reduce_scatter, all_gather and all_to_all, 1 for broadcast and
// sendrecv.
func BusFactor(op string, n int) (float64, error) {
	f := float64(n-1) / float64(n)
	switch op {
	case "allreduce":
		return 2 * f, nil
	case "reduce_scatter", "all_gather", "all_to_all":
		return f, nil
	case "broadcast", "sendrecv":
		return 1, nil
	}
	return 0, fmt.Errorf("comm: unknown benchmark op %q (want one of %v)", op, BenchOps)
}

// BenchCollective times op on float32 data of sizeBytes (nccl-tests
// sizes: the whole buffer for allreduce and broadcast, the whole input of
// reduce_scatter, the whole output of all_gather, the whole send buffer of
// all_to_all, what each rank sends in sendrecv: rank r sends to r+1 and
// receives as much from r-1, both at once, as a pipeline's stages and
// ring attention's rotations do). Every member of g calls it with the same arguments; all
// get the same result: the mean over iters operations after warmup
// untimed ones, taking the slowest rank's time.
func BenchCollective(ctx context.Context, g Group, op string, sizeBytes int, iters, warmup int) (BenchResult, error) {
	n := g.Size()
	bus, err := BusFactor(op, n)
	if err != nil {
		return BenchResult{}, err
	}
	if iters <= 0 || warmup < 0 || sizeBytes < 0 {
		return BenchResult{}, fmt.Errorf("comm: bench %s: bad iters %d, warmup %d or size %d", op, iters, warmup, sizeBytes)
	}
	elems := sizeBytes / 4
	if op == "all_to_all" {
		elems -= elems % n // equal chunks for every pair
	}
	a := make([]float32, elems)
	for i := range a {
		a[i] = float32(i%1000) * 1e-3
	}
	var b []float32
	var run func() error
	switch op {
	case "allreduce":
		run = func() error { return g.AllReduce(ctx, F32(a), Sum) }
	case "broadcast":
		run = func() error { return g.Broadcast(ctx, F32(a), 0) }
	case "reduce_scatter":
		b = make([]float32, ChunkLen(elems, n, g.Rank()))
		run = func() error { return g.ReduceScatter(ctx, F32(a), F32(b), Sum) }
	case "all_gather":
		b = make([]float32, ChunkLen(elems, n, g.Rank()))
		run = func() error { return g.AllGather(ctx, F32(b), F32(a)) }
	case "all_to_all":
		b = make([]float32, elems)
		run = func() error { return g.AllToAll(ctx, F32(a), F32(b), nil, nil) }
	case "sendrecv":
		b = make([]float32, elems)
		r := g.Rank()
		run = func() error {
			w := g.SendAsync(ctx, F32(a), (r+1)%n)
			errR := g.Recv(ctx, F32(b), (r-1+n)%n)
			if err := w.Wait(); err != nil {
				return err
			}
			return errR
		}
	}
	for range warmup {
		if err := run(); err != nil {
			return BenchResult{}, err
		}
	}
	if err := g.Barrier(ctx); err != nil {
		return BenchResult{}, err
	}
	start := time.Now()
	for range iters {
		if err := run(); err != nil {
			return BenchResult{}, err
		}
	}
	t := []float64{time.Since(start).Seconds() / float64(iters)}
	if err := g.AllReduce(ctx, F64(t), Max); err != nil {
		return BenchResult{}, err
	}
	res := BenchResult{Op: op, SizeBytes: elems * 4, NProc: n, Transport: g.Transport(), TimeS: t[0]}
	if t[0] > 0 {
		res.AlgBW = float64(res.SizeBytes) / t[0] / 1e9
		res.BusBW = res.AlgBW * bus
	}
	if math.IsInf(res.AlgBW, 0) {
		res.AlgBW, res.BusBW = 0, 0
	}
	return res, nil
}

// ParseSize parses a byte size such as "64MiB", "1GiB", "512KiB", "100MB",
// "4096" or "4k" (k, m, g are binary multiples).
func ParseSize(s string) (int, error) {
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
		{"k", 1 << 10}, {"K", 1 << 10}, {"m", 1 << 20}, {"M", 1 << 20}, {"g", 1 << 30}, {"G", 1 << 30},
		{"B", 1}, {"", 1},
	}
	for _, u := range units {
		if len(s) > len(u.suffix) && s[len(s)-len(u.suffix):] == u.suffix {
			v, err := strconv.ParseFloat(s[:len(s)-len(u.suffix)], 64)
			if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
				break
			}
			return int(v * u.mult), nil
		}
	}
	return 0, fmt.Errorf("comm: bad size %q (want e.g. 64MiB, 1GiB, 4096)", s)
}
