package main

import (
	"testing"
)

// hyenaRun is a short training run of the hyena debug flavor on data.
func hyenaRun(dump, data string, steps int) []string {
	return []string{"train", "--recipe", "../../recipes/hyena_debug.toml",
		"--set", "model.flavor=debug", "--set", "training.seq_len=32", "--set", "training.local_batch_size=4",
		"--set", "training.dataset=text", "--set", "training.dataset_path=" + data,
		"--set", "training.steps=" + itoa(steps), "--set", "metrics.log_freq=1",
		"--set", "lr_scheduler.warmup_steps=2", "--set", "validation.enable=false",
		"--set", "checkpoint.enable=true", "--set", "checkpoint.interval=100", "--set", "checkpoint.last_save_model_only=true",
		"--set", "job.dump_folder=" + dump}
}

// TestHyenaParallelismMatchesOneProcess: the hyena family trains under
// DDP2, FSDP2 (resharding after forward or not), PP2 (1F1B, ZBV) and
// PP2×FSDP2 of the one engine like one process with the same global batch: losses and
// gradient norms within 1e-5 relative at every step, parameters within
// 1e-5 (L2 relative), with clipping on (max_norm 1) and off.
func TestHyenaParallelismMatchesOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process training runs")
	}
	const steps = 6
	data := corpus(t)
	for _, clip := range []string{"1.0", "1e9"} {
		one := t.TempDir()
		if out, err := titan(t, append(hyenaRun(one, data, steps), "--set", "training.max_norm="+clip)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, c := range []struct {
			name string
			args []string
		}{
			{"DDP2", []string{"--nproc", "2", "--set", "training.local_batch_size=2", "--set", "parallelism.data_parallel_replicate_degree=2", "--set", "parallelism.data_parallel_shard_degree=1"}},
			{"FSDP2", []string{"--nproc", "2", "--set", "training.local_batch_size=2", "--set", "parallelism.fsdp_reshard_after_forward=always"}},
			{"FSDP2 never", []string{"--nproc", "2", "--set", "training.local_batch_size=2", "--set", "parallelism.fsdp_reshard_after_forward=never"}},
			// The head, on the last stage, is tied to the first stage's
			// embedding: the engine keeps the copy in step.
			{"PP2 1F1B", []string{"--nproc", "2", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=1"}},
			{"PP2 ZBV", []string{"--nproc", "2", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=1", "--set", "parallelism.pipeline_parallel_schedule=ZBVZeroBubble"}},
			{"PP2xFSDP2 Interleaved1F1B", []string{"--nproc", "4", "--set", "training.local_batch_size=2", "--set", "parallelism.pipeline_parallel_degree=2", "--set", "parallelism.data_parallel_shard_degree=2", "--set", "parallelism.pipeline_parallel_schedule=Interleaved1F1B", "--set", "parallelism.fsdp_reshard_after_forward=always"}},
		} {
			name := c.name + " max_norm " + clip
			t.Run(name, func(t *testing.T) {
				dump := t.TempDir()
				args := append(hyenaRun(dump, data, steps), "--set", "training.max_norm="+clip)
				if out, err := titan(t, append(args, c.args...)...); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
				checkParity(t, name, one, dump, steps)
			})
		}
	}
}
