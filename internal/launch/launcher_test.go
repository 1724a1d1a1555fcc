//go:build unix

package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// launchTimeout bounds every launcher test: a launcher that fails to stop
// its workers shows up as a context error instead of a hung test.
const launchTimeout = 60 * time.Second

// setFakeWorkers makes the workers Launch spawns run the given actions.
func setFakeWorkers(t *testing.T, actions string) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv(fakeWorkerEnv, actions)
	t.Setenv(fakeDirEnv, dir)
	return dir
}

func localSpec(nproc int) Spec {
	spec, err := Detect(nil, Flags{NProc: nproc})
	if err != nil {
		panic(err)
	}
	return spec
}

func shortGrace(t *testing.T, d time.Duration) {
	old := killGrace
	killGrace = d
	t.Cleanup(func() { killGrace = old })
}

// checkPrefixes checks that every line of out is a launcher line or comes
// from a rank in [0, world), and returns the worker lines by rank.
func checkPrefixes(t *testing.T, out []string, world int) map[int][]string {
	t.Helper()
	re := regexp.MustCompile(`^\[rank (\d+)\] (.*)$`)
	byRank := make(map[int][]string)
	for _, line := range out {
		if strings.HasPrefix(line, "titanrun: ") {
			continue
		}
		m := re.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("output line without a rank prefix: %q", line)
			continue
		}
		var r int
		fmt.Sscan(m[1], &r)
		if r < 0 || r >= world {
			t.Errorf("line from rank %d outside world %d: %q", r, world, line)
		}
		byRank[r] = append(byRank[r], m[2])
	}
	return byRank
}

func TestLaunchWorkerEnvironment(t *testing.T) {
	setFakeWorkers(t, "*:env")
	t.Setenv("RANK", "77") // inherited torchrun variables must be replaced
	t.Setenv("GOMAXPROCS", "")
	os.Unsetenv("GOMAXPROCS")
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
	defer cancel()
	out := newWatchWriter("", 0)
	spec := localSpec(3)
	if err := Launch(ctx, spec, []string{"train", "--nproc", "3"}, out); err != nil {
		t.Fatalf("Launch: %v\noutput:\n%s", err, out)
	}
	threads := max(1, runtime.NumCPU()/3)
	byRank := checkPrefixes(t, out.lines(), 3)
	for r := range 3 {
		want := regexp.MustCompile(fmt.Sprintf(`^mode=worker source=titanrun rank=%d local=%d world=3 localworld=3 node=0 nnodes=1 threads=%d gomaxprocs=%d endpoint_set=true secret_len=32 job=titanrun-[0-9a-f]{16} args=\["train" "--nproc" "3"\]$`,
			r, r, threads, threads+1))
		if got := byRank[r]; len(got) != 1 || !want.MatchString(got[0]) {
			t.Errorf("rank %d printed %q, want a match of %s", r, got, want)
		}
	}
}

func TestLaunchStreamsLines(t *testing.T) {
	setFakeWorkers(t, "*:lines")
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
	defer cancel()
	out := newWatchWriter("", 0)
	if err := Launch(ctx, localSpec(2), nil, out); err != nil {
		t.Fatalf("Launch: %v\noutput:\n%s", err, out)
	}
	byRank := checkPrefixes(t, out.lines(), 2)
	for r := range 2 {
		var want []string
		for i := range 3 {
			want = append(want, fmt.Sprintf("out %d of rank %d", i, r), fmt.Sprintf("err %d of rank %d", i, r))
		}
		want = append(want, fmt.Sprintf("partial line of rank %d", r))
		got := slices.Clone(byRank[r])
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("rank %d lines:\n got %q\nwant %q", r, got, want)
		}
	}
}

func TestLaunchWorkerFailureStopsOthers(t *testing.T) {
	tests := []struct {
		name    string
		actions string
		grace   time.Duration
		check   func(*WorkerError) bool
		wantMsg string // regexp
	}{
		{
			name:    "exit status",
			actions: "1:exit=3;*:hang",
			check:   func(e *WorkerError) bool { return e.Rank == 1 && e.Status == 3 && e.Signal == 0 && e.ExitCode() == 3 },
			wantMsg: `^rank 1 \(pid \d+\) exited with status 3$`,
		},
		{
			name:    "kill -9",
			actions: "2:kill;*:hang",
			check: func(e *WorkerError) bool {
				return e.Rank == 2 && e.Signal == syscall.SIGKILL && e.Status == -1 && e.ExitCode() == 137
			},
			wantMsg: `^rank 2 \(pid \d+\) was killed by signal 9 \(killed\)$`,
		},
		{
			// The peer's exit, a consequence, is seen first; the
			// launcher names the kill, the cause.
			name:    "kill -9 after which a peer exits",
			actions: "1:dying;0:exitwhendying=1;*:hang",
			check: func(e *WorkerError) bool {
				return e.Rank == 1 && e.Signal == syscall.SIGKILL && e.Status == -1 && e.ExitCode() == 137
			},
			wantMsg: `^rank 1 \(pid \d+\) was killed by signal 9 \(killed\)$`,
		},
		{
			name:    "kill -9 with workers that ignore SIGTERM",
			actions: "0:kill;*:stubborn",
			grace:   300 * time.Millisecond,
			check:   func(e *WorkerError) bool { return e.Rank == 0 && e.Signal == syscall.SIGKILL },
			wantMsg: `^rank 0 \(pid \d+\) was killed by signal 9 \(killed\)$`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			setFakeWorkers(t, tc.actions)
			if tc.grace > 0 {
				shortGrace(t, tc.grace)
			}
			ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
			defer cancel()
			out := newWatchWriter("", 0)
			err := Launch(ctx, localSpec(4), nil, out)
			t.Logf("output:\n%s", out)
			var we *WorkerError
			if !errors.As(err, &we) {
				t.Fatalf("Launch returned %v, want a *WorkerError\noutput:\n%s", err, out)
			}
			if !tc.check(we) {
				t.Errorf("WorkerError %+v does not match", *we)
			}
			if !regexp.MustCompile(tc.wantMsg).MatchString(err.Error()) {
				t.Errorf("error %q does not match %q", err, tc.wantMsg)
			}
			if !strings.Contains(out.String(), "titanrun: "+err.Error()+"; stopping the job") {
				t.Errorf("launcher did not log the failure:\n%s", out)
			}
			if tc.grace > 0 && !strings.Contains(out.String(), "after SIGTERM; killing them") {
				t.Errorf("launcher did not escalate to SIGKILL:\n%s", out)
			}
		})
	}
}

