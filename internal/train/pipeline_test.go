package train

import (
	"cmp"
	"context"
	"io"
	"math"
	"strconv"
	"sync"
	"testing"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/config"
)

// pipelineTrainers builds one trainer per rank of an in-process job of
// world ranks (one goroutine each) on recipes with sets
// applied (the defaults otherwise), and returns them with a function that runs fn on every rank
// at once.
func pipelineTrainers(tb testing.TB, world int, sets ...string) ([]*Trainer, func(fn func(tr *Trainer) error)) {
	tb.Helper()
	trs := make([]*Trainer, world)
	errs := make([]error, world)
	st := comm.NewMemStore()
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := config.Load("", sets, nil)
			if err != nil {
				errs[r] = err
				return
			}
			g, err := comm.NewWorld(context.Background(), st, r, world, comm.Options{})
			if err != nil {
				errs[r] = err
				return
			}
			trs[r], errs[r] = New(j, testDevice(1), io.Discard, &Dist{Rank: r, World: world, Group: g})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			tb.Fatalf("rank %d: %v", r, err)
		}
	}
	tb.Cleanup(func() {
		for _, tr := range trs {
			tr.Close()
			tr.dist.Group.Close()
		}
	})
	all := func(fn func(tr *Trainer) error) {
		tb.Helper()
		var wg sync.WaitGroup
		for r, tr := range trs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = fn(tr)
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				tb.Fatalf("rank %d: %v", r, err)
			}
		}
	}
	return trs, all
}

// pipelineSets are recipe overrides for the in-process pipeline runs.
func pipelineSets(job *config.Job, steps int, extra ...string) []string {
	return append([]string{
		"model.flavor=tiny_bench", "training.seq_len=16", "training.local_batch_size=4",
		"training.dataset=text", "training.dataset_path=" + job.Training.DatasetPath,
		"training.steps=" + strconv.Itoa(steps), "training.seed=3", "job.dump_folder=" + job.Job.DumpFolder,
		"lr_scheduler.warmup_steps=2", "metrics.log_freq=100", "checkpoint.enable=false",
		"validation.enable=true", "validation.steps=2", "validation.dataset=text", "validation.dataset_path=" + job.Training.DatasetPath,
	}, extra...)
}

// TestPipelineTrainsAndValidatesLikeOneProcess: two in-process pipeline
// ranks (ZBV places the last stage on rank 0, 1F1B on rank 1) give the
// one-process training losses and validation loss within 1e-5 relative;
// zero-bubble schedules splitting the backward of recomputed layers give
// their losses without activation checkpointing bitwise, in float32 and
// under bfloat16 mixed precision.
func TestPipelineTrainsAndValidatesLikeOneProcess(t *testing.T) {
	job := testJob(t, t.TempDir(), 3)
	base := pipelineSets(job, 3)
	// run trains 3 steps and validates on every rank of world.
	run := func(world int, sets ...string) [][]float64 {
		_, all := pipelineTrainers(t, world, append(append([]string(nil), base...), sets...)...)
		got := make([][]float64, world)
		all(func(tr *Trainer) error {
			for range 3 {
				l, _, _, err := tr.TrainStep()
				if err != nil {
					return err
				}
				got[tr.dist.Rank] = append(got[tr.dist.Rank], l)
			}
			v, err := tr.Validate(2)
			got[tr.dist.Rank] = append(got[tr.dist.Rank], v)
			return err
		})
		if world > 1 {
			all(func(tr *Trainer) error {
				ps, err := tr.eng.PipelineStep()
				if err == nil && (ps.Bubble <= -1e-9 || ps.Bubble >= 1) {
					t.Errorf("rank %d: measured bubble %v outside [0, 1)", tr.dist.Rank, ps.Bubble)
				}
				return err
			})
		}
		return got
	}
	pp := func(sched string, sets ...string) []string {
		return append(sets, "parallelism.pipeline_parallel_degree=2", "parallelism.pipeline_parallel_schedule="+sched)
	}
	const bf16 = "training.mixed_precision_param=bfloat16"
	full := []string{"activation_checkpoint.mode=full"}
	op := []string{"activation_checkpoint.mode=selective", "activation_checkpoint.selective_ac_option=op"}
	for _, c := range []struct {
		name     string
		sets     []string
		refWorld int
		ref      []string
		tol      float64 // relative
		world    int     // 0: 2
	}{
		{"1F1B", pp("1F1B"), 1, nil, 1e-5, 0},
		{"ZBVZeroBubble", pp("ZBVZeroBubble"), 1, nil, 1e-5, 0},
		// Recomputation gives the kept activations' values, so a split
		// backward under checkpointing matches the same schedule without
		// it bitwise (which the cases above check against one process).
		{"ZBVZeroBubble full AC bf16", pp("ZBVZeroBubble", append(full, bf16)...), 2, pp("ZBVZeroBubble", bf16), 0, 0},
		{"InterleavedZeroBubble op AC bf16", pp("InterleavedZeroBubble", append(op, bf16)...), 2, pp("InterleavedZeroBubble", bf16), 0, 0},
		// Two accumulated passes a step, each reducing the stages' held
		// gradients once (fsdp.Runtime.SetGradientSync): the second pass
		// must not overwrite the first's buffers while they reduce.
		{"PP2xFSDP2 1F1B two accumulated passes", pp("1F1B", "parallelism.data_parallel_shard_degree=2", "training.local_batch_size=2", "training.gradient_accumulation_steps=2"),
			1, []string{"training.local_batch_size=8"}, 1e-5, 4},
		{"PP2xDDP2 ZBVZeroBubble two accumulated passes", pp("ZBVZeroBubble", "parallelism.data_parallel_replicate_degree=2", "training.local_batch_size=2", "training.gradient_accumulation_steps=2"),
			1, []string{"training.local_batch_size=8"}, 1e-5, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref := run(c.refWorld, c.ref...)[0]
			got := run(cmp.Or(c.world, 2), c.sets...)
			for r := range got {
				for i, x := range ref {
					if y := got[r][i]; math.Abs(x-y) > c.tol*math.Abs(x) {
						t.Errorf("rank %d, value %d (3 training losses, then validation): %.9g, reference %.9g", r, i, y, x)
					}
				}
			}
		})
	}
}

