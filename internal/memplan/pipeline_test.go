package memplan

import (
	"testing"

	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/model/llama"
	"github.com/titan-go/titan/internal/parallel"
)

// TestPipelineScheduleActivations checks that with a resolved pipeline
// the activations are the executor's activation sets: GPipe keeps every
// microbatch, 1F1B at most pp on the first rank, and the sum matches
// the sets counted by hand from the schedule.
func TestPipelineScheduleActivations(t *testing.T) {
	cfg, err := llama.Flavor("debug")
	if err != nil {
		t.Fatal(err)
	}
	act := map[string]int64{}
	for _, sched := range []string{"GPipe", "1F1B", "Interleaved1F1B"} {
		pp, err := parallel.PlanPipeline(cfg.NLayers, 8, parallel.PipelineSettings{Degree: 2, Schedule: sched, MicrobatchSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		plan := Plan{Model: cfg, Batch: 8, SeqLen: 256, MicrobatchRows: 1, Degrees: Degrees{PP: 2},
			Pipeline: &parallel.PipelineSettings{Schedule: sched, MicrobatchSize: 1}}
		r, err := Estimate(plan)
		if err != nil {
			t.Fatal(err)
		}
		// By hand: the larger rank total of sets × what one set keeps,
		// plus the rank's scratch once: the largest of its stages'.
		var want int64
		for rank := range 2 {
			peak, _ := pp.Schedule.ActivationSets(rank)
			var a, scratch int64
			for _, s := range pp.Schedule.Stages(rank) {
				ls := llama.StageSpec(pp.Stages[s])
				n, err := llama.ActivationBytesFor(cfg, 1, 256, llama.Plan{Stage: &ls})
				if err != nil {
					t.Fatal(err)
				}
				f32, _, err := llama.ScratchLen(cfg, 1, 256, llama.Plan{Stage: &ls})
				sh := int64(f32) * 4
				if err != nil || sh <= 0 || sh >= n {
					t.Fatalf("stage %d: shared %d of %d bytes (%v)", s, sh, n, err)
				}
				a += int64(peak[s]) * (n - sh)
				scratch = max(scratch, sh)
			}
			want = max(want, a+scratch)
		}
		if r.Activations != want {
			t.Errorf("%s: activations %d, want %d from the schedule's activation sets", sched, r.Activations, want)
		}
		act[sched] = r.Activations
	}
	if act["GPipe"] <= act["1F1B"] {
		t.Errorf("GPipe keeps all 8 microbatches, 1F1B at most 2: activations %d <= %d", act["GPipe"], act["1F1B"])
	}
}

// TestPrecision checks that bfloat16 compute halves exactly the compute
// parts and leaves the float32 state alone.
func TestPrecision(t *testing.T) {
	cfg, _ := llama.Flavor("debug")
	for _, d := range []Degrees{{DPShard: 4}, {TP: 2}, {CP: 2}} {
		p := Plan{Model: cfg, Batch: 8, SeqLen: 256, Degrees: d}
		f32, err := Estimate(p)
		if err != nil {
			t.Fatal(err)
		}
		p.Precision = Precision{State: 4, Compute: 2}
		bf, err := Estimate(p)
		if err != nil {
			t.Fatal(err)
		}
		if bf.Params != f32.Params || bf.Grads != f32.Grads || bf.Optimizer != f32.Optimizer {
			t.Errorf("%s: state changed with the compute precision", d)
		}
		if 2*bf.Activations != f32.Activations || 2*bf.FSDPBuffers != f32.FSDPBuffers || 2*bf.Comm != f32.Comm {
			t.Errorf("%s: bf16 compute parts %d %d %d, want half of %d %d %d", d, bf.Activations, bf.FSDPBuffers, bf.Comm, f32.Activations, f32.FSDPBuffers, f32.Comm)
		}
	}
}

// TestFromJobResolvesPipeline checks that the trainer's estimate sees
// the recipe's schedule.
func TestFromJobResolvesPipeline(t *testing.T) {
	job := config.Default()
	job.Model.Flavor = "debug"
	job.Training.LocalBatchSize, job.Training.SeqLen = 8, 256
	job.Parallelism.PipelineParallelDegree = 2
	job.Parallelism.DataParallelShardDegree = 1
	job.Parallelism.PipelineParallelSchedule = "GPipe"
	p, err := FromJob(job, 2)
	if err != nil {
		t.Fatal(err)
	}
	pp, err := p.ResolvePipeline()
	if err != nil || pp.Schedule.Name != "GPipe" || pp.Schedule.Microbatches != 8 {
		t.Fatalf("pipeline %+v (%v), want GPipe over 8 microbatches", pp, err)
	}
	// A suggestion of another pipeline degree or batch re-resolves.
	p.Degrees.PP, p.Batch = 3, 6
	if pp, err := p.ResolvePipeline(); err != nil || pp.Schedule.PP != 3 || pp.Schedule.Microbatches != 6 {
		t.Fatalf("re-resolved pipeline %+v (%v), want 3 ranks over 6 microbatches", pp, err)
	}
}

// TestEstimateRanks checks the per-rank reports of a pipeline: one per
// rank, only the rank of the last stage computing the loss (Head), and
// Estimate the largest of them; without a pipeline a single report with
// the head.
func TestEstimateRanks(t *testing.T) {
	cfg, err := llama.Flavor("debug")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sched    string
		headRank int
	}{{"1F1B", 1}, {"GPipe", 1}, {"Interleaved1F1B", 1}} {
		plan := Plan{Model: cfg, Batch: 8, SeqLen: 256, MicrobatchRows: 1, Degrees: Degrees{PP: 2},
			Pipeline: &parallel.PipelineSettings{Schedule: c.sched, MicrobatchSize: 1}}
		rs, err := EstimateRanks(plan)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 2 {
			t.Fatalf("%s: %d reports for 2 pipeline ranks", c.sched, len(rs))
		}
		var largest int64
		for rank, r := range rs {
			if r.Head != (rank == c.headRank) {
				t.Errorf("%s: rank %d Head %v", c.sched, rank, r.Head)
			}
			largest = max(largest, r.Total())
		}
		if e, err := Estimate(plan); err != nil || e.Total() != largest {
			t.Errorf("%s: Estimate %d (%v), largest rank %d", c.sched, e.Total(), err, largest)
		}
		if rs[0].Total() == rs[1].Total() {
			t.Errorf("%s: both ranks %d bytes: the reports are not per rank", c.sched, rs[0].Total())
		}
	}
	rs, err := EstimateRanks(Plan{Model: cfg, Batch: 8, SeqLen: 256, Degrees: Degrees{DPShard: 2}})
	if err != nil || len(rs) != 1 || !rs[0].Head {
		t.Errorf("no pipeline: %d reports, %v", len(rs), err)
	}
}