func TestLaunchForwardsSignals(t *testing.T) {
	tests := []struct {
		name    string
		actions string
		signals []syscall.Signal
		want    []string // in the output
	}{
		{"SIGTERM reaches workers", "*:trap", []syscall.Signal{syscall.SIGTERM},
			[]string{"[rank 0] got terminated", "[rank 1] got terminated", "[rank 2] got terminated"}},
		{"SIGINT reaches workers", "*:trap", []syscall.Signal{syscall.SIGINT},
			[]string{"[rank 0] got interrupt", "[rank 2] got interrupt"}},
		{"second signal kills", "*:stubborn", []syscall.Signal{syscall.SIGINT, syscall.SIGINT},
			[]string{"got interrupt again; killing the workers"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			setFakeWorkers(t, tc.actions)
			ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
			defer cancel()
			out := newWatchWriter("] ready", 3)
			errc := make(chan error, 1)
			go func() { errc <- Launch(ctx, localSpec(3), nil, out) }()
			select {
			case <-out.done:
			case err := <-errc:
				t.Fatalf("Launch returned %v before the workers were ready\noutput:\n%s", err, out)
			}
			// Launch has called signal.Notify before starting the workers,
			// so these signals reach it, not the default handler.
			for _, sig := range tc.signals {
				syscall.Kill(os.Getpid(), sig)
				time.Sleep(50 * time.Millisecond)
			}
			err := <-errc
			if !errors.Is(err, ErrInterrupted) {
				t.Errorf("Launch returned %v, want ErrInterrupted", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestLaunchContextCancel(t *testing.T) {
	setFakeWorkers(t, "*:hang")
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
	defer cancel()
	out := newWatchWriter("] ready", 2)
	errc := make(chan error, 1)
	lctx, lcancel := context.WithCancel(ctx)
	go func() { errc <- Launch(lctx, localSpec(2), nil, out) }()
	<-out.done
	lcancel()
	err := <-errc
	if !errors.Is(err, ErrInterrupted) || !errors.Is(err, context.Canceled) {
		t.Errorf("Launch returned %v, want ErrInterrupted and context.Canceled", err)
	}
}

func TestLaunchRejectsBadSpec(t *testing.T) {
	tests := []struct {
		spec Spec
		want string
	}{
		{Spec{Mode: ModeWorker}, "want launcher"},
		{Spec{Mode: ModeLauncher, NProcPerNode: 0, NNodes: 1}, "bad layout"},
		{Spec{Mode: ModeLauncher, NProcPerNode: 2, NNodes: 2, NodeRank: 2}, "bad layout"},
		{Spec{Mode: ModeLauncher, NProcPerNode: 2, NNodes: 2}, "rendezvous endpoint"},
	}
	for _, tc := range tests {
		err := Launch(context.Background(), tc.spec, nil, &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Launch(%+v) = %v, want an error containing %q", tc.spec, err, tc.want)
		}
	}
}

func TestWorkerErrorMessages(t *testing.T) {
	tests := []struct {
		err  WorkerError
		want string
		code int
	}{
		{WorkerError{Rank: 2, PID: 1234, Status: -1, Signal: syscall.SIGKILL}, "rank 2 (pid 1234) was killed by signal 9 (killed)", 137},
		{WorkerError{Rank: 1, PID: 7, Status: 3}, "rank 1 (pid 7) exited with status 3", 3},
		{WorkerError{Rank: 5, Node: 1, Status: 1, Reason: "loss is NaN"}, "rank 5 on node 1 exited with status 1: loss is NaN", 1},
		{WorkerError{Rank: 3, PID: 9, Status: -1, Lost: true, Reason: "silent for 10s"}, "rank 3 (pid 9) was lost (no heartbeats): silent for 10s", 1},
	}
	for _, tc := range tests {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
		if got := tc.err.ExitCode(); got != tc.code {
			t.Errorf("%q: ExitCode() = %d, want %d", tc.want, got, tc.code)
		}
	}
}

// TestKilledLauncherTakesWorkersAlong kills a launcher with SIGKILL (it
// cannot stop its workers itself then) and checks that its workers die
// too, through the parent-death signal.
func TestKilledLauncherTakesWorkersAlong(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs Linux's parent-death signal")
	}
	dir := setFakeWorkers(t, "*:hang")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fakeLauncherEnv+"=3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	pids := make([]int, 3)
	deadline := time.Now().Add(launchTimeout)
	for r := 0; r < 3; {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("ready.%d", r)))
		if err == nil && len(b) > 0 {
			pids[r], _ = strconv.Atoi(string(b))
			r++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %d never got ready", r)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	for r, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				for _, p := range pids {
					syscall.Kill(p, syscall.SIGKILL)
				}
				t.Fatalf("rank %d (pid %d) outlived its launcher", r, pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z'
}
