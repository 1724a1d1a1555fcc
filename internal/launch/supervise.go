package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/titan-go/titan/internal/control"
)

// Rendezvous backends, as torchrun names them (--rdzv-backend).
const (
	BackendC10d = "c10d" // built in: hosted by a launcher (the default)
	BackendEtcd = "etcd" // an etcd v3 cluster at --rdzv-endpoint
)

// Defaults of the elastic rendezvous (--rdzv-conf), as torchrun's.
const (
	DefaultJoinTimeout       = 600 * time.Second
	DefaultLastCallTimeout   = 30 * time.Second
	DefaultKeepAliveInterval = 5 * time.Second
	DefaultKeepAliveAttempts = 3
)

// Variables torchrun sets for elastic workers, which Launch sets too.
const (
	EnvRestartCount = "TORCHELASTIC_RESTART_COUNT" // restarts so far
	EnvMaxRestarts  = "TORCHELASTIC_MAX_RESTARTS"  // --max-restarts
	EnvRunID        = "TORCHELASTIC_RUN_ID"        // the job id
)

// Elastic configures an elastic launcher (Spec.Elastic): one that meets
// the other nodes' launchers in rounds of a rendezvous, restarts every
// worker from the latest checkpoint when one fails, and takes nodes that
// leave or join into account with a new round.
type Elastic struct {
	// MinNodes and MaxNodes are --nnodes MIN:MAX.
	MinNodes, MaxNodes int
	// MaxRestarts is --max-restarts: how many times a failure (a worker
	// that died or stopped answering, a node that left) restarts the job.
	MaxRestarts int
	// Backend is BackendC10d or BackendEtcd.
	Backend string
	// Endpoint is --rdzv-endpoint: the c10d host:port ("" on one node: an
	// in-process rendezvous) or the etcd cluster's endpoints.
	Endpoint string
	// JoinTimeout, LastCall and LeaseTTL are --rdzv-conf's join_timeout,
	// last_call_timeout and keep_alive_interval × keep_alive_max_attempt.
	JoinTimeout, LastCall, LeaseTTL time.Duration
	// CheckWorld, when set, tells whether the job can run on a world of
	// that many workers (e.g. the recipe's parallelism degrees fit it);
	// a round whose world does not fit fails the job with its error, on
	// every node, before any worker starts.
	CheckWorld func(world int) error
}

// worldUnfit is the result of a round whose world size the job cannot
// run on (Elastic.CheckWorld).
type worldUnfit struct {
	world int
	err   error
}

func (e *worldUnfit) Error() string {
	return fmt.Sprintf("the job cannot run on the %d workers of this rendezvous round: %v", e.world, e.err)
}

func (e *worldUnfit) Unwrap() error { return e.err }

// elastic reports whether the flags ask for an elastic launcher.
func (f Flags) elastic() bool {
	return f.MaxRestarts > 0 || (f.MinNodes > 0 && f.MinNodes < f.NNodes) || f.RdzvBackend == BackendEtcd
}

// ParseNNodes parses --nnodes: "N" or torchrun's "MIN:MAX".
func ParseNNodes(s string) (minNodes, maxNodes int, err error) {
	if s == "" {
		return 0, 0, nil
	}
	lo, hi, isRange := strings.Cut(s, ":")
	if minNodes, err = strconv.Atoi(strings.TrimSpace(lo)); err != nil || minNodes < 1 {
		return 0, 0, fmt.Errorf("--nnodes %q: want N or MIN:MAX with 1 <= MIN <= MAX", s)
	}
	maxNodes = minNodes
	if isRange {
		if maxNodes, err = strconv.Atoi(strings.TrimSpace(hi)); err != nil || maxNodes < minNodes {
			return 0, 0, fmt.Errorf("--nnodes %q: want N or MIN:MAX with 1 <= MIN <= MAX", s)
		}
	}
	return minNodes, maxNodes, nil
}

