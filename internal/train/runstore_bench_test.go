//go:build unix

package train

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/config"
)

// BenchmarkRunStoreOverhead measures what recording costs training: the
// same short run (tiny_bench, 30 steps, every step logged, so every step
// is recorded) with metrics.enable_db off and on, alternating, b.N times
// each. It reports tokens/s both ways — as the log computes it (the mean
// of the logged steps after the first, as titan runs list does) and over
// the wall time of Run, which includes opening the store and the final
// flush — and the on/off ratios of their medians.
//
//	go test -run '^$' -bench RunStoreOverhead -benchtime 7x ./internal/train
func BenchmarkRunStoreOverhead(b *testing.B) {
	data := filepath.Join(b.TempDir(), "corpus.txt")
	os.WriteFile(data, []byte(strings.Repeat("a stitch in time saves nine; measure twice, cut once.\n", 2000)), 0o644)
	db := filepath.Join(b.TempDir(), "runs.db")
	run := func(on bool) (logged, wall, cpu float64) {
		job, err := config.Load("", []string{
			"model.flavor=tiny_bench", "training.seq_len=64", "training.local_batch_size=4",
			"training.dataset=text", "training.dataset_path=" + data, "training.steps=30",
			"training.seed=3", "training.threads=1", "lr_scheduler.warmup_steps=2", "metrics.log_freq=1",
			"checkpoint.enable=false", "validation.enable=false", "job.dump_folder=" + b.TempDir(),
			"metrics.db=" + db, "metrics.enable_db=" + strconv.FormatBool(on),
		}, nil)
		if err != nil {
			b.Fatal(err)
		}
		tr, err := New(job, testDevice(1), io.Discard, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer tr.Close()
		start, cpu0 := time.Now(), cpuSeconds()
		if err := tr.Run(context.Background()); err != nil {
			b.Fatal(err)
		}
		wall, cpu = float64(30*64*4)/time.Since(start).Seconds(), cpuSeconds()-cpu0
		recs := jsonlRecords(b, job.Job.DumpFolder)
		for _, r := range recs[1:] {
			logged += r.TokensPerSec
		}
		return logged / float64(len(recs)-1), wall, cpu
	}
	run(false) // warm up
	var offL, onL, offW, onW, offC, onC []float64
	for i := 0; i < b.N; i++ {
		l, w, c := run(false)
		offL, offW, offC = append(offL, l), append(offW, w), append(offC, c)
		l, w, c = run(true)
		onL, onW, onC = append(onL, l), append(onW, w), append(onC, c)
		if testing.Verbose() {
			b.Logf("pair %d: logged tokens/s off %.0f on %.0f, wall off %.0f on %.0f, CPU s off %.3f on %.3f", i, offL[i], onL[i], offW[i], onW[i], offC[i], onC[i])
		}
	}
	b.ReportMetric(median(offL), "off-tokens/s")
	b.ReportMetric(median(onL), "on-tokens/s")
	b.ReportMetric(median(onL)/median(offL), "on/off")
	b.ReportMetric(median(onW)/median(offW), "on/off-wall")
	b.ReportMetric(median(onC)/median(offC), "on/off-cpu")
	b.ReportMetric(0, "ns/op")
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// cpuSeconds is the process's user and system CPU time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
