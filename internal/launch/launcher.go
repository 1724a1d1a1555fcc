package launch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/titan-go/titan/internal/backend/cpu"
	"github.com/titan-go/titan/internal/control"
)

// flightGrace is how long workers get to dump their flight recorders
// after SIGUSR1 when a rank was lost, before they are stopped.
const flightGrace = 2 * time.Second

// killGrace is how long workers get between SIGTERM and SIGKILL when the
// launcher stops them; a variable for tests.
var killGrace = 5 * time.Second

// failureSettle is how long the launcher waits, once a worker has
// failed, for the ends of the others before it names the failure and
// stops them: a worker killed by a signal makes its peers fail at their
// next collective, and both ends reach the launcher within moments, in
// either order. A variable for tests.
var failureSettle = time.Second

// heartbeatTimeout is how long a worker's heartbeats may stop before the
// launcher's control server declares it lost (0: the control default).
var heartbeatTimeout time.Duration

// ErrInterrupted is wrapped by Launch's error when a signal or a cancelled
// context ended the job.
var ErrInterrupted = errors.New("interrupted")

// WorkerError reports the worker whose failure ended a job.
type WorkerError struct {
	// Rank is the failed worker's global rank.
	Rank int
	// Node is the worker's node rank.
	Node int
	// PID is the worker's process id; 0 for a worker on another node.
	PID int
	// Status is the exit status, or -1 when the worker was killed by a
	// signal or lost.
	Status int
	// Signal is the signal that killed the worker, or 0.
	Signal syscall.Signal
	// Lost reports that the control plane declared the worker lost
	// (its heartbeats stopped).
	Lost bool
	// Reason is what the worker reported at exit or what the control
	// plane observed; may be empty.
	Reason string
}

// Error describes the failure, naming the rank and how it died, e.g.
// "rank 2 (pid 1234) was killed by signal 9 (killed)".
func (e *WorkerError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rank %d", e.Rank)
	if e.PID > 0 {
		fmt.Fprintf(&b, " (pid %d)", e.PID)
	} else {
		fmt.Fprintf(&b, " on node %d", e.Node)
	}
	switch {
	case e.Lost:
		b.WriteString(" was lost (no heartbeats)")
	case e.Signal != 0:
		fmt.Fprintf(&b, " was killed by signal %d (%v)", int(e.Signal), e.Signal)
	default:
		fmt.Fprintf(&b, " exited with status %d", e.Status)
	}
	if e.Reason != "" {
		b.WriteString(": ")
		b.WriteString(e.Reason)
	}
	return b.String()
}

// ExitCode is a process exit code for a launcher that ends with this
// error: the worker's status, 128 + signal number, or 1.
func (e *WorkerError) ExitCode() int {
	switch {
	case e.Signal != 0:
		return 128 + int(e.Signal)
	case e.Status > 0 && e.Status < 256:
		return e.Status
	}
	return 1
}

// Launch runs this node's part of a job described by a launcher Spec
// (see Detect): on node rank 0 it starts the control server (on loopback
// port 0 for one node, on the rendezvous endpoint for several); it spawns
// spec.NProcPerNode workers that re-execute the current binary with
// workerArgs and the worker environment (see the package documentation);
// it copies their stdout and stderr to out line by line, prefixed with
// "[rank R] "; it forwards SIGINT and SIGTERM to the workers (a second
// signal kills them); and it monitors them.
//
// Workers ignore the launcher flags (see Detect), so workerArgs may be the
// launcher's own arguments unchanged.
//
// When a worker exits non-zero or is killed, or the control server reports
// a rank lost or failed, Launch stops the other workers (SIGTERM, then
// SIGKILL after a grace period) and returns a *WorkerError naming the rank
// and how it died: the root cause among the failures of the next second
// (a worker killed by a signal, rather than the peers whose collectives
// then failed, whichever the launcher saw first). It returns nil when every worker exits 0, and an error
// wrapping ErrInterrupted after a signal or when ctx ends. On node 0 of
// several, Launch keeps the control server up after its own workers are
// done until the other nodes' ranks have reported their exit (or 30 s
// passed), and a failure they report becomes its error.
func Launch(ctx context.Context, spec Spec, workerArgs []string, out io.Writer) error {
	if spec.Mode != ModeLauncher {
		return fmt.Errorf("launch: spec mode is %v, want launcher", spec.Mode)
	}
	if spec.NProcPerNode < 1 || spec.NNodes < 1 || spec.NodeRank < 0 || spec.NodeRank >= spec.NNodes {
		return fmt.Errorf("launch: bad layout: %d processes per node, %d nodes, node rank %d", spec.NProcPerNode, spec.NNodes, spec.NodeRank)
	}
	if spec.NNodes > 1 && spec.Endpoint == "" && spec.Elastic == nil {
		return fmt.Errorf("launch: %d nodes need a rendezvous endpoint", spec.NNodes)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("launch: finding the titan binary to start workers: %w", err)
	}
	if spec.Elastic != nil {
		return superviseElastic(ctx, spec, exe, workerArgs, &syncWriter{out: out})
	}
	l := &launcher{spec: spec, exe: exe, args: workerArgs, out: &syncWriter{out: out}}
	return l.run(ctx)
}

