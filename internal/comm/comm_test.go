package comm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Multi-process tests run the test binary itself as N children; TestMain
// sends a child (COMMTEST_SCENARIO set) to its scenario.

func TestMain(m *testing.M) {
	if sc := os.Getenv("COMMTEST_SCENARIO"); sc != "" {
		os.Exit(childMain(sc))
	}
	os.Exit(m.Run())
}

type childEnv struct {
	rank, size int
	transport  string
	dir        string
	store      Store
}

// scenarios run in child processes. They print "OK ..." or "ERR ..." lines
// the parent checks, and return an error to fail the child.
var scenarios = map[string]func(ctx context.Context, e childEnv) error{
	"battery":  scenarioBattery,
	"mesh":     scenarioMesh,
	"hang":     scenarioHang,
	"kill":     scenarioKill,
	"mismatch": scenarioMismatch,
	"bench":    scenarioBench,
}

func childMain(name string) int {
	rank, _ := strconv.Atoi(os.Getenv("COMMTEST_RANK"))
	size, _ := strconv.Atoi(os.Getenv("COMMTEST_SIZE"))
	dir := os.Getenv("COMMTEST_DIR")
	store, err := NewFileStore(filepath.Join(dir, "store"))
	if err == nil {
		f := scenarios[name]
		if f == nil {
			err = fmt.Errorf("unknown scenario %q", name)
		} else {
			err = f(context.Background(), childEnv{rank: rank, size: size, transport: os.Getenv("COMMTEST_TRANSPORT"), dir: dir, store: store})
		}
	}
	if err != nil {
		fmt.Printf("FAIL rank %d: %v\n", rank, err)
		return 1
	}
	return 0
}

type childResult struct {
	rank   int
	pid    int
	out    string
	err    error // from Wait: exit status
	signal syscall.Signal
}

// spawn runs scenario in n child processes and returns their results.
func spawn(t testing.TB, scenario string, n int, transport string, env ...string) (string, []childResult) {
	t.Helper()
	dir := t.TempDir()
	cmds := make([]*exec.Cmd, n)
	outs := make([]*strings.Builder, n)
	for r := range n {
		c := exec.Command(os.Args[0], "-test.run=^$")
		c.Env = append(os.Environ(),
			"COMMTEST_SCENARIO="+scenario, "COMMTEST_RANK="+strconv.Itoa(r), "COMMTEST_SIZE="+strconv.Itoa(n),
			"COMMTEST_DIR="+dir, "COMMTEST_TRANSPORT="+transport)
		c.Env = append(c.Env, env...)
		outs[r] = &strings.Builder{}
		c.Stdout, c.Stderr = outs[r], outs[r]
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = c
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			for _, c := range cmds {
				c.Process.Kill()
			}
		}
	}()
	res := make([]childResult, n)
	for r, c := range cmds {
		err := c.Wait()
		res[r] = childResult{rank: r, pid: c.Process.Pid, err: err}
		if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res[r].signal = ws.Signal()
		}
	}
	close(done)
	for r := range res {
		res[r].out = outs[r].String()
	}
	return dir, res
}

func requireOK(t testing.TB, res []childResult) {
	t.Helper()
	checkNoShmLeft(t, res)
	for _, r := range res {
		if r.err != nil {
			t.Errorf("rank %d: %v\n%s", r.rank, r.err, r.out)
		}
	}
}

// testOpts are small pipelining sizes, so that small buffers span several
// segments and shared-memory rounds.
func testOpts(transport string) Options {
	return Options{Transport: transport, Timeout: 30 * time.Second, SegmentBytes: 1024, ShmSlotBytes: 4096}
}

var batterySizes = []int{0, 1, 2, 3, 7, 1001, 3 * 1024}

