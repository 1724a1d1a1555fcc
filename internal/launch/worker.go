package launch

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/control"
)

// Timings of the worker bootstrap; variables for tests.
var (
	// rendezvousTimeout bounds Join's wait for the control server and for
	// every rank to arrive when ctx has no deadline and the options set no
	// InitTimeout.
	rendezvousTimeout = 10 * time.Minute
	// heartbeatEvery is the workers' heartbeat interval.
	heartbeatEvery = time.Second
	// hostLinger is how long the host of the control server (a worker in
	// Close, or node 0's launcher whose workers are done) keeps it up for
	// the other ranks to report their exit.
	hostLinger = 30 * time.Second
)

// Worker is one worker process of a distributed job, joined to the
// control plane and to the communication world.
type Worker struct {
	// Rank and WorldSize place the worker in the job; LocalRank and
	// LocalWorldSize on its node.
	Rank, WorldSize           int
	LocalRank, LocalWorldSize int
	// NodeRank is the worker's node index.
	NodeRank int
	// Threads is the number of CPU threads the worker should use (see
	// Spec.Threads).
	Threads int
	// Spec is the Spec the worker joined with.
	Spec Spec
	// Control is the worker's connection to the control plane; it is
	// also the store of World.
	Control *control.Client
	// World is the process group of all ranks.
	World comm.Group

	server  *control.Server // when this worker hosts the control server
	exited  chan struct{}   // closed once every rank exited or was lost (host only)
	servErr chan error
}

// Hosts is the number of hosts (nodes) of the job: the world size over
// the workers per node, rounded up; 1 when unknown. MFU divides by the
// peak of that many hosts (see cpu.HostPeakFLOPS).
func (w *Worker) Hosts() int {
	if w.LocalWorldSize < 1 || w.WorldSize < 1 {
		return 1
	}
	return (w.WorldSize + w.LocalWorldSize - 1) / w.LocalWorldSize
}

// Join bootstraps a worker (spec.Mode == ModeWorker, from Detect): when
// the worker hosts the control server (rank 0 under Slurm and env://) it
// starts it; it dials the control plane, joins the rendezvous, starts
// heartbeats and creates the world group with the control client as its
// store. The ranks of all workers must call Join. See JoinOptions to
// configure the world's transports and timeouts.
func Join(ctx context.Context, spec Spec) (*Worker, error) {
	return JoinOptions(ctx, spec, comm.Options{})
}