// parseRdzvConf parses --rdzv-conf "key=value,...": join_timeout,
// last_call_timeout, keep_alive_interval (seconds) and
// keep_alive_max_attempt.
func parseRdzvConf(s string, e *Elastic) error {
	e.JoinTimeout, e.LastCall = DefaultJoinTimeout, DefaultLastCallTimeout
	interval, attempts := DefaultKeepAliveInterval, DefaultKeepAliveAttempts
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("--rdzv-conf %q: want key=value pairs separated by commas", kv)
		}
		k = strings.TrimSpace(k)
		if k == "keep_alive_max_attempt" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 1 {
				return fmt.Errorf("--rdzv-conf keep_alive_max_attempt=%s: want a positive integer", v)
			}
			attempts = n
			continue
		}
		secs, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || secs <= 0 {
			return fmt.Errorf("--rdzv-conf %s=%s: want a positive number of seconds", k, v)
		}
		d := time.Duration(secs * float64(time.Second))
		switch k {
		case "join_timeout":
			e.JoinTimeout = d
		case "last_call_timeout":
			e.LastCall = d
		case "keep_alive_interval":
			interval = d
		default:
			return fmt.Errorf("--rdzv-conf %s: unknown key (known: join_timeout, last_call_timeout, keep_alive_interval, keep_alive_max_attempt)", k)
		}
	}
	e.LeaseTTL = interval * time.Duration(attempts)
	return nil
}

// elasticSpec completes a launcher Spec for the elastic flags.
func elasticSpec(s *Spec, env map[string]string, f Flags) error {
	e := &Elastic{MinNodes: max(f.MinNodes, 1), MaxNodes: max(f.NNodes, 1), MaxRestarts: f.MaxRestarts,
		Backend: f.RdzvBackend, Endpoint: f.RdzvEndpoint}
	if e.MinNodes > e.MaxNodes {
		e.MinNodes = e.MaxNodes
	}
	if e.Backend == "" {
		e.Backend = BackendC10d
	}
	if err := parseRdzvConf(f.RdzvConf, e); err != nil {
		return err
	}
	if e.Endpoint == "" && env["MASTER_ADDR"] != "" && env["MASTER_PORT"] != "" {
		e.Endpoint = net.JoinHostPort(env["MASTER_ADDR"], env["MASTER_PORT"])
	}
	switch {
	case e.Backend == BackendEtcd && e.Endpoint == "":
		return fmt.Errorf("--rdzv-backend etcd needs --rdzv-endpoint host:port of the etcd cluster")
	case e.MaxNodes > 1 && e.Endpoint == "":
		return fmt.Errorf("--nnodes %d:%d needs --rdzv-endpoint host:port (where the first node's launcher hosts the rendezvous)", e.MinNodes, e.MaxNodes)
	case e.MaxNodes > 1 && s.Secret == "":
		return fmt.Errorf("--nnodes %d:%d: the launchers of an elastic job need the job secret before they meet: set the same random %s on every node", e.MinNodes, e.MaxNodes, EnvSecret)
	}
	if s.Secret == "" {
		s.Secret = randomHex(16) // one node: only its own workers need it
	}
	if s.JobID == "" {
		s.JobID = "titanrun-local-" + randomHex(8)
		if e.Endpoint != "" {
			s.JobID = "titanrun-" + e.Endpoint
		}
	}
	s.Mode, s.Source, s.Elastic = ModeLauncher, SourceFlags, e
	s.Endpoint = "" // each round's control server gets its own
	return nil
}

// notices receives the elastic launcher's round and restart messages.
var notices io.Writer = os.Stderr

// roundEnded is the result of a round that the rendezvous ended.
type roundEnded struct{ reason string }

func (e *roundEnded) Error() string { return "round ended: " + e.reason }

// openStore opens the rendezvous backend; closeFn releases it. hosting
// reports that this launcher serves the c10d rendezvous to other nodes.
func openStore(e *Elastic, secret string) (store rdzvStore, closeFn func(), hosting bool, err error) {
	switch e.Backend {
	case BackendEtcd:
		s, err := openEtcd(e.Endpoint, 10*time.Second)
		if err != nil {
			return nil, nil, false, err
		}
		return s, func() { s.Close() }, false, nil
	case BackendC10d:
		if e.Endpoint == "" {
			s := newMemStore()
			return s, func() { s.Close() }, false, nil
		}
		c, srv, err := openC10d(e.Endpoint, secret)
		if err != nil {
			return nil, nil, false, err
		}
		return c, func() {
			c.Close()
			if srv != nil {
				srv.Close()
			}
		}, srv != nil, nil
	}
	return nil, nil, false, fmt.Errorf("--rdzv-backend %q: want %s or %s", e.Backend, BackendC10d, BackendEtcd)
}

