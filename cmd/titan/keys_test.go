package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/hf"
	"github.com/titan-go/titan/internal/modelfile"
	"github.com/titan-go/titan/internal/runstore"
)

// keyCheck says how TestEveryRecipeKeyIsHonest shows that a recipe key is
// not silently ignored. Exactly one of its fields is set.
type keyCheck struct {
	// refuse is a value that titan must refuse, naming the key, because
	// the feature is not supported yet.
	refuse string
	// check shows that setting the key changes something observable: a
	// training run's metrics.jsonl, its files or its log.
	check func(t *testing.T, h *keysHarness)
	// inertUnless names a switch key that the key only matters under;
	// the switch must be refused (so the key cannot be silently
	// ignored).
	inertUnless string
	// coveredBy names the test in this package (or, with a path prefix,
	// in another) that shows the key's effect; the test must exist.
	coveredBy string
}

// keysHarness runs tiny trainings and caches them by their overrides.
type keysHarness struct {
	data, data2 string
	root        string // holds every run's dump folder
	runs        map[string]*keysRun
}

// keysRun is one finished (or refused) run.
type keysRun struct {
	dump, out string
	err       error
}

// keysBase are the overrides of every tiny run: 3 steps of the
// tiny_bench model on 2 sequences of 16 tokens, logging every step.
func keysBase(dump, data string) []string {
	return []string{"train", "--recipe", "../../recipes/llama3_debug.toml",
		"--set", "model.flavor=tiny_bench", "--set", "training.seq_len=16", "--set", "training.local_batch_size=2",
		"--set", "training.dataset=text", "--set", "training.dataset_path=" + data,
		"--set", "training.steps=3", "--set", "metrics.log_freq=1", "--set", "lr_scheduler.warmup_steps=1",
		"--set", "validation.enable=false", "--set", "checkpoint.enable=false", "--set", "training.threads=1",
		"--set", "job.dump_folder=" + dump}
}

// run trains with the base overrides plus sets ("section.key=value", or
// raw arguments starting with --), once per distinct list.
func (h *keysHarness) run(t *testing.T, sets ...string) *keysRun {
	t.Helper()
	id := strings.Join(sets, "\x00")
	if r, ok := h.runs[id]; ok {
		return r
	}
	dump, err := os.MkdirTemp(h.root, "dump")
	if err != nil {
		t.Fatal(err)
	}
	args := keysBase(dump, h.data)
	for _, s := range sets {
		if strings.HasPrefix(s, "--") {
			args = append(args, strings.Fields(s)...)
		} else {
			args = append(args, "--set", s)
		}
	}
	out, err := titan(t, args...)
	r := &keysRun{dump: dump, out: out, err: err}
	h.runs[id] = r
	return r
}

// ok runs and requires success.
func (h *keysHarness) ok(t *testing.T, sets ...string) *keysRun {
	t.Helper()
	r := h.run(t, sets...)
	if r.err != nil {
		t.Fatalf("run %v: %v\n%s", sets, r.err, r.out)
	}
	return r
}

// col reads one column of metrics.jsonl (steps without it are absent).
func (r *keysRun) col(t *testing.T, key string) map[int]float64 {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(r.dump, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]float64{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var m map[string]float64
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if v, ok := m[key]; ok {
			out[int(m["step"])] = v
		}
	}
	return out
}

// differs requires that column key of the run with sets differs from the
// baseline's at some step.
func (h *keysHarness) differs(t *testing.T, key string, sets ...string) {
	t.Helper()
	base, got := h.ok(t).col(t, key), h.ok(t, sets...).col(t, key)
	if reflect.DeepEqual(base, got) {
		t.Errorf("%v: %s column unchanged: %v", sets, key, got)
	}
}

// differsFrom is differs against the run with base instead of the
// baseline.
func (h *keysHarness) differsFrom(t *testing.T, key string, base []string, sets ...string) {
	t.Helper()
	a, b := h.ok(t, base...).col(t, key), h.ok(t, append(base, sets...)...).col(t, key)
	if reflect.DeepEqual(a, b) {
		t.Errorf("%v on %v: %s column unchanged: %v", sets, base, key, a)
	}
}

// logDiffers requires that the run's log matches re and the baseline's
// does not.
func (h *keysHarness) logDiffers(t *testing.T, re string, sets ...string) {
	t.Helper()
	rx := regexp.MustCompile(re)
	if base := h.ok(t).out; rx.MatchString(base) {
		t.Fatalf("baseline log already matches %q:\n%s", re, base)
	}
	if out := h.ok(t, sets...).out; !rx.MatchString(out) {
		t.Errorf("%v: log does not match %q:\n%s", sets, re, out)
	}
}

// fails requires that the run fails with an error that contains want.
func (h *keysHarness) fails(t *testing.T, want string, sets ...string) {
	t.Helper()
	r := h.run(t, sets...)
	if r.err == nil || !strings.Contains(r.err.Error(), want) {
		t.Errorf("%v: error %v, want one containing %q\n%s", sets, r.err, want, r.out)
	}
}

// exists requires that path (relative to the run's dump folder) exists or not.
func (r *keysRun) exists(t *testing.T, path string, want bool) {
	t.Helper()
	_, err := os.Stat(filepath.Join(r.dump, path))
	if (err == nil) != want {
		t.Errorf("%s exists = %v, want %v", path, err == nil, want)
	}
}

func steps(m map[int]float64) int { return len(m) }

