package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/metrics"
	"github.com/titan-go/titan/internal/straggler"
	"github.com/titan-go/titan/internal/testenv"
)

// tbEvents is what internal/tensorboard/testdata/read_events.py (an
// independent reader: its own CRC-32C, its own protobuf decoder) finds in
// the event files under dir: per file its version and events.
type tbFile struct {
	File        string `json:"file"`
	FileVersion string `json:"file_version"`
	Events      []struct {
		Step   int                `json:"step"`
		Values map[string]float64 `json:"values"`
	} `json:"events"`
}

func readTB(t *testing.T, dir string) []tbFile {
	t.Helper()
	_, err := os.Stat(testenv.Python)
	testenv.Require(t, testenv.Python, err == nil)
	out, err := exec.Command(testenv.Python, "../../internal/tensorboard/testdata/read_events.py", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("read_events.py %s: %v\n%s", dir, err, out)
	}
	var files []tbFile
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		var f tbFile
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Fatalf("read_events.py: %v: %q", err, line)
		}
		files = append(files, f)
	}
	return files
}

// jsonlRecords reads a metrics JSONL file as key → value per step.
func jsonlRecords(t *testing.T, path string) map[int]map[string]float64 {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var m map[string]float64
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		out[int(m["step"])] = m
	}
	return out
}

// sameAsJSONL requires that the one event file in dir holds, at every
// step of the JSONL file, every metric under its tag, equal to the JSONL
// value rounded to float32, and nothing else.
func sameAsJSONL(t *testing.T, dir, jsonl string) {
	t.Helper()
	files := readTB(t, dir)
	if len(files) != 1 {
		t.Fatalf("%s: %d event files, want 1", dir, len(files))
	}
	f := files[0]
	if f.FileVersion != "brain.Event:2" || !strings.HasPrefix(filepath.Base(f.File), "events.out.tfevents.") {
		t.Fatalf("%s: file_version %q", f.File, f.FileVersion)
	}
	want := jsonlRecords(t, jsonl)
	if len(f.Events) != 1+len(want) {
		t.Fatalf("%s: %d events, want the version event and %d steps", f.File, len(f.Events), len(want))
	}
	compared := 0
	for _, ev := range f.Events[1:] {
		rec, ok := want[ev.Step]
		if !ok {
			t.Errorf("step %d is in TensorBoard, not in %s", ev.Step, jsonl)
			continue
		}
		n := 0
		for _, kt := range metrics.TensorBoardTags {
			w, inJSON := rec[kt.Key]
			got, inTB := ev.Values[kt.Tag]
			if inJSON != inTB {
				t.Errorf("step %d: %s in jsonl %v, %s in TensorBoard %v", ev.Step, kt.Key, inJSON, kt.Tag, inTB)
				continue
			}
			if !inJSON {
				continue
			}
			n++
			if got != float64(float32(w)) || math.IsNaN(got) {
				t.Errorf("step %d %s: TensorBoard %v, jsonl %v (float32 %v)", ev.Step, kt.Tag, got, w, float32(w))
			}
			compared++
		}
		if n != len(ev.Values) {
			t.Errorf("step %d: %d TensorBoard values, %d known tags: %v", ev.Step, len(ev.Values), n, ev.Values)
		}
		// Every JSONL key but the step is a TensorBoard tag.
		if len(rec)-1 != n {
			t.Errorf("step %d: jsonl has %d metrics, TensorBoard %d", ev.Step, len(rec)-1, n)
		}
	}
	t.Logf("%s: %d steps, %d values equal to %s", dir, len(f.Events)-1, compared, filepath.Base(jsonl))
}