// JoinOptions is Join with options for comm.NewWorld. When opts.Addr is
// empty and the job spans several nodes, the world listens on all
// interfaces and advertises the local address that routes to the control
// endpoint, so that the other nodes can reach it.
//
// opts.InitTimeout (the recipe's comm.init_timeout_seconds), when set and
// ctx has no deadline, bounds the whole bootstrap: reaching the control
// server, every rank joining, and the world's connections; without it the
// bound is 10 minutes. A bootstrap that runs out of time fails with an
// error that wraps context.DeadlineExceeded and names the timeout.
func JoinOptions(ctx context.Context, spec Spec, opts comm.Options) (*Worker, error) {
	if spec.Mode != ModeWorker {
		return nil, fmt.Errorf("launch: join: spec mode is %v, want worker", spec.Mode)
	}
	if spec.WorldSize < 1 || spec.Rank < 0 || spec.Rank >= spec.WorldSize {
		return nil, fmt.Errorf("launch: join: rank %d outside world size %d", spec.Rank, spec.WorldSize)
	}
	if _, ok := ctx.Deadline(); !ok {
		timeout := rendezvousTimeout
		if opts.InitTimeout > 0 {
			timeout = opts.InitTimeout
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, timeout, &initTimeoutError{timeout})
		defer cancel()
	}
	w := &Worker{
		Rank: spec.Rank, WorldSize: spec.WorldSize, LocalRank: spec.LocalRank, LocalWorldSize: spec.LocalWorldSize,
		NodeRank: spec.NodeRank, Threads: spec.Threads, Spec: spec,
	}
	joined := false
	defer func() {
		if !joined {
			w.teardown()
		}
	}()

	if spec.HostServer {
		tlsConf, err := spec.serverTLS()
		if err != nil {
			return nil, fmt.Errorf("launch: rank %d: %w", spec.Rank, err)
		}
		srv, err := control.NewServer(control.ServerConfig{
			Addr: spec.ListenAddr, JobID: spec.JobID, Secret: spec.Secret, WorldSize: spec.WorldSize,
			TLS: tlsConf, HeartbeatTimeout: heartbeatTimeout,
		})
		if err != nil {
			return nil, fmt.Errorf("launch: rank %d hosting the control server (%s): %w; MASTER_PORT chooses another port", spec.Rank, sourceName(spec.Source), err)
		}
		w.server = srv
		w.servErr = make(chan error, 1)
		w.exited = make(chan struct{})
		go func() { w.servErr <- srv.Serve() }()
		go w.watchExits(srv.Events(), spec.WorldSize)
	}

	clientTLS, err := spec.clientTLS()
	if err != nil {
		return nil, fmt.Errorf("launch: rank %d: %w", spec.Rank, err)
	}
	w.Control, err = control.Dial(ctx, control.DialConfig{
		Endpoint: spec.Endpoint, JobID: spec.JobID, Secret: spec.Secret, TLS: clientTLS, Timeout: time.Until(deadline(ctx)),
	})
	if err != nil {
		return nil, fmt.Errorf("launch: rank %d: %w%s", spec.Rank, err, timeoutNote(ctx))
	}

	if opts.Secret == "" {
		opts.Secret = spec.Secret // the data plane proves it too
	}
	if opts.Addr == "" && spec.NNodes > 1 {
		opts.Addr = ":0"
		if opts.AdvertiseHost == "" {
			opts.AdvertiseHost = routeHost(spec.Endpoint)
		}
	}
	advertise := opts.AdvertiseHost
	if advertise == "" {
		advertise, _ = os.Hostname()
	}

	// Ranks set by the environment (Slurm, env://) are kept as they are,
	// whatever the task layout: each joins as the only worker of its own
	// slot. Ranks of our launcher follow node rank and local rank.
	nodeRank, localRank, localWorld := spec.NodeRank, spec.LocalRank, spec.LocalWorldSize
	if spec.Source != SourceTitanrun {
		nodeRank, localRank, localWorld = spec.Rank, 0, 1
	}
	rank, world, err := w.Control.Join(ctx, nodeRank, localRank, localWorld, advertise)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("launch: rank %d: not all %d ranks joined job %s at %s in time: %w%s", spec.Rank, spec.WorldSize, spec.JobID, spec.Endpoint, err, timeoutNote(ctx))
		}
		return nil, fmt.Errorf("launch: rank %d joining job %s at %s: %w", spec.Rank, spec.JobID, spec.Endpoint, err)
	}
	if rank != spec.Rank || world != spec.WorldSize {
		return nil, fmt.Errorf("launch: control plane at %s assigned rank %d of %d, but the environment says rank %d of %d", spec.Endpoint, rank, world, spec.Rank, spec.WorldSize)
	}
	w.Control.StartHeartbeats(rank, heartbeatEvery)

	w.World, err = comm.NewWorld(ctx, w.Control, rank, world, opts)
	if err != nil {
		return nil, fmt.Errorf("launch: rank %d creating the world group: %w%s", rank, err, timeoutNote(ctx))
	}
	joined = true
	return w, nil
}

// initTimeoutError is the cause of a bootstrap that ran out of its init
// timeout.
type initTimeoutError struct{ d time.Duration }

func (e *initTimeoutError) Error() string {
	return fmt.Sprintf("init timeout of %s exceeded (comm.init_timeout_seconds)", e.d)
}

// Is makes the cause match context.DeadlineExceeded.
func (e *initTimeoutError) Is(target error) bool { return target == context.DeadlineExceeded }

// timeoutNote explains a bootstrap error when ctx ran out of the init
// timeout that Join set: "" otherwise.
func timeoutNote(ctx context.Context) string {
	// A remote peer (the control server, propagating the deadline) may
	// report the deadline a moment before ctx itself expires: wait for
	// it when it is that close.
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < time.Second {
			select {
			case <-ctx.Done():
			case <-time.After(left + 50*time.Millisecond):
			}
		}
	}
	var ie *initTimeoutError
	if errors.As(context.Cause(ctx), &ie) {
		return "; " + ie.Error()
	}
	return ""
}