type launcher struct {
	spec Spec
	exe  string
	args []string
	out  *syncWriter

	workers []*child
	byRank  map[int]*child
	reasons map[int]string // exit reasons reported through the control plane
	failure *WorkerError
	settle  <-chan time.Time // armed by the first failure (see fail)
	intr    os.Signal        // the first signal received
	ctxErr  error
	killAt  <-chan time.Time
	stopped bool
	gone    map[int]bool // ranks known to have exited or been lost
	linger  bool         // local workers are done; waiting for other nodes

	// Elastic rounds (see superviseElastic); zero for a fixed job.
	ended     <-chan string // delivers why the rendezvous ended the round
	endReason string        // what ended delivered
	onFail    func(error)   // told of the failure that stops the round
	extraEnv  []string      // worker variables beyond workerEnv's
	started   func(pids []int)
}

type child struct {
	rank, localRank int
	cmd             *exec.Cmd
	pid             int
	stdout, stderr  *prefixWriter
	done            bool
}

type exitMsg struct {
	c   *child
	err error
}

func (l *launcher) logf(format string, args ...any) {
	fmt.Fprintf(l.out, "titanrun: "+format+"\n", args...)
}

func (l *launcher) run(ctx context.Context) error {
	spec := l.spec
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	endpoint, jobID, secret := spec.Endpoint, spec.JobID, spec.Secret
	var secretPath string // a generated secret's file
	if jobID == "" {
		jobID = "titanrun-" + randomHex(8)
	}
	var events <-chan control.Event
	if spec.NodeRank == 0 {
		generated := secret == ""
		if generated {
			secret = randomHex(16)
		}
		listen := "127.0.0.1:0"
		if endpoint != "" {
			listen = listenAddrFor(endpoint)
		}
		spec.Secret, spec.JobID = secret, jobID
		tlsConf, err := spec.serverTLS()
		if err != nil {
			return fmt.Errorf("launch: %w", err)
		}
		if spec.NNodes > 1 && generated {
			// The other nodes need the secret: hand it over in a file
			// only this user can read, and never print it.
			path, err := writeSecretFile(jobID, secret)
			if err != nil {
				return fmt.Errorf("launch: node rank 0 generated the job secret: %w", err)
			}
			secretPath = path
			// The secret is this job's: it goes with it (a new job, or a
			// relaunch, generates another).
			defer os.Remove(path)
		}
		srv, err := control.NewServer(control.ServerConfig{
			Addr: listen, JobID: jobID, Secret: secret, WorldSize: spec.NProcPerNode * spec.NNodes,
			TLS: tlsConf, HeartbeatTimeout: heartbeatTimeout,
		})
		if err != nil {
			return fmt.Errorf("launch: starting the control server: %w", err)
		}
		defer srv.Stop()
		go func() {
			if err := srv.Serve(); err != nil {
				l.logf("control server: %v", err)
			}
		}()
		if endpoint == "" {
			endpoint = srv.Addr()
		}
		events = srv.Events()
		if secretPath != "" {
			l.logf("job secret generated into %s (readable by this user only); copy that file (mode 0600) to the other nodes and start the launchers of node ranks 1..%d with --rdzv-secret-file FILE --nnodes %d --rdzv-endpoint %s",
				secretPath, spec.NNodes-1, spec.NNodes, endpoint)
		}
	}
	return l.supervise(ctx, sigs, endpoint, jobID, secret, events)
}

