package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/runstore"
)

// TestRunsCommands: two recorded runs through titan runs list (table and
// --json), show (table, --json, --recipe) and compare.
func TestRunsCommands(t *testing.T) {
	data := corpus(t)
	db := filepath.Join(t.TempDir(), "runs.db")
	for _, desc := range []string{"first", "second"} {
		args := append(keysBase(t.TempDir(), data), "--set", "metrics.db="+db, "--set", "job.description="+desc)
		if out, err := titan(t, args...); err != nil {
			t.Fatalf("train: %v\n%s", err, out)
		}
	}

	out, err := titan(t, "runs", "list", "--json", "--db", db)
	if err != nil {
		t.Fatalf("runs list --json: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("runs list --json: %d lines, want 2:\n%s", len(lines), out)
	}
	type listed struct {
		ID           string   `json:"id"`
		RecipePath   string   `json:"recipe_path"`
		Model        string   `json:"model"`
		Flavor       string   `json:"flavor"`
		Layout       string   `json:"layout"`
		Status       string   `json:"status"`
		Steps        int      `json:"steps"`
		LastStep     int      `json:"last_step"`
		FinalLoss    *float64 `json:"final_loss"`
		TokensPerSec *float64 `json:"mean_tokens_per_sec"`
		StartedAt    string   `json:"started_at"`
		Description  string   `json:"description"`
	}
	var runs []listed
	for _, l := range lines {
		var r listed
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		runs = append(runs, r)
	}
	for _, r := range runs {
		if r.ID == "" || r.RecipePath != "../../recipes/llama3_debug.toml" || r.Model != "llama3" || r.Flavor != "tiny_bench" || r.Layout == "" ||
			r.Status != "finished" || r.Steps != 3 || r.LastStep != 3 || r.FinalLoss == nil || r.TokensPerSec == nil || r.StartedAt == "" {
			t.Errorf("listed run: %+v", r)
		}
	}
	if runs[0].Description != "second" || runs[1].Description != "first" {
		t.Errorf("not newest first: %s, %s", runs[0].Description, runs[1].Description)
	}

	out, err = titan(t, "runs", "list", "--db", db)
	if err != nil || !strings.Contains(out, "FINAL LOSS") || !strings.Contains(out, runs[0].ID) || !strings.Contains(out, "llama3/tiny_bench") {
		t.Errorf("runs list: %v\n%s", err, out)
	}

	// titan plot overlays both runs' loss, raw and smoothed.
	png := filepath.Join(t.TempDir(), "loss.png")
	if out, err := titan(t, "plot", runs[0].ID, runs[1].ID, "--metric", "loss", "--db", db, "--out", png); err != nil {
		t.Errorf("plot: %v\n%s", err, out)
	} else if fi, err := os.Stat(png); err != nil || fi.Size() < 1000 {
		t.Errorf("plot wrote %v, %v", fi, err)
	}
	if _, err := titan(t, "plot", runs[0].ID, "--metric", "nonsense", "--db", db, "--out", png); err == nil || !strings.Contains(err.Error(), "--metric") {
		t.Errorf("plot of an unknown metric: %v, want an error naming --metric", err)
	}

	id := runs[1].ID
	out, err = titan(t, "runs", "show", id[:len(id)-2], "--db", db) // a unique prefix
	if err != nil || !strings.Contains(out, "status       finished") || !strings.Contains(out, "VAL_LOSS") || strings.Count(out, "\n") < 17 {
		t.Errorf("runs show: %v\n%s", err, out)
	}
	out, err = titan(t, "runs", "show", id, "--json", "--db", db)
	var shown struct {
		Run   struct{ ID, Status string }
		Steps []struct {
			Step int
			Loss *float64
		}
	}
	if err != nil || strings.Count(out, "\n") != 1 || json.Unmarshal([]byte(out), &shown) != nil || shown.Run.ID != id || len(shown.Steps) != 3 || shown.Steps[2].Loss == nil {
		t.Errorf("runs show --json: %v %+v\n%s", err, shown, out)
	}
	out, err = titan(t, "runs", "show", id, "--recipe", "--db", db)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "again.toml")
	os.WriteFile(p, []byte(out), 0o644)
	if j, err := config.Load(p, nil, nil); err != nil || j.Job.Description != "first" || j.Metrics.DB != db {
		t.Errorf("runs show --recipe does not load back: %v", err)
	}

	out, err = titan(t, "runs", "compare", runs[0].ID, runs[1].ID, "--db", db)
	if err != nil || !strings.Contains(out, "loss at 96 tokens") || !strings.Contains(out, "mean tokens/s") || !strings.Contains(out, "peak mem GiB") {
		t.Errorf("runs compare: %v\n%s", err, out)
	}
	out, err = titan(t, "runs", "compare", runs[0].ID, runs[1].ID, "--json", "--db", db)
	if err != nil || strings.Count(out, "\n") != 2 || !strings.Contains(out, `"loss_at_step":3`) {
		t.Errorf("runs compare --json: %v\n%s", err, out)
	}

	if _, err := titan(t, "runs", "show", "nope", "--db", db); err == nil || !strings.Contains(err.Error(), "no such run") {
		t.Errorf("runs show nope: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "none.db")
	if out, err := titan(t, "runs", "list", "--db", empty); err != nil || !strings.Contains(out, "no runs recorded") {
		t.Errorf("runs list of a missing store: %v\n%s", err, out)
	}
	if _, err := os.Stat(empty); err == nil {
		t.Error("runs list created the store")
	}
}

// TestKilledRunIsInterrupted: a run killed with SIGKILL cannot record its
// end; titan runs shows it interrupted, naming the process that is gone,
// instead of running for ever.
func TestKilledRunIsInterrupted(t *testing.T) {
	data := corpus(t)
	db := filepath.Join(t.TempDir(), "runs.db")
	args := append(keysBase(t.TempDir(), data), "--set", "metrics.db="+db, "--set", "training.steps=100000")
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "TITANTEST_RUN_MAIN=1")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	ctx := context.Background()
	var id string
	for deadline := time.Now().Add(2 * time.Minute); id == "" && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		s, err := runstore.OpenExisting(ctx, db)
		if err != nil {
			continue
		}
		runs, err := s.List(ctx, 1)
		s.Close()
		if err == nil && len(runs) == 1 && runs[0].Steps >= 2 {
			id = runs[0].ID
		}
	}
	if id == "" {
		t.Fatalf("no run with 2 steps recorded:\n%s", log.String())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	out, err := titan(t, "runs", "show", id, "--json", "--db", db)
	if err != nil {
		t.Fatalf("runs show: %v\n%s", err, out)
	}
	var shown struct {
		Run runstore.Run `json:"run"`
	}
	if err := json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &shown); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	r := shown.Run
	want := fmt.Sprintf("pid %d on ", cmd.Process.Pid)
	if r.Status != runstore.Interrupted || !strings.Contains(r.Error, want) || !strings.Contains(r.Error, "is gone") || r.EndedAt == nil {
		t.Errorf("killed run: status %s, error %q, ended %v; want interrupted naming %q", r.Status, r.Error, r.EndedAt, want)
	}
}

