package plan

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/titan-go/titan/internal/backend"
	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/bytesize"
	"github.com/titan-go/titan/internal/cluster"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/memplan"
	"github.com/titan-go/titan/internal/model"
	"github.com/titan-go/titan/internal/model/llama"
)

// CalibrateOptions are the settings of CalibrateCPU.
type CalibrateOptions struct {
	// Exe is the titan binary whose `bench comm` and `train` measure the
	// collectives and the process's memory beyond memplan's estimate.
	Exe string
	// Flavor is the model whose shapes the kernels are timed at
	// ("debug" when empty).
	Flavor string
	// Batch and SeqLen are the shapes' batch and sequence (8 × 256 when
	// zero: the debug recipe's).
	Batch, SeqLen int
	// NProcs are the process counts whose collectives are measured
	// (2 and 4 when empty).
	NProcs []int
	// Log receives progress (nil: none).
	Log io.Writer
}

// CalibrateCPU measures, on this host, titan's own kernels at the
// shapes of a model (GEMMs of its projections, causal attention, the
// RMSNorm and SwiGLU passes with their backwards), its collectives over
// worker processes (titan bench comm: allreduce, all_gather,
// reduce_scatter and the pipeline's and ring attention's exchange with
// the next rank, sendrecv, at a small and a large size for each process
// count)
// and how a titan train process's memory relates to memplan's estimate
// (two 2-step runs of the tiny_bench model, see measureMemory); a short
// one-process run of the model the kernels were timed on then scales
// their efficiencies to what they reach inside a training step
// (measureInStep). It returns them as a calibration for cluster c.
func CalibrateCPU(ctx context.Context, c cluster.Cluster, o CalibrateOptions) (Calibration, error) {
	if !c.CPU() {
		return Calibration{}, fmt.Errorf("plan: --calibrate measures this machine; cluster %s is not a CPU host (GPU calibrations come from the published reference row)", c.Name)
	}
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", a...)
		}
	}
	if o.Flavor == "" {
		o.Flavor = "debug"
	}
	if o.Batch == 0 {
		o.Batch = 8
	}
	if o.SeqLen == 0 {
		o.SeqLen = 256
	}
	if len(o.NProcs) == 0 {
		o.NProcs = []int{2, 4}
	}
	cfg, err := llama.Flavor(o.Flavor)
	if err != nil {
		return Calibration{}, fmt.Errorf("plan: calibrate: %w", err)
	}
	k, err := bestKernels(cfg, o.Batch, o.SeqLen, o.NProcs, kernelPasses)
	if err != nil {
		return Calibration{}, err
	}
	logf("kernels (%s, %d × %d, %d threads): GEMM %.3g FLOP/s (bf16 %.3g), attention %.3g FLOP/s (bf16 %.3g), element-wise %.3g B/s", o.Flavor, o.Batch, o.SeqLen, k.threads, k.gemm, k.gemmBF16, k.attn, k.attnBF16, k.ew)
	// Efficiencies are fractions of the peak titan train's MFU uses.
	peak := cpu.HostPeakFLOPS()
	c = Calibration{HostPeak: peak}.OnHost(c)
	logf("host peak (float32 GEMM, as titan train's MFU): %.3g FLOP/s", peak)
	cal := Calibration{
		Source:     fmt.Sprintf("titan plan --calibrate on this host (%s shapes; %s)", o.Flavor, time.Now().UTC().Format(time.RFC3339)),
		Cluster:    c.Name,
		HostPeak:   peak,
		Matmul:     k.gemm / c.Device.PeakFP32,
		Attention:  k.attn / c.Device.PeakFP32,
		MatmulBF16: k.gemmBF16 / c.Device.PeakFP32, AttentionBF16: k.attnBF16 / c.Device.PeakFP32,
		Elementwise: k.ew / c.Device.MemoryBandwidth,
		Comm:        1, MemoryFactor: 1,
		RingAttention: k.ring,
		Created:       time.Now().UTC().Format(time.RFC3339),
	}
	if o.Exe == "" {
		return cal, fmt.Errorf("plan: calibrate: no titan binary to run the collectives with")
	}
	for _, n := range o.NProcs {
		for _, op := range []string{"allreduce", "all_gather", "reduce_scatter", "sendrecv"} {
			fit, err := measureCollective(ctx, o.Exe, op, n)
			if err != nil {
				return cal, err
			}
			logf("%s on %d processes (%s): latency %.3g s, bandwidth %.3g B/s", op, n, fit.Transport, fit.Latency, fit.Bandwidth)
			cal.Collectives = append(cal.Collectives, fit)
		}
	}
	factor, base, err := measureMemory(ctx, o.Exe)
	if err != nil {
		return cal, err
	}
	cal.MemoryFactor, cal.MemoryBase = factor, base
	logf("process memory: %.3f × memplan's estimate + %s", factor, bytesize.Human(int64(base)))
	inStep, predicted, measured, acSpeedup, err := measureInStep(ctx, o, c, cal)
	if err != nil {
		return cal, err
	}
	cal.ACSpeedup = acSpeedup
	cal.Matmul, cal.Attention, cal.Elementwise = cal.Matmul/inStep, cal.Attention/inStep, cal.Elementwise/inStep
	cal.MatmulBF16, cal.AttentionBF16 = cal.MatmulBF16/inStep, cal.AttentionBF16/inStep
	for i := range cal.RingAttention {
		r := &cal.RingAttention[i]
		r.Efficiency, r.EfficiencyBF16 = r.Efficiency/c.Device.PeakFP32/inStep, r.EfficiencyBF16/c.Device.PeakFP32/inStep
	}
	cal.InStep = inStep
	logf("in a training step (%s, %d × %d, 1 process, %d steps, median of %d runs): %.0f tokens/s against %.0f from the kernels alone: compute efficiencies divided by %.3f", o.Flavor, o.Batch, o.SeqLen, stepProbeSteps, stepProbeRuns, measured, predicted, inStep)
	for _, r := range acSpeedup {
		logf("under activation checkpointing %s the same step computed %.3f× as fast as the rates predict (median of %d runs, each against the run without)", r.Mode, r.Speedup, stepProbeRuns)
	}
	for _, n := range o.NProcs {
		if n > k.threads {
			// More ranks than cores take turns on them, and a rank that
			// waits on a collective waits for a peer the host has
			// descheduled: side-by-side probes, which never wait on each
			// other, would credit those ranks with a speed they do not
			// get (4 processes on 2 cores: 13 % lost to waiting between
			// 6 ms computations, bench/plan/README.md). Not measured: 1.
			continue
		}
		sp, threads, err := measureShared(ctx, o, k.threads, n)
		if err != nil {
			return cal, err
		}
		cal.Shared = append(cal.Shared, SharedRate{NProc: n, Speedup: sp})
		logf("%d step probes side by side (%d threads each), between one-process probes: each rank computes at %.3f× 1/%d of one process on the whole host", n, threads, sp, n)
	}
	return cal, cal.Validate()
}

