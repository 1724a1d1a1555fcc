package main

import (
	"cmp"
	"math"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/parallel"
)

// TestPipelineParallelMatchesOneProcess: two pipeline ranks under each
// schedule (and two pipelines of two ranks, replicated or sharded data
// parallel) train
// like one process with the same global batch of 4 sequences: the same
// losses within 1e-5 relative at every one of 10 steps and the same
// parameters within 1e-5 (L2 relative) after them, read from rank 0's
// model-only checkpoint of the whole model.
func TestPipelineParallelMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	const steps = 10
	data := corpus(t)
	run := func(dump string, extra ...string) {
		t.Helper()
		args := append(tinyRun(dump, data, steps), "--set", "checkpoint.last_save_model_only=true")
		out, err := titan(t, append(args, extra...)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	one := t.TempDir()
	run(one, "--set", "training.local_batch_size=4")
	refState := metricsColumn(t, one, "state_gib")[1]
	for _, c := range []struct {
		name, schedule               string
		mbs, replicate, shard, batch int
		reshard                      string
	}{
		{"PP2 GPipe", "GPipe", 2, 1, 1, 4, ""},
		{"PP2 1F1B", "1F1B", 1, 1, 1, 4, ""},
		{"PP2 Interleaved1F1B", "Interleaved1F1B", 1, 1, 1, 4, ""},
		{"PP2 InterleavedZeroBubble", "InterleavedZeroBubble", 1, 1, 1, 4, ""},
		{"PP2 ZBVZeroBubble", "ZBVZeroBubble", 1, 1, 1, 4, ""},
		{"PP2xDDP2 1F1B", "1F1B", 1, 2, 1, 2, ""},
		{"PP2xFSDP2 Interleaved1F1B", "Interleaved1F1B", 1, 1, 2, 2, "always"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dump := t.TempDir()
			run(dump, "--nproc", itoa(2*c.replicate*c.shard), "--set", "parallelism.pipeline_parallel_degree=2",
				"--set", "parallelism.data_parallel_replicate_degree="+itoa(c.replicate), "--set", "parallelism.data_parallel_shard_degree="+itoa(c.shard),
				"--set", "training.local_batch_size="+itoa(c.batch),
				"--set", "parallelism.pipeline_parallel_schedule="+c.schedule,
				"--set", "parallelism.pipeline_parallel_microbatch_size="+itoa(c.mbs),
				"--set", "parallelism.fsdp_reshard_after_forward="+cmp.Or(c.reshard, "default"))
			checkParity(t, c.name, one, dump, steps)
			// Parameters, gradients and optimizer state: the largest
			// pipeline rank's share of the model, over dp_shard.
			share := pipelineShare(t, "tiny_bench", c.schedule, 2, c.batch, c.mbs) / float64(c.shard)
			state := metricsColumn(t, dump, "state_gib")[1]
			if ratio := state / refState / share; math.Abs(ratio-1) > 0.1 {
				t.Errorf("state per worker %.6f GiB, one process %.6f GiB: %.3f × the ideal %.4f, want within 10%%", state, refState, ratio, share)
			}
			t.Logf("%s: state %.6f GiB per worker, %.4f of one process (ideal %.4f)", c.name, state, state/refState, share)
			if c.shard > 1 && c.reshard == "always" {
				if g := metricsColumn(t, dump, "gathered_units")[steps]; g > 2 {
					t.Errorf("%v gathered units alive at once, want at most 2 (the unit computing and the one prefetched)", g)
				}
			}
		})
	}
}

// pipelineShare is the largest fraction of flavor's parameters one
// pipeline rank holds under schedule on pp ranks.
func pipelineShare(t *testing.T, flavor, schedule string, pp, batch, mbs int) float64 {
	t.Helper()
	cfg, err := llama.Flavor(flavor)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := parallel.PlanPipeline(cfg.NLayers, batch, parallel.PipelineSettings{
		Degree: pp, Schedule: schedule, FirstLessLayers: 1, LastLessLayers: 1, MicrobatchSize: mbs})
	if err != nil {
		t.Fatal(err)
	}
	fam := llama.Family{Cfg: cfg}
	most := 0
	for r := 0; r < pp; r++ {
		n := 0
		for _, s := range plan.Schedule.Stages(r) {
			n += fam.StageRange(plan.Stages[s], 1).Len()
		}
		most = max(most, n)
	}
	return float64(most) / float64(cfg.NumParams())
}