// TestRunsFlagsRefused: flags that cannot do what they say are refused,
// naming them, before the run store is opened.
func TestRunsFlagsRefused(t *testing.T) {
	db := filepath.Join(t.TempDir(), "none.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"runs", "compare", "20261201-1026", "--db", db}, "at least 2"},
		{[]string{"runs", "show", "20261201-1026", "--recipe", "--json", "--db", db}, "--recipe"},
		{[]string{"runs", "list", "-n", "-1", "--db", db}, "--limit -1"},
		{[]string{"plot", "20261201-1026", "--out", "loss.svg", "--db", db}, "--out loss.svg"},
	} {
		if _, err := titan(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}

// TestResumedRunsShareALineage: a run that resumes from its dump folder's
// checkpoint is a run of its own, and titan runs show lists both runs of
// the job with the steps each trained; a fresh start in the same folder
// (its checkpoints deleted) is another job.
func TestResumedRunsShareALineage(t *testing.T) {
	data := corpus(t)
	db := filepath.Join(t.TempDir(), "runs.db")
	dump := t.TempDir()
	train := func(steps string) {
		t.Helper()
		args := append(keysBase(dump, data), "--set", "metrics.db="+db, "--set", "checkpoint.enable=true",
			"--set", "checkpoint.interval=3", "--set", "training.steps="+steps)
		if out, err := titan(t, args...); err != nil {
			t.Fatalf("train to step %s: %v\n%s", steps, err, out)
		}
	}
	ids := func() []string { // newest first
		t.Helper()
		out, err := titan(t, "runs", "list", "--json", "--db", db)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var r struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, r.ID)
		}
		return ids
	}
	train("3")
	train("5")
	got := ids()
	if len(got) != 2 {
		t.Fatalf("%d runs recorded, want 2", len(got))
	}
	out, err := titan(t, "runs", "show", got[0], "--db", db)
	if err != nil || !strings.Contains(out, "the job's 2 runs in this dump folder") ||
		!regexp.MustCompile(regexp.QuoteMeta(got[1])+` +finished +1-3 `).MatchString(out) ||
		!regexp.MustCompile(regexp.QuoteMeta(got[0])+` +finished +4-5 +.*\(this run\)`).MatchString(out) ||
		!strings.Contains(out, "4-5 of 5 trained (resumed from step 3)") {
		t.Errorf("runs show of the resumed run: %v\n%s", err, out)
	}
	out, err = titan(t, "runs", "show", got[1], "--json", "--db", db)
	var shown struct {
		Run struct {
			ResumedFrom *int `json:"resumed_from"`
		} `json:"run"`
		Lineage []string `json:"lineage"`
	}
	if err != nil || json.Unmarshal([]byte(out), &shown) != nil || !slices.Equal(shown.Lineage, []string{got[1], got[0]}) ||
		shown.Run.ResumedFrom == nil || *shown.Run.ResumedFrom != 0 {
		t.Errorf("runs show --json: %v %+v, want lineage [%s %s] and resumed_from 0\n%s", err, shown, got[1], got[0], out)
	}
	// The checkpoints deleted, the same command starts a new job there.
	if err := os.RemoveAll(filepath.Join(dump, "checkpoint")); err != nil {
		t.Fatal(err)
	}
	train("3")
	got = ids()
	out, err = titan(t, "runs", "show", got[0], "--json", "--db", db)
	if err != nil || json.Unmarshal([]byte(out), &shown) != nil || !slices.Equal(shown.Lineage, []string{got[0]}) {
		t.Errorf("a fresh start in the folder: lineage %v, want itself alone (%v)\n%s", shown.Lineage, err, out)
	}
}