// storeRuns lists the runs of the run store at target (none when it does
// not exist).
func storeRuns(t *testing.T, target string) []runstore.Summary {
	t.Helper()
	s, err := runstore.OpenExisting(context.Background(), target)
	if errors.Is(err, runstore.ErrNoStore) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runs, err := s.List(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

// keyTable has an entry for every recipe key.
var keyTable = map[string]keyCheck{
	// [job]
	"job.dump_folder": {check: func(t *testing.T, h *keysHarness) { h.ok(t).exists(t, "metrics.jsonl", true) }},
	"job.description": {check: func(t *testing.T, h *keysHarness) {
		r := h.ok(t, "job.description=zebra-run")
		svg, _ := os.ReadFile(filepath.Join(r.dump, "loss.svg"))
		if !strings.Contains(string(svg), "zebra-run") {
			t.Error("loss.svg title lacks job.description")
		}
	}},
	"job.print_config": {check: func(t *testing.T, h *keysHarness) {
		h.logDiffers(t, `(?m)^\[training\]$`, "job.print_config=true")
	}},
	"job.save_config_file": {check: func(t *testing.T, h *keysHarness) {
		r := h.ok(t, "job.save_config_file=saved.toml")
		j, err := config.Load(filepath.Join(r.dump, "saved.toml"), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if j.Model.Flavor != "tiny_bench" || j.Training.SeqLen != 16 || j.Job.SaveConfigFile != "saved.toml" {
			t.Errorf("saved recipe: flavor %s seq_len %d", j.Model.Flavor, j.Training.SeqLen)
		}
		h.ok(t).exists(t, "saved.toml", false)
	}},
	// [profiling]: traces (schedule and folder) and memory snapshots.
	"profiling.enable_profiling":   {coveredBy: "TestProfilingTrace"},
	"profiling.save_traces_folder": {coveredBy: "TestProfilingTrace"},
	"profiling.profile_freq": {check: func(t *testing.T, h *keysHarness) {
		h.ok(t, "profiling.enable_profiling=true", "profiling.profile_freq=3", "profiling.profiler_warmup=1").exists(t, "profile_traces/iteration_3/trace.json", true)
		h.fails(t, "profiling.profile_freq", "profiling.enable_profiling=true", "profiling.profile_freq=2", "profiling.profiler_warmup=2")
	}},
	"profiling.profiler_active":             {coveredBy: "TestProfilingTrace"},
	"profiling.profiler_warmup":             {coveredBy: "TestProfilingTrace"},
	"profiling.enable_memory_snapshot":      {coveredBy: "TestMemorySnapshot"},
	"profiling.save_memory_snapshot_folder": {coveredBy: "TestMemorySnapshot"},
	// [metrics]
	"metrics.log_freq": {check: func(t *testing.T, h *keysHarness) {
		// Steps 1 and the last are always logged.
		if n := steps(h.ok(t, "metrics.log_freq=5").col(t, "loss")); n != 2 {
			t.Errorf("log_freq 5 over 3 steps logged %d steps, want 2", n)
		}
	}},
	"metrics.enable_tensorboard": {coveredBy: "TestTensorBoardMatchesMetrics"},
	"metrics.disable_color_printing": {check: func(t *testing.T, h *keysHarness) {
		// CLICOLOR_FORCE colours the line as a terminal would; the key
		// takes the colour away.
		t.Setenv("CLICOLOR_FORCE", "1")
		const esc = "\x1b[3"
		if out := h.ok(t, "job.description=colour").out; !strings.Contains(out, esc) {
			t.Fatalf("CLICOLOR_FORCE=1: no colour in the log:\n%s", out)
		}
		if out := h.ok(t, "job.description=colour", "metrics.disable_color_printing=true").out; strings.Contains(out, esc) {
			t.Errorf("metrics.disable_color_printing=true: the log is coloured:\n%q", out)
		}
	}},
	"metrics.save_tb_folder": {check: func(t *testing.T, h *keysHarness) {
		r := h.ok(t, "metrics.enable_tensorboard=true", "metrics.save_tb_folder=elsewhere")
		r.exists(t, "elsewhere", true)
		r.exists(t, "tb", false)
		h.fails(t, "metrics.save_tb_folder", "metrics.enable_tensorboard=true", "metrics.save_tb_folder=")
	}},
	"metrics.enable_db": {check: func(t *testing.T, h *keysHarness) {
		on := filepath.Join(t.TempDir(), "on.db")
		h.ok(t, "metrics.db="+on)
		if runs := storeRuns(t, on); len(runs) != 1 || runs[0].Status != runstore.Finished || runs[0].Steps != 3 {
			t.Errorf("metrics.enable_db on (the default): runs %+v, want one finished run of 3 steps", runs)
		}
		off := filepath.Join(t.TempDir(), "off.db")
		h.ok(t, "metrics.db="+off, "metrics.enable_db=false")
		if _, err := os.Stat(off); err == nil {
			t.Errorf("metrics.enable_db=false created %s", off)
		}
		// Rank 0 alone records: two workers, one run.
		two := filepath.Join(t.TempDir(), "two.db")
		h.ok(t, "metrics.db="+two, "--nproc 2", "training.local_batch_size=1")
		if runs := storeRuns(t, two); len(runs) != 1 || runs[0].World != 2 || runs[0].Steps != 3 {
			t.Errorf("--nproc 2: runs %+v, want one run of world 2", runs)
		}
	}},
	"metrics.db": {check: func(t *testing.T, h *keysHarness) {
		// The run goes to metrics.db, not to $TITAN_DB.
		before := len(storeRuns(t, os.Getenv(runstore.EnvDB)))
		db := filepath.Join(t.TempDir(), "sub", "mine.db")
		r := h.ok(t, "metrics.db="+db, "job.description=mine")
		if runs := storeRuns(t, db); len(runs) != 1 || runs[0].Description != "mine" || runs[0].DumpFolder != r.dump {
			t.Errorf("metrics.db: runs %+v", runs)
		}
		if after := len(storeRuns(t, os.Getenv(runstore.EnvDB))); after != before {
			t.Errorf("a run with metrics.db also went to %s (%d runs, then %d)", runstore.EnvDB, before, after)
		}
		h.fails(t, "metrics.db", "metrics.db=mysql://host/runs")
	}},
	"metrics.save_for_all_ranks": {check: func(t *testing.T, h *keysHarness) {
		r := h.ok(t, "metrics.save_for_all_ranks=true", "--nproc 2", "training.local_batch_size=1")
		r.exists(t, "metrics.jsonl", true)
		r.exists(t, "metrics_rank1.jsonl", true)
	}},
	// [model]
	"model.name": {check: func(t *testing.T, h *keysHarness) { h.fails(t, "model.name", "model.name=gpt2") }},
	"model.flavor": {check: func(t *testing.T, h *keysHarness) {
		h.logDiffers(t, `llama3 debug, 6\.\d+ ?M parameters`, "model.flavor=debug")
	}},
	"model.tokenizer_path": {check: func(t *testing.T, h *keysHarness) {
		h.fails(t, "model.tokenizer_path", "model.tokenizer_path=/nonexistent/tok.model")
	}},
	"model.converters": {coveredBy: "TestFloat8Trains"},
	// [optimizer]: each changes the losses after the first step.
	"optimizer.name": {check: func(t *testing.T, h *keysHarness) {
		h.differs(t, "loss", "optimizer.name=Adam", "optimizer.weight_decay=5")
	}},
	"optimizer.lr":           {check: func(t *testing.T, h *keysHarness) { h.differs(t, "loss", "optimizer.lr=0.01") }},
	"optimizer.beta1":        {check: func(t *testing.T, h *keysHarness) { h.differs(t, "loss", "optimizer.beta1=0.5") }},
	"optimizer.beta2":        {check: func(t *testing.T, h *keysHarness) { h.differs(t, "loss", "optimizer.beta2=0.5") }},
	"optimizer.eps":          {check: func(t *testing.T, h *keysHarness) { h.differs(t, "loss", "optimizer.eps=0.01") }},
	"optimizer.weight_decay": {check: func(t *testing.T, h *keysHarness) { h.differs(t, "loss", "optimizer.weight_decay=50") }},
	"optimizer.implementation": {check: func(t *testing.T, h *keysHarness) {
		// Expected once wired: the same losses within 1e-6 and the log
		// names the implementation.
		h.logDiffers(t, "for-loop", "optimizer.implementation=for-loop")
	}},
	// [lr_scheduler]: the lr column.
	"lr_scheduler.warmup_steps": {check: func(t *testing.T, h *keysHarness) { h.differs(t, "lr", "lr_scheduler.warmup_steps=3") }},
	"lr_scheduler.total_steps":  {check: func(t *testing.T, h *keysHarness) { h.differs(t, "lr", "lr_scheduler.total_steps=4") }},
	// Over 6 steps, so that the decay has points in its middle.
	"lr_scheduler.decay_ratio": {check: func(t *testing.T, h *keysHarness) {
		h.differsFrom(t, "lr", []string{"training.steps=6"}, "lr_scheduler.decay_ratio=0.4")
	}},
	"lr_scheduler.decay_type": {check: func(t *testing.T, h *keysHarness) {
		h.differsFrom(t, "lr", []string{"training.steps=6"}, "lr_scheduler.decay_type=linear")
	}},
	"lr_scheduler.min_lr_factor": {check: func(t *testing.T, h *keysHarness) {
		h.differs(t, "lr", "lr_scheduler.min_lr_factor=0.5")
	}},
	// [training]
	"training.dataset": {check: func(t *testing.T, h *keysHarness) {
		h.fails(t, "malformed JSON line", "training.dataset=jsonl")
	}},
	"training.dataset_path": {check: func(t *testing.T, h *keysHarness) {
		h.differs(t, "loss", "training.dataset_path="+h.data2)
	}},
	"training.local_batch_size": {check: func(t *testing.T, h *keysHarness) {
		h.logDiffers(t, `3 sequences × 16 tokens`, "training.local_batch_size=3")
	}},
	"training.global_batch_size": {check: func(t *testing.T, h *keysHarness) {
		h.logDiffers(t, `\(2 accumulated local batches of 2`, "training.global_batch_size=4")
	}},
	"training.seq_len": {check: func(t *testing.T, h *keysHarness) {
		h.logDiffers(t, `× 24 tokens`, "training.seq_len=24")
	}},
	"training.max_norm": {check: func(t *testing.T, h *keysHarness) { h.differs(t, "loss", "training.max_norm=0.001") }},
	"training.steps": {check: func(t *testing.T, h *keysHarness) {
		if n := steps(h.ok(t, "training.steps=2").col(t, "loss")); n != 2 {
			t.Errorf("training.steps=2 logged %d steps", n)
		}
	}},
	"training.gradient_accumulation_steps": {check: func(t *testing.T, h *keysHarness) {
		h.logDiffers(t, `\(3 accumulated local batches of 2`, "training.gradient_accumulation_steps=3")
	}},
	"training.seed": {check: func(t *testing.T, h *keysHarness) { h.differs(t, "loss", "training.seed=7") }},
	"training.deterministic": {check: func(t *testing.T, h *keysHarness) {
		// titan's kernels and collectives are deterministic in every
		// mode: the key is logged, and two runs agree bit for bit.
		h.logDiffers(t, "deterministic: on", "training.deterministic=true")
		a := h.ok(t, "training.deterministic=true")
		b := h.ok(t, "training.deterministic=true", "job.description=again")
		for _, col := range []string{"loss", "grad_norm"} {
			if x, y := a.col(t, col), b.col(t, col); !reflect.DeepEqual(x, y) {
				t.Errorf("training.deterministic=true: %s %v, then %v", col, x, y)
			}
		}
	}},
	"training.mixed_precision_param":  {coveredBy: "TestMixedPrecisionLayoutsMatchOneProcess"},
	"training.mixed_precision_reduce": {coveredBy: "TestMixedPrecisionLayoutsMatchOneProcess"},
	// [float8]: the recipes and the filter change a float8 run's losses,
	// which tensor parallelism keeps (TestFloat8TensorParallelMatchesOneProcess);
	// the FSDP float8 all-gather moves the float8 weights in half the
	// bytes of the bfloat16 gather, with the same losses; precomputed
	// scales take fewer amax all-reduces, with the same losses.
	"float8.recipe_name": {coveredBy: "TestFloat8Trains"},
	"float8.filter_fqns": {coveredBy: "TestFloat8Trains"},
	"float8.enable_fsdp_float8_all_gather": {check: func(t *testing.T, h *keysHarness) {
		base := float8FSDP()
		a, b := h.ok(t, base...), h.ok(t, append(base, "float8.enable_fsdp_float8_all_gather=true")...)
		ga, gb := gatherLog(t, a), gatherLog(t, b)
		if ga.as != "bfloat16" || gb.as != "e4m3" || gb.float8*2 != ga.float8 || gb.other != ga.other {
			t.Errorf("float8 weights gathered as %s in %d B (other %d B), with the float8 all-gather as %s in %d B (other %d B): want e4m3 in half the bytes",
				ga.as, ga.float8, ga.other, gb.as, gb.float8, gb.other)
		}
		if x, y := a.col(t, "loss"), b.col(t, "loss"); !reflect.DeepEqual(x, y) {
			t.Errorf("the float8 all-gather changed the losses: %v, then %v", x, y)
		}
		h.fails(t, "float8.enable_fsdp_float8_all_gather", "float8.enable_fsdp_float8_all_gather=true")
	}},
	"float8.precompute_float8_dynamic_scale_for_fsdp": {check: func(t *testing.T, h *keysHarness) {
		base := append(float8FSDP(), "float8.enable_fsdp_float8_all_gather=true")
		a, b := h.ok(t, base...), h.ok(t, append(base, "float8.precompute_float8_dynamic_scale_for_fsdp=true")...)
		ga, gb := gatherLog(t, a), gatherLog(t, b)
		if steps := 3; gb.amax != steps || ga.amax <= gb.amax {
			t.Errorf("amax all-reduces: %d per weight and gather, %d precomputed: want one per step (%d)", ga.amax, gb.amax, steps)
		}
		if x, y := a.col(t, "loss"), b.col(t, "loss"); !reflect.DeepEqual(x, y) {
			t.Errorf("precomputed scales changed the losses: %v, then %v", x, y)
		}
		h.fails(t, "float8.precompute_float8_dynamic_scale_for_fsdp", "float8.precompute_float8_dynamic_scale_for_fsdp=true")
	}},
	// training.device: "cuda" takes the CUDA backend, which on a machine
	// without a GPU (CI) is an error naming the key; TestDevicesWithoutGPU
	// checks its text.
	"training.device": {check: func(t *testing.T, h *keysHarness) {
		h.fails(t, `training.device = "cuda"`, "training.device=cuda")
	}},
	"training.threads": {check: func(t *testing.T, h *keysHarness) {
		h.logDiffers(t, `, 2 threads per rank`, "training.threads=2")
	}},
	// [parallelism]: on one process, a degree that needs more workers
	// is refused by the trainer, which shows the key is read.
	"parallelism.data_parallel_replicate_degree": {check: func(t *testing.T, h *keysHarness) {
		h.fails(t, "dp_replicate 2", "parallelism.data_parallel_replicate_degree=2")
	}},
	"parallelism.data_parallel_shard_degree": {check: func(t *testing.T, h *keysHarness) {
		h.fails(t, "dp_shard 2", "parallelism.data_parallel_shard_degree=2")
	}},
	"parallelism.fsdp_reshard_after_forward": {coveredBy: "TestShardedParallelismMatchesOneProcess"},
	"parallelism.tensor_parallel_degree": {check: func(t *testing.T, h *keysHarness) {
		h.fails(t, "tp 2", "parallelism.tensor_parallel_degree=2")
	}},
	"parallelism.disable_loss_parallel":        {refuse: "true"},
	"parallelism.enable_async_tensor_parallel": {refuse: "true"},
	"parallelism.pipeline_parallel_degree": {check: func(t *testing.T, h *keysHarness) {
		h.fails(t, "pp 2", "parallelism.pipeline_parallel_degree=2")
	}},
	"parallelism.pipeline_parallel_schedule":         {coveredBy: "TestPipelineParallelMatchesOneProcess"},
	"parallelism.pipeline_parallel_microbatch_size":  {coveredBy: "TestPipelineParallelRefusesBadLayouts"},
	"parallelism.pipeline_parallel_layers_per_stage": {coveredBy: "TestPipelineParallelMatchesOneProcess"},
	"parallelism.pipeline_parallel_first_stage_less_layers": {check: func(t *testing.T, h *keysHarness) {
		// tiny_bench's 4 layers over pp 2 split 2+2 by default (the
		// embedding and the head count as one layer each); counted as 8
		// layers, the embedding leaves the first stage -1. The split
		// itself is TestSplitLayers' (internal/parallel).
		h.fails(t, "stage 0 would get -1", "--nproc 2", "parallelism.pipeline_parallel_degree=2", "parallelism.pipeline_parallel_first_stage_less_layers=8")
	}},
	"parallelism.pipeline_parallel_last_stage_less_layers": {check: func(t *testing.T, h *keysHarness) {
		h.fails(t, "stage 1 would get -2", "--nproc 2", "parallelism.pipeline_parallel_degree=2", "parallelism.pipeline_parallel_last_stage_less_layers=8")
	}},
	"parallelism.context_parallel_degree": {check: func(t *testing.T, h *keysHarness) {
		h.fails(t, "cp 2", "parallelism.context_parallel_degree=2")
	}},
	"parallelism.context_parallel_rotate_method": {refuse: "allgather"},
	// [checkpoint]
	"checkpoint.enable": {check: func(t *testing.T, h *keysHarness) {
		h.ok(t, "checkpoint.enable=true").exists(t, "checkpoint", true)
		h.ok(t).exists(t, "checkpoint", false)
	}},
	"checkpoint.folder": {check: func(t *testing.T, h *keysHarness) {
		h.ok(t, "checkpoint.enable=true", "checkpoint.folder=ck2").exists(t, "ck2", true)
	}},
	"checkpoint.interval": {check: func(t *testing.T, h *keysHarness) {
		r := h.ok(t, "checkpoint.enable=true", "checkpoint.interval=1", "checkpoint.keep_latest_k=0")
		if n := len(stepDirs(t, r, "checkpoint")); n != 3 {
			t.Errorf("interval 1 over 3 steps left %d checkpoints, want 3", n)
		}
	}},
	"checkpoint.initial_load_path": {check: func(t *testing.T, h *keysHarness) {
		src := h.ok(t, "checkpoint.enable=true")
		dirs := stepDirs(t, src, "checkpoint")
		h.differs(t, "loss", "checkpoint.enable=true", "checkpoint.initial_load_path="+filepath.Join(src.dump, "checkpoint", dirs[len(dirs)-1]))
	}},
	"checkpoint.initial_load_model_only": {check: func(t *testing.T, h *keysHarness) {
		// false: the full state of the checkpoint (its step, optimizer and
		// data position), so training goes on at step 4.
		src := h.ok(t, "checkpoint.enable=true", "checkpoint.last_save_model_only=false")
		from := "checkpoint.initial_load_path=" + filepath.Join(src.dump, "checkpoint", "step-3")
		full := h.ok(t, "checkpoint.enable=true", from, "checkpoint.initial_load_model_only=false", "training.steps=5").col(t, "loss")
		if _, ok := full[1]; ok || len(full) != 2 {
			t.Errorf("initial_load_model_only=false logged steps %v, want 4 and 5", full)
		}
		weights := h.ok(t, "checkpoint.enable=true", from, "checkpoint.initial_load_model_only=true", "training.steps=5").col(t, "loss")
		if len(weights) != 5 {
			t.Errorf("initial_load_model_only=true logged steps %v, want 1 to 5", weights)
		}
	}},
	"checkpoint.initial_load_in_hf": {check: func(t *testing.T, h *keysHarness) {
		// The weights of a Hugging Face export train exactly as the titan
		// checkpoint they came from, and unlike the recipe's initial ones.
		src := h.ok(t, "checkpoint.enable=true")
		step := filepath.Join(src.dump, "checkpoint", "step-3")
		hfDir := filepath.Join(t.TempDir(), "hf")
		if out, err := titan(t, "checkpoint", "export", "--checkpoint", step, "--hf", hfDir); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		fromHF := h.ok(t, "checkpoint.enable=true", "checkpoint.initial_load_path="+hfDir, "checkpoint.initial_load_in_hf=true")
		fromTitan := h.ok(t, "checkpoint.enable=true", "checkpoint.initial_load_path="+step)
		if a, b := fromHF.col(t, "loss"), fromTitan.col(t, "loss"); !reflect.DeepEqual(a, b) {
			t.Errorf("losses from the Hugging Face folder %v, from the titan checkpoint %v", a, b)
		}
		h.differs(t, "loss", "checkpoint.enable=true", "checkpoint.initial_load_path="+hfDir, "checkpoint.initial_load_in_hf=true")
	}},
	"checkpoint.last_save_model_only": {check: func(t *testing.T, h *keysHarness) {
		full := h.ok(t, "checkpoint.enable=true", "checkpoint.last_save_model_only=false")
		lite := h.ok(t, "checkpoint.enable=true", "checkpoint.last_save_model_only=true")
		if a, b := dirSize(t, full, "checkpoint"), dirSize(t, lite, "checkpoint"); a <= b {
			t.Errorf("full last save %d bytes, model-only %d", a, b)
		}
	}},
	"checkpoint.last_save_in_hf": {check: func(t *testing.T, h *keysHarness) {
		// The Hugging Face folder holds the final weights exactly.
		r := h.ok(t, "checkpoint.enable=true", "checkpoint.last_save_in_hf=true")
		got := hfWeights(t, filepath.Join(r.dump, "checkpoint", "hf-step-3"))
		want := finalWeights(t, filepath.Join(r.dump, "checkpoint", "step-3"))
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("weight %d: %v exported, %v in the checkpoint", i, got[i], want[i])
			}
		}
		h.ok(t, "checkpoint.enable=true").exists(t, "checkpoint/hf-step-3", false)
	}},
	"checkpoint.export_dtype": {check: func(t *testing.T, h *keysHarness) {
		// bfloat16: the final weights rounded to nearest even, in half
		// the bytes.
		r := h.ok(t, "checkpoint.enable=true", "checkpoint.last_save_in_hf=true", "checkpoint.export_dtype=bfloat16")
		f32 := h.ok(t, "checkpoint.enable=true", "checkpoint.last_save_in_hf=true")
		dir := filepath.Join(r.dump, "checkpoint", "hf-step-3")
		got := hfWeights(t, dir)
		want := finalWeights(t, filepath.Join(r.dump, "checkpoint", "step-3"))
		for i := range want {
			if b := bf16RNE(want[i]); math.Float32bits(got[i]) != b {
				t.Fatalf("weight %d: %08x exported, %v rounds to %08x", i, math.Float32bits(got[i]), want[i], b)
			}
		}
		if a, b := dirSize(t, r, "checkpoint/hf-step-3"), dirSize(t, f32, "checkpoint/hf-step-3"); a*3 > b*2 {
			t.Errorf("bfloat16 export %d bytes, float32 %d", a, b)
		}
	}},
	"checkpoint.async_mode": {check: func(t *testing.T, h *keysHarness) {
		// Both modes save in the background (the log says so) exactly
		// the state a synchronous save writes.
		sync := h.ok(t, "checkpoint.enable=true", "checkpoint.interval=1", "checkpoint.keep_latest_k=0", "checkpoint.async_mode=disabled")
		for _, mode := range []string{"async", "async_with_pinned_mem"} {
			sets := []string{"checkpoint.enable=true", "checkpoint.interval=1", "checkpoint.keep_latest_k=0", "checkpoint.async_mode=" + mode}
			h.logDiffers(t, `checkpoint step-2 \(full state\): loop blocked [0-9.]+ ms \([0-9.]+% of a step\), written in the background`, sets...)
			r := h.ok(t, sets...)
			for _, step := range []string{"step-1", "step-2"} {
				sameState(t, mode+" "+step, filepath.Join(sync.dump, "checkpoint", step), filepath.Join(r.dump, "checkpoint", step), "step", "optimizer_step", "seed")
			}
		}
	}},
	"checkpoint.keep_latest_k": {check: func(t *testing.T, h *keysHarness) {
		r := h.ok(t, "checkpoint.enable=true", "checkpoint.interval=1", "checkpoint.keep_latest_k=2")
		if n := len(stepDirs(t, r, "checkpoint")); n != 2 {
			t.Errorf("keep_latest_k 2 left %d checkpoints", n)
		}
	}},
	"checkpoint.load_step": {check: func(t *testing.T, h *keysHarness) {
		r := h.ok(t, "checkpoint.enable=true", "checkpoint.interval=1", "checkpoint.keep_latest_k=0", "checkpoint.last_save_model_only=false")
		args := append(keysBase(r.dump, h.data), "--set", "checkpoint.enable=true", "--set", "checkpoint.load_step=1", "--set", "training.steps=4")
		out, err := titan(t, args...)
		if err != nil || !strings.Contains(out, "at step 1") {
			t.Errorf("load_step=1: %v\n%s", err, out)
		}
	}},
	"checkpoint.exclude_from_loading": {check: func(t *testing.T, h *keysHarness) {
		// Expected: resuming with exclude_from_loading=["train_state"]
		// starts again at step 1 (today only optimizer and dataloader
		// are honoured).
		r := h.ok(t, "checkpoint.enable=true", "checkpoint.interval=1", "checkpoint.last_save_model_only=false")
		args := append(keysBase(r.dump, h.data), "--set", "checkpoint.enable=true", "--set", "training.steps=4", "--set", `checkpoint.exclude_from_loading=["train_state"]`)
		out, err := titan(t, args...)
		if err != nil || strings.Contains(out, "resumed") {
			t.Errorf("exclude train_state: %v\n%s", err, out)
		}
	}},
	"checkpoint.enable_first_step_checkpoint": {check: func(t *testing.T, h *keysHarness) {
		r := h.ok(t, "checkpoint.enable=true", "checkpoint.enable_first_step_checkpoint=true", "checkpoint.keep_latest_k=0")
		if got := stepDirs(t, r, "checkpoint"); !reflect.DeepEqual(got, []string{"step-1", "step-3"}) {
			t.Errorf("first-step checkpoint: step folders %v, want step-1 and step-3", got)
		}
		if got := stepDirs(t, h.ok(t, "checkpoint.enable=true", "checkpoint.keep_latest_k=0"), "checkpoint"); !reflect.DeepEqual(got, []string{"step-3"}) {
			t.Errorf("without it: step folders %v", got)
		}
	}},
	"checkpoint.create_seed_checkpoint": {check: func(t *testing.T, h *keysHarness) {
		// The seed (made with training.seed 7) holds the model only, at
		// step 0, and nothing is trained; a run (seed 8) in its folder
		// starts from those weights: as from initial_load_path, unlike
		// from its own initial weights.
		seed := h.ok(t, "checkpoint.enable=true", "checkpoint.create_seed_checkpoint=true", "training.seed=7")
		if got := stepDirs(t, seed, "checkpoint"); !reflect.DeepEqual(got, []string{"step-0"}) {
			t.Fatalf("seed checkpoint folders %v", got)
		}
		if k := kindOf(t, seed.dump, 0); k != "model-only" {
			t.Errorf("seed checkpoint is %s", k)
		}
		if st, err := os.Stat(filepath.Join(seed.dump, "metrics.jsonl")); err == nil && st.Size() > 0 {
			t.Errorf("creating the seed trained (%d bytes of metrics)", st.Size())
		}
		dump := t.TempDir()
		if err := os.CopyFS(filepath.Join(dump, "checkpoint"), os.DirFS(filepath.Join(seed.dump, "checkpoint"))); err != nil {
			t.Fatal(err)
		}
		out, err := titan(t, append(keysBase(dump, h.data), "--set", "checkpoint.enable=true", "--set", "training.seed=8")...)
		if err != nil || !strings.Contains(out, "seed checkpoint") {
			t.Fatalf("training from the seed: %v\n%s", err, out)
		}
		got := (&keysRun{dump: dump}).col(t, "loss")
		viaPath := h.ok(t, "checkpoint.enable=true", "training.seed=8", "checkpoint.initial_load_path="+filepath.Join(seed.dump, "checkpoint", "step-0")).col(t, "loss")
		own := h.ok(t, "checkpoint.enable=true", "training.seed=8").col(t, "loss")
		if !reflect.DeepEqual(got, viaPath) || reflect.DeepEqual(got, own) {
			t.Errorf("losses from the seed %v; from initial_load_path %v; from seed 8's own weights %v", got, viaPath, own)
		}
		h.fails(t, "run it on one process", "checkpoint.enable=true", "checkpoint.create_seed_checkpoint=true", "--nproc 2")
	}},
	"checkpoint.load_only": {check: func(t *testing.T, h *keysHarness) {
		// The run resumes from the folder's checkpoint and saves nothing.
		src := h.ok(t, "checkpoint.enable=true", "checkpoint.last_save_model_only=false")
		for _, loadOnly := range []string{"true", "false"} {
			dump := t.TempDir()
			if err := os.CopyFS(filepath.Join(dump, "checkpoint"), os.DirFS(filepath.Join(src.dump, "checkpoint"))); err != nil {
				t.Fatal(err)
			}
			args := append(keysBase(dump, h.data), "--set", "checkpoint.enable=true", "--set", "training.steps=5", "--set", "checkpoint.load_only="+loadOnly)
			if out, err := titan(t, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			r := &keysRun{dump: dump}
			if l := r.col(t, "loss"); len(l) != 2 {
				t.Errorf("load_only=%s: logged steps %v, want the resumed 4 and 5", loadOnly, l)
			}
			want := []string{"step-3", "step-5"}
			if loadOnly == "true" {
				want = want[:1]
			}
			if got := stepDirs(t, r, "checkpoint"); !reflect.DeepEqual(got, want) {
				t.Errorf("load_only=%s: step folders %v, want %v", loadOnly, got, want)
			}
		}
	}},
	// [activation_checkpoint]: the log's policy and activation memory.
	"activation_checkpoint.mode": {check: func(t *testing.T, h *keysHarness) {
		h.logDiffers(t, `activation checkpointing full`, "activation_checkpoint.mode=full")
	}},
	"activation_checkpoint.selective_ac_option": {check: func(t *testing.T, h *keysHarness) {
		a := h.ok(t, "activation_checkpoint.mode=selective", "activation_checkpoint.selective_ac_option=1").out
		b := h.ok(t, "activation_checkpoint.mode=selective", "activation_checkpoint.selective_ac_option=op").out
		if acLine(a) == acLine(b) {
			t.Errorf("selective_ac_option 1 and op log the same: %q", acLine(a))
		}
	}},
	// [validation]
	"validation.enable": {check: func(t *testing.T, h *keysHarness) {
		h.differs(t, "val_loss", "validation.enable=true", "validation.freq=1", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+h.data)
	}},
	"validation.dataset": {check: func(t *testing.T, h *keysHarness) {
		h.fails(t, "malformed JSON line", "validation.enable=true", "validation.freq=1", "validation.dataset=jsonl", "validation.dataset_path="+h.data)
	}},
	"validation.dataset_path": {check: func(t *testing.T, h *keysHarness) {
		a := h.ok(t, "validation.enable=true", "validation.freq=1", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+h.data).col(t, "val_loss")
		b := h.ok(t, "validation.enable=true", "validation.freq=1", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+h.data, "validation.dataset=text", "validation.dataset_path="+h.data2).col(t, "val_loss")
		if reflect.DeepEqual(a, b) {
			t.Errorf("val_loss unchanged by validation.dataset_path: %v", a)
		}
	}},
	"validation.local_batch_size": {check: func(t *testing.T, h *keysHarness) {
		a := h.ok(t, "validation.enable=true", "validation.freq=1", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+h.data).col(t, "val_loss")
		b := h.ok(t, "validation.enable=true", "validation.freq=1", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+h.data, "validation.local_batch_size=1").col(t, "val_loss")
		if reflect.DeepEqual(a, b) {
			t.Errorf("val_loss unchanged by validation.local_batch_size: %v", a)
		}
	}},
	"validation.seq_len": {check: func(t *testing.T, h *keysHarness) {
		a := h.ok(t, "validation.enable=true", "validation.freq=1", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+h.data).col(t, "val_loss")
		b := h.ok(t, "validation.enable=true", "validation.freq=1", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+h.data, "validation.seq_len=8").col(t, "val_loss")
		if reflect.DeepEqual(a, b) {
			t.Errorf("val_loss unchanged by validation.seq_len: %v", a)
		}
	}},
	"validation.freq": {check: func(t *testing.T, h *keysHarness) {
		a := h.ok(t, "validation.enable=true", "validation.freq=1", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+h.data).col(t, "val_loss")
		b := h.ok(t, "validation.enable=true", "validation.freq=2", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+h.data).col(t, "val_loss")
		if len(a) != 3 || len(b) != 1 {
			t.Errorf("validations at freq 1: %v, at freq 2: %v", a, b)
		}
	}},
	"validation.steps": {check: func(t *testing.T, h *keysHarness) {
		a := h.ok(t, "validation.enable=true", "validation.freq=1", "validation.steps=1", "validation.dataset=text", "validation.dataset_path="+h.data).col(t, "val_loss")
		b := h.ok(t, "validation.enable=true", "validation.freq=1", "validation.steps=3", "validation.dataset=text", "validation.dataset_path="+h.data).col(t, "val_loss")
		if reflect.DeepEqual(a, b) {
			t.Errorf("val_loss unchanged by validation.steps: %v", a)
		}
	}},
	// [comm]: the values reach the worker's comm.Options; their effects
	// are tested in internal/launch (TestInitTimeout) and internal/comm
	// (TestFlightSize); init_timeout_seconds also end to end here.
	"comm.init_timeout_seconds": {check: func(t *testing.T, h *keysHarness) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		// Rank 0 of a world of 2 whose rank 1 never comes.
		t.Setenv("MASTER_ADDR", "127.0.0.1")
		t.Setenv("MASTER_PORT", fmt.Sprint(port))
		t.Setenv("WORLD_SIZE", "2")
		t.Setenv("RANK", "0")
		h.fails(t, "comm.init_timeout_seconds", "comm.init_timeout_seconds=1")
	}},
	"comm.train_timeout_seconds": {check: func(t *testing.T, h *keysHarness) { commField(t, "comm.train_timeout_seconds=7") }},
	"comm.trace_buf_size":        {check: func(t *testing.T, h *keysHarness) { commField(t, "comm.trace_buf_size=0") }},
	"comm.save_traces_folder":    {check: func(t *testing.T, h *keysHarness) { commField(t, "comm.save_traces_folder=tr") }},
}

// commField requires that the override changes the worker's comm
// settings (commSettingsOf).
func commField(t *testing.T, set string) {
	t.Helper()
	base, err := config.Load("../../recipes/llama3_debug.toml", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	j, err := config.Load("../../recipes/llama3_debug.toml", []string{set}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := commSettingsOf(base), commSettingsOf(j); a == b {
		t.Errorf("%s leaves the comm settings at %+v", set, a)
	}
}

// acLine is the activation-checkpointing part of the start-up log line.
func acLine(out string) string {
	if i := strings.Index(out, "activation checkpointing"); i >= 0 {
		out = out[i:]
		if j := strings.IndexByte(out, '\n'); j >= 0 {
			out = out[:j]
		}
		return out
	}
	return ""
}

// hfWeights imports a Hugging Face folder's weights (titan's flat layout).
func hfWeights(t *testing.T, dir string) []float32 {
	t.Helper()
	_, params, err := hf.Import(dir)
	if err != nil {
		t.Fatal(err)
	}
	return params
}

// finalWeights reads a checkpoint's weights (titan's flat layout).
func finalWeights(t *testing.T, dir string) []float32 {
	t.Helper()
	m, err := modelfile.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m.Params
}

// bf16RNE is x rounded to bfloat16 (nearest, ties to even) as float32
// bits, computed here independently of the exporter. x is finite.
func bf16RNE(x float32) uint32 {
	b := math.Float32bits(x)
	return (b + 0x7fff + (b>>16)&1) &^ 0xffff
}

// stepDirs lists the step folders of a checkpoint folder.
func stepDirs(t *testing.T, r *keysRun, folder string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(r.dump, folder))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "step") {
			out = append(out, e.Name())
		}
	}
	return out
}

