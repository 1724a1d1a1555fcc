package plan

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"

	"github.com/titan-go/titan/internal/cluster"
	"github.com/titan-go/titan/internal/memplan"
)

// Calibration is what a prediction's compute, communication and memory
// figures are scaled by: efficiencies as fractions of the cluster's peak
// figures, measured collectives on a CPU host, and how the device's
// memory use relates to memplan's estimate.
type Calibration struct {
	// Source says where the figures come from.
	Source string `json:"source"`
	// Cluster is the cluster the calibration was made on or for.
	Cluster string `json:"cluster"`
	// Matmul is the fraction of the device's peak (bf16 on a GPU, fp32
	// on a CPU) that matrix products reach; MatmulFP8 the fraction of
	// the float8 peak that float8 products reach.
	Matmul    float64 `json:"matmul_efficiency"`
	MatmulFP8 float64 `json:"matmul_fp8_efficiency"`
	// Attention is the fraction of the same peak that attention (its
	// causal FLOPs, see attentionFLOPs) reaches.
	Attention float64 `json:"attention_efficiency"`
	// MatmulBF16 and AttentionBF16 are the fractions of a CPU's fp32 peak
	// that its bfloat16 products (titan's mixed precision: GemmBF16,
	// attention's bfloat16 products) reach; 0 when not measured, and then
	// taken as the float32 ones.
	MatmulBF16    float64 `json:"matmul_bf16_efficiency,omitempty"`
	AttentionBF16 float64 `json:"attention_bf16_efficiency,omitempty"`
	// Elementwise is the fraction of the memory bandwidth element-wise
	// passes reach.
	Elementwise float64 `json:"elementwise_efficiency"`
	// Comm is the fraction of a link's bandwidth a ring collective's
	// transfers reach (GPU).
	Comm float64 `json:"comm_efficiency"`
	// Collectives are measured collective times on a CPU host (empty on
	// GPUs, which use the ring model over the cluster's links).
	Collectives []Collective `json:"collectives,omitempty"`
	// MemoryFactor multiplies memplan's estimate and MemoryBase is added
	// to it to give the device memory a rank uses (allocator slack; the
	// process's runtime, data and binary on a CPU).
	MemoryFactor float64 `json:"memory_factor"`
	MemoryBase   float64 `json:"memory_base_bytes"`
	// RingAttention, on a CPU host, are the fractions of the same peak
	// that one rank's ring attention reaches at the measured cp degrees
	// (its blocks' attention, the merges and the host staging of the
	// rotating blocks, without the transfers: llama.RingAttentionProbe),
	// which runs many small blocks well below Attention's rate over
	// whole rows; a layout at a cp not measured uses Attention.
	RingAttention []RingRate `json:"ring_attention,omitempty"`
	// InStep, on a CPU host, is how much slower a training step ran than
	// the kernels' rates alone predicted (measureInStep); the compute
	// efficiencies above are already divided by it (0: not measured).
	InStep float64 `json:"in_step_factor,omitempty"`
	// Shared, on a CPU host, is how much faster each of n ranks that
	// share the host computes than 1/n of one process on all its cores
	// (measureShared: n step probes side by side, each on its share of
	// the threads, at the slowest one's pace; a one-thread rank pays no
	// thread barriers). Without a figure for n, 1.
	Shared []SharedRate `json:"shared,omitempty"`
	// ACSpeedup, on a CPU host, is how much faster a training step under
	// an activation checkpointing policy computed than the rates above
	// predict (measureInStep: the step probe under each policy, its
	// tokens/s over the probe's without checkpointing, against the same
	// ratio predicted). The recomputation writes a layer's activations
	// and its backward reads them right after, from the caches, where a
	// step without checkpointing reads what its forward wrote a whole
	// pass earlier; the policy's smaller working set also leaves the
	// caches more of the weights (bench/plan/README.md). None measured:
	// 1.
	ACSpeedup []ACRate `json:"ac_speedup,omitempty"`
	// HostPeak, on a CPU host, is the float32 GEMM peak titan train
	// measures MFU against (cpu.HostPeakFLOPS); the efficiencies above
	// are fractions of it, and OnHost puts it in place of the cluster
	// file's nominal peak, which a VM's unseen clock boosts make
	// meaningless (0: not measured, the nominal peak is used).
	HostPeak float64 `json:"host_peak_flops,omitempty"`
	// Created is when the calibration was made (RFC 3339).
	Created string `json:"created,omitempty"`
	// Priors, on a GPU cluster, are the priors CalibrateGPU set before
	// fitting the reference row (nil on a CPU host).
	Priors *Priors `json:"priors,omitempty"`
}