// deadline returns ctx's deadline (Join always sets one).
func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// routeHost returns the local IP address that routes to endpoint's host,
// found by connecting a UDP socket (which sends nothing); the machine's
// host name if that fails.
func routeHost(endpoint string) string {
	if c, err := net.Dial("udp", endpoint); err == nil {
		defer c.Close()
		if a, ok := c.LocalAddr().(*net.UDPAddr); ok && !a.IP.IsUnspecified() {
			return a.IP.String()
		}
	}
	h, _ := os.Hostname()
	return h
}

// watchExits closes w.exited once every rank has reported its exit or been
// declared lost (or the server stopped).
func (w *Worker) watchExits(events <-chan control.Event, world int) {
	defer close(w.exited)
	gone := make(map[int]bool)
	for ev := range events {
		if ev.Kind == control.EventExited || ev.Kind == control.EventLost {
			gone[ev.Rank] = true
			if len(gone) == world {
				return
			}
		}
	}
}

// Close ends the worker's part in the job: it closes the world group,
// reports the exit to the control plane (code 0 when exitErr is nil, else
// 1, or exitErr's ExitCode() if it has one, with exitErr's text as the
// reason), stops heartbeats and closes the connection. A worker that hosts
// the control server first waits (a bounded time) for the other ranks to
// report their exit, so that they do not lose the server while finishing.
func (w *Worker) Close(exitErr error) error {
	code, reason := 0, ""
	if exitErr != nil {
		code, reason = 1, exitErr.Error()
		var ec interface{ ExitCode() int }
		if errors.As(exitErr, &ec) && ec.ExitCode() != 0 {
			code = ec.ExitCode()
		}
	}
	var errs []error
	if w.World != nil {
		if err := w.World.Close(); err != nil {
			errs = append(errs, fmt.Errorf("launch: rank %d closing the world group: %w", w.Rank, err))
		}
		w.World = nil
	}
	if w.Control != nil {
		// Best effort: when the server is gone (its launcher ended the
		// job) nobody is left to read the report.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		w.Control.ReportExit(ctx, w.Rank, code, reason)
		cancel()
	}
	if w.server != nil {
		select {
		case <-w.exited:
		case <-time.After(hostLinger):
		}
	}
	w.teardown()
	return errors.Join(errs...)
}

// teardown closes the client and stops a hosted server.
func (w *Worker) teardown() {
	if w.World != nil {
		w.World.Close()
		w.World = nil
	}
	if w.Control != nil {
		w.Control.Close()
		w.Control = nil
	}
	if w.server != nil {
		w.server.Stop()
		<-w.servErr
		w.server = nil
	}
}

// sourceName names a worker source for messages.
func sourceName(source string) string {
	switch source {
	case SourceSlurm:
		return "Slurm"
	case SourceEnv:
		return "env://"
	}
	return source
}

// serverTLS returns the control server's TLS configuration: the user's
// certificate (TITANRUN_TLS_CERT) when given, else the certificate that
// control.JobTLS derives from the job secret and job id. titan's control
// plane always speaks TLS, loopback included.
func (s Spec) serverTLS() (*tls.Config, error) {
	if s.TLSCert != "" {
		return control.LoadServerTLS(s.TLSCert, s.TLSKey, s.TLSCA)
	}
	srv, _, err := control.JobTLS(s.Secret, s.JobID)
	return srv, err
}

// clientTLS returns the control clients' TLS configuration, matching
// serverTLS: the user's CA (and certificate) when TITANRUN_TLS_CERT is
// given, else the pinned key that control.JobTLS derives.
func (s Spec) clientTLS() (*tls.Config, error) {
	if s.TLSCert != "" {
		return control.LoadClientTLS(s.TLSCA, s.TLSCert, s.TLSKey)
	}
	_, cl, err := control.JobTLS(s.Secret, s.JobID)
	return cl, err
}
