package plan

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

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