// superviseElastic runs an elastic launcher: rounds of rendezvous, each
// with its own control server (hosted by the round's node rank 0) and job
// id, until the workers of a round all succeed, the restarts run out or a
// signal ends it.
func superviseElastic(ctx context.Context, spec Spec, exe string, args []string, out *syncWriter) error {
	e := spec.Elastic
	say := func(format string, a ...any) { fmt.Fprintf(notices, "titanrun: "+format+"\n", a...) }
	sctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	store, closeStore, hosting, err := openStore(e, spec.Secret)
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	defer closeStore()
	host, _ := os.Hostname()
	nodeID := fmt.Sprintf("%04d-%s-%d", spec.NodeRank, host, os.Getpid())
	cfg := rdzvConfig{MinNodes: e.MinNodes, MaxNodes: e.MaxNodes, MaxRestarts: e.MaxRestarts,
		JoinTimeout: e.JoinTimeout, LastCall: e.LastCall, LeaseTTL: e.LeaseTTL}
	rz, err := newRendezvous(sctx, store, cfg, spec.JobID, nodeID)
	if err != nil {
		return fmt.Errorf("launch: %s rendezvous at %s: %w", e.Backend, e.Endpoint, err)
	}
	defer rz.close()
	say("node %s: %s rendezvous of job %s (%d to %d nodes, --max-restarts %d)", nodeID, e.Backend, spec.JobID, e.MinNodes, e.MaxNodes, e.MaxRestarts)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	for {
		info, err := rz.next(sctx)
		switch {
		case errors.Is(err, errJobDone):
			say("job %s already finished; nothing to do", spec.JobID)
			return nil
		case sctx.Err() != nil:
			return fmt.Errorf("launch: %w while waiting for the rendezvous", ErrInterrupted)
		case err != nil:
			return fmt.Errorf("launch: %w", err)
		}
		err = runRound(ctx, spec, exe, args, out, rz, info, sigs)
		k := info.Round
		var re *roundEnded
		var we *WorkerError
		var wf *worldUnfit
		switch {
		case err == nil:
			if ferr := rz.finish(context.Background(), k); ferr != nil {
				say("marking job %s finished: %v", spec.JobID, ferr)
			}
			if hosting {
				// The other nodes may still need the rendezvous to
				// finish; they leave it as they end.
				rz.awaitLeft(ctx, info, hostLinger)
			}
			return nil
		case errors.Is(err, ErrInterrupted):
			rz.end(context.Background(), k, fmt.Sprintf("node %s was interrupted", nodeID), endChange)
			return err
		case errors.As(err, &re), errors.As(err, &we), errors.As(err, &wf):
			reason, kind := err.Error(), endChange
			switch {
			case we != nil:
				reason, kind = "worker "+reason, endFailure
			case wf != nil:
				kind = endFatal
			}
			st, serr := rz.end(context.Background(), k, reason, kind)
			if serr != nil {
				return fmt.Errorf("launch: %w (after %v)", serr, err)
			}
			if st.Fatal != "" {
				say("%s; the job fails", st.Fatal)
				switch {
				case we != nil:
					return fmt.Errorf("launch: %w: %w", errNoRestarts, we)
				case wf != nil:
					return fmt.Errorf("launch: %w", wf)
				}
				return fmt.Errorf("launch: %w: %s", errNoRestarts, st.Fatal)
			}
			if st.Failure {
				say("%s; restart %d of %d from the latest checkpoint", st.Reason, st.Restarts, e.MaxRestarts)
			} else {
				say("%s; new rendezvous round %d, resuming from the latest checkpoint", st.Reason, st.Round)
			}
		default:
			return err
		}
	}
}