// stepProbeSteps is the length of measureInStep's run, logged every 4
// steps (the first window holds start-up and is left out).
const stepProbeSteps = 12

// stepProbe is measureInStep's job: the model and batch shape whose
// kernels the calibration timed, in one process, without activation
// checkpointing.
func stepProbe(o CalibrateOptions) []string {
	return acProbe(o, memplan.Checkpoint{Mode: "none"})
}

// acProbe is the step probe under activation checkpointing policy ac.
func acProbe(o CalibrateOptions, ac memplan.Checkpoint) []string {
	sets := []string{"model.flavor=" + o.Flavor, "training.local_batch_size=" + strconv.Itoa(o.Batch), "training.seq_len=" + strconv.Itoa(o.SeqLen),
		"training.steps=" + strconv.Itoa(stepProbeSteps), "metrics.log_freq=4", "checkpoint.enable=false",
		"validation.enable=false", "activation_checkpoint.mode=" + ac.Mode}
	if ac.Option != "" {
		sets = append(sets, "activation_checkpoint.selective_ac_option="+ac.Option)
	}
	return sets
}

// measureInStep trains the step probe in one process and returns how
// much slower its step is than the kernels' rates alone predict (the
// ratio of predicted to measured tokens/s): kernels timed one at a time
// keep their operands in cache and their threads awake, a training step
// runs them back to back between the optimizer, the loss and the
// collector, and what one kernel leaves in the caches slows the next by
// how much the model's tensors overflow them, which differs between
// models: on a Zen 5 host the tiny_bench model (the debug model's
// products, but 4 heads of 64 where it has 16 of 16) ran 6 % below the
// rates its kernels predicted and the debug model 19 % below, so the
// probe is the model the kernels were timed on. The compute
// efficiencies are divided by it; communication is measured separately
// and is not.
//
// Each run of the probe is followed by the same probe under each
// policy of acProbes, and acSpeedup is how much faster than predicted
// each ran (Calibration.ACSpeedup): the median over the runs of its
// tokens/s over the run's without checkpointing, against the predicted
// ratio. Taken within a run, the ratio leaves out the host's drift.
func measureInStep(ctx context.Context, o CalibrateOptions, c cluster.Cluster, cal Calibration) (inStep, predicted, measured float64, acSpeedup []ACRate, err error) {
	predictProbe := func(ac memplan.Checkpoint) (float64, error) {
		job, err := config.Load("", acProbe(o, ac), nil)
		if err != nil {
			return 0, fmt.Errorf("plan: calibrate: the step probe: %w", err)
		}
		j, err := FromRecipe(job, 1)
		if err != nil {
			return 0, fmt.Errorf("plan: calibrate: the step probe: %w", err)
		}
		pred, err := Predict(j, c, cal)
		if err != nil {
			return 0, fmt.Errorf("plan: calibrate: the step probe: %w", err)
		}
		return pred.TokensPerDevice, nil
	}
	run := func(ac memplan.Checkpoint) (float64, error) {
		data, err := trainProbe(ctx, o.Exe, acProbe(o, ac))
		if err != nil {
			return 0, err
		}
		return probeTPS(data, 0)
	}
	if predicted, err = predictProbe(memplan.Checkpoint{Mode: "none"}); err != nil {
		return 0, 0, 0, nil, err
	}
	predAC := make([]float64, len(acProbes))
	for i, ac := range acProbes {
		if predAC[i], err = predictProbe(ac); err != nil {
			return 0, 0, 0, nil, err
		}
	}
	// The median of a few runs: one run of a few seconds is one sample of
	// a host whose speed drifts by tens of percent over minutes, and a
	// calibration made in a fast moment over-predicts everything after.
	runs := make([]float64, stepProbeRuns)
	ratios := make([][]float64, len(acProbes))
	for i := range runs {
		if runs[i], err = run(memplan.Checkpoint{Mode: "none"}); err != nil {
			return 0, 0, 0, nil, err
		}
		for k, ac := range acProbes {
			tps, err := run(ac)
			if err != nil {
				return 0, 0, 0, nil, err
			}
			ratios[k] = append(ratios[k], (tps/runs[i])/(predAC[k]/predicted))
		}
	}
	slices.Sort(runs)
	measured = runs[len(runs)/2]
	for k, ac := range acProbes {
		slices.Sort(ratios[k])
		acSpeedup = append(acSpeedup, ACRate{Mode: ac.String(), Speedup: ratios[k][len(ratios[k])/2]})
	}
	return predicted / measured, predicted, measured, acSpeedup, nil
}

