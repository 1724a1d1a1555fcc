package plan

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/cluster"
	"github.com/titan-go/titan/internal/testenv"
)

// TestGPUPriorsScriptRuns runs bench/plan/gpu_priors.py (the GPU priors
// `make gpu-check` measures, once, on a lent GPU) at toy shapes on this
// machine: every part must run, and its emulation of PyTorch's
// load-balanced ring attention must reproduce causal attention over the
// whole sequence and its query gradients on every rank (float32, against
// autograd), so that the ring's timings on a GPU are of that algorithm.
func TestGPUPriorsScriptRuns(t *testing.T) {
	py := testenv.Torch(t)
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, filepath.Join(root, "bench", "plan", "gpu_priors.py"), "--smoke")
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("gpu_priors.py --smoke: %v\n%s", err, msg)
	}
	var res struct {
		Errors    []string           `json:"errors"`
		RingCheck map[string]float64 `json:"ring_check"`
		Ring      struct {
			CP map[string]struct {
				LayerS     float64 `json:"layer_s"`
				PerBlockS  float64 `json:"per_block_s"`
				VsCP1      float64 `json:"per_block_vs_cp1"`
				AllocRetry int     `json:"alloc_retries"`
			} `json:"cp"`
		} `json:"ring"`
		Attention []map[string]any `json:"attention"`
		BF16      float64          `json:"matmul_bf16_flops_per_s"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("gpu_priors.py --smoke printed no JSON object: %v\n%s", err, out)
	}
	if len(res.Errors) > 0 {
		t.Fatalf("parts failed: %v\n%s", res.Errors, out)
	}
	for _, k := range []string{"forward", "dq"} {
		d, ok := res.RingCheck[k]
		if !ok || d > 1e-5 {
			t.Errorf("ring emulation %s: largest difference from whole-sequence attention %g (present %v), want rounding (< 1e-5)", k, d, ok)
		}
	}
	for _, cp := range []string{"1", "2", "4", "8"} {
		r, ok := res.Ring.CP[cp]
		if !ok || !(r.LayerS > 0) || !(r.PerBlockS > 0) {
			t.Errorf("ring at cp %s: %+v (present %v)", cp, r, ok)
		}
	}
	if len(res.Attention) != 4 || !(res.BF16 > 0) {
		t.Errorf("attention shapes %d (want 4), bf16 matmul rate %g", len(res.Attention), res.BF16)
	}
}

// TestLoadPriors: a GPU's measured priors (gpu_priors.py's JSON) replace
// the assumed ones in the GPU calibration, which still reproduces its
// reference row; what was not measured stays assumed; a smoke run, a
// CPU's figures, a missing shape and a ratio that is no efficiency are
// refused naming the file.
func TestLoadPriors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	measured := write("h100.json", `{"device": "NVIDIA H100 80GB HBM3", "smoke": false,
		"attention_rel": {"2x32x8192x8192x128 causal": 0.5, "1x32x32768x32768x128 causal": 0.7},
		"fp8_rel": 0.8, "elementwise_fraction": {"bf16_add_bytes_per_s": 0.85, "fp32_merge_bytes_per_s": 0.6}}`)
	p, err := LoadPriors(measured)
	if err != nil {
		t.Fatal(err)
	}
	want := Priors{AttentionRel: 0.5, FP8Rel: 0.8, Elementwise: 0.85, Comm: AssumedPriors.Comm}
	if got := p; got.AttentionRel != want.AttentionRel || got.FP8Rel != want.FP8Rel || got.Elementwise != want.Elementwise || got.Comm != want.Comm ||
		!strings.Contains(p.Source, "attention, float8, element-wise measured on NVIDIA H100 80GB HBM3 (h100.json)") {
		t.Errorf("priors %+v, want %+v measured on the H100", p, want)
	}
	gpu, err := cluster.Load(ReferenceCluster)
	if err != nil {
		t.Fatal(err)
	}
	cal, err := CalibrateGPU(gpu, p)
	if err != nil {
		t.Fatal(err)
	}
	if r := cal.Attention / cal.Matmul; math.Abs(r-0.5) > 1e-12 || math.Abs(cal.MatmulFP8/cal.Matmul-0.8) > 1e-12 || cal.Elementwise != 0.85 || cal.Comm != 0.8 ||
		cal.Priors == nil || *cal.Priors != p || !strings.Contains(cal.Source, "priors (attention, float8, element-wise measured on") {
		t.Errorf("calibration under measured priors: %+v", cal)
	}
	rs, cal2, err := CompareReference(p)
	if err != nil {
		t.Fatal(err)
	}
	assumed, _, err := CompareReference(AssumedPriors)
	if err != nil {
		t.Fatal(err)
	}
	if cal2.Matmul != cal.Matmul {
		t.Errorf("CompareReference calibrated matmul %g, CalibrateGPU %g", cal2.Matmul, cal.Matmul)
	}
	moved := 0
	for i, r := range rs {
		if r.Row.Name == ReferenceRow && math.Abs(r.TPSErr) > 1e-6 {
			t.Errorf("the reference row under measured priors: %+.4f%%, want 0", 100*r.TPSErr)
		}
		if r.Prediction.TokensPerDevice != assumed[i].Prediction.TokensPerDevice {
			moved++
		}
	}
	if moved == 0 {
		t.Error("no published row moved with the priors")
	}

	fp8Missing := write("nofp8.json", `{"device": "NVIDIA A100", "attention_rel": {"2x32x8192x8192x128 causal": 0.55}, "fp8_rel": null}`)
	if p, err := LoadPriors(fp8Missing); err != nil || p.FP8Rel != AssumedPriors.FP8Rel || p.Elementwise != AssumedPriors.Elementwise ||
		!strings.HasPrefix(p.Source, "attention measured on NVIDIA A100") {
		t.Errorf("priors without float8 and element-wise: %+v, %v; want those assumed", p, err)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"smoke.json", `{"device": "cpu", "smoke": true, "attention_rel": {"2x32x8192x8192x128 causal": 0.5}}`, "--smoke"},
		{"cpu.json", `{"device": "cpu", "attention_rel": {"2x32x8192x8192x128 causal": 0.5}}`, `no GPU measured these (device "cpu")`},
		{"shape.json", `{"device": "GPU", "attention_rel": {"1x32x32768x32768x128 causal": 0.5}}`, `attention_rel has no "2x32x8192x8192x128 causal"`},
		{"range.json", `{"device": "GPU", "attention_rel": {"2x32x8192x8192x128 causal": 0.5}, "fp8_rel": 3}`, "fp8_rel 3 is out of range"},
		{"bandwidth.json", `{"device": "GPU", "attention_rel": {"2x32x8192x8192x128 causal": 0.5}, "elementwise_fraction": {"bf16_add_bytes_per_s": 1.2}}`, "elementwise_fraction 1.2 is out of range: want more than 0 and at most 1"},
		{"array.json", `[1, 2]`, "not the JSON object gpu_priors.py prints"},
		{"bad.json", `{"device": `, "not the JSON object gpu_priors.py prints"},
	} {
		path := write(tc.name, tc.body)
		if _, err := LoadPriors(path); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming the file and %q", tc.name, err, tc.want)
		}
	}
	if _, err := LoadPriors(filepath.Join(dir, "none.json")); err == nil || !strings.Contains(err.Error(), "--priors") {
		t.Errorf("a missing file: %v", err)
	}
	if _, _, err := LoadCluster("cpu-2core", "", p); err == nil || !strings.Contains(err.Error(), "--priors") {
		t.Errorf("priors on a CPU host: %v, want refused naming --priors", err)
	}
	low := write("low.json", `{"device": "GPU", "attention_rel": {"2x32x8192x8192x128 causal": 0.001}}`)
	pl, err := LoadPriors(low)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CalibrateGPU(gpu, pl); err == nil || !strings.Contains(err.Error(), "low.json") || !strings.Contains(err.Error(), "the priors are too low") {
		t.Errorf("priors the reference row cannot meet: %v, want an error naming the priors", err)
	}
}