func scenarioBattery(ctx context.Context, e childEnv) error {
	g, err := NewWorld(ctx, e.store, e.rank, e.size, testOpts(e.transport))
	if err != nil {
		return err
	}
	defer g.Close()
	if g.Transport() != e.transport {
		return fmt.Errorf("transport %s, want %s", g.Transport(), e.transport)
	}
	if err := battery(ctx, g, batterySizes); err != nil {
		return err
	}
	// One moderate size, with the default pipelining sizes.
	g2, err := NewWorld(ctx, e.store, e.rank, e.size, Options{Transport: e.transport, Timeout: 30 * time.Second, StorePrefix: "big"})
	if err != nil {
		return err
	}
	defer g2.Close()
	const N = 3<<20 + 5
	ins := make([]tbuf, e.size)
	for r := range e.size {
		ins[r] = input(Float32, Sum, 4242, r, N, 0)
	}
	x := input(Float32, Sum, 4242, e.rank, N, 0)
	if err := g2.AllReduce(ctx, x.buf(), Sum); err != nil {
		return err
	}
	return checkEqual("moderate allreduce", x, refFold(Sum, ins))
}

func TestMultiProcessCollectives(t *testing.T) {
	for _, transport := range []string{"tcp", "shm"} {
		for _, n := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("%s/%dproc", transport, n), func(t *testing.T) {
				_, res := spawn(t, "battery", n, transport)
				requireOK(t, res)
			})
		}
	}
}

func scenarioMesh(ctx context.Context, e childEnv) error {
	g, err := NewWorld(ctx, e.store, e.rank, e.size, testOpts(e.transport))
	if err != nil {
		return err
	}
	defer g.Close()
	return meshTest(ctx, g)
}

func TestMultiProcessMesh(t *testing.T) {
	for _, transport := range []string{"tcp", "shm"} {
		t.Run(transport, func(t *testing.T) {
			_, res := spawn(t, "mesh", 4, transport)
			requireOK(t, res)
		})
	}
}

// scenarioHang: the last rank never enters the second allreduce. The others
// must time out naming it, and the flight recorder must show it.
func scenarioHang(ctx context.Context, e childEnv) error {
	opts := testOpts(e.transport)
	opts.Timeout = 1500 * time.Millisecond
	opts.TraceDir = filepath.Join(e.dir, "trace")
	g, err := NewWorld(ctx, e.store, e.rank, e.size, opts)
	if err != nil {
		return err
	}
	defer g.Close()
	x := make([]float32, 1000)
	if err := g.AllReduce(ctx, F32(x), Sum); err != nil {
		return err
	}
	hung := e.size - 1
	if e.rank == hung {
		// Busy elsewhere until the others gave up; then the group is
		// aborted.
		time.Sleep(4 * time.Second)
		err := g.AllReduce(ctx, F32(x), Sum)
		if !errors.Is(err, ErrAborted) {
			return fmt.Errorf("late allreduce on the aborted group: %v, want ErrAborted", err)
		}
		fmt.Printf("ERR %v\n", err)
		return nil
	}
	err = g.AllReduce(ctx, F32(x), Sum)
	var ce *Error
	if !errors.As(err, &ce) {
		return fmt.Errorf("allreduce with a hung peer: %v, want *Error", err)
	}
	fmt.Printf("ERR %v\n", err)
	if !ce.Timeout && !errors.Is(err, ErrAborted) {
		return fmt.Errorf("error is neither a timeout nor an abort: %v", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("waiting for rank %d", hung)) {
		return fmt.Errorf("error does not name rank %d: %v", hung, err)
	}
	if ce.Timeout && (len(ce.Peers) != 1 || ce.Peers[0] != hung || !strings.Contains(err.Error(), "never entered allreduce #2")) {
		return fmt.Errorf("timeout blames %v: %v", ce.Peers, err)
	}
	// Later operations fail at once.
	if err := g.Barrier(ctx); !errors.Is(err, ErrAborted) {
		return fmt.Errorf("barrier after the timeout: %v, want ErrAborted", err)
	}
	return nil
}

func TestMultiProcessHangNamesRank(t *testing.T) {
	for _, transport := range []string{"tcp", "shm"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel() // mostly sleeping
			dir, res := spawn(t, "hang", 3, transport)
			requireOK(t, res)
			for _, r := range res[:2] {
				t.Logf("rank %d: %s", r.rank, strings.TrimSpace(r.out))
			}
			rep, err := AnalyzeFlight(filepath.Join(dir, "trace"))
			if err != nil {
				t.Fatal(err)
			}
			t.Log(rep.Summary)
			if len(rep.Ranks) != 3 {
				t.Errorf("dumps from ranks %v, want all three", rep.Ranks)
			}
			if len(rep.Stalls) != 1 {
				t.Fatalf("stalls %+v, want one", rep.Stalls)
			}
			s := rep.Stalls[0]
			if s.Seq != 2 || s.Op != "allreduce" || fmt.Sprint(s.Missing) != "[2]" || fmt.Sprint(s.Waiting) != "[0 1]" {
				t.Errorf("stall %+v, want allreduce #2 waited on by [0 1], missing [2]", s)
			}
			if !strings.Contains(rep.Summary, "never entered by rank 2") {
				t.Errorf("summary does not name rank 2:\n%s", rep.Summary)
			}
		})
	}
}

