package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/titan-go/titan/internal/checkpoint"
	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/launch"
	"github.com/titan-go/titan/internal/livemetrics"
)

// launchFlags are torchrun's flags, shared by train and bench comm, and
// train's observability flags (registerObservability).
type launchFlags struct {
	f      launch.Flags
	nnodes string // --nnodes N or MIN:MAX, parsed into f
	// checkWorld, when set, is an elastic launcher's
	// launch.Elastic.CheckWorld.
	checkWorld    func(world int) error
	metricsAddr   string
	metricsPublic bool
	pprof         bool
}

// registerObservability adds --metrics-addr, --metrics-public and --pprof.
func (l *launchFlags) registerObservability(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&l.metricsAddr, "metrics-addr", "", "serve the job's live metrics (Prometheus text format) at http://ADDR/metrics, e.g. 127.0.0.1:9400 (loopback only unless --metrics-public)")
	fs.BoolVar(&l.metricsPublic, "metrics-public", false, "allow --metrics-addr on a non-loopback address")
	fs.BoolVar(&l.pprof, "pprof", false, "every worker serves net/http/pprof on a loopback port, logged at start")
}

func (l *launchFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.IntVar(&l.f.NProc, "nproc", 0, "worker processes on this node (they split the CPU cores)")
	fs.StringVar(&l.nnodes, "nnodes", "", "number of nodes (one launcher per node), or MIN:MAX for an elastic job")
	fs.IntVar(&l.f.NodeRank, "node-rank", 0, "this node's index in [0, nnodes) (elastic jobs: orders the nodes)")
	fs.StringVar(&l.f.RdzvEndpoint, "rdzv-endpoint", "", "host:port of the rendezvous: the control server node 0 hosts (c10d), or the etcd cluster")
	fs.IntVar(&l.f.MaxRestarts, "max-restarts", 0, "restart every worker from the latest checkpoint at most this many times when one dies or stops answering")
	fs.StringVar(&l.f.RdzvBackend, "rdzv-backend", "", "rendezvous backend of an elastic job: c10d (built in, hosted by the first node's launcher; default) or etcd")
	fs.StringVar(&l.f.RdzvConf, "rdzv-conf", "", "elastic rendezvous settings key=value,...: join_timeout (600), last_call_timeout (30), keep_alive_interval (5), keep_alive_max_attempt (3)")
	fs.StringVar(&l.f.SecretFile, "rdzv-secret-file", "", "file holding the job secret (mode 0600; also "+launch.EnvSecretFile+"); node 0 of several generates one when no secret is given")
	fs.StringVar(&l.f.RdzvID, "rdzv-id", "", "job id every node presents (default: derived from --rdzv-endpoint)")
}

// flags returns the parsed launcher flags.
func (l *launchFlags) flags() (launch.Flags, error) {
	f := l.f
	lo, hi, err := launch.ParseNNodes(l.nnodes)
	if err != nil {
		return f, err
	}
	f.NNodes = hi
	if lo < hi {
		f.MinNodes = lo
	}
	return f, nil
}

// commandArgs are the arguments titan was started with; workers are
// started with the same ones (the launcher flags then do nothing).
var commandArgs = os.Args[1:]

// commSettings configure a worker's process groups.
type commSettings struct {
	// Timeout bounds each collective (comm.train_timeout_seconds).
	Timeout time.Duration
	// InitTimeout bounds the bootstrap (comm.init_timeout_seconds; 0:
	// launch's default).
	InitTimeout time.Duration
	// TraceDir receives the flight recorder dumps.
	TraceDir string
	// FlightSize is comm.Options.FlightSize (comm.FlightSizeOf of
	// comm.trace_buf_size; 0: comm's default).
	FlightSize int
}

// commSettingsOf reads a recipe's [comm] section.
func commSettingsOf(job *config.Job) commSettings {
	return commSettings{
		Timeout:     time.Duration(job.Comm.TrainTimeoutSeconds) * time.Second,
		InitTimeout: time.Duration(job.Comm.InitTimeoutSeconds) * time.Second,
		TraceDir:    traceDir(job.Job.DumpFolder, job.Comm.SaveTracesFolder),
		FlightSize:  comm.FlightSizeOf(job.Comm.TraceBufSize),
	}
}

// distributed runs fn as this process's part of a job: as a launcher it
// spawns the workers (which re-enter here) and supervises them, copying
// their output to out; as a
// worker it joins the job first; standalone it calls fn(nil).
func (l *launchFlags) distributed(ctx context.Context, out io.Writer, cs commSettings, fn func(w *launch.Worker) error) error {
	f, err := l.flags()
	if err != nil {
		return err
	}
	spec, err := launch.Detect(os.Environ(), f)
	if err != nil {
		return err
	}
	switch spec.Mode {
	case launch.ModeLauncher:
		if spec.Elastic != nil {
			spec.Elastic.CheckWorld = l.checkWorld
		} else if l.checkWorld != nil {
			// A fixed world: refuse a layout it cannot hold before any
			// worker starts (each would refuse it on its own).
			if err := l.checkWorld(spec.NNodes * spec.NProcPerNode); err != nil {
				return err
			}
		}
		spec.MetricsAddr, spec.MetricsPublic, spec.Pprof = l.metricsAddr, l.metricsPublic, l.pprof
		// The launcher forwards Ctrl-C to its workers itself and waits for
		// them to save; the signal must not cancel it.
		return launch.Launch(context.WithoutCancel(ctx), spec, commandArgs, out)
	case launch.ModeWorker:
		if id, round, ok := launch.ElasticRound(os.Environ()); ok {
			// The dump folder's lock of an earlier round is stale.
			checkpoint.ElasticRound.Job, checkpoint.ElasticRound.Round = id, round
		}
		defer comm.InstallFlightDumpOnSignal(cs.TraceDir)()
		w, err := launch.JoinOptions(ctx, spec, comm.Options{Timeout: cs.Timeout, InitTimeout: cs.InitTimeout, TraceDir: cs.TraceDir, FlightSize: cs.FlightSize})
		if err != nil {
			return err
		}
		err = fn(w)
		if cerr := w.Close(err); err == nil {
			err = cerr
		}
		return err
	}
	stop, err := l.standaloneObservability(out)
	if err != nil {
		return err
	}
	defer stop()
	return fn(nil)
}

// standaloneObservability serves --metrics-addr from this process and
// asks it for --pprof when there is no launcher to do so.
func (l *launchFlags) standaloneObservability(out io.Writer) (func(), error) {
	if l.pprof {
		os.Setenv(livemetrics.EnvPprof, "127.0.0.1:0")
	}
	if l.metricsAddr == "" {
		return func() {}, nil
	}
	srv, err := livemetrics.StartServer(l.metricsAddr, "standalone", l.metricsPublic)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "titan: live metrics on http://%s/metrics\n", srv.Addr)
	os.Setenv(livemetrics.EnvFile, srv.File)
	return func() { os.Unsetenv(livemetrics.EnvFile); srv.Close() }, nil
}

// traceDir is where workers dump their flight recorders.
func traceDir(dumpFolder, sub string) string {
	if sub == "" {
		return ""
	}
	if filepath.IsAbs(sub) {
		return sub
	}
	return filepath.Join(dumpFolder, sub)
}