// measureShared runs n step probes side by side, each on its share of
// the host's threads (at least one), as n ranks of a job share the host,
// and returns their pace together over one process's tokens/s on all
// the threads (Calibration.Shared's speedup), and the threads each had.
// The probes train independently: what it measures is compute (a
// one-thread rank pays no thread barriers), not the collectives,
// calibrated apart.
func measureShared(ctx context.Context, o CalibrateOptions, hostThreads, n int) (float64, int, error) {
	threads := max(1, hostThreads/n)
	// The host's speed drifts by tens of percent over minutes: each
	// side-by-side run sits between two one-process probes of the same
	// length and is compared with their mean, and the median of
	// sharedRuns such ratios counts (single ratios ranged 1.10 to 1.27
	// for 2 ranks over one morning).
	one := func() (float64, error) { return sideBySide(ctx, o, hostThreads, 1) }
	before, err := one()
	if err != nil {
		return 0, 0, err
	}
	ratios := make([]float64, sharedRuns)
	for i := range ratios {
		together, err := sideBySide(ctx, o, threads, n)
		if err != nil {
			return 0, 0, err
		}
		after, err := one()
		if err != nil {
			return 0, 0, err
		}
		ratios[i], before = together/((before+after)/2), after
	}
	slices.Sort(ratios)
	return ratios[len(ratios)/2], threads, nil
}