// gpuPriors are the priors of a GPU calibration (AssumedPriors when it
// records none).
func (c Calibration) gpuPriors() Priors {
	if c.Priors != nil {
		return *c.Priors
	}
	return AssumedPriors
}

// OnHost returns CPU cluster cl with the peaks the calibration's
// efficiencies are fractions of: the measured HostPeak for float32, and
// the bfloat16 peak scaled by the same ratio. GPU clusters and
// calibrations without a host peak are returned as they are.
func (c Calibration) OnHost(cl cluster.Cluster) cluster.Cluster {
	if !cl.CPU() || c.HostPeak <= 0 || cl.Device.PeakFP32 <= 0 {
		return cl
	}
	r := c.HostPeak / cl.Device.PeakFP32
	cl.Device.PeakFP32, cl.Device.PeakBF16 = c.HostPeak, r*cl.Device.PeakBF16
	return cl
}

// RingRate is ring attention's efficiency at one cp degree, with
// float32 and with bfloat16 products.
type RingRate struct {
	CP             int     `json:"cp"`
	Efficiency     float64 `json:"efficiency"`
	EfficiencyBF16 float64 `json:"efficiency_bf16"`
}

// ring returns ring attention's efficiency at cp (with bfloat16 products
// when bf16), and whether it was measured.
func (c Calibration) ring(cp int, bf16 bool) (float64, bool) {
	for _, r := range c.RingAttention {
		if r.CP == cp {
			if bf16 {
				return r.EfficiencyBF16, true
			}
			return r.Efficiency, true
		}
	}
	return 0, false
}

// ACRate is the compute speedup of a training step under one activation
// checkpointing policy (Calibration.ACSpeedup): Mode "full" or
// "selective op".
type ACRate struct {
	Mode    string  `json:"mode"`
	Speedup float64 `json:"speedup"`
}

// acProbes are the policies measureInStep measures ACSpeedup under, as
// ACRate.Mode names them.
var acProbes = []memplan.Checkpoint{{Mode: "selective", Option: "op"}, {Mode: "full"}}

// acSpeedup is the compute speedup of policy ac (Calibration.ACSpeedup):
// per-layer selective checkpointing every nth layer takes the full
// policy's on its share of the layers; a policy not measured, 1.
func (c Calibration) acSpeedup(ac memplan.Checkpoint) float64 {
	rate := func(mode string) float64 {
		for _, r := range c.ACSpeedup {
			if r.Mode == mode {
				return r.Speedup
			}
		}
		return 1
	}
	switch {
	case ac.Mode == "full":
		return rate("full")
	case ac.Mode == "selective" && ac.Option == "op":
		return rate(ac.String())
	case ac.Mode == "selective":
		if every, err := strconv.Atoi(ac.Option); err == nil && every > 0 {
			return 1 + (rate("full")-1)/float64(every)
		}
	}
	return 1
}

// SharedRate is the compute speedup of each of NProc ranks sharing a
// host (Calibration.Shared).
type SharedRate struct {
	NProc   int     `json:"nproc"`
	Speedup float64 `json:"speedup"`
}

// sharedSpeedup is Calibration.Shared's figure for n ranks, and whether
// it has one (1 when not).
func (c Calibration) sharedSpeedup(n int) (float64, bool) {
	for _, r := range c.Shared {
		if r.NProc == n {
			return r.Speedup, true
		}
	}
	return 1, false
}

// Collective is a fit of one measured collective, t = Latency + size /
// Bandwidth, where size is the nccl-tests size of the operation (the
// whole buffer of allreduce, the input of reduce_scatter, the output of
// all_gather).
type Collective struct {
	Op        string  `json:"op"`
	NProc     int     `json:"nproc"`
	Transport string  `json:"transport"`
	Latency   float64 `json:"latency_s"`
	Bandwidth float64 `json:"bandwidth_bytes_per_s"`
}

