package memplan

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/titan-go/titan/internal/bytesize"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/model/llama"
)

const gib = int64(1) << 30

func flavor(t *testing.T, name string) llama.Config {
	t.Helper()
	c, err := llama.Flavor(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func estimate(t *testing.T, p Plan) Report {
	t.Helper()
	r, err := Estimate(p)
	if err != nil {
		t.Fatalf("Estimate(%+v): %v", p.Degrees, err)
	}
	return r
}

// TestStateBytesExact: on one process the parameter, gradient and
// optimizer estimates are NumParams floats, the same again, and two
// moments; the communication buffers are the model's host buffers (its
// per-token losses, llama.HostBytesFor).
func TestStateBytesExact(t *testing.T) {
	for _, name := range []string{"debug", "tiny_bench", "8B", "70B"} {
		t.Run(name, func(t *testing.T) {
			c := flavor(t, name)
			r := estimate(t, Plan{Model: c, Batch: 1, SeqLen: 16})
			n := c.NumParams() * 4
			staging, host, err := llama.HostBytesFor(c, 1, 16, llama.Plan{})
			if err != nil || staging != 0 || host != 16*4 {
				t.Fatalf("host buffers %d + %d (%v), want the 16 per-token losses", staging, host, err)
			}
			for _, p := range []struct {
				what      string
				got, want int64
			}{{"parameters", r.Params, n}, {"gradients", r.Grads, n}, {"optimizer", r.Optimizer, 2 * n}, {"FSDP buffers", r.FSDPBuffers, 0}, {"comm", r.Comm, host}} {
				if p.got != p.want {
					t.Errorf("%s: %d bytes, want %d", p.what, p.got, p.want)
				}
			}
		})
	}
}

// TestActivationsMatchModel: on one process the activation estimate is
// what the model plans, for every checkpointing policy.
func TestActivationsMatchModel(t *testing.T) {
	for _, tc := range []struct {
		flavor string
		B, T   int
	}{{"debug", 8, 256}, {"tiny_bench", 8, 256}, {"debug", 1, 2048}, {"8B", 1, 8192}} {
		c := flavor(t, tc.flavor)
		for _, ac := range checkpoints {
			ac := ac
			if ac.Mode == "selective" && ac.Option == "2" {
				ac.Option = "3"
			}
			t.Run(fmt.Sprintf("%s/B%d/T%d/%s", tc.flavor, tc.B, tc.T, ac), func(t *testing.T) {
				want, err := llama.ActivationBytesFor(c, tc.B, tc.T, llama.Plan{Checkpoint: llama.ActivationCheckpoint{Mode: ac.Mode, SelectiveOption: ac.Option}})
				if err != nil {
					t.Fatal(err)
				}
				got := estimate(t, Plan{Model: c, Batch: tc.B, SeqLen: tc.T, Checkpoint: ac}).Activations
				if got != want {
					t.Errorf("activations %d bytes (%s), the model plans %d", got, bytesize.Human(got), want)
				}
			})
		}
	}
}

// TestFSDPHalvesState: dp_shard 2 halves parameters, gradients and
// optimizer state (up to one element of rounding per unit) and adds the
// unit buffers.
func TestFSDPHalvesState(t *testing.T) {
	for _, name := range []string{"debug", "8B"} {
		c := flavor(t, name)
		one := estimate(t, Plan{Model: c, Batch: 1, SeqLen: 64})
		two := estimate(t, Plan{Model: c, Batch: 1, SeqLen: 64, Degrees: Degrees{DPShard: 2}})
		units := int64(c.NLayers + 2)
		for _, p := range []struct {
			what      string
			got, full int64
		}{{"parameters", two.Params, one.Params}, {"gradients", two.Grads, one.Grads}, {"optimizer", two.Optimizer, one.Optimizer}} {
			if d := p.got - p.full/2; d < 0 || d > units*8 {
				t.Errorf("%s %s: %d bytes with dp_shard 2, want half of %d", name, p.what, p.got, p.full)
			}
		}
		if two.FSDPBuffers <= 0 {
			t.Errorf("%s: no FSDP unit buffers with dp_shard 2", name)
		}
		if two.Activations != one.Activations {
			t.Errorf("%s: FSDP changed the activations: %d, want %d", name, two.Activations, one.Activations)
		}
	}
}

// TestParallelDegreesShrink: each parallel dimension lowers the busiest
// rank's share of what it splits.
func TestParallelDegreesShrink(t *testing.T) {
	c := flavor(t, "8B")
	base := estimate(t, Plan{Model: c, Batch: 2, SeqLen: 8192, MicrobatchRows: 1})
	for _, tc := range []struct {
		name  string
		d     Degrees
		parts func(Report) int64
	}{
		{"tp splits state", Degrees{TP: 8}, func(r Report) int64 { return r.Params + r.Grads + r.Optimizer }},
		{"tp splits activations", Degrees{TP: 8}, func(r Report) int64 { return r.Activations }},
		{"cp splits activations", Degrees{CP: 4}, func(r Report) int64 { return r.Activations }},
		{"pp splits state", Degrees{PP: 4}, func(r Report) int64 { return r.Params }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := estimate(t, Plan{Model: c, Batch: 2, SeqLen: 8192, MicrobatchRows: 1, Degrees: tc.d})
			if got, was := tc.parts(r), tc.parts(base); got >= was {
				t.Errorf("%s: %s, not below %s on one rank", tc.d, bytesize.Human(got), bytesize.Human(was))
			}
			if r.Comm <= 0 {
				t.Errorf("%s: no communication buffers", tc.d)
			}
		})
	}
}

// TestCheck: the 8B flavor at seq 8192 on one 24 GiB process is refused,
// naming the parts and the ranks needed; the debug flavor fits.
func TestCheck(t *testing.T) {
	const avail = 24 * gib
	for _, tc := range []struct {
		name   string
		plan   Plan
		refuse bool
		want   []string
	}{
		{"8B one process", Plan{Model: flavor(t, "8B"), Flavor: "8B", Batch: 1, SeqLen: 8192}, true,
			[]string{"parameters", "gradients", "optimizer state", "activations", "24.00 GiB", "needs at least", "ranks", "FSDP", "data_parallel_shard_degree"}},
		{"8B on 64 ranks", Plan{Model: flavor(t, "8B"), Flavor: "8B", Batch: 1, SeqLen: 8192, Degrees: Degrees{DPShard: 64}}, true,
			[]string{"settings that would fit", "--set"}},
		{"debug", Plan{Model: flavor(t, "debug"), Flavor: "debug", Batch: 8, SeqLen: 256}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := estimate(t, tc.plan)
			err := Check(r, avail)
			if !tc.refuse {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if tc.name == "8B on 64 ranks" {
				// Make this layout too big, so that a change of layout or
				// checkpointing is what fits.
				err = Check(r, r.Total()-1)
			}
			if err == nil {
				t.Fatalf("not refused; estimate\n%s", r)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestSuggestionsFit: every suggested setting's estimate fits, and the
// rank count found is the smallest power of two that does.
func TestSuggestionsFit(t *testing.T) {
	c := flavor(t, "8B")
	p := Plan{Model: c, Batch: 1, SeqLen: 8192, Degrees: Degrees{DPShard: 8}}
	r := estimate(t, p)
	avail := r.Total() * 3 / 4
	for _, s := range Suggest(p, avail) {
		if !strings.Contains(s, "--set") {
			t.Errorf("suggestion %q changes nothing", s)
		}
	}
	n, _ := RanksNeeded(Plan{Model: c, Batch: 1, SeqLen: 8192}, 24*gib)
	if n < 2 {
		t.Fatalf("RanksNeeded = %d", n)
	}
	for _, tc := range []struct {
		ranks int
		fits  bool
	}{{n, true}, {n / 2, false}} {
		best := int64(math.MaxInt64)
		for _, ac := range []Checkpoint{{Mode: "none"}, {Mode: "full"}} {
			best = min(best, estimate(t, Plan{Model: c, Batch: 1, SeqLen: 8192, Degrees: Degrees{DPShard: tc.ranks}, Checkpoint: ac}).Total())
		}
		if (tc.ranks > 1 && best <= 24*gib) != tc.fits {
			t.Errorf("%d ranks: best estimate %s, fits %v, want %v", tc.ranks, bytesize.Human(best), best <= 24*gib, tc.fits)
		}
	}
}

func TestFromJob(t *testing.T) {
	job := config.Default()
	job.Model.Flavor = "debug"
	job.Parallelism.DataParallelShardDegree = -1
	job.Parallelism.TensorParallelDegree = 2
	p, err := FromJob(job, 8)
	if err != nil {
		t.Fatal(err)
	}
	if p.Degrees.DPShard != 4 || p.Degrees.TP != 2 || p.Degrees.World() != 8 {
		t.Errorf("degrees %s, want dp_shard 4 × tp 2", p.Degrees)
	}
	if _, err := FromJob(job, 7); err == nil {
		t.Error("7 ranks over tp 2: no error")
	}
	// As torchtitan, a recipe may train past the flavor's max_seq_len (8B:
	// 131072), as its 256K context-parallel rows do.
	job.Training.SeqLen, job.Parallelism.ContextParallelDegree, job.Parallelism.TensorParallelDegree = 262144, 8, 1
	if p, err = FromJob(job, 8); err != nil || p.Model.MaxSeqLen != 262144 {
		t.Errorf("seq_len 262144 on debug (max_seq_len 131072): max_seq_len %d, %v; want 262144, no error", p.Model.MaxSeqLen, err)
	}
	job.Training.SeqLen, job.Parallelism.ContextParallelDegree, job.Parallelism.TensorParallelDegree = 2048, 1, 2
	job.ActivationCheckpoint.Mode = "sometimes"
	if _, err := FromJob(job, 8); err == nil || !strings.Contains(err.Error(), "sometimes") {
		t.Errorf("bad mode: %v", err)
	}
}

func TestAvailable(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(dir, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/meminfo", "MemTotal: 100 kB\nMemAvailable: 4194304 kB\n")
	write("proc/self/cgroup", "0::/job\n")
	for _, tc := range []struct {
		name         string
		max, current string
		want         int64
	}{
		{"no limit", "max", "0", 4 * gib},
		{"limit below meminfo", "3221225472", "1073741824", 2 * gib},
		{"limit above meminfo", "10737418240", "0", 4 * gib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			write("cg/job/memory.max", tc.max)
			write("cg/job/memory.current", tc.current)
			got, err := available(filepath.Join(dir, "proc"), filepath.Join(dir, "cg"))
			if err != nil || got != tc.want {
				t.Errorf("available = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
	if _, err := os.Stat("/proc/meminfo"); err == nil {
		if n, err := Available(); err != nil || n <= 0 {
			t.Errorf("Available() = %d, %v", n, err)
		}
	}
}

func TestWarnings(t *testing.T) {
	for _, tc := range []struct {
		warmup, steps int
		want          string
	}{{10, 100, ""}, {100, 100, ""}, {200, 100, "warmup_steps 200 exceeds training.steps 100: the warmup is cut to 100 steps (as torchtitan does), so the learning rate reaches optimizer.lr only at the last step"}} {
		job := config.Default()
		job.LRScheduler.WarmupSteps, job.Training.Steps = tc.warmup, tc.steps
		got := strings.Join(Warnings(job), "\n")
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("warmup %d, steps %d: %q, want %q", tc.warmup, tc.steps, got, tc.want)
		}
	}
}

func TestLossWatch(t *testing.T) {
	const vocab = 2048
	ceiling := math.Log(vocab) + 2
	for _, tc := range []struct {
		name   string
		losses []float64
		warnAt int // step of the warning, 0: none
	}{
		{"falling", []float64{7.6, 7, 6, 5, 4, 3}, 0},
		{"jump above 1.5× first", []float64{4, 4.5, 6.5, 7, 8}, 3},
		{"above ceiling early is tolerated", []float64{ceiling + 1, ceiling + 1.2, ceiling + 1}, 0},
		{"above ceiling after step 10", append(repeat(ceiling-0.5, 10), ceiling+0.5, ceiling+0.6), 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := NewLossWatch(vocab, 3e-3)
			warnings := 0
			for i, l := range tc.losses {
				msg := w.Observe(i+1, l)
				if msg == "" {
					continue
				}
				warnings++
				if i+1 != tc.warnAt {
					t.Errorf("warning at step %d, want %d: %s", i+1, tc.warnAt, msg)
				}
				if !strings.Contains(msg, "optimizer.lr") {
					t.Errorf("warning does not suggest a lower optimizer.lr: %s", msg)
				}
			}
			if want := min(tc.warnAt, 1); warnings != want {
				t.Errorf("%d warnings, want %d", warnings, want)
			}
		})
	}
}

func repeat(x float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = x
	}
	return out
}

func TestReportString(t *testing.T) {
	r := estimate(t, Plan{Model: flavor(t, "debug"), Flavor: "debug", Batch: 8, SeqLen: 256, Degrees: Degrees{DPShard: 2}})
	s := r.String()
	for _, w := range []string{"debug", "parameters", "gradients", "optimizer", "FSDP", "activations", "total", bytesize.Human(r.Total())} {
		if !strings.Contains(s, w) {
			t.Errorf("String() lacks %q:\n%s", w, s)
		}
	}
}