// sideBySide runs n step probes at once, each on threads threads, and
// returns their pace together: n times the slowest one's tokens/s, as
// every step of a job waits for its slowest rank. The cores of a VM are
// not equal: side by side, one probe ran 1.4 to 6 % slower than the
// other through a whole run, and in a TP2 job the rank on the slower
// core computed 7-8 % longer in every kernel group while the other
// waited in the collectives (bench/plan/README.md). Only the windows
// when all n surely run count: after the first (start-up; the probes
// start a little apart) and before the last (the first to finish leaves
// the others the host).
func sideBySide(ctx context.Context, o CalibrateOptions, threads, n int) (float64, error) {
	probe := append(stepProbe(o), "training.threads="+strconv.Itoa(threads), "training.steps="+strconv.Itoa(sharedProbeSteps))
	tps := make([]float64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data, err := trainProbe(ctx, o.Exe, probe)
			if err == nil {
				tps[i], err = probeTPS(data, sharedProbeSteps-4)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			return 0, fmt.Errorf("plan: calibrate: %d step probes side by side: %w", n, errs[i])
		}
	}
	return float64(n) * slices.Min(tps), nil
}

// sharedRuns is how many side-by-side runs measureShared takes the
// median of.
const sharedRuns = 3

// sharedProbeSteps is measureShared's probe length.
const sharedProbeSteps = 24

// probeTPS is a step probe's mean tokens/s over its logged windows after
// the first (which holds start-up), up to step last (0: all).
func probeTPS(data []byte, last int) (float64, error) {
	var windows []float64
	for _, line := range bytes.Split(data, []byte("\n")) {
		var rec struct {
			Step int     `json:"step"`
			TPS  float64 `json:"tokens_per_sec"`
		}
		if json.Unmarshal(line, &rec) == nil && rec.Step > 4 && (last == 0 || rec.Step <= last) && rec.TPS > 0 {
			windows = append(windows, rec.TPS)
		}
	}
	if len(windows) == 0 {
		return 0, fmt.Errorf("plan: calibrate: the step probe logged no tokens/s after step 4")
	}
	sum := 0.0
	for _, w := range windows {
		sum += w
	}
	return sum / float64(len(windows)), nil
}

// stepProbeRuns is how many times measureInStep runs the step probe (the
// median counts).
const stepProbeRuns = 3

// kernelRates are measured throughputs.
type kernelRates struct {
	gemm, attn, ew     float64
	gemmBF16, attnBF16 float64    // mixed precision's bfloat16 products
	ring               []RingRate // ring attention's FLOP/s (not yet fractions of the peak)
	threads            int
}

// timeIt returns the best of a few runs of fn (at least 3, for up to
// 200 ms).
func timeIt(fn func()) float64 {
	best := time.Duration(1 << 62)
	deadline := time.Now().Add(200 * time.Millisecond)
	for i := 0; i < 3 || time.Now().Before(deadline); i++ {
		t0 := time.Now()
		fn()
		best = min(best, time.Since(t0))
		if i > 100 {
			break
		}
	}
	return best.Seconds()
}

// kernelPasses is how many times CalibrateCPU times the kernels.
const kernelPasses = 3

// bestKernels runs measureKernels passes times and keeps each rate's
// best. A shared or throttled host slows every kernel for seconds at a
// time (a GEMM rate moved 8% and the element-wise one 20% between two
// calibrations a minute apart); passes spread over the whole calibration
// each meet some quiet time, where the best of one short burst may not.
func bestKernels(cfg llama.Config, B, T int, cps []int, passes int) (kernelRates, error) {
	var best kernelRates
	for p := 0; p < passes; p++ {
		k, err := measureKernels(cfg, B, T, cps)
		if err != nil {
			return k, err
		}
		if p == 0 {
			best = k
			continue
		}
		best.gemm, best.attn, best.ew = max(best.gemm, k.gemm), max(best.attn, k.attn), max(best.ew, k.ew)
		best.gemmBF16, best.attnBF16 = max(best.gemmBF16, k.gemmBF16), max(best.attnBF16, k.attnBF16)
		for i := range best.ring {
			best.ring[i].Efficiency = max(best.ring[i].Efficiency, k.ring[i].Efficiency)
			best.ring[i].EfficiencyBF16 = max(best.ring[i].EfficiencyBF16, k.ring[i].EfficiencyBF16)
		}
	}
	return best, nil
}