// scenarioKill: the last rank kills itself (SIGKILL) instead of entering
// the second allreduce. The others must fail quickly, naming it, well
// before the (long) timeout.
//
// The victim dies only once every survivor has finished the first
// allreduce, as the survivors tell it through the store. An allreduce
// returning on one rank does not mean it has finished on the others: the
// victim's last chunks may still be in flight to a survivor when the
// victim's own allreduce returns, and a survivor that sees the victim's
// control connection close then fails allreduce #1 (rightly, naming the
// dead rank). Without this handshake the test would sometimes kill the
// victim during the first allreduce rather than before the second.
func scenarioKill(ctx context.Context, e childEnv) error {
	opts := testOpts(e.transport)
	opts.Timeout = 60 * time.Second
	g, err := NewWorld(ctx, e.store, e.rank, e.size, opts)
	if err != nil {
		return err
	}
	defer g.Close()
	x := make([]float32, 100000)
	if err := g.AllReduce(ctx, F32(x), Sum); err != nil {
		return err
	}
	victim := e.size - 1
	doneKey := func(r int) string { return fmt.Sprintf("kill/allreduce1-done/%d", r) }
	if e.rank == victim {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for r := range victim {
			if _, err := e.store.Get(wctx, doneKey(r)); err != nil {
				return fmt.Errorf("waiting for rank %d to finish allreduce #1: %w", r, err)
			}
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	if err := e.store.Set(ctx, doneKey(e.rank), nil); err != nil {
		return err
	}
	start := time.Now()
	err = g.AllReduce(ctx, F32(x), Sum)
	took := time.Since(start)
	fmt.Printf("ERR after %v: %v\n", took.Round(time.Millisecond), err)
	var ce *Error
	if !errors.As(err, &ce) || ce.Timeout {
		return fmt.Errorf("allreduce with a dead peer: %v, want a non-timeout *Error", err)
	}
	if ce.Op != "allreduce" || ce.Seq != 2 {
		return fmt.Errorf("error is about %s #%d, want allreduce #2: %v", ce.Op, ce.Seq, err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("rank %d died", victim)) {
		return fmt.Errorf("error does not say rank %d died: %v", victim, err)
	}
	return nil
}

func TestMultiProcessKilledPeer(t *testing.T) {
	for _, transport := range []string{"tcp", "shm"} {
		t.Run(transport, func(t *testing.T) {
			_, res := spawn(t, "kill", 3, transport)
			if res[2].signal != syscall.SIGKILL {
				t.Errorf("victim: %v, want killed\n%s", res[2].err, res[2].out)
			}
			checkNoShmLeft(t, res)
			requireOK(t, res[:2])
			for _, r := range res[:2] {
				t.Logf("rank %d: %s", r.rank, strings.TrimSpace(r.out))
			}
		})
	}
}

// scenarioMismatch: ranks issue different collectives; all must fail with
// an error that says so, none may hang.
func scenarioMismatch(ctx context.Context, e childEnv) error {
	opts := testOpts(e.transport)
	opts.Timeout = 20 * time.Second
	g, err := NewWorld(ctx, e.store, e.rank, e.size, opts)
	if err != nil {
		return err
	}
	defer g.Close()
	x := make([]float32, 10)
	if e.rank == 0 {
		err = g.AllReduce(ctx, F32(x), Sum)
	} else {
		err = g.Broadcast(ctx, F32(x), 0)
	}
	fmt.Printf("ERR %v\n", err)
	if err == nil || !strings.Contains(err.Error(), "issued") {
		return fmt.Errorf("mismatched collectives: %v, want an error naming both", err)
	}
	opts.StorePrefix = "second"
	g2, err := NewWorld(ctx, e.store, e.rank, e.size, opts)
	if err != nil {
		return err
	}
	defer g2.Close()
	err = g2.AllReduce(ctx, F32(make([]float32, 10+e.rank)), Sum)
	fmt.Printf("ERR %v\n", err)
	if err == nil || !strings.Contains(err.Error(), "elements") {
		return fmt.Errorf("allreduce of different sizes: %v, want an error", err)
	}
	return nil
}

func TestMultiProcessMismatch(t *testing.T) {
	for _, transport := range []string{"tcp", "shm"} {
		t.Run(transport, func(t *testing.T) {
			_, res := spawn(t, "mismatch", 2, transport)
			requireOK(t, res)
			t.Logf("%s", res[0].out)
		})
	}
}

// runInProc runs f on n ranks that are goroutines of this process.
func runInProc(t *testing.T, n int, opts Options, f func(g Group) error) {
	t.Helper()
	st := NewMemStore()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := NewWorld(context.Background(), st, r, n, opts)
			if err != nil {
				errs[r] = err
				return
			}
			defer g.Close()
			errs[r] = f(g)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestInProcess runs the battery with ranks as goroutines (fast, and
// covered by the race detector), including groups of one.
func TestInProcess(t *testing.T) {
	for _, transport := range []string{"tcp", "shm"} {
		for _, n := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/%d", transport, n), func(t *testing.T) {
				runInProc(t, n, testOpts(transport), func(g Group) error {
					return battery(context.Background(), g, []int{0, 5, 1001})
				})
			})
		}
	}
}

func TestInProcessMesh(t *testing.T) {
	runInProc(t, 4, testOpts("auto"), func(g Group) error { return meshTest(context.Background(), g) })
}

func TestPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	_, err = NewWorld(context.Background(), NewMemStore(), 0, 1, Options{Addr: addr})
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("NewWorld on a used port: %v, want an error naming %s", err, addr)
	}
}