// supervise starts this node's workers for the control plane at endpoint
// and monitors them until they are all done (see Launch). events are the
// control server's when this launcher hosts it, else nil.
func (l *launcher) supervise(ctx context.Context, sigs <-chan os.Signal, endpoint, jobID, secret string, events <-chan control.Event) error {
	spec := l.spec
	threads := spec.Threads
	if threads <= 0 {
		threads = max(1, runtime.NumCPU()/spec.NProcPerNode)
	}

	exits := make(chan exitMsg, spec.NProcPerNode)
	l.byRank = make(map[int]*child)
	l.reasons = make(map[int]string)
	l.gone = make(map[int]bool)

	// Pdeathsig kills a worker when the thread that started it exits; keep
	// this goroutine on one thread, which lives as long as Launch runs.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	base := hostPeakEnv(os.Environ(), cpu.HostPeakFLOPS)
	base, stopObs, err := l.observability(base, jobID)
	if err != nil {
		return err
	}
	defer stopObs()
	l.logf("job %s: starting %d workers on node %d of %d (ranks %d..%d of %d, threads per worker %d), control plane %s",
		jobID, spec.NProcPerNode, spec.NodeRank, spec.NNodes, spec.NodeRank*spec.NProcPerNode,
		(spec.NodeRank+1)*spec.NProcPerNode-1, spec.NProcPerNode*spec.NNodes, threads, endpoint)
	for lr := range spec.NProcPerNode {
		rank := spec.NodeRank*spec.NProcPerNode + lr
		c := &child{rank: rank, localRank: lr}
		prefix := fmt.Sprintf("[rank %d] ", rank)
		c.stdout, c.stderr = newPrefixWriter(l.out, prefix), newPrefixWriter(l.out, prefix)
		c.cmd = exec.Command(l.exe, l.args...)
		c.cmd.Env = append(workerEnv(base, spec, lr, endpoint, jobID, secret, threads), l.extraEnv...)
		c.cmd.Stdout, c.cmd.Stderr = c.stdout, c.stderr
		c.cmd.WaitDelay = time.Second // bound the wait for stray holders of the pipes
		c.cmd.SysProcAttr = workerProcAttr()
		if err := c.cmd.Start(); err != nil {
			l.signalAll(syscall.SIGKILL)
			l.waitAll(exits)
			return fmt.Errorf("launch: starting rank %d (%s): %w", rank, l.exe, err)
		}
		c.pid = c.cmd.Process.Pid
		l.workers = append(l.workers, c)
		l.byRank[rank] = c
		go func() { exits <- exitMsg{c, c.cmd.Wait()} }()
	}
	if l.started != nil {
		pids := make([]int, len(l.workers))
		for i, c := range l.workers {
			pids[i] = c.pid
		}
		l.started(pids)
	}

	ctxDone := ctx.Done()
	for live := len(l.workers); live > 0; {
		select {
		case reason, ok := <-l.ended:
			l.ended = nil
			if ok && !l.stopped {
				l.endReason = reason
				l.logf("%s; stopping the workers", reason)
				l.stop()
			}
		case m := <-exits:
			live--
			l.exited(m)
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			l.event(ev)
		case sig := <-sigs:
			if l.intr == nil {
				l.intr = sig
				l.logf("got %v; forwarding it to the workers (again to kill them)", sig)
				l.signalAll(sig.(syscall.Signal))
			} else {
				l.logf("got %v again; killing the workers", sig)
				l.signalAll(syscall.SIGKILL)
			}
		case <-ctxDone:
			ctxDone = nil
			l.ctxErr = ctx.Err()
			l.logf("%v; stopping the workers", l.ctxErr)
			l.stop()
		case <-l.settle:
			l.failed()
		case <-l.killAt:
			l.killAt = nil
			l.logf("workers still running %v after SIGTERM; killing them", killGrace)
			l.signalAll(syscall.SIGKILL)
		}
	}
	if events != nil && spec.NNodes > 1 && l.failure == nil && l.intr == nil && l.ctxErr == nil && l.endReason == "" {
		l.awaitOtherNodes(ctx, events, sigs)
	}
	if l.settle != nil { // every local worker ended within the window
		l.failed()
	}
	switch {
	case l.failure != nil:
		return l.failure
	case l.intr != nil:
		return fmt.Errorf("launch: %w by %v", ErrInterrupted, l.intr)
	case l.ctxErr != nil:
		return fmt.Errorf("launch: %w: %w", ErrInterrupted, l.ctxErr)
	case l.endReason != "":
		return &roundEnded{l.endReason}
	}
	return nil
}

