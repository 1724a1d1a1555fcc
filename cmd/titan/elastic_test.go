//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/runstore"
	"github.com/titan-go/titan/internal/testenv"
)

// The elastic runs train the tiny model for elasticSteps steps with a
// global batch of 8 sequences (local_batch_size 2): 1 micro-batch per step
// on 4 workers, 2 accumulated micro-batches on 2, so that the loss curve
// is the recipe's whatever the world size. A checkpoint every 4 steps.
const elasticSteps = 16

func elasticRun(dump, data string) []string {
	return set(tinyRun(dump, data, elasticSteps), "training.global_batch_size=8", "checkpoint.interval=4",
		"lr_scheduler.total_steps="+strconv.Itoa(elasticSteps))
}

// syncBuf is a goroutine-safe output buffer.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if os.Getenv("TITANTEST_ELASTIC_TRACE") != "" { // stream the output, timed
		fmt.Fprintf(os.Stderr, "%s %s", time.Now().Format("05.000"), p)
	}
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a titan process under test (the test binary standing in).
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuf
	done chan error
}

func startTitan(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	exe, _ := os.Executable()
	p := &proc{cmd: exec.Command(exe, args...), out: &syncBuf{}, done: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Env = append(append(os.Environ(), "TITANTEST_RUN_MAIN=1"), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
	})
	return p
}

// await waits until the output matches re (after offset from), returning
// the submatches and the end offset of the match.
func (p *proc) await(t *testing.T, re string, from int) ([]string, int) {
	t.Helper()
	rx := regexp.MustCompile(re)
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		out := p.out.String()
		if from > len(out) {
			from = len(out)
		}
		if loc := rx.FindStringSubmatchIndex(out[from:]); loc != nil {
			var subs []string
			for i := 0; i < len(loc); i += 2 {
				subs = append(subs, out[from+loc[i]:from+loc[i+1]])
			}
			return subs, from + loc[1]
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("titan ended (%v) before printing %q:\n%s", err, re, out)
		default:
		}
	}
	t.Fatalf("timed out waiting for %q:\n%s", re, p.out)
	return nil, 0
}

// wait waits for the process to exit 0.
func (p *proc) wait(t *testing.T, what string) {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- nil
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, p.out)
		}
	case <-time.After(120 * time.Second):
		t.Fatalf("%s did not finish:\n%s", what, p.out)
	}
}

// referenceLosses caches the uninterrupted runs by world size.
var referenceLosses sync.Map

// uninterrupted returns the losses of an uninterrupted elastic recipe run
// on nproc workers.
func uninterrupted(t *testing.T, data string, nproc int) map[int]string {
	t.Helper()
	if v, ok := referenceLosses.Load(nproc); ok {
		return v.(map[int]string)
	}
	dump := t.TempDir()
	p := startTitan(t, nil, append(elasticRun(dump, data), "--nproc", strconv.Itoa(nproc))...)
	p.wait(t, fmt.Sprintf("uninterrupted run on %d workers", nproc))
	l := losses(t, dump)
	referenceLosses.Store(nproc, l)
	return l
}

// pidsOf reads the worker pids of a round notice.
func pidsOf(s string) []int {
	var pids []int
	for _, f := range strings.Fields(s) {
		n, _ := strconv.Atoi(f)
		pids = append(pids, n)
	}
	return pids
}

const roundNotice = `titanrun: round (\d+): node rank (\d+) of (\d+), world size (\d+), ranks \d+\.\.\d+ \(pids \[([\d ]+)\]\)`

// roundOfWorld matches the notice of a round of the given world size.
func roundOfWorld(world int) string {
	return strings.Replace(roundNotice, `world size (\d+)`, fmt.Sprintf(`world size (%d)`, world), 1)
}

