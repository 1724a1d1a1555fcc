package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestPlanReferenceRecipe checks that the shipped 8B recipe on the
// published benchmark machine predicts the published reference row it
// is calibrated on, and that the comparison table runs.
func TestPlanReferenceRecipe(t *testing.T) {
	out, err := titan(t, "plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-grandteton", "--world", "8", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var got struct {
		Prediction struct {
			TokensPerSec float64 `json:"tokens_per_sec_per_device"`
			Memory       struct {
				Predicted float64 `json:"predicted"`
			} `json:"memory_bytes"`
		} `json:"prediction"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if math.Abs(got.Prediction.TokensPerSec/5762-1) > 1e-6 || math.Abs(got.Prediction.Memory.Predicted/(82.4*(1<<30))-1) > 1e-6 {
		t.Errorf("8B on 8 H100: %.1f tokens/s, %.2f GiB; the calibration row is 5762 and 82.4", got.Prediction.TokensPerSec, got.Prediction.Memory.Predicted/(1<<30))
	}
	png := filepath.Join(t.TempDir(), "published.png")
	out, err = titan(t, "plan", "--reference", "--plot", png)
	if err != nil || !strings.Contains(out, "8B FSDP8 (calibration)") || !strings.Contains(out, "405B PP8 FSDP8 TP8 Interleaved1F1B") {
		t.Errorf("--reference: %v\n%s", err, out)
	}
	// Each row with the settings its table states, and each distinct
	// footnote once, numbered.
	for _, want := range []string{"| 8B FSDP1 CP8 256K | lbs1 ac:full +compile +float8, seq 256K |", "\n¹ 8 microbatches of 4 rows", "\n² compile assumed on"} {
		if !strings.Contains(out, want) {
			t.Errorf("--reference: no %q in\n%s", want, out)
		}
	}
	if data, err := os.ReadFile(png); err != nil || !strings.HasPrefix(string(data), "\x89PNG\r\n") {
		t.Errorf("--reference --plot: no PNG written (%v)", err)
	}
}

// TestPlanErrors checks the refusals name what is wrong.
func TestPlanErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.toml")
	raw, err := os.ReadFile("../../configs/clusters/h100-sxm.toml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, append([]byte("gpu_count = 8\n"), raw...), 0o644); err != nil {
		t.Fatal(err)
	}
	// Calibrations that are not this machine's: one naming a GPU
	// cluster, one without the host peak its efficiencies are fractions of.
	calFile := func(name, cluster string, peak float64) string {
		path := filepath.Join(t.TempDir(), name)
		cal := map[string]any{"source": "test", "cluster": cluster, "matmul_efficiency": 0.5, "attention_efficiency": 0.1, "elementwise_efficiency": 0.5,
			"comm_efficiency": 1, "memory_factor": 1.1, "host_peak_flops": peak, "collectives": []map[string]any{
				{"op": "allreduce", "nproc": 2, "latency_s": 1e-4, "bandwidth_bytes_per_s": 2e9}, {"op": "all_gather", "nproc": 2, "latency_s": 1e-4, "bandwidth_bytes_per_s": 2e9},
				{"op": "reduce_scatter", "nproc": 2, "latency_s": 1e-4, "bandwidth_bytes_per_s": 2e9}}}
		data, _ := json.Marshal(cal)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	gpuCal, noPeak := calFile("gpu.json", "h100-sxm", 3e11), calFile("nopeak.json", "cpu-2core", 0)
	priors := writePriors(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", bad}, "unknown key(s) gpu_count"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxxm"}, "unknown cluster"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_debug.toml", "--cluster", "this", "--calibration", filepath.Join(t.TempDir(), "none.json")}, "titan plan --calibrate"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "a100-80gb", "--world", "8", "--float8"}, "float8"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--plot", filepath.Join(t.TempDir(), "p.png")}, "goes with --reference"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--set", "training.mixed_precision_param=float32"}, "training.mixed_precision_param"},
		// --world and the cluster's size, --world and the recipe's degrees.
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "1024"}, "has 128 devices"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--set", "parallelism.data_parallel_shard_degree=2"}, "make 2 ranks"},
		// --float8 is the converter: the float8 keys apply to it.
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--float8", "--set", "float8.recipe_name=rowwise"}, "float8.recipe_name"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--float8", "--set", "float8.enable_fsdp_float8_all_gather=true"}, "enable_fsdp_float8_all_gather"},
		// Async TP: needs compile, and a tensor-parallel layout.
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--async-tp", "--set", "parallelism.tensor_parallel_degree=2"}, "needs compile"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--async-tp", "--compile"}, "has none"},
		{[]string{"plan", "--reference", "--cluster", "h100-sxm"}, "takes no"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--search", "--top", "0"}, "--top 0"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--set", "training.threads=1"}, "training.threads"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_debug.toml", "--cluster", "this", "--calibration", gpuCal}, "not a CPU host"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_debug.toml", "--cluster", "this", "--calibration", noPeak}, "host_peak_flops"},
		// Flags of another mode, which would be ignored.
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-grandteton", "--world", "8", "--top", "3"}, "--top goes with --search"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-grandteton", "--world", "8", "--headroom", "0.2"}, "--headroom goes with --search"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-grandteton", "--world", "8", "--calibrate-nproc", "2"}, "--calibrate-nproc goes with --calibrate"},
		{[]string{"plan", "--calibrate", "--recipe", "../../recipes/llama3_8b.toml"}, "takes no --recipe"},
		{[]string{"plan", "--reference", "--calibrate-nproc", "2"}, "takes no --calibrate-nproc"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-grandteton", "--world", "8", "--calibration", gpuCal}, "GPU cluster"},
		// GPU priors: for a GPU cluster or --reference only.
		{[]string{"plan", "--recipe", "../../recipes/llama3_debug.toml", "--cluster", "this", "--priors", priors}, "--priors: a GPU's priors"},
		{[]string{"plan", "--calibrate", "--priors", priors}, "takes no --priors"},
		{[]string{"plan", "--reference", "--priors", filepath.Join(t.TempDir(), "none.json")}, "--priors"},
		{[]string{"plan", "--reference", "--priors="}, "--priors: give the JSON file"},
		// The recipe's layout needs more than the device has: the
		// prediction is written, and the command fails.
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8"}, "does not fit on h100-sxm: it needs 82.40 GiB of the device's 80.00 GiB, 76.95 GiB of tensors"},
		{[]string{"plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--json"}, "does not fit"},
	} {
		out, err := titan(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q\n%s", c.args, err, c.want, out)
		}
		if strings.Contains(c.want, "does not fit") && !strings.Contains(out, "82.4") {
			t.Errorf("%v: the prediction was not written before the error:\n%s", c.args, out)
		}
	}
}

// writePriors writes priors as a GPU's run of bench/plan/gpu_priors.py
// prints them (attention at 0.5 of the matmul's rate at the reference
// row's shape, float8 0.8).
func writePriors(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "priors.json")
	body := `{"device": "NVIDIA H100 80GB HBM3", "smoke": false, "attention_rel": {"2x32x8192x8192x128 causal": 0.5}, "fp8_rel": 0.8}`
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPlanPriors: --priors puts a GPU's measured priors in the GPU
// calibration, for --reference and for a recipe on a GPU cluster, and
// says so.
func TestPlanPriors(t *testing.T) {
	priors := writePriors(t)
	out, err := titan(t, "plan", "--reference", "--priors", priors)
	if err != nil || !strings.Contains(out, "priors (attention, float8 measured on NVIDIA H100 80GB HBM3 (priors.json), the rest assumed) attention 0.50×matmul, float8 0.80×matmul") {
		t.Errorf("plan --reference --priors: %v\n%.600s", err, out)
	}
	out, err = titan(t, "plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "16", "--priors", priors, "--json")
	var got struct {
		Calibration struct {
			Matmul    float64 `json:"matmul_efficiency"`
			Attention float64 `json:"attention_efficiency"`
			Priors    struct {
				Source string `json:"source"`
			} `json:"priors"`
		} `json:"calibration"`
	}
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || math.Abs(got.Calibration.Attention/got.Calibration.Matmul-0.5) > 1e-9 ||
		!strings.Contains(got.Calibration.Priors.Source, "measured on NVIDIA H100") {
		t.Errorf("plan --priors --json: %v %+v\n%.600s", err, got, out)
	}
}

// TestPlanCalibrateThisMachine runs the calibration (collectives on 2
// processes only) and predicts the debug recipe with it.
func TestPlanCalibrateThisMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs benchmarks")
	}
	cal := filepath.Join(t.TempDir(), "cal.json")
	if out, err := titan(t, "plan", "--calibrate", "--calibration", cal, "--calibrate-nproc", "2"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// The in-step probe ran: a training step's rate against the kernels'.
	// So did the host peak, which MFU is then taken against.
	// So did the probes under activation checkpointing.
	var written struct {
		InStep    float64 `json:"in_step_factor"`
		HostPeak  float64 `json:"host_peak_flops"`
		ACSpeedup []struct {
			Mode    string  `json:"mode"`
			Speedup float64 `json:"speedup"`
		} `json:"ac_speedup"`
	}
	if data, err := os.ReadFile(cal); err != nil || json.Unmarshal(data, &written) != nil || !(written.InStep > 0) || !(written.HostPeak > 0) ||
		len(written.ACSpeedup) != 2 || written.ACSpeedup[0].Mode != "selective op" || written.ACSpeedup[1].Mode != "full" ||
		!(written.ACSpeedup[0].Speedup > 0) || !(written.ACSpeedup[1].Speedup > 0) {
		t.Errorf("calibration %s: in_step_factor %g, host_peak_flops %g, ac_speedup %+v (%v)", cal, written.InStep, written.HostPeak, written.ACSpeedup, err)
	}
	out, err := titan(t, "plan", "--recipe", "../../recipes/llama3_debug.toml", "--cluster", "this", "--calibration", cal, "--world", "2",
		"--set", "parallelism.tensor_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=1")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"tp comm (exposed)", "tokens/s per device", "memplan total"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if m := regexp.MustCompile(`MFU ([0-9.]+)%`).FindStringSubmatch(out); m == nil {
		t.Errorf("no MFU in\n%s", out)
	} else if mfu, _ := strconv.ParseFloat(m[1], 64); !(mfu > 0 && mfu < 100) {
		t.Errorf("MFU %g%% against the measured host peak, want within (0, 100)", mfu)
	}
	out, err = titan(t, "plan", "--recipe", "../../recipes/llama3_debug.toml", "--cluster", "this", "--calibration", cal, "--world", "4", "--search", "--top", "3")
	if err != nil || !strings.Contains(out, "why slower than #1") {
		t.Errorf("--search: %v\n%s", err, out)
	}
}

// TestPlanJSON checks the --json forms of --reference (every row with its
// step breakdown, null where a row publishes no memory) and of --search
// (the recipe's own layout, its rank and why it loses).
func TestPlanJSON(t *testing.T) {
	out, err := titan(t, "plan", "--reference", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var ref struct {
		Rows []struct {
			Row          string   `json:"row"`
			PublishedGiB *float64 `json:"published_memory_gib"`
			MemoryError  *float64 `json:"memory_error"`
			Prediction   struct {
				Step []struct {
					Seconds float64 `json:"seconds"`
				} `json:"step_seconds"`
				StepTotal float64 `json:"step_total_seconds"`
			} `json:"prediction"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &ref); err != nil || len(ref.Rows) == 0 {
		t.Fatalf("--reference --json: %v\n%.500s", err, out)
	}
	var without int
	for _, r := range ref.Rows {
		sum := 0.0
		for _, p := range r.Prediction.Step {
			sum += p.Seconds
		}
		if !(r.Prediction.StepTotal > 0) || math.Abs(sum/r.Prediction.StepTotal-1) > 1e-9 {
			t.Errorf("%s: step parts sum to %g s, step %g s", r.Row, sum, r.Prediction.StepTotal)
		}
		if (r.PublishedGiB == nil) != (r.MemoryError == nil) {
			t.Errorf("%s: published memory %v with error %v", r.Row, r.PublishedGiB, r.MemoryError)
		}
		if r.PublishedGiB == nil {
			without++
		}
	}
	if without == 0 {
		t.Errorf("no row without published memory reads null")
	}
	out, err = titan(t, "plan", "--recipe", "../../recipes/llama3_8b.toml", "--cluster", "h100-sxm", "--world", "8", "--search", "--top", "2", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var s struct {
		Given *struct {
			Rank       int `json:"rank"`
			Prediction struct {
				Why string `json:"why_slower"`
			} `json:"prediction"`
		} `json:"given"`
	}
	// The recipe's 8B FSDP8 needs 82.4 GiB of an 80 GiB H100: it does
	// not fit, and says so.
	if err := json.Unmarshal([]byte(out), &s); err != nil || s.Given == nil || s.Given.Rank != 0 || !strings.Contains(s.Given.Prediction.Why, "needs") {
		t.Errorf("--search --json given: %+v (%v)\n%.800s", s.Given, err, out)
	}
}