// waitAll reaps the workers started so far (after a start failure).
func (l *launcher) waitAll(exits <-chan exitMsg) {
	for range l.workers {
		(<-exits).c.done = true
	}
}

// awaitOtherNodes keeps node 0's control server up, for at most
// hostLinger, until the ranks of the other nodes have reported their exit
// (they may still need the store while they finish), and turns a failure
// they report into the launcher's error.
func (l *launcher) awaitOtherNodes(ctx context.Context, events <-chan control.Event, sigs <-chan os.Signal) {
	world := l.spec.NProcPerNode * l.spec.NNodes
	if len(l.gone) >= world {
		return
	}
	l.linger = true
	timer := time.NewTimer(hostLinger)
	defer timer.Stop()
	for len(l.gone) < world && l.failure == nil {
		select {
		case ev, ok := <-events:
			if !ok {
				return
			}
			l.event(ev)
		case <-timer.C:
			var missing []int
			for r := range world {
				if !l.gone[r] {
					missing = append(missing, r)
				}
			}
			l.logf("local workers are done; ranks %v of the other nodes did not report their exit within %v", missing, hostLinger)
			return
		case sig := <-sigs:
			l.intr = sig
			return
		case <-ctx.Done():
			l.ctxErr = ctx.Err()
			return
		}
	}
}

// exited handles a worker's exit.
func (l *launcher) exited(m exitMsg) {
	c := m.c
	c.done = true
	l.gone[c.rank] = true
	c.stdout.Flush()
	c.stderr.Flush()
	if m.err == nil {
		return
	}
	we := &WorkerError{Rank: c.rank, Node: l.spec.NodeRank, PID: c.pid, Status: -1, Reason: l.reasons[c.rank]}
	var ee *exec.ExitError
	if errors.As(m.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			we.Signal = ws.Signal()
		} else {
			we.Status = ee.ExitCode()
		}
	} else if we.Reason == "" {
		we.Reason = m.err.Error() // e.g. the output copy outlived WaitDelay
	}
	if l.stopped || l.intr != nil {
		return // an expected end of a worker the launcher is stopping
	}
	l.fail(we)
}

// event handles a membership event of the control server.
func (l *launcher) event(ev control.Event) {
	switch ev.Kind {
	case control.EventRefused:
		l.logf("control server: %v", ev)
	case control.EventExited:
		l.gone[ev.Rank] = true
		if ev.Code == 0 {
			return
		}
		l.reasons[ev.Rank] = ev.Reason
		if _, local := l.byRank[ev.Rank]; local {
			return // its process exit follows and is reported then
		}
		if !l.stopped && l.intr == nil {
			l.fail(&WorkerError{Rank: ev.Rank, Node: l.nodeOf(ev.Rank), Status: ev.Code, Reason: ev.Reason})
		}
	case control.EventLost:
		l.gone[ev.Rank] = true
		if l.stopped || l.intr != nil || l.linger {
			// While lingering, a rank that stops its heartbeats most
			// likely ended without reporting; its own launcher knows how.
			return
		}
		we := &WorkerError{Rank: ev.Rank, Node: l.nodeOf(ev.Rank), Status: -1, Lost: true, Reason: ev.Reason}
		if c, local := l.byRank[ev.Rank]; local {
			if c.done {
				return
			}
			we.PID = c.pid
		}
		l.fail(we)
	}
}

func (l *launcher) nodeOf(rank int) int { return rank / l.spec.NProcPerNode }

// fail records a worker's failure. The first arms failureSettle; until
// it fires (failed), later failures may replace it as the one that ends
// the job: the root cause, by causeRank.
func (l *launcher) fail(we *WorkerError) {
	if l.failure == nil {
		l.settle = time.After(failureSettle)
	}
	if l.failure == nil || causeRank(we) > causeRank(l.failure) {
		l.failure = we
	}
}

// causeRank orders failures seen together by how surely they are a root
// cause: a worker killed by a signal (before the launcher signals
// anyone) did not die of a peer's end, while one that exits with a status
// or stops its heartbeats may have (its collectives fail once a peer is
// gone).
func causeRank(we *WorkerError) int {
	if we.Signal != 0 {
		return 1
	}
	return 0
}