// ValidateHost checks what a CPU host's calibration must hold beyond
// Validate: a measured host peak and the collectives the step model
// times communication with (without them it would fall back to the
// cluster file's nominal links unannounced).
func (c Calibration) ValidateHost() error {
	if err := c.Validate(); err != nil {
		return err
	}
	if !(c.HostPeak > 0) {
		return fmt.Errorf("plan: calibration has no host_peak_flops (the peak its efficiencies are fractions of): run titan plan --calibrate again")
	}
	for _, op := range []string{"allreduce", "all_gather", "reduce_scatter"} {
		if !slices.ContainsFunc(c.Collectives, func(k Collective) bool { return k.Op == op }) {
			return fmt.Errorf("plan: calibration has no measured %s (collectives): run titan plan --calibrate again", op)
		}
	}
	return nil
}

// Validate checks that every figure is usable.
func (c Calibration) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"matmul_efficiency", c.Matmul}, {"attention_efficiency", c.Attention}, {"elementwise_efficiency", c.Elementwise}, {"comm_efficiency", c.Comm}, {"memory_factor", c.MemoryFactor}} {
		if !(f.v > 0) {
			return fmt.Errorf("plan: calibration %s = %g must be > 0", f.name, f.v)
		}
	}
	if c.MatmulFP8 < 0 || c.MemoryBase < 0 || c.MatmulBF16 < 0 || c.AttentionBF16 < 0 || c.HostPeak < 0 {
		return fmt.Errorf("plan: calibration matmul_fp8_efficiency %g, matmul_bf16_efficiency %g, attention_bf16_efficiency %g, memory_base_bytes %g and host_peak_flops %g must be >= 0", c.MatmulFP8, c.MatmulBF16, c.AttentionBF16, c.MemoryBase, c.HostPeak)
	}
	for _, r := range c.RingAttention {
		if r.CP < 2 || !(r.Efficiency > 0) || !(r.EfficiencyBF16 > 0) {
			return fmt.Errorf("plan: calibration ring_attention at cp %d: efficiency %g, efficiency_bf16 %g must be > 0", r.CP, r.Efficiency, r.EfficiencyBF16)
		}
	}
	for _, r := range c.ACSpeedup {
		if !slices.ContainsFunc(acProbes, func(p memplan.Checkpoint) bool { return p.String() == r.Mode }) || !(r.Speedup > 0.5 && r.Speedup < 2) {
			return fmt.Errorf("plan: calibration ac_speedup %q: %g, want a policy of %v and a speedup in (0.5, 2)", r.Mode, r.Speedup, acProbes)
		}
	}
	for _, r := range c.Shared {
		if r.NProc < 2 || !(r.Speedup > 0.25 && r.Speedup < 4) {
			return fmt.Errorf("plan: calibration shared at %d processes: speedup %g must be in (0.25, 4)", r.NProc, r.Speedup)
		}
	}
	for _, k := range c.Collectives {
		if k.NProc < 2 || !(k.Bandwidth > 0) || k.Latency < 0 {
			return fmt.Errorf("plan: calibration collective %s on %d processes: latency %g, bandwidth %g", k.Op, k.NProc, k.Latency, k.Bandwidth)
		}
	}
	return nil
}

