package control

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// workerModeEnv selects a worker role when the test binary is re-executed
// as a child process (see TestMain).
const workerModeEnv = "TITANCONTROL_TEST_WORKER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(workerModeEnv); mode != "" {
		if err := runWorker(mode); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func envInt(name string) int {
	n, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		panic(fmt.Sprintf("%s=%q: %v", name, os.Getenv(name), err))
	}
	return n
}

// runWorker is the body of a child process. It reads its configuration from
// the launcher-to-worker variables of the distributed design.
func runWorker(mode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, DialConfig{
		Endpoint: os.Getenv("TITANRUN_ENDPOINT"),
		JobID:    os.Getenv("TITANRUN_JOB_ID"),
		Secret:   os.Getenv("TITANRUN_SECRET"),
		Timeout:  20 * time.Second,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	myAddr := fmt.Sprintf("pid-%d", os.Getpid())
	rank, world, err := c.Join(ctx, envInt("NODE_RANK"), envInt("LOCAL_RANK"), envInt("LOCAL_WORLD_SIZE"), myAddr)
	if err != nil {
		return err
	}
	c.StartHeartbeats(rank, 30*time.Millisecond)
	switch mode {
	case "rendezvous":
		// Exchange addresses through the store, as the data plane does.
		if err := c.Set(ctx, fmt.Sprintf("addr/%d", rank), []byte(myAddr)); err != nil {
			return err
		}
		var peers []string
		for r := range world {
			v, err := c.Get(ctx, fmt.Sprintf("addr/%d", r))
			if err != nil {
				return err
			}
			peers = append(peers, string(v))
		}
		if err := c.Barrier(ctx, "done", world); err != nil {
			return err
		}
		fmt.Printf("rank=%d world=%d peers=%s\n", rank, world, strings.Join(peers, ","))
		return c.ReportExit(ctx, rank, 0, "finished")
	case "hang":
		fmt.Println("ready")
		select {}
	}
	return fmt.Errorf("unknown worker mode %q", mode)
}

// workerCmd re-executes the test binary as a worker.
func workerCmd(mode, endpoint string, node, local, lws int) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(),
		workerModeEnv+"="+mode,
		"TITANRUN_ENDPOINT="+endpoint,
		"TITANRUN_JOB_ID="+testJob,
		"TITANRUN_SECRET="+testSecret,
		fmt.Sprintf("NODE_RANK=%d", node),
		fmt.Sprintf("LOCAL_RANK=%d", local),
		fmt.Sprintf("LOCAL_WORLD_SIZE=%d", lws),
	)
	return cmd
}

func TestProcessRendezvous(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	const nodes, perNode = 2, 2
	// The workers start before the server listens, as they often do.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	type proc struct {
		cmd         *exec.Cmd
		out, errs   bytes.Buffer
		node, local int
	}
	var procs []*proc
	for node := range nodes {
		for local := range perNode {
			p := &proc{cmd: workerCmd("rendezvous", addr, node, local, perNode), node: node, local: local}
			p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errs
			if err := p.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			procs = append(procs, p)
		}
	}
	s := startServer(t, ServerConfig{Addr: addr, WorldSize: nodes * perNode})

	pids := make([]string, nodes*perNode)
	for _, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("worker node %d local %d: %v\nstderr: %s", p.node, p.local, err, p.errs.String())
		}
		rank := p.node*perNode + p.local
		pids[rank] = fmt.Sprintf("pid-%d", p.cmd.Process.Pid)
	}
	for _, p := range procs {
		rank := p.node*perNode + p.local
		want := fmt.Sprintf("rank=%d world=%d peers=%s\n", rank, nodes*perNode, strings.Join(pids, ","))
		if got := p.out.String(); got != want {
			t.Errorf("worker node %d local %d printed %q, want %q", p.node, p.local, got, want)
		}
	}

	var joined, exited []int
	for len(exited) < nodes*perNode {
		e := nextEvent(t, s, 10*time.Second)
		switch e.Kind {
		case EventJoined:
			joined = append(joined, e.Rank)
		case EventExited:
			if e.Code != 0 || e.Reason != "finished" {
				t.Errorf("exit event %v", e)
			}
			exited = append(exited, e.Rank)
		default:
			t.Errorf("unexpected event %v", e)
		}
	}
	slices.Sort(joined)
	slices.Sort(exited)
	if want := []int{0, 1, 2, 3}; !slices.Equal(joined, want) || !slices.Equal(exited, want) {
		t.Errorf("joined %v, exited %v; want %v for both", joined, exited, want)
	}
}

func TestProcessKilledIsLost(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	const timeout = 300 * time.Millisecond
	s := startServer(t, ServerConfig{WorldSize: 1, HeartbeatTimeout: timeout})
	cmd := workerCmd("hang", s.Addr(), 0, 0, 1)
	var errs bytes.Buffer
	cmd.Stderr = &errs
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("worker said %q, %v; stderr: %s", line, err, errs.String())
	}
	if e := nextEvent(t, s, 5*time.Second); e.Kind != EventJoined {
		t.Fatalf("event %v, want joined", e)
	}
	// Monitoring starts with the first heartbeat.
	waitFor(t, "the worker's first heartbeat", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.lastBeat) == 1
	})
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	e := nextEvent(t, s, 10*timeout)
	if e.Kind != EventLost || e.Rank != 0 {
		t.Fatalf("event %v, want rank 0 lost", e)
	}
	t.Logf("kill -9 detected after %v (timeout %v): %v", time.Since(killed).Round(time.Millisecond), timeout, e)
}
