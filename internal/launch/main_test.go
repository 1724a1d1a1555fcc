//go:build unix

package launch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a fake worker: Launch re-executes it
// (os.Executable) and TestMain, seeing fakeWorkerEnv, runs the action that
// the variable assigns to the worker's rank instead of the tests.
//
// fakeWorkerEnv holds "rank:action" pairs separated by ";", with rank "*"
// for every rank not named. Actions:
//
//	exit=N    print a greeting, exit with status N
//	kill      wait until every other rank is ready, then SIGKILL itself
//	hang      say ready, sleep until a signal ends the process
//	stubborn  ignore SIGTERM and SIGINT, say ready, sleep forever
//	trap      say ready; on SIGINT or SIGTERM print "got <signal>", exit 0
//	lines     print numbered lines to stdout and stderr, the last unterminated
//	env       print Detect's view of the worker environment and the arguments
//	allreduce Join the job, all-reduce the ranks, print the result
//
// "Ready" means printing "ready" and writing the process id to ready.<rank>
// in fakeDirEnv.
const (
	fakeWorkerEnv = "LAUNCHTEST_WORKER"
	fakeDirEnv    = "LAUNCHTEST_DIR"
)

func TestMain(m *testing.M) {
	if n := os.Getenv(fakeLauncherEnv); n != "" && os.Getenv(EnvEndpoint) == "" {
		os.Exit(fakeLauncher(n))
	}
	if spec := os.Getenv(fakeWorkerEnv); spec != "" {
		os.Exit(fakeWorker(spec))
	}
	os.Exit(m.Run())
}

// fakeLauncherEnv makes the test binary a launcher of that many workers.
const fakeLauncherEnv = "LAUNCHTEST_LAUNCHER"

func fakeLauncher(n string) int {
	nproc, _ := strconv.Atoi(n)
	spec, err := Detect(nil, Flags{NProc: nproc})
	if err == nil {
		err = Launch(context.Background(), spec, nil, os.Stdout)
	}
	if err != nil {
		fmt.Println("launcher:", err)
		return 1
	}
	return 0
}

// fakeRank is the worker's rank: RANK, or SLURM_PROCID under srun.
func fakeRank() int {
	for _, k := range []string{"RANK", "SLURM_PROCID"} {
		if r, err := strconv.Atoi(os.Getenv(k)); err == nil {
			return r
		}
	}
	return -1
}

func fakeWorker(spec string) int {
	rank := fakeRank()
	action := ""
	for _, pair := range strings.Split(spec, ";") {
		r, a, _ := strings.Cut(pair, ":")
		if r == strconv.Itoa(rank) || (r == "*" && action == "") {
			action = a
		}
	}
	dir := os.Getenv(fakeDirEnv)
	ready := func() {
		fmt.Println("ready")
		if dir != "" {
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("ready.%d", rank)), []byte(strconv.Itoa(os.Getpid())), 0o644)
		}
	}
	switch {
	case strings.HasPrefix(action, "exit="):
		code, _ := strconv.Atoi(strings.TrimPrefix(action, "exit="))
		fmt.Printf("hello from rank %d\n", rank)
		return code
	case action == "kill":
		awaitPeers(dir)
		fmt.Println("killing myself")
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case action == "dying":
		// As "kill", but first says so (the file "dying") and takes
		// 300 ms to die: a peer's consequent failure reaches the launcher
		// first (see "exitwhendying").
		awaitPeers(dir)
		os.WriteFile(filepath.Join(dir, "dying"), nil, 0o644)
		time.Sleep(300 * time.Millisecond)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case strings.HasPrefix(action, "exitwhendying="):
		code, _ := strconv.Atoi(strings.TrimPrefix(action, "exitwhendying="))
		ready()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, "dying")); err == nil {
				break
			}
		}
		fmt.Println("my peer is gone")
		return code
	case action == "hang":
		ready()
		select {}
	case action == "stubborn":
		signal.Ignore(syscall.SIGTERM, syscall.SIGINT)
		ready()
		select {}
	case action == "trap":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		ready()
		fmt.Printf("got %v\n", <-c)
		return 0
	case action == "lines":
		for i := range 3 {
			fmt.Fprintf(os.Stdout, "out %d of rank %d\n", i, rank)
			fmt.Fprintf(os.Stderr, "err %d of rank %d\n", i, rank)
		}
		fmt.Fprintf(os.Stdout, "partial line of rank %d", rank)
		return 0
	case action == "env":
		spec, err := Detect(os.Environ(), Flags{NProc: 99})
		if err != nil {
			fmt.Println("detect error:", err)
			return 1
		}
		fmt.Printf("mode=%v source=%s rank=%d local=%d world=%d localworld=%d node=%d nnodes=%d threads=%d gomaxprocs=%s endpoint_set=%v secret_len=%d job=%s args=%q\n",
			spec.Mode, spec.Source, spec.Rank, spec.LocalRank, spec.WorldSize, spec.LocalWorldSize, spec.NodeRank, spec.NNodes,
			spec.Threads, os.Getenv("GOMAXPROCS"), spec.Endpoint != "", len(spec.Secret), spec.JobID, os.Args[1:])
		return 0
	case action == "allreduce":
		return fakeAllReduce()
	}
	fmt.Fprintf(os.Stderr, "fake worker: no action for rank %d in %q\n", rank, spec)
	return 2
}

// awaitPeers waits (at most 30 s) until every other rank said it is
// ready.
func awaitPeers(dir string) {
	world, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n, _ := filepath.Glob(filepath.Join(dir, "ready.*"))
		if len(n) >= world-1 {
			return
		}
	}
}

// watchWriter collects output and signals when n lines contain want.
type watchWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	n    int
	seen int
	done chan struct{}
}

func newWatchWriter(want string, n int) *watchWriter {
	return &watchWriter{want: want, n: n, done: make(chan struct{})}
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.want != "" {
		w.seen += bytes.Count(p, []byte(w.want))
		if w.seen >= w.n && w.n > 0 {
			w.n = 0
			close(w.done)
		}
	}
	return len(p), nil
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// lines returns the output lines.
func (w *watchWriter) lines() []string {
	return strings.Split(strings.TrimSuffix(w.String(), "\n"), "\n")
}