// TestPipelineParallelRefusesBadLayouts: stages that do not divide among
// the ranks, a single-stage schedule given several stages per rank, a
// multi-stage schedule given one, and a first stage lighter than its
// embedding weight are refused with a message that says why.
func TestPipelineParallelRefusesBadLayouts(t *testing.T) {
	data := corpus(t)
	for _, c := range []struct {
		name string
		set  []string
		want string
	}{
		{"stages not divisible", []string{"parallelism.pipeline_parallel_layers_per_stage=2"}, "gives 3 stages for 4 layers (+1 +1 for the embedding and the head), not divisible by pipeline_parallel_degree 2"},
		{"single-stage schedule", []string{"parallelism.pipeline_parallel_layers_per_stage=1"}, "1F1B runs one stage per rank"},
		{"virtual 1", []string{"parallelism.pipeline_parallel_schedule=Interleaved1F1B", "parallelism.pipeline_parallel_layers_per_stage=3"}, "needs virtual >= 2"},
		{"first stage too light", []string{"parallelism.pipeline_parallel_first_stage_less_layers=8"}, "stage 0 would get -1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(tinyRun(t.TempDir(), data, 2), "--nproc", "2", "--set", "parallelism.pipeline_parallel_degree=2")
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			out, err := titan(t, args...)
			if err == nil || !strings.Contains(err.Error()+out, c.want) {
				t.Fatalf("got %v\n%s\nwant an error containing %q", err, out, c.want)
			}
			// titan config validate refuses the same layout, before
			// any process starts.
			vargs := []string{"config", "validate", "--recipe", "../../recipes/llama3_debug.toml", "--set", "model.flavor=tiny_bench",
				"--set", "training.local_batch_size=2", "--set", "parallelism.pipeline_parallel_degree=2"}
			for _, s := range c.set {
				vargs = append(vargs, "--set", s)
			}
			out, err = titan(t, vargs...)
			if err == nil || !strings.Contains(err.Error()+out, c.want) {
				t.Fatalf("config validate: got %v\n%s\nwant an error containing %q", err, out, c.want)
			}
		})
	}
}

// TestPipelineCheckpointResumes: a full checkpoint written under PP2
// Interleaved1F1B (whole tensors, gathered on rank 0) resumes under PP2
// ZBV, with other stage boundaries, under PP2×FSDP2 1F1B, each rank
// loading its chunk of its stage, under PP2×CP2×TP2 1F1B with selective
// activation checkpointing of every second layer, each rank loading its
// tp shards of its stage, and under one process, and all
// continue like the uninterrupted run.
func TestPipelineCheckpointResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	data := corpus(t)
	pp := func(schedule string) []string {
		return []string{"--nproc", "2", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.pipeline_parallel_schedule=" + schedule,
			"--set", "training.local_batch_size=4", "--set", "lr_scheduler.total_steps=6"}
	}
	whole := t.TempDir()
	if out, err := titan(t, append(tinyRun(whole, data, 6), pp("Interleaved1F1B")...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	half := t.TempDir()
	if out, err := titan(t, append(tinyRun(half, data, 4), pp("Interleaved1F1B")...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"PP2 ZBV", pp("ZBVZeroBubble")},
		{"PP2xFSDP2 1F1B", append(pp("1F1B"), "--nproc", "4", "--set", "parallelism.data_parallel_shard_degree=2", "--set", "training.local_batch_size=2")},
		{"PP2xCP2xTP2 1F1B AC selective 2", append(pp("1F1B"), "--nproc", "8", "--set", "parallelism.context_parallel_degree=2", "--set", "parallelism.tensor_parallel_degree=2",
			"--set", "activation_checkpoint.mode=selective", "--set", "activation_checkpoint.selective_ac_option=2")},
		{"one process", []string{"--set", "training.local_batch_size=4", "--set", "lr_scheduler.total_steps=6"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkResume(t, c.name, "PP2", whole, half, data, c.args)
		})
	}
}
