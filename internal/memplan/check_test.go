package memplan

import (
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/bytesize"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/model/llama"
)

// suggestion is one line of a Check message that can be pasted: the --set
// overrides (as key=value) and the number of ranks it is for.
type suggestion struct {
	ranks int
	sets  []string
}

var (
	setRE   = regexp.MustCompile(`--set (\S+)`)
	ranksRE = regexp.MustCompile(`(\d+) ranks`)
)

// suggestions parses the pasteable lines of a Check message of a job on
// world ranks: each line "  --set k=v ... (about X per rank)" is for the
// rank count the last line naming "N ranks" gave (world before any).
func suggestions(msg string, world int) []suggestion {
	var out []suggestion
	ranks := world
	for _, line := range strings.Split(msg, "\n") {
		if strings.HasPrefix(line, "  --set ") {
			s := suggestion{ranks: ranks}
			for _, m := range setRE.FindAllStringSubmatch(line, -1) {
				s.sets = append(s.sets, m[1])
			}
			out = append(out, s)
			continue
		}
		if m := ranksRE.FindAllStringSubmatch(line, -1); m != nil {
			ranks, _ = strconv.Atoi(m[len(m)-1][1])
		}
	}
	return out
}

// recipeReport loads a recipe of the repository with sets and estimates
// one rank of it on world ranks.
func recipeReport(t *testing.T, recipe string, sets []string, world int) Report {
	t.Helper()
	job, err := config.Load("../../recipes/"+recipe, sets, nil)
	if err != nil {
		t.Fatalf("recipe %s with %q: %v", recipe, sets, err)
	}
	plan, err := FromJob(job, world)
	if err != nil {
		t.Fatalf("recipe %s with %q on %d ranks: %v", recipe, sets, world, err)
	}
	return estimate(t, plan)
}

// TestCheckSuggestsWhatFits pins Check on the repository's recipes: the
// 8B recipe on one rank of 22 GiB (the host it is run on) is refused with
// the number of ranks FSDP needs, full activation checkpointing and the
// smaller local batch that makes it fit; on 64 ranks of local batch 1
// checkpointing alone fits and comes first; a sequence too long for any
// rank count says so; the debug model fits. Every suggested line, loaded
// as --set overrides of the recipe on its rank count, fits.
func TestCheckSuggestsWhatFits(t *testing.T) {
	const avail = 22 * gib
	for _, tc := range []struct {
		name   string
		recipe string
		sets   []string
		world  int
		// fits: Check must not refuse. Otherwise wantRanks and
		// wantFirst are the first suggestion's rank count and overrides
		// (nil: no suggestion at all), want what the message says.
		fits      bool
		wantRanks int
		wantFirst []string
		want      []string
	}{
		// The 8B cases pin float32, whose figures they state.
		{name: "8B recipe on one rank", recipe: "llama3_8b.toml", sets: []string{"training.mixed_precision_param=float32"}, world: 1,
			wantRanks: 32,
			wantFirst: []string{"parallelism.data_parallel_shard_degree=32", "training.local_batch_size=1", "activation_checkpoint.mode=full"},
			want:      []string{"activations", "22.00 GiB", "activation checkpointing alone is not enough", "needs at least 32 ranks", "with FSDP", "at training.local_batch_size=2 no number of ranks fits", "FSDP unit buffers", "tensor parallelism", "parallelism.tensor_parallel_degree="}},
		{name: "8B on 64 ranks, checkpointing alone", recipe: "llama3_8b.toml", sets: []string{"training.mixed_precision_param=float32", "training.local_batch_size=1"}, world: 64,
			wantRanks: 64,
			wantFirst: []string{"activation_checkpoint.mode=full"},
			want:      []string{"settings that would fit"}},
		{name: "8B sequence too long", recipe: "llama3_8b.toml", sets: []string{"training.mixed_precision_param=float32", "training.seq_len=131072"}, world: 1,
			want: []string{"no layout of up to 65536 ranks", "lower training.seq_len (now 131072)"}},
		{name: "debug fits", recipe: "llama3_debug.toml", world: 1, fits: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := recipeReport(t, tc.recipe, tc.sets, tc.world)
			err := Check(r, avail)
			if tc.fits {
				if err != nil {
					t.Fatalf("refused:\n%v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("not refused; estimate\n%s", r)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q:\n%s", w, msg)
				}
			}
			got := suggestions(msg, tc.world)
			if tc.wantFirst == nil {
				if len(got) > 0 {
					t.Errorf("suggests %v, want nothing:\n%s", got, msg)
				}
				return
			}
			if len(got) == 0 {
				t.Fatalf("no suggestion:\n%s", msg)
			}
			if first := got[0]; first.ranks != tc.wantRanks || strings.Join(first.sets, " ") != strings.Join(tc.wantFirst, " ") {
				t.Errorf("first suggestion %d ranks %q, want %d ranks %q:\n%s", first.ranks, first.sets, tc.wantRanks, tc.wantFirst, msg)
			}
			for _, s := range got {
				fit := recipeReport(t, tc.recipe, append(append([]string(nil), tc.sets...), s.sets...), s.ranks)
				if fit.Total() >= avail {
					t.Errorf("suggestion %q on %d ranks does not fit:\n%s", s.sets, s.ranks, fit)
				}
			}
		})
	}
}

