package plan

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/titan-go/titan/internal/cluster"
	"github.com/titan-go/titan/internal/memplan"
	"github.com/titan-go/titan/internal/model/llama"
)

// Published is one row of torchtitan's published H100 benchmarks
// (docs/reference/torchtitan.md §4): a job on the benchmark's machine and
// the tokens/s per GPU and peak memory torchtitan measured. Tables 1–6
// are benchmarks/llama3_h100_202412_torchtitan.md (§4.2); table A is
// benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md and table H the
// 405B rows of the historical docs/performance.md of 2024-12-03 (§4.3),
// which publish no memory.
type Published struct {
	Table  string
	Name   string
	Job    Job
	TPS    float64 // tokens/s per GPU
	MemGiB float64 // 0: not published
	// Note says where titan's layout differs from torchtitan's, or what
	// the source leaves unsaid.
	Note string
}

// HasMemory reports whether the row publishes its memory.
func (p Published) HasMemory() bool { return p.MemGiB > 0 }

// ReferenceCluster is the machine of the published tables.
const ReferenceCluster = "h100-grandteton"

// ReferenceRow is the row calibrations for GPUs come from: Llama 3.1 8B
// on 8 H100s with FSDP (table 1, no compile, no float8).
const ReferenceRow = "8B FSDP8"

// Priors are the efficiencies a GPU calibration cannot tell apart from the
// matmul efficiency on its one reference row, set before the row is
// fitted: attention (flash attention's causal FLOPs) at AttentionRel of
// the matmul efficiency, float8 products at FP8Rel of it (of the float8
// peak), element-wise kernels at Elementwise of the memory bandwidth and
// collectives at Comm of the link bandwidth (NCCL's bus bandwidth against
// NVLink's and a NIC's line rate).
type Priors struct {
	AttentionRel float64 `json:"attention_rel"`
	FP8Rel       float64 `json:"fp8_rel"`
	Elementwise  float64 `json:"elementwise"`
	Comm         float64 `json:"comm"`
	// Source says where they come from: AssumedPriors' "assumed", or the
	// file and the device that measured them (LoadPriors).
	Source string `json:"source"`
}

// AssumedPriors were fixed before any published row was looked at.
var AssumedPriors = Priors{AttentionRel: 0.6, FP8Rel: 0.75, Elementwise: 0.7, Comm: 0.8, Source: "assumed"}

// PriorsShape is the attention shape of gpu_priors.py whose rate over the
// bf16 matmul's is the attention prior: the reference row's (table 1:
// local batch 2 × 8192 tokens, Llama 3.1 8B's 32 heads of 128, causal).
const PriorsShape = "2x32x8192x8192x128 causal"