// measureKernels times the CPU backend's kernels at cfg's shapes for
// batches of B × T tokens, with all the host's threads, counting FLOPs
// and bytes as Predict does; ring attention at each cp degree in cps
// that the shapes allow.
func measureKernels(cfg llama.Config, B, T int, cps []int) (kernelRates, error) {
	be := cpu.New(0)
	defer be.Close()
	N, D, F, V := B*T, cfg.Dim, cfg.FFNHidden(), cfg.VocabSize
	Q, KV := cfg.NHeads*cfg.HeadDim(), cfg.KVHeads()*cfg.HeadDim()
	fill := func(n int) backend.Tensor {
		t := be.Alloc(backend.Float32, n)
		h := make([]float32, n)
		for i := range h {
			h[i] = float32(i%13)*0.01 - 0.06
		}
		be.Upload(t, h)
		return t
	}
	// Mixed precision's operands that the engine keeps in bfloat16: the
	// weights, the products' activation inputs, attention's q, k, v and
	// output (gradients stay float32).
	half := func(n int) backend.Tensor {
		t := be.Alloc(backend.BFloat16, n)
		be.Copy(t, fill(n))
		return t
	}
	// The products of a layer and the head, forward and both backward
	// products, as the model runs them: x[N×in] · W[out×in]^T.
	shapes := [][2]int{{D, Q}, {D, KV}, {D, KV}, {Q, D}, {D, F}, {D, F}, {F, D}, {D, V}}
	var flops, secs, secsBF16 float64
	for _, s := range shapes {
		in, out := s[0], s[1]
		x, w, y := fill(N*in), fill(out*in), fill(N*out)
		dx, dw := fill(N*in), fill(out*in)
		xh, wh := half(N*in), half(out*in)
		secs += timeIt(func() {
			be.Gemm(false, true, N, out, in, 1, x, in, w, in, 0, y, out)
			be.Gemm(false, false, N, in, out, 1, y, out, w, in, 0, dx, in)
			be.Gemm(true, false, out, in, N, 1, y, out, x, in, 0, dw, in)
		})
		secsBF16 += timeIt(func() {
			be.GemmBF16(false, true, N, out, in, 1, xh, in, wh, in, 0, y, out)
			be.GemmBF16(false, false, N, in, out, 1, y, out, wh, in, 0, dx, in)
			be.GemmBF16(true, false, out, in, N, 1, y, out, xh, in, 0, dw, in)
		})
		flops += 3 * 2 * float64(N) * float64(in) * float64(out)
	}
	r := kernelRates{gemm: flops / secs, gemmBF16: flops / secsBF16, threads: be.Threads()}
	// Causal attention forward and backward, in float32 and with
	// bfloat16 products.
	lse, dout := fill(B*cfg.NHeads*T), fill(N*Q)
	dq, dk, dv := fill(N*Q), fill(N*KV), fill(N*KV)
	af := attentionFLOPs(cfg, float64(N), float64(T))
	for _, bf16 := range []bool{false, true} {
		d := backend.AttentionDims{B: B, Tq: T, Tk: T, NH: cfg.NHeads, NKV: cfg.KVHeads(), HD: cfg.HeadDim(), BF16: bf16}
		alloc := fill
		if bf16 {
			alloc = half
		}
		q, k, v, out := alloc(N*Q), alloc(N*KV), alloc(N*KV), alloc(N*Q)
		fwd := timeIt(func() { be.AttentionForward(out, lse, q, k, v, d) })
		bwd := timeIt(func() { be.AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, d) })
		if bf16 {
			r.attnBF16 = af * (1 + attentionBackward) / (fwd + bwd)
		} else {
			r.attn = af * (1 + attentionBackward) / (fwd + bwd)
		}
	}
	// Ring attention: one rank's share of the causal FLOPs, on the
	// threads a rank of cp processes on this host gets; the rate is
	// counted as cp such ranks filling the host (Predict divides by the
	// ranks sharing it).
	for _, cp := range cps {
		if cp < 2 || llama.CheckParallel(cfg, T, 1, cp) != nil {
			continue
		}
		rr, err := measureRing(cfg, B, T, cp, be.Threads(), af)
		if err != nil {
			return r, err
		}
		r.ring = append(r.ring, rr)
	}
	// Element-wise: RMSNorm over N×D and SwiGLU over N×F, forward and
	// backward, in the bytes ewElements counts for fused kernels.
	x, w, y, rstd := fill(N*D), fill(D), fill(N*D), fill(N)
	dx, dw := fill(N*D), fill(D)
	g, u, h := fill(N*F), fill(N*F), fill(N*F)
	dg, du := fill(N*F), fill(N*F)
	ewSecs := timeIt(func() {
		be.RMSNormForward(y, rstd, x, w, N, D, 1e-5)
		be.RMSNormBackward(dx, dw, y, x, w, rstd, N, D)
		be.SwiGLUForward(h, g, u, N*F)
		be.SwiGLUBackward(dg, du, h, g, u, N*F)
	})
	// Forward: the norm reads and writes N×D, SwiGLU reads two N×F and
	// writes one; the backwards move twice as much.
	r.ew = 3 * float64(2*N*D+3*N*F) * 4 / ewSecs
	if !(r.gemm > 0 && r.attn > 0 && r.ew > 0 && r.gemmBF16 > 0 && r.attnBF16 > 0) {
		return r, fmt.Errorf("plan: calibrate: kernel timings out of range (%+v)", r)
	}
	return r, nil
}