// TestKilledWorkerRestartsBitwise: kill -9 of one worker of 2 and of 4 in
// the middle of a run with --max-restarts 1: the launcher says why and
// restarts every worker from the latest checkpoint, the run finishes, and
// its losses equal an uninterrupted run's bit for bit at every step.
func TestKilledWorkerRestartsBitwise(t *testing.T) {
	data := corpus(t)
	for _, nproc := range []int{2, 4} {
		t.Run(fmt.Sprintf("nproc%d", nproc), func(t *testing.T) {
			ref := uninterrupted(t, data, nproc)
			dump := t.TempDir()
			db := filepath.Join(t.TempDir(), "runs.db")
			p := startTitan(t, nil, append(set(elasticRun(dump, data), "metrics.db="+db), "--nproc", strconv.Itoa(nproc), "--max-restarts", "1")...)
			m, off := p.await(t, roundNotice, 0)
			victim := pidsOf(m[5])[1]
			p.await(t, `\[rank 0\] step +6 `, off)
			if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			p.wait(t, "the interrupted run")
			out := p.out.String()
			want := fmt.Sprintf("worker rank 1 (pid %d) was killed by signal 9 (killed); restart 1 of 1 from the latest checkpoint", victim)
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q", want)
			}
			if !regexp.MustCompile(`\[rank 0\] titan: resumed from \S+step-(4|8|12)`).MatchString(out) {
				t.Errorf("the restarted workers did not resume from a checkpoint")
			}
			checkRounds(t, db)
			got := losses(t, dump)
			same := 0
			for step := 1; step <= elasticSteps; step++ {
				if ref[step] == "" || got[step] != ref[step] {
					t.Errorf("step %d: loss %s uninterrupted, %s with a restart", step, ref[step], got[step])
				} else {
					same++
				}
			}
			t.Logf("worker pid %d killed; %d of %d losses bitwise equal to the uninterrupted run's", victim, same, elasticSteps)
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}

// checkRounds: the run store holds the two rounds of a restarted job as
// the lineage of its dump folder: the round whose worker was killed
// ended without finishing, the restarted one finished.
func checkRounds(t *testing.T, db string) {
	t.Helper()
	s, err := runstore.OpenExisting(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	runs, err := s.List(context.Background(), 0)
	if err != nil || len(runs) != 2 {
		t.Fatalf("run store: %d runs, %v; want the 2 rounds", len(runs), err)
	}
	lin, err := s.Lineage(context.Background(), runs[0].ID)
	if err != nil || len(lin) != 2 || lin[0].Status == runstore.Finished || lin[1].Status != runstore.Finished ||
		lin[1].FirstStep <= 1 || lin[1].LastStep != elasticSteps {
		t.Errorf("lineage of the restarted job: %v %+v; want a round that did not finish, then one that trained from its checkpoint to step %d", err, lin, elasticSteps)
		return
	}
	t.Logf("run store: round 1 %s at step %d (%s), round 2 %s, steps %d-%d", lin[0].Status, lin[0].LastStep, lin[0].Error, lin[1].Status, lin[1].FirstStep, lin[1].LastStep)
}

// closeTo checks losses within 1e-5 relative at every step.
func closeTo(t *testing.T, ref, got map[int]string, what string) {
	t.Helper()
	worst := 0.0
	for step := 1; step <= elasticSteps; step++ {
		x, err1 := json.Number(ref[step]).Float64()
		y, err2 := json.Number(got[step]).Float64()
		if err1 != nil || err2 != nil || math.Abs(x-y) > 1e-5*math.Abs(x) {
			t.Errorf("step %d: loss %s uninterrupted on 4 workers, %s %s", step, ref[step], got[step], what)
		}
		worst = max(worst, math.Abs(x-y)/math.Abs(x))
	}
	t.Logf("%d steps %s: largest relative loss difference to the uninterrupted run %.2g", elasticSteps, what, worst)
}

// shrinkAndGrow runs two launchers of 2 workers each with --nnodes 1:2 on
// this machine: once both train (world 4), the launcher of node `victim`
// is killed; the other goes on alone (world 2) from the latest
// checkpoint; the killed one is started again and both go on (world 4)
// to the end. The loss curve continues the uninterrupted one's within
// 1e-5 relative.
func shrinkAndGrow(t *testing.T, data string, victim int, rdzv ...string) {
	ref := uninterrupted(t, data, 4)
	dump := t.TempDir()
	env := []string{"TITANRUN_SECRET=elastic-test-secret"}
	node := func(rank int) *proc {
		args := append(elasticRun(dump, data), "--nproc", "2", "--nnodes", "1:2", "--node-rank", strconv.Itoa(rank), "--max-restarts", "1",
			"--rdzv-conf", "last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=4")
		return startTitan(t, env, append(args, rdzv...)...)
	}
	nodes := []*proc{node(0), nil}
	nodes[0].await(t, `rendezvous of job`, 0)
	nodes[1] = node(1)
	survivor := nodes[1-victim]
	// Both nodes train (if node 1 came after round 0 closed, in round 1).
	_, off := survivor.await(t, roundOfWorld(4), 0)
	_, off0 := nodes[0].await(t, roundOfWorld(4), 0)
	nodes[0].await(t, `\[rank 0\] step +5 `, off0)
	nodes[victim].cmd.Process.Kill()
	_, off = survivor.await(t, roundOfWorld(2), off)
	// Let the shrunk world (whose rank 0 is the survivor's) train a few
	// steps past its resume point.
	resumed, off := survivor.await(t, `titan: resumed from \S+step-(\d+)`, off)
	from, _ := strconv.Atoi(resumed[1])
	_, off = survivor.await(t, fmt.Sprintf(`\[rank 0\] step +%d `, from+3), off)
	nodes[victim] = node(victim)
	survivor.await(t, roundOfWorld(4), off)
	for i, p := range nodes {
		p.wait(t, fmt.Sprintf("node %d", i))
	}
	out := survivor.out.String()
	for _, want := range []string{"restart 1 of 1 from the latest checkpoint", "waits to join (1 of at most 2 nodes run); new rendezvous round"} {
		if !strings.Contains(out, want) {
			t.Errorf("survivor's output lacks %q", want)
		}
	}
	closeTo(t, ref, losses(t, dump), "shrunk to 2 workers and grown back to 4")
	if t.Failed() {
		t.Logf("survivor:\n%s\nrestarted node:\n%s", out, nodes[victim].out)
	}
}

// freeEndpoint returns a loopback host:port that was free a moment ago.
func freeEndpoint(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestElasticShrinkAndGrowC10d: the c10d rendezvous (hosted by node 0's
// launcher); node 1's launcher is killed and started again.
func TestElasticShrinkAndGrowC10d(t *testing.T) {
	shrinkAndGrow(t, corpus(t), 1, "--rdzv-endpoint", freeEndpoint(t))
}

// TestElasticShrinkAndGrowEtcd: the etcd rendezvous; the launcher of the
// first node (which hosts the control server) is killed and started again.
func TestElasticShrinkAndGrowEtcd(t *testing.T) {
	e := testenv.EtcdServer(t)
	shrinkAndGrow(t, corpus(t), 0, "--rdzv-backend", "etcd", "--rdzv-endpoint", e.Endpoint)
}
