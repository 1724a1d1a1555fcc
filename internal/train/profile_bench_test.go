package train

import (
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/trace"
)

// BenchmarkProfilingOverhead measures what [profiling] costs a step: the
// same trainer's steps (tiny_bench, 4 × 64 tokens, one thread) with
// recording off and on, alternating, b.N times each. It reports the
// median step time both ways, the profiled step's slowdown, the spans a
// step records and the time rank 0 takes to write the window (trace.json,
// summary, SVG and PNG timelines). Profiling off, every hook is one
// atomic load (see BenchmarkHookOff in internal/trace): spans/step of
// them per step.
//
//	go test -run '^$' -bench ProfilingOverhead -benchtime 20x ./internal/train
func BenchmarkProfilingOverhead(b *testing.B) {
	data := filepath.Join(b.TempDir(), "corpus.txt")
	os.WriteFile(data, []byte(strings.Repeat("a stitch in time saves nine; measure twice, cut once.\n", 2000)), 0o644)
	job, err := config.Load("", []string{
		"model.flavor=tiny_bench", "training.seq_len=64", "training.local_batch_size=4",
		"training.dataset=text", "training.dataset_path=" + data, "training.steps=100000",
		"training.seed=3", "training.threads=1", "metrics.log_freq=100",
		"checkpoint.enable=false", "validation.enable=false", "job.dump_folder=" + b.TempDir(),
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	tr, err := New(job, testDevice(1), io.Discard, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	step := func() time.Duration {
		t0 := time.Now()
		if _, _, _, err := tr.TrainStep(); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	for range 3 {
		step() // warm up
	}
	var off, on []float64
	var spans []trace.Span
	for i := 0; i < b.N; i++ {
		off = append(off, step().Seconds())
		trace.Start(i)
		on = append(on, step().Seconds())
		trace.Stop()
		spans = trace.Take()
	}
	t0 := time.Now()
	if err := writeWindow(b.TempDir(), []trace.RankTrace{{Host: "bench", Spans: spans}}, nil); err != nil {
		b.Fatal(err)
	}
	flush := time.Since(t0)
	median := func(x []float64) float64 {
		sort.Float64s(x)
		return x[len(x)/2]
	}
	mOff, mOn := median(off), median(on)
	b.ReportMetric(mOff*1e3, "off-ms/step")
	b.ReportMetric(mOn*1e3, "on-ms/step")
	b.ReportMetric(100*(mOn/mOff-1), "slowdown-%")
	b.ReportMetric(float64(len(spans)), "spans/step")
	b.ReportMetric(float64(flush)/1e6, "write-ms")
}