func TestArgumentErrors(t *testing.T) {
	runInProc(t, 2, testOpts("tcp"), func(g Group) error {
		ctx := context.Background()
		x := make([]float32, 10)
		cases := []struct {
			name string
			err  error
			want string
		}{
			{"rs recv length", g.ReduceScatter(ctx, F32(x), F32(make([]float32, 4)), Sum), "want 5"},
			{"rs dtype", g.ReduceScatter(ctx, F32(x), F64(make([]float64, 5)), Sum), "float64"},
			{"ag send length", g.AllGather(ctx, F32(make([]float32, 3)), F32(x)), "want 5"},
			{"root", g.Broadcast(ctx, F32(x), 2), "root 2"},
			{"send self", g.Send(ctx, F32(x), g.Rank()), "peer"},
			{"avg int", g.AllReduce(ctx, I32(make([]int32, 3)), Avg), "avg"},
			{"a2a counts", g.AllToAll(ctx, F32(x), F32(make([]float32, 10)), []int{1, 2}, nil), "add up"},
			{"a2a overlap", g.AllToAll(ctx, F32(x), F32(x), nil, nil), "overlap"},
			{"rs overlap", g.ReduceScatter(ctx, F32(x), F32(x[2:7]), Sum), "overlaps"},
		}
		for _, c := range cases {
			if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
				return fmt.Errorf("%s: %v, want an error containing %q", c.name, c.err, c.want)
			}
		}
		if _, err := g.NewGroup(ctx, []int{1 - g.Rank()}, "other"); err == nil {
			return errors.New("NewGroup without this rank succeeded")
		}
		// Argument errors are local: the group still works.
		return g.AllReduce(ctx, F32(x), Sum)
	})
}

func TestClosedGroup(t *testing.T) {
	runInProc(t, 2, testOpts("auto"), func(g Group) error {
		if err := g.Close(); err != nil {
			return err
		}
		if err := g.Barrier(context.Background()); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("barrier on a closed group: %v", err)
		}
		if err := g.Send(context.Background(), F32(nil), 1-g.Rank()); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("send on a closed group: %v", err)
		}
		return nil
	})
}