// dirSize is the size of the files under folder of the run's dump.
func dirSize(t *testing.T, r *keysRun, folder string) int64 {
	t.Helper()
	var n int64
	filepath.Walk(filepath.Join(r.dump, folder), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// TestEveryRecipeKeyIsHonest: every recipe key either does what it says
// (a tiny run shows the difference) or is refused, naming the key, as not
// supported yet. A key added to config.Job without an entry here fails.
func TestEveryRecipeKeyIsHonest(t *testing.T) {
	keys := config.Keys()
	for _, k := range keys {
		if _, ok := keyTable[k]; !ok {
			t.Errorf("recipe key %s has no entry in keyTable: refuse it in config validation or show its effect", k)
		}
	}
	for k := range keyTable {
		if !contains(keys, k) {
			t.Errorf("keyTable entry %s is not a recipe key", k)
		}
	}
	src := packageSource(t)
	h := &keysHarness{data: corpus(t), data2: otherCorpus(t), root: t.TempDir(), runs: map[string]*keysRun{}}
	for _, k := range keys {
		c := keyTable[k]
		t.Run(k, func(t *testing.T) {
			switch {
			case c.refuse != "":
				refused(t, k, c.refuse)
			case c.inertUnless != "":
				sw, ok := keyTable[c.inertUnless]
				if !ok || sw.refuse == "" {
					t.Fatalf("%s is inert unless %s, which must be refused", k, c.inertUnless)
				}
				refused(t, c.inertUnless, sw.refuse)
			case c.coveredBy != "":
				if !strings.Contains(src, "func "+c.coveredBy+"(t *testing.T)") {
					t.Errorf("%s is said to be covered by %s, which does not exist", k, c.coveredBy)
				}
			case c.check != nil:
				c.check(t, h)
			default:
				t.Fatalf("entry for %s says nothing", k)
			}
		})
	}
}

// refused requires that titan config validate and titan train refuse
// key=value, naming the key and saying it is not supported yet.
func refused(t *testing.T, key, value string) {
	t.Helper()
	for _, args := range [][]string{
		{"config", "validate", "--recipe", "../../recipes/llama3_debug.toml", "--set", key + "=" + value},
		{"train", "--recipe", "../../recipes/llama3_debug.toml", "--set", "job.dump_folder=" + t.TempDir(), "--set", key + "=" + value},
	} {
		out, err := titan(t, args...)
		if err == nil {
			t.Errorf("titan %s accepted %s=%s", args[0], key, value)
			continue
		}
		msg := err.Error() + out
		if !strings.Contains(msg, key) || !strings.Contains(msg, "not supported yet") {
			t.Errorf("titan %s with %s=%s: %v, want the key named and \"not supported yet\"", args[0], key, value, err)
		}
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// packageSource is the text of this package's test files.
func packageSource(t *testing.T) string {
	t.Helper()
	files, _ := filepath.Glob("*_test.go")
	var b strings.Builder
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(raw)
	}
	return b.String()
}

// otherCorpus is a second small text dataset, different from corpus.
func otherCorpus(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "other.txt")
	var b strings.Builder
	for i := 0; i < 400; i++ {
		fmt.Fprintf(&b, "%d sphinx of black quartz, judge my vow %d; how vexingly quick daft zebras jump!\n", i, i*i)
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// float8FSDP are the overrides of a tensorwise float8 FSDP2 run in
// bfloat16.
func float8FSDP() []string {
	return []string{"--nproc 2", "training.local_batch_size=1", "training.mixed_precision_param=bfloat16",
		`model.converters=["float8"]`, "float8.recipe_name=tensorwise"}
}

// gathers is a run's FSDP all-gather line ("titan: fsdp: ...").
type gathers struct {
	as                  string
	float8, other, amax int
}

var gatherRx = regexp.MustCompile(`float8 weights (\d+) B as (\w+), other parameters (\d+) B, padding \d+ B; (\d+) float8 amax all-reduces`)

func gatherLog(t *testing.T, r *keysRun) gathers {
	t.Helper()
	m := gatherRx.FindStringSubmatch(r.out)
	if m == nil {
		t.Fatalf("no float8 all-gather line in the log:\n%s", r.out)
	}
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	return gathers{as: m[2], float8: atoi(m[1]), other: atoi(m[3]), amax: atoi(m[4])}
}
