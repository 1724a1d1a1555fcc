package main

import (
	"bytes"
	"io"
	"math"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/straggler"
)

// runTop runs titan top in this process (leaving commandArgs, which the
// running launcher uses, alone).
func runTop(args ...string) (string, error) {
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"top"}, args...))
	err := root.Execute()
	return out.String(), err
}

// scrape reads the endpoint with the tests' own parser (parseProm): the
// job's samples by name, each rank's by rank and name.
func scrape(t *testing.T, addr string) (job map[string]float64, ranks map[string]map[string]float64, hosts map[string]string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, nil, nil
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	job, ranks, hosts = map[string]float64{}, map[string]map[string]float64{}, map[string]string{}
	for _, s := range parseProm(t, string(body)) {
		if r, ok := s.labels["rank"]; ok {
			if ranks[r] == nil {
				ranks[r] = map[string]float64{}
			}
			ranks[r][s.name], hosts[r] = s.value, s.labels["host"]
			continue
		}
		job[s.name] = s.value
	}
	return job, ranks, hosts
}

// TestTopOnce: titan top --once against a 2-process run's --metrics-addr
// prints the job line and one row per rank with what the endpoint served
// (scraped independently just before and after, the snapshot unchanged
// in between): step, loss, steps/s, tokens/s, MFU, straggler reports,
// each rank's host, step and compute time, compute share and memory, to
// the digits shown. The run's console has one line per log step.
func TestTopOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv(straggler.EnvSlowRank, "1:25") // steps of some 25 ms: time to scrape one snapshot thrice
	dump := t.TempDir()
	args := append(set(tinyRun(dump, corpus(t), 30), "checkpoint.enable=false", "training.local_batch_size=1", "metrics.log_freq=5"),
		"--nproc", "2", "--metrics-addr", addr)
	commandArgs = args
	root := newRootCmd()
	out := &syncBuffer{}
	root.SetOut(out)
	root.SetErr(out)
	root.SetArgs(args)
	done := make(chan error, 1)
	go func() { done <- root.Execute() }()

	var view string
	var job map[string]float64
	var ranks map[string]map[string]float64
	var hosts map[string]string
	deadline := time.Now().Add(2 * time.Minute)
	for view == "" && time.Now().Before(deadline) {
		select {
		case err := <-done:
			t.Fatalf("the run ended before a consistent view: %v\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
		a, ar, ah := scrape(t, addr)
		if a == nil || a["titan_job_up"] != 1 || a["titan_step"] < 2 {
			continue
		}
		got, err := runTop("--once", "--metrics-addr", addr)
		if err != nil {
			t.Fatalf("titan top --once: %v\n%s", err, got)
		}
		if b, _, _ := scrape(t, addr); b != nil && b["titan_last_update_timestamp_seconds"] == a["titan_last_update_timestamp_seconds"] {
			view, job, ranks, hosts = got, a, ar, ah
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if view == "" {
		t.Fatalf("no scrape saw one snapshot before and after titan top:\n%s", out.String())
	}
	t.Logf("titan top --once:\n%s", view)

	near := func(what string, got string, want, tol float64) {
		t.Helper()
		g, err := strconv.ParseFloat(got, 64)
		if err != nil || math.Abs(g-want) > tol*(1+1e-9) {
			t.Errorf("%s: top shows %s, the endpoint served %v", what, got, want)
		}
	}
	m := regexp.MustCompile(`(?m)^step (\d+)/(\d+)  loss (\S+)  (\S+) steps/s  (\S+) tokens/s  mfu (\S+)%  stragglers reported (\d+)$`).FindStringSubmatch(view)
	if m == nil {
		t.Fatalf("no job line in:\n%s", view)
	}
	near("step", m[1], job["titan_step"], 0)
	near("steps", m[2], job["titan_steps_total_planned"], 0)
	near("loss", m[3], job["titan_loss"], 0.5e-4)
	near("steps/s", m[4], job["titan_steps_per_second"], 0.005)
	near("tokens/s", m[5], job["titan_tokens_per_second"], 0.5)
	near("mfu", m[6], job["titan_mfu_percent"], 0.005)
	near("stragglers", m[7], job["titan_stragglers_reported"], 0)
	rows := regexp.MustCompile(`(?m)^\s+(\d+)  (\S+)\s+(\S+)\s+(\S+)\s+(\S+)%\s+(\S+)  [█░]*$`).FindAllStringSubmatch(view, -1)
	if len(rows) != 2 || len(ranks) != 2 {
		t.Fatalf("%d rows, %d ranks served:\n%s", len(rows), len(ranks), view)
	}
	for _, r := range rows {
		served := ranks[r[1]]
		if served == nil || r[2] != hosts[r[1]] {
			t.Errorf("row of rank %s, host %s: served %v, host %q", r[1], r[2], served, hosts[r[1]])
			continue
		}
		step, comp := served["titan_rank_step_seconds"], served["titan_rank_compute_seconds"]
		near("rank "+r[1]+" step ms", r[3], 1e3*step, 0.005)
		near("rank "+r[1]+" compute ms", r[4], 1e3*comp, 0.005)
		near("rank "+r[1]+" compute share", r[5], 100*comp/step, 0.05)
		near("rank "+r[1]+" memory GiB", r[6], served["titan_rank_memory_bytes"]/(1<<30), 0.0005)
	}

	var logged []string
	for _, l := range regexp.MustCompile(`(?m)^.*step\s+(\d+)\s+loss .*$`).FindAllStringSubmatch(out.String(), -1) {
		logged = append(logged, l[1])
	}
	if strings.Join(logged, " ") != "1 5 10 15 20 25 30" {
		t.Errorf("console log lines at steps %v, want one each at 1 5 10 15 20 25 30:\n%s", logged, out.String())
	}
}