// runRound runs this node's workers for one closed round: node rank 0
// starts the round's control server and publishes it, the others wait for
// it; then the workers run until they are done or the rendezvous ends the
// round.
func runRound(ctx context.Context, spec Spec, exe string, args []string, out *syncWriter, rz *rendezvous, info roundInfo, sigs <-chan os.Signal) error {
	e := spec.Elastic
	k := info.Round
	rs := spec
	rs.NodeRank, rs.NNodes = info.NodeRank, len(info.Nodes)
	rs.WorldSize = rs.NNodes * rs.NProcPerNode
	jobID := fmt.Sprintf("%s-r%d", spec.JobID, k)
	if e.CheckWorld != nil {
		if err := e.CheckWorld(rs.WorldSize); err != nil {
			return &worldUnfit{rs.WorldSize, err}
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var endpoint string
	var events <-chan control.Event
	if info.NodeRank == 0 {
		listen, advertise := "127.0.0.1:0", ""
		if h, _, _ := net.SplitHostPort(e.Endpoint); e.Endpoint != "" && !isLoopback(h) {
			listen, advertise = ":0", routeHost(e.Endpoint)
		}
		round := spec
		round.JobID = jobID // the certificate derives from the round's job id
		tlsConf, err := round.serverTLS()
		if err != nil {
			return fmt.Errorf("launch: %w", err)
		}
		srv, err := control.NewServer(control.ServerConfig{
			Addr: listen, JobID: jobID, Secret: spec.Secret, WorldSize: rs.WorldSize,
			TLS: tlsConf, HeartbeatTimeout: heartbeatTimeout,
		})
		if err != nil {
			return fmt.Errorf("launch: starting the control server of round %d: %w", k, err)
		}
		defer srv.Stop()
		go srv.Serve()
		endpoint = srv.Addr()
		if advertise != "" {
			_, port, _ := net.SplitHostPort(endpoint)
			endpoint = net.JoinHostPort(advertise, port)
		}
		events = srv.Events()
		if err := rz.publishEndpoint(wctx, k, endpoint); err != nil {
			return fmt.Errorf("launch: %w", err)
		}
	} else {
		var err error
		if endpoint, err = rz.endpoint(wctx, info); err != nil {
			return fmt.Errorf("launch: %w", err)
		}
		if endpoint == "" {
			return &roundEnded{fmt.Sprintf("round %d ended before its control server started", k)}
		}
	}
	l := &launcher{spec: rs, exe: exe, args: args, out: out,
		ended: rz.watch(wctx, info),
		onFail: func(err error) {
			// Tell the other nodes at once; runRound's caller ends the
			// round again (a no-op then) once the workers are stopped.
			go rz.end(context.Background(), k, "worker "+err.Error(), endFailure)
		},
		extraEnv: []string{
			EnvRestartCount + "=" + strconv.Itoa(info.Restarts),
			EnvMaxRestarts + "=" + strconv.Itoa(e.MaxRestarts),
			EnvRunID + "=" + spec.JobID,
		},
	}
	l.started = func(pids []int) {
		fmt.Fprintf(notices, "titanrun: round %d: node rank %d of %d, world size %d, ranks %d..%d (pids %v), control plane %s\n",
			k, rs.NodeRank, rs.NNodes, rs.WorldSize, rs.NodeRank*rs.NProcPerNode, (rs.NodeRank+1)*rs.NProcPerNode-1, pids, endpoint)
	}
	return l.supervise(ctx, sigs, endpoint, jobID, spec.Secret, events)
}

// ElasticRound returns the run id and the rendezvous round of a worker of
// an elastic job, read from its environment (os.Environ() form); ok is
// false for any other process.
func ElasticRound(environ []string) (runID string, round int, ok bool) {
	env := envMap(environ)
	runID = env[EnvRunID]
	rest, found := strings.CutPrefix(env[EnvJobID], runID+"-r")
	if runID == "" || !found {
		return "", 0, false
	}
	round, err := strconv.Atoi(rest)
	if err != nil || round < 0 {
		return "", 0, false
	}
	return runID, round, true
}