// measureRing times one rank's ring attention at cp on the threads a
// rank of cp processes on a host of threads gets (llama.RingAttentionProbe),
// in float32 and with bfloat16 products, as the FLOP/s of cp such ranks
// filling the host; af is the causal attention FLOPs of all cp ranks.
func measureRing(cfg llama.Config, B, T, cp, threads int, af float64) (RingRate, error) {
	rr := RingRate{CP: cp}
	be := cpu.New(max(1, threads/cp))
	defer be.Close()
	for _, bf16 := range []bool{false, true} {
		prec := model.Precision{Param: backend.Float32}
		if bf16 {
			prec.Param = backend.BFloat16
		}
		fwd, bwd, err := llama.RingAttentionProbe(be, cfg, B, T, cp, prec)
		if err != nil {
			return rr, fmt.Errorf("plan: calibrate: ring attention at cp %d: %w", cp, err)
		}
		var ferr, berr error
		tf := timeIt(func() { ferr = fwd() })
		tb := timeIt(func() { berr = bwd() })
		if err := errors.Join(ferr, berr); err != nil {
			return rr, fmt.Errorf("plan: calibrate: ring attention at cp %d: %w", cp, err)
		}
		rate := af * (1 + attentionBackward) / (tf + tb) // cp ranks' FLOPs, each af/cp
		rate *= float64(min(cp, threads)) / float64(cp)
		if bf16 {
			rr.EfficiencyBF16 = rate
		} else {
			rr.Efficiency = rate
		}
	}
	return rr, nil
}

// measureCollective fits latency and bandwidth of op on n processes
// from titan bench comm at 64 KiB and 16 MiB.
func measureCollective(ctx context.Context, exe, op string, n int) (Collective, error) {
	var pts [2]struct{ size, t float64 }
	var transport string
	for i, size := range []string{"64KiB", "16MiB"} {
		cmd := exec.CommandContext(ctx, exe, "bench", "comm", "--op", op, "--size", size, "--nproc", strconv.Itoa(n), "--json")
		cmd.Stderr = nil
		raw, err := cmd.Output()
		if err != nil {
			return Collective{}, fmt.Errorf("plan: calibrate: %s bench comm --op %s --size %s --nproc %d: %w", exe, op, size, n, err)
		}
		var res struct {
			SizeBytes int     `json:"size_bytes"`
			TimeS     float64 `json:"time_s"`
			Transport string  `json:"transport"`
		}
		if err := lastJSON(raw, &res); err != nil || res.TimeS <= 0 {
			return Collective{}, fmt.Errorf("plan: calibrate: bench comm --op %s --nproc %d: no result (%v)", op, n, err)
		}
		pts[i].size, pts[i].t, transport = float64(res.SizeBytes), res.TimeS, res.Transport
	}
	bw := (pts[1].size - pts[0].size) / (pts[1].t - pts[0].t)
	if !(bw > 0) {
		bw = pts[1].size / pts[1].t
	}
	lat := max(0, pts[0].t-pts[0].size/bw)
	return Collective{Op: op, NProc: n, Transport: transport, Latency: lat, Bandwidth: bw}, nil
}