// TestActivationsAreTheModels: without pipeline stages the activation
// estimate is exactly what the model plans, under tensor and context
// parallelism too.
func TestActivationsAreTheModels(t *testing.T) {
	c := flavor(t, "8B")
	for _, d := range []Degrees{{}, {TP: 4}, {CP: 2}, {TP: 2, CP: 2}, {DPShard: 8}} {
		for _, ac := range checkpoints {
			p := Plan{Model: c, Batch: 2, SeqLen: 8192, Degrees: d, Checkpoint: ac}
			got := estimate(t, p).Activations
			var comm llama.ParallelComm
			if max(d.TP, 1)*max(d.CP, 1) > 1 {
				comm = planOnly{}
			}
			want, err := llama.ActivationBytesFor(c, 2, 8192, llama.Plan{TP: d.TP, CP: d.CP, Comm: comm, Checkpoint: llama.ActivationCheckpoint{Mode: ac.Mode, SelectiveOption: ac.Option}})
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s, %s: activations %d, the model plans %d", d, ac, got, want)
			}
		}
	}
}

// TestEstimateIsCheap: estimating runs before anything is allocated, on
// hosts that the model will nearly fill, and Check searches many layouts:
// an estimate of the 70B model allocates little, and refusing the 8B
// recipe with its suggestions takes well under a second.
func TestEstimateIsCheap(t *testing.T) {
	p := Plan{Model: flavor(t, "70B"), Batch: 2, SeqLen: 8192, Degrees: Degrees{TP: 8, DPShard: 4, PP: 2}, Checkpoint: Checkpoint{Mode: "full"}}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const runs = 10
	for range runs {
		estimate(t, p)
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 4<<20 {
		t.Errorf("one 70B estimate allocates %s, want under 4 MiB", bytesize.Human(int64(per)))
	}
	r := recipeReport(t, "llama3_8b.toml", nil, 1)
	start := time.Now()
	if Check(r, 22*gib) == nil {
		t.Fatal("8B on one rank of 22 GiB not refused")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Check of the 8B recipe took %v", d)
	}
}

// BenchmarkCheck8B is the refusal of the 8B recipe on one rank of 22 GiB,
// with its search for layouts that fit.
func BenchmarkCheck8B(b *testing.B) {
	c, err := llama.Flavor("8B")
	if err != nil {
		b.Fatal(err)
	}
	r, err := Estimate(Plan{Model: c, Flavor: "8B", Batch: 2, SeqLen: 8192, Checkpoint: Checkpoint{Mode: "selective", Option: "op"}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for range b.N {
		if Check(r, 22*gib) == nil {
			b.Fatal("fits")
		}
	}
}

// BenchmarkEstimate8B is one estimate of the 8B model.
func BenchmarkEstimate8B(b *testing.B) {
	c, err := llama.Flavor("8B")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for range b.N {
		if _, err := Estimate(Plan{Model: c, Batch: 2, SeqLen: 8192, Checkpoint: Checkpoint{Mode: "full"}}); err != nil {
			b.Fatal(err)
		}
	}
}