// collective returns the time of op on n processes for size bytes from
// the measured fits: the fit of n processes, else of the nearest count
// measured, scaled by the ring's (n-1)/n factor (none for sendrecv, in
// which every rank sends size bytes to one peer); ok false when op was
// not measured.
func (c Calibration) collective(op string, n int, size float64) (float64, bool) {
	var fits []Collective
	for _, k := range c.Collectives {
		if k.Op == op {
			fits = append(fits, k)
		}
	}
	if len(fits) == 0 {
		return 0, false
	}
	sort.Slice(fits, func(i, j int) bool { return abs(fits[i].NProc-n) < abs(fits[j].NProc-n) })
	k := fits[0]
	if op == "sendrecv" { // every rank moves size, whatever n
		return k.Latency + size/k.Bandwidth, true
	}
	scale := (float64(n-1) / float64(n)) / (float64(k.NProc-1) / float64(k.NProc))
	return k.Latency*float64(n-1)/float64(k.NProc-1) + size*scale/k.Bandwidth, true
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// CalibrationPath is where titan plan --calibrate writes and plan reads
// this machine's calibration: given (--calibration) when set, else
// $TITAN_PLAN_CALIBRATION when set, else plan-calibration.json in
// titan's folder of the user's cache.
func CalibrationPath(given string) (string, error) {
	if given != "" {
		return given, nil
	}
	if p := os.Getenv("TITAN_PLAN_CALIBRATION"); p != "" {
		return p, nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("plan: no cache folder for the calibration (set TITAN_PLAN_CALIBRATION): %w", err)
	}
	return filepath.Join(dir, "titan", "plan-calibration.json"), nil
}

// LoadCalibration reads a calibration file.
func LoadCalibration(path string) (Calibration, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Calibration{}, fmt.Errorf("plan: calibration: %w", err)
	}
	var c Calibration
	if err := json.Unmarshal(raw, &c); err != nil {
		return Calibration{}, fmt.Errorf("plan: calibration %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return Calibration{}, fmt.Errorf("%w (in %s)", err, path)
	}
	return c, nil
}

// Save writes the calibration to path (write, fsync, rename).
func (c Calibration) Save(path string) error {
	if err := c.Validate(); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("plan: calibration: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".plan-calibration-*")
	if err != nil {
		return fmt.Errorf("plan: calibration: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("plan: calibration: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("plan: calibration: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("plan: calibration: %w", err)
	}
	return os.Rename(tmp.Name(), path)
}

// Runtime is how a device stores and computes: element sizes, whether
// the loss materialises the whole logits, whether element-wise
// operations are fused kernels, and whether communication overlaps
// computation.
type Runtime struct {
	Precision memplan.Precision
	// WholeLogits: the loss keeps the whole logits (PyTorch's cross
	// entropy); otherwise titan's chunked logits.
	WholeLogits bool
	// Fused: element-wise operations run as fused kernels (titan's CPU
	// kernels; torch.compile on a GPU) rather than one kernel per
	// operation (PyTorch eager).
	Fused bool
	// Overlap: collectives run on their own engines beside the compute
	// (GPU); on a CPU host they run on the cores that compute.
	Overlap bool
	// Shared is the number of ranks sharing one device's compute (CPU
	// worker processes on one host); 1 on GPUs.
	Shared int
	// TorchRing: context parallelism is PyTorch's ring attention
	// (torchRing), as torchtitan runs it, rather than titan's rotations
	// of the key/value heads.
	TorchRing bool
	// PipelineNoSync: under pipeline parallelism FSDP2 accumulates a
	// stage's unsharded gradients in float32 from its first backward to
	// its last (pipelineGradHold), where titan's executor holds each
	// unit's gradient buffer for the whole step (memplan's HeldGrads).
	// Both reduce once a step.
	PipelineNoSync bool
	// TorchSAC: selective per-operation checkpointing is PyTorch's
	// (torchtitan's policy, which also saves w2's output: sacSaved)
	// rather than titan's, which keeps the same tensors but that one.
	TorchSAC bool
	// KeepsRecomputed: a zero-bubble schedule's split backward keeps a
	// recomputed layer's tensors alive until its weight gradients
	// (PyTorch's autograd) rather than copying the weight products'
	// inputs out of the shared scratch set (titan's llama.Model).
	KeepsRecomputed bool
}

// computeBytes is the size of a compute-precision element.
func (rt Runtime) computeBytes() float64 {
	if rt.Precision.Compute > 0 {
		return float64(rt.Precision.Compute)
	}
	return 4
}

// RuntimeOf returns the runtime of layout l on cluster c: float32 and
// titan's fused kernels on a CPU (whose ranks share the host's cores),
// with the layout's mixed precision; float32 state with bf16 compute,
// whole logits, eager element-wise kernels unless compiled, PyTorch's
// ring attention, its pipeline's unsynchronised gradients, its
// selective checkpointing and its split backward on a GPU.
func RuntimeOf(c cluster.Cluster, l Layout) Runtime {
	if c.CPU() {
		return Runtime{Precision: memplan.Precision{ParamBF16: l.ParamBF16, ReduceBF16: l.ReduceBF16}, Fused: true, Shared: min(l.World(), c.Nodes*c.DevicesPerNode)}
	}
	return Runtime{Precision: memplan.Precision{State: 4, Compute: 2}, WholeLogits: true, Fused: l.Compile, Overlap: true, Shared: 1, TorchRing: true, PipelineNoSync: true, TorchSAC: true, KeepsRecomputed: true}
}