func TestCancelAborts(t *testing.T) {
	runInProc(t, 2, testOpts("tcp"), func(g Group) error {
		ctx, cancel := context.WithCancel(context.Background())
		if g.Rank() == 0 {
			cancel()
		} else {
			defer cancel()
		}
		err := g.AllReduce(ctx, F32(make([]float32, 10)), Sum)
		if !errors.Is(err, ErrAborted) && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("allreduce after cancel: %v", err)
		}
		return nil
	})
}

func TestSignalDump(t *testing.T) {
	dir := t.TempDir()
	stop := InstallFlightDumpOnSignal(dir)
	defer stop()
	runInProc(t, 2, testOpts("auto"), func(g Group) error {
		ctx := context.Background()
		if err := g.AllReduce(ctx, F32(make([]float32, 8)), Sum); err != nil {
			return err
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		if g.Rank() == 0 {
			syscall.Kill(os.Getpid(), syscall.SIGUSR1)
		}
		name := filepath.Join(dir, fmt.Sprintf("flight-rank%d.json", g.Rank()))
		for range 200 {
			if _, err := os.Stat(name); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		return g.Barrier(ctx)
	})
	rep, err := AnalyzeFlight(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(rep.Ranks) != "[0 1]" {
		t.Errorf("report %+v, want dumps of ranks 0 and 1", rep)
	}
	// A dump may catch a rank inside the barrier, but no rank missed one.
	for _, s := range rep.Stalls {
		if len(s.Missing) > 0 {
			t.Errorf("stall %+v, want none missing", s)
		}
	}
}

func scenarioBench(ctx context.Context, e childEnv) error {
	g, err := NewWorld(ctx, e.store, e.rank, e.size, Options{Transport: e.transport, Timeout: 100 * time.Second})
	if err != nil {
		return err
	}
	defer g.Close()
	iters, _ := strconv.Atoi(os.Getenv("COMMTEST_ITERS"))
	size, _ := strconv.Atoi(os.Getenv("COMMTEST_BYTES"))
	res, err := BenchCollective(ctx, g, os.Getenv("COMMTEST_OP"), size, max(iters, 1), 3)
	if err != nil {
		return err
	}
	if e.rank == 0 {
		b, _ := json.Marshal(res)
		fmt.Printf("RESULT %s\n", b)
	}
	return nil
}

// BenchmarkAllReduce64MiB measures a float32 all-reduce of 64 MiB with 2
// and 4 local processes on both transports; b.N sets the timed iterations
// (use -benchtime=20x). It reports nccl-tests' bandwidths.
func BenchmarkAllReduce64MiB(b *testing.B) {
	benchCollective(b, "allreduce", 64<<20)
}

func benchCollective(b *testing.B, op string, size int) {
	for _, transport := range []string{"tcp", "shm"} {
		for _, n := range []int{2, 4} {
			b.Run(fmt.Sprintf("%s/%dproc", transport, n), func(b *testing.B) {
				_, res := spawn(b, "bench", n, transport, "COMMTEST_OP="+op,
					"COMMTEST_BYTES="+strconv.Itoa(size), "COMMTEST_ITERS="+strconv.Itoa(b.N))
				requireOK(b, res)
				_, line, ok := strings.Cut(res[0].out, "RESULT ")
				var r BenchResult
				if !ok || json.Unmarshal([]byte(strings.TrimSpace(line)), &r) != nil {
					b.Fatalf("no result in %q", res[0].out)
				}
				b.ReportMetric(r.TimeS*1e3, "ms/op")
				b.ReportMetric(r.AlgBW, "algbw_GB/s")
				b.ReportMetric(r.BusBW, "busbw_GB/s")
			})
		}
	}
}

// checkNoShmLeft fails if a shared-memory segment of the children is left
// in /dev/shm.
func checkNoShmLeft(t testing.TB, res []childResult) {
	t.Helper()
	for _, r := range res {
		left, _ := filepath.Glob(fmt.Sprintf("/dev/shm/titan-comm-%d-*", r.pid))
		if len(left) > 0 {
			t.Errorf("rank %d left shared memory behind: %v", r.rank, left)
		}
	}
}