// TestTensorBoardMatchesMetrics: metrics.enable_tensorboard writes one
// event file under <dump>/<save_tb_folder> with every metric of
// metrics.jsonl at every logged step (val_loss on the validation steps),
// as read back by an independent reader.
func TestTensorBoardMatchesMetrics(t *testing.T) {
	dump := t.TempDir()
	args := set(tinyRun(dump, corpus(t), 4), "checkpoint.enable=false", "metrics.enable_tensorboard=true", "metrics.save_tb_folder=tbx",
		"validation.enable=true", "validation.freq=2", "validation.steps=1", "validation.seq_len=32", "validation.local_batch_size=2")
	if out, err := titan(t, args...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := jsonlRecords(t, filepath.Join(dump, "metrics.jsonl")); len(got) != 4 || got[2]["val_loss"] == 0 {
		t.Fatalf("metrics.jsonl: %v", got)
	}
	sameAsJSONL(t, filepath.Join(dump, "tbx"), filepath.Join(dump, "metrics.jsonl"))
	if _, err := os.Stat(filepath.Join(dump, "tb")); err == nil {
		t.Error("the default folder tb was written too")
	}
}

// TestTensorBoardAllRanks: with metrics.save_for_all_ranks every rank
// writes <tb>/rank_<R>, each equal to its own metrics JSONL file; without
// it rank 0 alone writes <tb>.
func TestTensorBoardAllRanks(t *testing.T) {
	data := corpus(t)
	all := t.TempDir()
	if out, err := titan(t, append(set(tinyRun(all, data, 2), "checkpoint.enable=false", "training.local_batch_size=1",
		"metrics.enable_tensorboard=true", "metrics.save_for_all_ranks=true"), "--nproc", "2")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for rank := 0; rank < 2; rank++ {
		sameAsJSONL(t, metrics.TensorBoardDir(all, "tb", rank, true), filepath.Join(all, metrics.RankFile(rank)))
	}
	one := t.TempDir()
	if out, err := titan(t, append(set(tinyRun(one, data, 2), "checkpoint.enable=false", "training.local_batch_size=1",
		"metrics.enable_tensorboard=true"), "--nproc", "2")...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if files := readTB(t, filepath.Join(one, "tb")); len(files) != 1 {
		t.Errorf("without save_for_all_ranks: %d event files, want rank 0's alone", len(files))
	}
	sameAsJSONL(t, filepath.Join(one, "tb"), filepath.Join(one, "metrics.jsonl"))
}

// TestStragglerNamed: in a 4-process run where the test hook
// TITAN_TEST_SLOW_RANK makes rank 1 sleep 150 ms of every step, rank 0's
// log names rank 1, its host and its ratio to the median within 5 steps
// (the detector needs straggler.DefaultSteps = 3 in a row).
func TestStragglerNamed(t *testing.T) {
	t.Setenv(straggler.EnvSlowRank, "1:150")
	dump := t.TempDir()
	out, err := titan(t, append(set(tinyRun(dump, corpus(t), 6), "checkpoint.enable=false", "training.local_batch_size=1"), "--nproc", "4")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	host, _ := os.Hostname()
	re := regexp.MustCompile(`straggler: rank 1 on (\S+) computed ([0-9.]+)x the median step \((\S+) vs (\S+) at step (\d+), (\d+) steps in a row\)`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no straggler line naming rank 1:\n%s", out)
	}
	ratio, _ := strconv.ParseFloat(m[2], 64)
	slow, err1 := time.ParseDuration(m[3])
	step, _ := strconv.Atoi(m[5])
	if m[1] != host || ratio <= straggler.DefaultFactor || err1 != nil || slow < 150*time.Millisecond || step > 5 || m[6] != "3" {
		t.Errorf("straggler line %q: host %s (want %s), ratio %v, compute %v (want >= 150ms), step %d (want <= 5)", m[0], m[1], host, ratio, slow, step)
	}
	t.Logf("%s", m[0])
}

// syncBuffer is a bytes.Buffer safe to read while a run writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// promSample is one sample line of the Prometheus text format.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseProm parses the Prometheus text exposition format (version
// 0.0.4): # HELP and # TYPE lines, then samples name{k="v",...} value. It
// requires that every sample's family was declared by TYPE before it.
func parseProm(t *testing.T, text string) []promSample {
	t.Helper()
	typed := map[string]string{}
	var out []promSample
	re := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$`)
	lre := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[0] == "#" && f[1] == "TYPE" {
			typed[f[2]] = f[3]
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		m := re.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("not a sample line: %q", line)
		}
		if typed[m[1]] == "" {
			t.Errorf("sample %s before its # TYPE", m[1])
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		s := promSample{name: m[1], labels: map[string]string{}, value: v}
		for _, l := range lre.FindAllStringSubmatch(m[2], -1) {
			s.labels[l[1]] = l[2]
		}
		out = append(out, s)
	}
	return out
}

// TestLiveMetricsEndpoint: with --metrics-addr the launcher serves the
// job's figures while it runs; a scrape during a 2-process run parses as
// Prometheus text with the job's step, loss (equal to metrics.jsonl's of
// that step), steps/s, tokens/s (steps/s times the tokens of a step), MFU
// and each rank's step time, compute time and memory; --pprof workers
// answer on the address they log. Afterwards the endpoint is gone; a
// non-loopback address is refused before anything starts.
func TestLiveMetricsEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dump := t.TempDir()
	args := append(set(tinyRun(dump, corpus(t), 40), "checkpoint.enable=false", "training.local_batch_size=1"),
		"--nproc", "2", "--metrics-addr", addr, "--pprof")
	commandArgs = args
	root := newRootCmd()
	out := &syncBuffer{}
	root.SetOut(out)
	root.SetErr(out)
	root.SetArgs(args)
	done := make(chan error, 1)
	go func() { done <- root.Execute() }()

	var samples []promSample
	pprofOK := false
	pprofRE := regexp.MustCompile(`\[rank 1\] titan: pprof on (http://\S+/debug/pprof/)`)
	deadline := time.Now().Add(2 * time.Minute)
	step := 0.0
poll:
	for time.Now().Before(deadline) && (step < 3 || !pprofOK) {
		select {
		case err := <-done:
			t.Fatalf("the run ended before the scrape (step %v, pprof %v): %v\n%s", step, pprofOK, err, out.String())
		case <-time.After(30 * time.Millisecond):
		}
		if m := pprofRE.FindStringSubmatch(out.String()); m != nil && !pprofOK {
			if resp, err := http.Get(m[1] + "cmdline"); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				pprofOK = resp.StatusCode == 200 && strings.Contains(string(b), "train")
			}
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
			t.Fatalf("Content-Type %q", ct)
		}
		s := parseProm(t, string(body))
		for _, x := range s {
			if x.name == "titan_step" {
				step = x.value
				if step >= 3 {
					samples = s
					continue poll
				}
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if samples == nil || !pprofOK {
		t.Fatalf("scraped no step >= 3 (last %v) or pprof unanswered (%v):\n%s", step, pprofOK, out.String())
	}
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Error("the endpoint still answers after the job")
	}
	host, _ := os.Hostname()
	job := map[string]float64{}
	ranks := map[string]map[string]float64{}
	for _, s := range samples {
		if s.labels["job_id"] == "" {
			t.Errorf("%s without job_id", s.name)
		}
		if r, ok := s.labels["rank"]; ok {
			if s.labels["host"] != host {
				t.Errorf("%s rank %s host %q, want %q", s.name, r, s.labels["host"], host)
			}
			if ranks[r] == nil {
				ranks[r] = map[string]float64{}
			}
			ranks[r][s.name] = s.value
			continue
		}
		job[s.name] = s.value
	}
	rec := jsonlRecords(t, filepath.Join(dump, "metrics.jsonl"))[int(job["titan_step"])]
	const tokensPerStep = 2 * 1 * 32
	switch {
	case job["titan_job_up"] != 1 || job["titan_steps_total_planned"] != 40:
		t.Errorf("job metrics %v", job)
	case rec == nil || job["titan_loss"] != rec["loss"]:
		t.Errorf("titan_loss %v at step %v, metrics.jsonl %v", job["titan_loss"], job["titan_step"], rec["loss"])
	case !(job["titan_steps_per_second"] > 0) || math.Abs(job["titan_tokens_per_second"]-tokensPerStep*job["titan_steps_per_second"]) > 1e-9*job["titan_tokens_per_second"]:
		t.Errorf("steps/s %v, tokens/s %v", job["titan_steps_per_second"], job["titan_tokens_per_second"])
	case !(job["titan_mfu_percent"] > 0):
		t.Errorf("mfu %v", job["titan_mfu_percent"])
	}
	if len(ranks) != 2 {
		t.Fatalf("per-rank metrics of %d ranks: %v", len(ranks), ranks)
	}
	for r, m := range ranks {
		st, c, mem := m["titan_rank_step_seconds"], m["titan_rank_compute_seconds"], m["titan_rank_memory_bytes"]
		if !(st > 0) || !(c > 0) || c > st || mem < 1<<20 {
			t.Errorf("rank %s: step %v s, compute %v s, memory %v B", r, st, c, mem)
		}
	}
	t.Logf("step %v: loss %v, %.2f steps/s, %.0f tokens/s, mfu %.2f%%; ranks %v", job["titan_step"], job["titan_loss"],
		job["titan_steps_per_second"], job["titan_tokens_per_second"], job["titan_mfu_percent"], ranks)

	if out, err := titan(t, append(tinyRun(t.TempDir(), corpus(t), 1), "--nproc", "2", "--metrics-addr", "0.0.0.0:0")...); err == nil ||
		!strings.Contains(err.Error(), "--metrics-addr") || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("non-loopback --metrics-addr: %v\n%s", err, out)
	}
}

// chromeTrace is the part of trace.json the profiling test reads.
type chromeTrace struct {
	TraceEvents []struct {
		Name string         `json:"name"`
		Cat  string         `json:"cat"`
		Ph   string         `json:"ph"`
		TS   float64        `json:"ts"`
		Dur  float64        `json:"dur"`
		PID  int            `json:"pid"`
		TID  int            `json:"tid"`
		Args map[string]any `json:"args"`
	} `json:"traceEvents"`
	OtherData struct {
		Profiled []int `json:"profiled_steps"`
		Warmup   []int `json:"warmup_steps"`
	} `json:"otherData"`
}

// TestProfilingTrace: [profiling] on a PP2×FSDP2 job of 4 processes
// (profile_freq 4, profiler_warmup 1, profiler_active 2 over 4 steps)
// writes <dump>/<save_traces_folder>/iteration_4 with one merged trace of
// steps 3 and 4 (step 2 warmed up, thrown away): a process per rank, each
// rank's pipeline actions of its own stage with all 4 microbatches
// forward and backward, FSDP all-gathers with their bytes overlapping the
// rank's compute, pipeline bubbles on every rank; clocks aligned (the
// second stage never starts a microbatch before the first stage has
// finished it); the summary's classes add up to each step; the SVG and
// PNG timelines exist.
func TestProfilingTrace(t *testing.T) {
	dump := t.TempDir()
	args := append(set(tinyRun(dump, corpus(t), 4), "checkpoint.enable=false", "training.local_batch_size=4",
		"parallelism.pipeline_parallel_degree=2", "parallelism.data_parallel_shard_degree=2", "parallelism.pipeline_parallel_microbatch_size=1",
		"profiling.enable_profiling=true", "profiling.save_traces_folder=prof", "profiling.profile_freq=4",
		"profiling.profiler_warmup=1", "profiling.profiler_active=2"), "--nproc", "4")
	out, err := titan(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	dir := filepath.Join(dump, "prof", "iteration_4")
	raw, err := os.ReadFile(filepath.Join(dir, "trace.json"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var tr chromeTrace
	if err := json.Unmarshal(raw, &tr); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(tr.OtherData.Profiled) != "[3 4]" || fmt.Sprint(tr.OtherData.Warmup) != "[2]" {
		t.Errorf("profiled steps %v, warmup %v; want [3 4], [2]", tr.OtherData.Profiled, tr.OtherData.Warmup)
	}
	type iv struct{ a, b float64 }
	procs := map[int]string{}
	stages := map[int]map[int]bool{}
	actions := map[int]map[string]int{} // rank → "F"/"B" → count
	steps := map[int]map[int]bool{}
	gemm := map[int][]iv{}
	gathers := map[int][]iv{}
	firstF := map[[2]int]iv{} // rank, microbatch → its forward of step 4
	bubbles := map[int]float64{}
	for _, e := range tr.TraceEvents {
		if e.Ph == "M" && e.Name == "process_name" {
			procs[e.PID] = e.Args["name"].(string)
			continue
		}
		if e.Ph != "X" {
			continue
		}
		if steps[e.PID] == nil {
			steps[e.PID], stages[e.PID], actions[e.PID] = map[int]bool{}, map[int]bool{}, map[string]int{}
		}
		steps[e.PID][int(e.Args["step"].(float64))] = true
		switch e.Cat {
		case "pipeline":
			st, mb := int(e.Args["stage"].(float64)), int(e.Args["microbatch"].(float64))
			stages[e.PID][st] = true
			kind := strings.Fields(e.Name)[0]
			actions[e.PID][kind]++
			if kind == "F" && int(e.Args["step"].(float64)) == 4 {
				k := [2]int{e.PID, mb}
				if cur, ok := firstF[k]; !ok || e.TS < cur.a {
					firstF[k] = iv{e.TS, e.TS + e.Dur}
				}
			}
		case "gemm":
			gemm[e.PID] = append(gemm[e.PID], iv{e.TS, e.TS + e.Dur})
		case "comm":
			if e.Name == "all_gather" {
				if b, _ := e.Args["bytes"].(float64); b <= 0 {
					t.Errorf("rank %d: all_gather without bytes", e.PID)
				}
				gathers[e.PID] = append(gathers[e.PID], iv{e.TS, e.TS + e.Dur})
			}
		case "bubble":
			bubbles[e.PID] += e.Dur
		}
	}
	host, _ := os.Hostname()
	// FSDP's prefetched gathers run while the rank computes. Each worker
	// has one thread here (four on two cores), so a gather and a GEMM
	// overlap only where the scheduler preempts the GEMM: a loaded host
	// can leave one rank without any in the two profiled steps, not all.
	overlapping := 0
	defer func() {
		if overlapping == 0 {
			t.Errorf("no rank has an all-gather overlapping a GEMM: the prefetch does not overlap compute")
		}
	}()
	for r := 0; r < 4; r++ {
		if procs[r] != fmt.Sprintf("rank %d (%s)", r, host) {
			t.Errorf("process %d named %q", r, procs[r])
		}
		if fmt.Sprint(steps[r]) != "map[3:true 4:true]" {
			t.Errorf("rank %d: spans of steps %v, want 3 and 4", r, steps[r])
		}
		if len(stages[r]) != 1 || actions[r]["F"] != 8 || actions[r]["B"] != 8 {
			t.Errorf("rank %d: stages %v, actions %v; want one stage, 4 microbatches × 2 steps forward and backward", r, stages[r], actions[r])
		}
		overlap := false
		for _, g := range gathers[r] {
			for _, c := range gemm[r] {
				overlap = overlap || (g.a < c.b && c.a < g.b)
			}
		}
		if len(gathers[r]) == 0 {
			t.Errorf("rank %d: no all-gathers", r)
		}
		if overlap {
			overlapping++
		}
		t.Logf("rank %d: %d all-gathers, overlapping a GEMM: %v", r, len(gathers[r]), overlap)
		if bubbles[r] <= 0 {
			t.Errorf("rank %d: no pipeline bubble", r)
		}
	}
	// Clock alignment: rank r+2 (stage 1) receives microbatch mb from its
	// pipeline peer, rank r (stage 0, the same dp_shard coordinate; pp is
	// the mesh's outermost dimension), so it starts its forward after
	// rank r's ends.
	for r := 0; r < 2; r++ {
		for mb := 0; mb < 4; mb++ {
			s0, ok0 := firstF[[2]int{r, mb}]
			s1, ok1 := firstF[[2]int{r + 2, mb}]
			if !ok0 || !ok1 || s1.a < s0.b-1000 { // 1 ms of slack for the offsets' error
				t.Errorf("microbatch %d: rank %d (stage 1) starts its forward at %v µs, its peer rank %d ends it at %v µs", mb, r+2, s1.a, r, s0.b)
			}
		}
	}
	var sums []struct {
		Step, Rank                            int
		Total, Compute, Exposed, Bubble, Idle int64
	}
	raw, err = os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &sums); err != nil {
		t.Fatal(err)
	}
	if len(sums) != 8 {
		t.Fatalf("%d summary rows, want 2 steps × 4 ranks", len(sums))
	}
	for _, s := range sums {
		if s.Compute+s.Exposed+s.Bubble+s.Idle != s.Total || s.Compute <= 0 || s.Bubble <= 0 || s.Exposed <= 0 {
			t.Errorf("summary %+v", s)
		}
	}
	for _, f := range []string{"summary.txt", "timeline.svg", "timeline.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if svg, _ := os.ReadFile(filepath.Join(dir, "timeline.svg")); !strings.Contains(string(svg), "titan: profiled steps 3-4, 4 ranks") {
		t.Error("timeline.svg's title does not name the window's steps 3-4")
	}
	if !strings.Contains(out, "exposed comm ms") {
		t.Errorf("the log lacks the summary table:\n%s", out)
	}
}

// TestMemorySnapshot: profiling.enable_memory_snapshot on an FSDP2 job
// of 2 processes (profile_freq 2, 3 steps) writes, for step 2 only, each
// rank's snapshot into save_memory_snapshot_folder: its parameter,
// gradient and optimizer bytes (whose largest sum over the ranks is
// metrics.jsonl's state_gib), activations, the FSDP unit pool, the
// gathered units in use over the step (some, never more than the pool),
// communication in flight and resident memory, with an SVG chart.
func TestMemorySnapshot(t *testing.T) {
	dump := t.TempDir()
	args := append(set(tinyRun(dump, corpus(t), 3), "checkpoint.enable=false", "training.local_batch_size=1",
		"profiling.enable_memory_snapshot=true", "profiling.save_memory_snapshot_folder=mem", "profiling.profile_freq=2",
		"profiling.profiler_warmup=0", "parallelism.fsdp_reshard_after_forward=always"), "--nproc", "2")
	if out, err := titan(t, args...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dump, "mem", "iteration_1")); err == nil {
		t.Error("step 1 was snapshotted; profile_freq 2 asks for step 2")
	}
	if _, err := os.Stat(filepath.Join(dump, "mem", "iteration_3")); err == nil {
		t.Error("step 3 was snapshotted")
	}
	state := jsonlRecords(t, filepath.Join(dump, "metrics.jsonl"))[2]["state_gib"]
	var maxState float64
	for r := 0; r < 2; r++ {
		base := filepath.Join(dump, "mem", "iteration_2", fmt.Sprintf("rank%d_memory_snapshot", r))
		raw, err := os.ReadFile(base + ".json")
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Rank, Step int
			Static     struct {
				Parameters, Gradients, Activations int64
				Optimizer                          int64 `json:"optimizer_state"`
				Units                              int64 `json:"fsdp_unit_buffers"`
			}
			PeakRSS      int64 `json:"peak_rss"`
			PeakGathered int64 `json:"peak_gathered_units"`
			PeakComm     int64 `json:"peak_comm_buffers"`
			Samples      []struct {
				MS       float64
				Gathered int64 `json:"gathered_units"`
			}
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		st := s.Static
		maxState = math.Max(maxState, float64(st.Parameters+st.Gradients+st.Optimizer)/(1<<30))
		switch {
		case s.Rank != r || s.Step != 2:
			t.Errorf("rank %d: snapshot of rank %d step %d", r, s.Rank, s.Step)
		case st.Parameters <= 0 || st.Gradients != st.Parameters || st.Optimizer != 2*st.Parameters || st.Activations <= 0:
			t.Errorf("rank %d: static %+v", r, st)
		case s.PeakGathered <= 0 || s.PeakGathered > st.Units || s.PeakComm <= 0 || s.PeakRSS <= 0:
			t.Errorf("rank %d: peak gathered %d of a pool of %d, comm %d, rss %d", r, s.PeakGathered, st.Units, s.PeakComm, s.PeakRSS)
		case len(s.Samples) < 2:
			t.Errorf("rank %d: %d samples", r, len(s.Samples))
		}
		if st, err := os.Stat(base + ".svg"); err != nil || st.Size() == 0 {
			t.Errorf("rank %d: SVG %v", r, err)
		}
	}
	if maxState != state {
		t.Errorf("largest parameters+gradients+optimizer %v GiB, metrics.jsonl state_gib %v", maxState, state)
	}
}

// TestNearOutOfMemorySnapshot: a rank whose resident memory passes 90% of
// its budget writes a memory snapshot with its last samples and says so,
// once, while it still can (a rank killed for memory cannot). The budget
// is set below the run's need with the test hook.
func TestNearOutOfMemorySnapshot(t *testing.T) {
	dump := t.TempDir()
	t.Setenv("TITAN_TEST_MEMORY_BUDGET", "10000000")
	args := set(tinyRun(dump, corpus(t), 8), "checkpoint.enable=false",
		"profiling.enable_memory_snapshot=true", "profiling.save_memory_snapshot_folder=mem", "profiling.profile_freq=100")
	var stderr bytes.Buffer
	out, err := withStderr(&stderr, func() (string, error) { return titan(t, args...) })
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	files, _ := filepath.Glob(filepath.Join(dump, "mem", "iteration_*", "rank0_near_oom_memory_snapshot.json"))
	if len(files) != 1 {
		t.Fatalf("%d near-out-of-memory snapshots (%v), want 1\n%s", len(files), files, stderr.String())
	}
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Reason  string
		PeakRSS int64 `json:"peak_rss"`
		Samples []struct{ RSS int64 }
		Static  struct{ Parameters int64 }
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.Reason, "near out of memory") || len(s.Samples) == 0 || s.PeakRSS <= 9000000 || s.Static.Parameters == 0 {
		t.Errorf("snapshot: reason %q, %d samples, peak %d, parameters %d", s.Reason, len(s.Samples), s.PeakRSS, s.Static.Parameters)
	}
	if _, err := os.Stat(strings.TrimSuffix(files[0], ".json") + ".svg"); err != nil {
		t.Error(err)
	}
	if !strings.Contains(stderr.String(), "rank 0: warning: near out of memory at step") {
		t.Errorf("no warning on stderr:\n%s", stderr.String())
	}
}

// withStderr runs f with os.Stderr sent to w as well.
func withStderr(w *bytes.Buffer, f func() (string, error)) (string, error) {
	r, pw, err := os.Pipe()
	if err != nil {
		return "", err
	}
	orig := os.Stderr
	os.Stderr = pw
	done := make(chan struct{})
	go func() {
		io.Copy(io.MultiWriter(w, orig), r)
		close(done)
	}()
	out, ferr := f()
	os.Stderr = orig
	pw.Close()
	<-done
	return out, ferr
}