// LoadPriors reads the priors bench/plan/gpu_priors.py measured on a GPU
// (its JSON output): attention's rate over the bf16 matmul's at
// PriorsShape, float8's efficiency over bf16's, and the fraction of the
// memory bandwidth a bf16 add reaches (present when the script was given
// the GPU's bandwidth). What it did not measure keeps its assumed value,
// and so does communication, which takes several GPUs; Source says which.
func LoadPriors(path string) (Priors, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Priors{}, fmt.Errorf("plan: --priors: %w", err)
	}
	var m struct {
		Smoke        bool               `json:"smoke"`
		Device       string             `json:"device"`
		AttentionRel map[string]float64 `json:"attention_rel"`
		FP8Rel       *float64           `json:"fp8_rel"`
		Elementwise  map[string]float64 `json:"elementwise_fraction"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return Priors{}, fmt.Errorf("plan: --priors %s: not the JSON object gpu_priors.py prints (%v)", path, err)
	}
	switch {
	case m.Smoke:
		return Priors{}, fmt.Errorf("plan: --priors %s: made with gpu_priors.py --smoke, at toy shapes: it measures nothing", path)
	case m.Device == "" || m.Device == "cpu":
		return Priors{}, fmt.Errorf("plan: --priors %s: no GPU measured these (device %q)", path, m.Device)
	}
	p := AssumedPriors
	measured := []string{"attention"}
	var ok bool
	if p.AttentionRel, ok = m.AttentionRel[PriorsShape]; !ok {
		return Priors{}, fmt.Errorf("plan: --priors %s: attention_rel has no %q (the reference row's shape)", path, PriorsShape)
	}
	if m.FP8Rel != nil {
		p.FP8Rel = *m.FP8Rel
		measured = append(measured, "float8")
	}
	if f, ok := m.Elementwise["bf16_add_bytes_per_s"]; ok {
		p.Elementwise = f
		measured = append(measured, "element-wise")
	}
	for _, v := range []struct {
		name    string
		x, most float64
	}{{"attention_rel", p.AttentionRel, 1.5}, {"fp8_rel", p.FP8Rel, 1.5}, {"elementwise_fraction", p.Elementwise, 1}} {
		if !(v.x > 0 && v.x <= v.most) {
			return Priors{}, fmt.Errorf("plan: --priors %s: %s %g is out of range: want more than 0 and at most %g", path, v.name, v.x, v.most)
		}
	}
	p.Source = fmt.Sprintf("%s measured on %s (%s), the rest assumed", strings.Join(measured, ", "), m.Device, filepath.Base(path))
	return p, nil
}

func flavor(name string, seq int) llama.Config {
	c, err := llama.Flavor(name)
	if err != nil {
		panic(err)
	}
	return c.Covering(seq) // the CP rows train past the flavor's 128K
}

// PublishedRows returns every row of the published H100 tables.
func PublishedRows() []Published {
	sac := memplan.Checkpoint{Mode: "selective", Option: "op"}
	full := memplan.Checkpoint{Mode: "full"}
	job := func(fl string, d memplan.Degrees, lbs, seq int, ac memplan.Checkpoint, opts ...string) Job {
		l := Layout{Degrees: d, LocalBatch: lbs, SeqLen: seq, Checkpoint: ac, Reshard: "default", Schedule: "1F1B", MicrobatchRows: 1, FirstLessLayers: 1, LastLessLayers: 1, ParamBF16: true}
		for _, o := range opts {
			switch o {
			case "compile":
				l.Compile = true
			case "float8":
				l.Float8 = true
			case "asynctp":
				l.AsyncTP = true
			case "interleaved":
				l.Schedule = "Interleaved1F1B"
			default:
				if rows, ok := strings.CutPrefix(o, "mb"); ok {
					l.MicrobatchRows, _ = strconv.Atoi(rows)
				}
			}
		}
		return Job{Flavor: fl, Model: flavor(fl, seq), Layout: l}
	}
	deg := func(pp, shard, cp, tp int) memplan.Degrees {
		return memplan.Degrees{PP: pp, DPReplicate: 1, DPShard: shard, CP: cp, TP: tp}
	}
	// torchtitan 9dec370 splits the local batch into as many microbatches
	// as pipeline ranks unless told otherwise
	// (experimental.pipeline_parallel_microbatches, default
	// pipeline_parallel_degree; torchtitan/parallelisms/pipelining_utils.py),
	// whatever the schedule: 32 rows in 8 microbatches of 4 for table 5, 8
	// of 1 for table 6.
	const mbNote = "8 microbatches of 4 rows (torchtitan's default of pp microbatches)"
	return []Published{
		{"1", ReferenceRow, job("8B", deg(1, 8, 1, 1), 2, 8192, sac), 5762, 82.4, "calibration row"},
		{"1", "8B FSDP8 +compile", job("8B", deg(1, 8, 1, 1), 2, 8192, sac, "compile"), 6667, 77.0, ""},
		{"1", "8B FSDP8 +compile +float8", job("8B", deg(1, 8, 1, 1), 2, 8192, sac, "compile", "float8"), 8532, 76.8, ""},
		{"2", "8B FSDP8 CP1 32K", job("8B", deg(1, 8, 1, 1), 1, 32768, full, "compile", "float8"), 3890, 83.9, ""},
		{"2", "8B FSDP4 CP2 64K", job("8B", deg(1, 4, 2, 1), 1, 65536, full, "compile", "float8"), 2540, 84.2, ""},
		{"2", "8B FSDP2 CP4 128K", job("8B", deg(1, 2, 4, 1), 1, 131072, full, "compile", "float8"), 1071, 84.0, ""},
		{"2", "8B FSDP1 CP8 256K", job("8B", deg(1, 1, 8, 1), 1, 262144, full, "compile", "float8"), 548, 84.5, ""},
		{"3", "8B FSDP128", job("8B", deg(1, 128, 1, 1), 2, 8192, sac), 5605, 67.0, ""},
		{"3", "8B FSDP128 +compile", job("8B", deg(1, 128, 1, 1), 2, 8192, sac, "compile"), 6514, 62.0, ""},
		{"3", "8B FSDP128 +compile +float8", job("8B", deg(1, 128, 1, 1), 2, 8192, sac, "compile", "float8"), 8380, 61.8, ""},
		{"4", "70B FSDP32 TP8", job("70B", deg(1, 32, 1, 8), 16, 8192, full, "compile", "float8"), 829, 71.9, ""},
		{"4", "70B FSDP32 TP8 +asyncTP", job("70B", deg(1, 32, 1, 8), 16, 8192, full, "compile", "float8", "asynctp"), 876, 67.6, ""},
		{"5", "405B PP8 FSDP8 TP8 1F1B", job("405B", deg(8, 8, 1, 8), 32, 8192, full, "compile", "float8", "asynctp", "mb4"), 100, 82.5, mbNote},
		{"5", "405B PP8 FSDP8 TP8 Interleaved1F1B", job("405B", deg(8, 8, 1, 8), 32, 8192, full, "compile", "float8", "asynctp", "interleaved", "mb4"), 128, 72.7, mbNote},
		{"6", "405B PP8 FSDP8 TP8 CP1 32K", job("405B", deg(8, 8, 1, 8), 8, 32768, full, "compile", "float8", "asynctp"), 76, 75.3, ""},
		{"6", "405B PP8 FSDP4 TP8 CP2 64K", job("405B", deg(8, 4, 2, 8), 8, 65536, full, "compile", "float8", "asynctp"), 47, 75.9, ""},
		{"6", "405B PP8 FSDP2 TP8 CP4 128K", job("405B", deg(8, 2, 4, 8), 8, 131072, full, "compile", "float8", "asynctp"), 31, 77.1, ""},
		{"6", "405B PP8 FSDP1 TP8 CP8 256K", job("405B", deg(8, 1, 8, 8), 8, 262144, full, "compile", "float8", "asynctp"), 16, 84.9, ""},
		// The async TP benchmark (2025-06): vanilla against async TP,
		// compile on; its float8 rowwise rows are not in the step model.
		{"A", "70B FSDP32 TP8 bf16", job("70B", deg(1, 32, 1, 8), 16, 8192, full, "compile"), 597.3, 0, ""},
		{"A", "70B FSDP32 TP8 bf16 +asyncTP", job("70B", deg(1, 32, 1, 8), 16, 8192, full, "compile", "asynctp"), 652.4, 0, ""},
		{"A", "70B FSDP32 TP8 float8", job("70B", deg(1, 32, 1, 8), 16, 8192, full, "compile", "float8"), 809.8, 0, ""},
		{"A", "70B FSDP32 TP8 float8 +asyncTP", job("70B", deg(1, 32, 1, 8), 16, 8192, full, "compile", "float8", "asynctp"), 942.4, 0, ""},
		{"A", "8B FSDP8 TP8 bf16", job("8B", deg(1, 8, 1, 8), 12, 8192, sac, "compile"), 4378, 0, ""},
		{"A", "8B FSDP8 TP8 bf16 +asyncTP", job("8B", deg(1, 8, 1, 8), 12, 8192, sac, "compile", "asynctp"), 4809.4, 0, ""},
		{"A", "8B FSDP8 TP8 float8", job("8B", deg(1, 8, 1, 8), 12, 8192, sac, "compile", "float8"), 5078.1, 0, ""},
		{"A", "8B FSDP8 TP8 float8 +asyncTP", job("8B", deg(1, 8, 1, 8), 12, 8192, sac, "compile", "float8", "asynctp"), 5570.1, 0, ""},
		// 405B on 128 GPUs, 2D, local batch 2, full AC.
		{"H", "405B FSDP16 TP8", job("405B", deg(1, 16, 1, 8), 2, 8192, full, "compile"), 109, 0, histNote},
		{"H", "405B FSDP16 TP8 +float8", job("405B", deg(1, 16, 1, 8), 2, 8192, full, "compile", "float8"), 177, 0, histNote},
		{"H", "405B FSDP16 TP8 +float8 +asyncTP", job("405B", deg(1, 16, 1, 8), 2, 8192, full, "compile", "float8", "asynctp"), 185, 0, histNote},
	}
}

// histNote is what table H leaves unsaid.
const histNote = "compile assumed on (async TP requires it; the source does not say)"

// CalibrateGPU derives a GPU calibration from the reference row alone:
// the matmul efficiency that makes the predicted tokens/s equal the
// published one and the memory factor that makes the predicted memory
// equal the published peak, the other efficiencies set from it by the
// priors pr (AssumedPriors, or a GPU's measured by LoadPriors).
func CalibrateGPU(c cluster.Cluster, pr Priors) (Calibration, error) {
	var ref Published
	for _, r := range PublishedRows() {
		if r.Name == ReferenceRow {
			ref = r
		}
	}
	cal := func(mm float64) Calibration {
		return Calibration{
			Source: fmt.Sprintf("torchtitan's published %s row (%.0f tokens/s/GPU, %.1f GiB) on %s, priors (%s) attention %.2f×matmul, float8 %.2f×matmul, elementwise %.2f, comm %.2f",
				ref.Name, ref.TPS, ref.MemGiB, ReferenceCluster, pr.Source, pr.AttentionRel, pr.FP8Rel, pr.Elementwise, pr.Comm),
			Cluster: c.Name, Matmul: mm, MatmulFP8: pr.FP8Rel * mm, Attention: pr.AttentionRel * mm,
			Elementwise: pr.Elementwise, Comm: pr.Comm, MemoryFactor: 1, Priors: &pr,
		}
	}
	refCluster, err := cluster.Load(ReferenceCluster)
	if err != nil {
		return Calibration{}, err
	}
	tps := func(mm float64) (float64, Prediction, error) {
		p, err := Predict(ref.Job, refCluster, cal(mm))
		return p.TokensPerDevice, p, err
	}
	// Tokens/s grows with the matmul efficiency: bisect.
	lo, hi := 0.01, 1.0
	if t, _, err := tps(hi); err != nil {
		return Calibration{}, err
	} else if t < ref.TPS {
		return Calibration{}, fmt.Errorf("plan: under priors (%s) attention %.2f×matmul, float8 %.2f×matmul, elementwise %.2f, the reference row %s reaches only %.0f tokens/s at full matmul efficiency, short of its published %.0f: the priors are too low",
			pr.Source, pr.AttentionRel, pr.FP8Rel, pr.Elementwise, ref.Name, t, ref.TPS)
	}
	for range 60 {
		mid := (lo + hi) / 2
		t, _, err := tps(mid)
		if err != nil {
			return Calibration{}, err
		}
		if t < ref.TPS {
			lo = mid
		} else {
			hi = mid
		}
	}
	out := cal((lo + hi) / 2)
	_, p, err := tps(out.Matmul)
	if err != nil {
		return Calibration{}, err
	}
	out.MemoryFactor = ref.MemGiB * (1 << 30) / p.needed()
	return out, nil
}

// RowResult is a published row against its prediction.
type RowResult struct {
	Row        Published
	Prediction Prediction
	// TPSErr and MemErr are (predicted - published) / published (MemErr
	// 0 when the row publishes no memory).
	TPSErr, MemErr float64
}

// CompareReference predicts every published row with the calibration
// from the reference row under priors pr.
func CompareReference(pr Priors) ([]RowResult, Calibration, error) {
	c, err := cluster.Load(ReferenceCluster)
	if err != nil {
		return nil, Calibration{}, err
	}
	cal, err := CalibrateGPU(c, pr)
	if err != nil {
		return nil, Calibration{}, err
	}
	var out []RowResult
	for _, r := range PublishedRows() {
		p, err := Predict(r.Job, c, cal)
		if err != nil {
			return nil, cal, fmt.Errorf("plan: row %q: %w", r.Name, err)
		}
		res := RowResult{Row: r, Prediction: p, TPSErr: p.TokensPerDevice/r.TPS - 1}
		if r.HasMemory() {
			res.MemErr = p.MemoryBytes/(r.MemGiB*(1<<30)) - 1
		}
		out = append(out, res)
	}
	return out, cal, nil
}