// lastJSON decodes the last line of out that holds a JSON object.
func lastJSON(out []byte, v any) error {
	var last []byte
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if b := sc.Bytes(); len(b) > 0 && b[0] == '{' {
			last = append(last[:0], b...)
		}
	}
	if last == nil {
		return fmt.Errorf("no JSON line in %q", out)
	}
	return json.Unmarshal(last, v)
}

// memoryProbes are the jobs measureMemory trains: tiny_bench with one
// sequence of 64 tokens (memplan's estimate small beside what the process
// itself holds) and with 8 of 512 (the activations large).
var memoryProbes = [][2]int{{1, 64}, {8, 512}}

// measureMemory runs the probe jobs and fits their peak resident memory
// as factor × memplan's estimate + base: the base is the Go runtime, the
// binary, the corpus and the tokenizer, which every worker holds
// whatever its model, the factor the heap's slack over the live buffers.
func measureMemory(ctx context.Context, exe string) (factor, base float64, err error) {
	cfg, err := llama.Flavor("tiny_bench")
	if err != nil {
		return 0, 0, err
	}
	var peak, est [2]float64
	for i, pr := range memoryProbes {
		if peak[i], err = probePeak(ctx, exe, pr[0], pr[1]); err != nil {
			return 0, 0, err
		}
		r, err := memplan.Estimate(memplan.Plan{Model: cfg, Batch: pr[0], SeqLen: pr[1]})
		if err != nil {
			return 0, 0, err
		}
		est[i] = float64(r.Total())
	}
	factor = (peak[1] - peak[0]) / (est[1] - est[0])
	base = peak[0] - factor*est[0]
	if !(factor > 0) || base < 0 {
		return 0, 0, fmt.Errorf("plan: calibrate: memory probes peaked at %s and %s for estimates of %s and %s: no fit", bytesize.Human(int64(peak[0])), bytesize.Human(int64(peak[1])), bytesize.Human(int64(est[0])), bytesize.Human(int64(est[1])))
	}
	return factor, base, nil
}

// probePeak trains tiny_bench for 2 steps at batch × seq and returns the
// largest peak resident memory it logged, in bytes.
func probePeak(ctx context.Context, exe string, batch, seq int) (float64, error) {
	data, err := trainProbe(ctx, exe, []string{"model.flavor=tiny_bench", "training.local_batch_size=" + strconv.Itoa(batch),
		"training.seq_len=" + strconv.Itoa(seq), "training.steps=2", "metrics.log_freq=1",
		"checkpoint.enable=false", "validation.enable=false", "activation_checkpoint.mode=none"})
	if err != nil {
		return 0, err
	}
	var peak float64
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var rec struct {
			MemGiB float64 `json:"mem_gib"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil {
			peak = max(peak, rec.MemGiB)
		}
	}
	if peak <= 0 {
		return 0, fmt.Errorf("plan: calibrate: the memory probe logged no memory")
	}
	return peak * (1 << 30), nil
}

// trainProbe runs `exe train` with the recipe overrides sets in a
// temporary dump folder and returns the metrics.jsonl it wrote.
func trainProbe(ctx context.Context, exe string, sets []string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "titan-plan-calibrate-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	args := []string{"train", "--set", "job.dump_folder=" + dir}
	for _, kv := range sets {
		args = append(args, "--set", kv)
	}
	if out, err := exec.CommandContext(ctx, exe, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("plan: calibrate: %s %v: %w\n%s", exe, args, err, out)
	}
	data, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("plan: calibrate: the probe run wrote no metrics: %w", err)
	}
	return data, nil
}