// BenchmarkPipelineBubble measures each schedule's bubble on two
// in-process pipeline ranks (8 microbatches of one sequence of 64 tokens
// of tiny_bench), without and with full activation checkpointing, and reports it next to pipeline.Theoretical: the
// "bubble" metric is 1 - (compute time summed over ranks)/(step time
// summed over ranks), averaged over the steps run; "simulated" is the
// schedule's simulated bubble (pipeline.Schedule.Simulate, no latency)
// with each step's mean forward, backward and weight-gradient times, and
// "theory" the unit-cost formula.
func BenchmarkPipelineBubble(b *testing.B) {
	job := testJob(&testing.T{}, b.TempDir(), 1)
	for _, c := range []struct{ sched, ac string }{
		{"GPipe", "none"}, {"1F1B", "none"}, {"Interleaved1F1B", "none"}, {"InterleavedZeroBubble", "none"}, {"ZBVZeroBubble", "none"},
		{"1F1B", "full"}, {"Interleaved1F1B", "full"}, {"InterleavedZeroBubble", "full"}, {"ZBVZeroBubble", "full"},
	} {
		b.Run(c.sched+"/ac="+c.ac, func(b *testing.B) {
			sets := append(pipelineSets(job, 1000), "training.seq_len=64", "training.local_batch_size=8", "validation.enable=false",
				"parallelism.pipeline_parallel_degree=2", "parallelism.pipeline_parallel_schedule="+c.sched, "activation_checkpoint.mode="+c.ac)
			_, all := pipelineTrainers(b, 2, sets...)
			all(func(tr *Trainer) error { _, _, _, err := tr.TrainStep(); return err }) // warm-up
			var sum, sim, th float64
			b.ResetTimer()
			for range b.N {
				all(func(tr *Trainer) error {
					if _, _, _, err := tr.TrainStep(); err != nil {
						return err
					}
					ps, err := tr.eng.PipelineStep()
					if err == nil && tr.dist.Rank == 0 {
						sum, sim, th = sum+ps.Bubble, sim+ps.Simulated, ps.Theory
					}
					return err
				})
			}
			b.ReportMetric(sum/float64(b.N), "bubble")
			b.ReportMetric(sim/float64(b.N), "simulated")
			b.ReportMetric(th, "theory")
		})
	}
}
