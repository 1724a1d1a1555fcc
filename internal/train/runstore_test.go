package train

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/runstore"
)

// TestMain keeps the tests' runs out of the user's run store: every run
// that does not name metrics.db records in a temporary one.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "titan-train-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv(runstore.EnvDB, filepath.Join(dir, "runs.db"))
	os.Setenv("XDG_DATA_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// jsonlRecords reads a dump folder's metrics.jsonl.
func jsonlRecords(t testing.TB, dump string) []metrics.Record {
	t.Helper()
	f, err := os.Open(filepath.Join(dump, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []metrics.Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r metrics.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// TestRunIsRecorded: with the run store on, a run records its start, each
// logged step (the records metrics.jsonl holds) and how it ended —
// finished, failed with the error (a checkpoint that cannot be written),
// or interrupted — and with it off records nothing.
func TestRunIsRecorded(t *testing.T) {
	for _, c := range []struct {
		name   string
		setup  func(job *config.Job, tr *Trainer, cancel context.CancelFunc)
		status runstore.Status
		steps  int
		err    string
		off    bool
	}{
		{name: "finished", status: runstore.Finished, steps: 3},
		{name: "failed", status: runstore.Failed, steps: 1, err: "not a directory",
			setup: func(job *config.Job, tr *Trainer, _ context.CancelFunc) {
				job.Checkpoint.Interval = 1
				tr.OnStep = func(step int, _ float64) {
					// The checkpoint folder becomes a file: step 1's save fails.
					os.RemoveAll(tr.ckptFolder)
					os.WriteFile(tr.ckptFolder, []byte("in the way"), 0o644)
				}
			}},
		{name: "interrupted", status: runstore.Interrupted, steps: 2,
			setup: func(_ *config.Job, tr *Trainer, cancel context.CancelFunc) {
				tr.OnStep = func(step int, _ float64) {
					if step == 2 {
						cancel()
					}
				}
			}},
		{name: "off", off: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dump := t.TempDir()
			db := filepath.Join(t.TempDir(), "runs.db")
			job := testJob(t, dump, 3)
			job.Metrics.LogFreq, job.Metrics.DB, job.Metrics.EnableDB = 1, db, !c.off
			tr, err := New(job, testDevice(1), io.Discard, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			tr.RecipePath = "recipes/test.toml"
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.setup != nil {
				c.setup(job, tr, cancel)
			}
			runErr := tr.Run(ctx)
			if (runErr != nil) != (c.status != runstore.Finished && !c.off) {
				t.Fatalf("Run: %v", runErr)
			}
			if c.off {
				if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("metrics.enable_db=false wrote %s: %v", db, err)
				}
				return
			}
			s, err := runstore.OpenExisting(context.Background(), db)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			runs, err := s.List(context.Background(), 0)
			if err != nil || len(runs) != 1 {
				t.Fatalf("runs: %v %+v", err, runs)
			}
			r, err := s.Get(context.Background(), runs[0].ID)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != c.status || r.EndedAt == nil || r.Model != "llama3" || r.Flavor != "tiny_bench" || r.RecipePath != "recipes/test.toml" ||
				r.World != 1 || r.TokensPerStep != 32 || r.StepsPlanned != 3 || !strings.Contains(r.Layout, "dp_shard 1") || r.Host == "" || r.Version == "" {
				t.Errorf("run: %+v", r)
			}
			if c.err != "" && (r.Error != runErr.Error() || !strings.Contains(r.Error, c.err)) {
				t.Errorf("error %q, want the run's %q (containing %q)", r.Error, runErr, c.err)
			}
			if !strings.Contains(r.Recipe, "flavor = 'tiny_bench'") && !strings.Contains(r.Recipe, `flavor = "tiny_bench"`) {
				t.Errorf("recipe lacks the flavor:\n%s", r.Recipe)
			}
			steps, err := s.Steps(context.Background(), r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if want := jsonlRecords(t, dump); len(steps) != c.steps || !reflect.DeepEqual(steps, want) {
				t.Errorf("stored steps %+v\nmetrics.jsonl %+v\nwant %d", steps, want, c.steps)
			}
			if _, err := os.Stat(filepath.Join(dump, runstore.SpoolFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("spool left in the dump folder: %v", err)
			}
		})
	}
}

// TestRecipeRoundTrip: the recorded recipe trains the same job.
func TestRecipeRoundTrip(t *testing.T) {
	dump := t.TempDir()
	db := filepath.Join(t.TempDir(), "runs.db")
	job := testJob(t, dump, 1)
	job.Metrics.DB = db
	job.Checkpoint.Enable = false
	tr, err := New(job, testDevice(1), io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := runstore.OpenExisting(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runs, _ := s.List(ctx, 0)
	if len(runs) != 1 {
		t.Fatalf("%d runs", len(runs))
	}
	r, err := s.Get(ctx, runs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "recipe.toml")
	os.WriteFile(p, []byte(r.Recipe), 0o644)
	back, err := config.Load(p, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, job) {
		t.Errorf("recorded recipe loads as\n%+v\nwant\n%+v", back, job)
	}
}