// failed names the failure that ends the job and stops the other
// workers.
func (l *launcher) failed() {
	l.settle = nil
	if l.failure.Lost && !l.stopped {
		// A lost rank is most often a hung one, and the others wait for it
		// inside a collective: their flight recorders say which (titan
		// debug flight), so they dump them (SIGUSR1) before being stopped.
		l.logf("asking the workers to dump their flight recorders (SIGUSR1) before stopping them")
		l.signalAll(syscall.SIGUSR1)
		time.Sleep(flightGrace)
	}
	if l.onFail != nil {
		l.logf("worker %v; stopping the workers", l.failure)
		l.onFail(l.failure)
	} else {
		l.logf("%v; stopping the job", l.failure)
	}
	l.stop()
}

// stop asks every live worker to terminate and arms the SIGKILL timer.
func (l *launcher) stop() {
	if l.stopped {
		return
	}
	l.stopped = true
	l.signalAll(syscall.SIGTERM)
	l.killAt = time.After(killGrace)
}

// signalAll sends sig to the process group of every live worker.
func (l *launcher) signalAll(sig syscall.Signal) {
	for _, c := range l.workers {
		if !c.done {
			// ESRCH: already gone.
			if err := signalGroup(c.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) && !errors.Is(err, os.ErrProcessDone) {
				l.logf("signalling rank %d (pid %d): %v", c.rank, c.pid, err)
			}
		}
	}
}

// workerEnv returns the environment of local worker lr: base without the
// variables the launcher owns, plus the worker's own.
func workerEnv(base []string, spec Spec, lr int, endpoint, jobID, secret string, threads int) []string {
	owned := map[string]bool{
		"RANK": true, "LOCAL_RANK": true, "WORLD_SIZE": true, "LOCAL_WORLD_SIZE": true,
		"NODE_RANK": true, "MASTER_ADDR": true, "MASTER_PORT": true,
	}
	userGOMAXPROCS := false
	env := make([]string, 0, len(base)+16)
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if k == "GOMAXPROCS" {
			userGOMAXPROCS = true
		}
		if owned[k] || k == EnvEndpoint || k == EnvSecret || k == EnvSecretFile || k == EnvJobID || k == EnvThreads ||
			k == EnvTLSCert || k == EnvTLSKey || k == EnvTLSCA {
			continue
		}
		env = append(env, kv)
	}
	host, port, _ := net.SplitHostPort(endpoint)
	set := func(k string, v any) { env = append(env, fmt.Sprintf("%s=%v", k, v)) }
	set("RANK", spec.NodeRank*spec.NProcPerNode+lr)
	set("LOCAL_RANK", lr)
	set("WORLD_SIZE", spec.NProcPerNode*spec.NNodes)
	set("LOCAL_WORLD_SIZE", spec.NProcPerNode)
	set("NODE_RANK", spec.NodeRank)
	set("MASTER_ADDR", host)
	set("MASTER_PORT", port)
	set(EnvEndpoint, endpoint)
	set(EnvSecret, secret)
	set(EnvJobID, jobID)
	set(EnvThreads, threads)
	for _, v := range []struct{ k, v string }{{EnvTLSCert, spec.TLSCert}, {EnvTLSKey, spec.TLSKey}, {EnvTLSCA, spec.TLSCA}} {
		if v.v != "" {
			set(v.k, v.v)
		}
	}
	if !userGOMAXPROCS {
		// One P beyond the compute threads, for the communication
		// goroutines (asynchronous sends and receives, collectives in
		// flight): with no free P they wait for the compute goroutine
		// to leave its kernel, up to the scheduler's preemption, which
		// held a pipeline's transfers back by ~10 ms behind each GEMM.
		set("GOMAXPROCS", strconv.Itoa(threads+1))
	}
	return env
}

// hostPeakEnv returns base with cpu.EnvHostPeakFLOPS set, so that every
// worker of this node computes MFU against the same peak, measured once
// with all the node's cores before any worker starts: a valid value
// already in base (set by the user or a scheduler) is kept, otherwise
// measure supplies it.
func hostPeakEnv(base []string, measure func() float64) []string {
	out := make([]string, 0, len(base)+1)
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		if k == cpu.EnvHostPeakFLOPS {
			if _, err := cpu.ParseHostPeak(v); err == nil {
				return base
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, cpu.EnvHostPeakFLOPS+"="+cpu.FormatHostPeak(measure()))
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}
