// Package livemetrics carries a running job's figures to its launcher,
// which serves them as a Prometheus text endpoint, and starts a worker's
// opt-in pprof server.
//
// Rank 0 writes a Snapshot after every step to the file named by the
// environment variable EnvFile (write to a temporary file, rename: a
// reader never sees half a snapshot); the launcher sets EnvFile for its
// workers when it serves metrics (titan train --metrics-addr) and renders
// the newest snapshot on every scrape of /metrics (WritePrometheus).
// Every rank's figures reach rank 0 through the all-reduce the ranks
// already run each step to agree on stopping (package train), so the
// endpoint shows per-rank step time and memory without another channel.
//
// A worker whose environment sets EnvPprof to a loopback host:port
// (titan train --pprof sets 127.0.0.1:0 for every worker) serves
// net/http/pprof there and logs the address.
package livemetrics

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Environment variables of the workers.
const (
	EnvFile  = "TITAN_LIVE_METRICS_FILE"
	EnvPprof = "TITAN_PPROF_ADDR"
)

// Rank is one rank's figures of its latest step.
type Rank struct {
	Rank int    `json:"rank"`
	Host string `json:"host"`
	// StepS is the rank's step time, ComputeS that step less the time it
	// was blocked in communication, in seconds.
	StepS    float64 `json:"step_s"`
	ComputeS float64 `json:"compute_s"`
	// MemGiB is the rank's peak resident memory.
	MemGiB float64 `json:"mem_gib"`
}

// Snapshot is the job's state after a step.
type Snapshot struct {
	Time         time.Time `json:"time"`
	Step         int       `json:"step"`
	Steps        int       `json:"steps"` // training.steps
	Loss         float64   `json:"loss"`
	StepsPerSec  float64   `json:"steps_per_sec"`
	TokensPerSec float64   `json:"tokens_per_sec"`
	MFU          float64   `json:"mfu"` // percent
	// Stragglers is the number of straggler reports so far.
	Stragglers int    `json:"stragglers"`
	Ranks      []Rank `json:"ranks"`
}

// Write replaces the snapshot at path atomically.
func Write(path string, s Snapshot) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".live-*")
	if err != nil {
		return fmt.Errorf("livemetrics: %w", err)
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("livemetrics: writing %s: %w", path, err)
	}
	return nil
}

// Read loads the snapshot at path; ok is false when none was written yet.
func Read(path string) (s Snapshot, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, false, fmt.Errorf("livemetrics: %s: %w", path, err)
	}
	return s, true, nil
}

// Names of the endpoint's metric families (titan top reads them). Every
// sample has the label job_id; the per-rank ones rank and host too.
const (
	MetricUp           = "titan_job_up"
	MetricStep         = "titan_step"
	MetricSteps        = "titan_steps_total_planned"
	MetricLoss         = "titan_loss"
	MetricStepsPerSec  = "titan_steps_per_second"
	MetricTokensPerSec = "titan_tokens_per_second"
	MetricMFU          = "titan_mfu_percent"
	MetricStragglers   = "titan_stragglers_reported"
	MetricRankStep     = "titan_rank_step_seconds"
	MetricRankCompute  = "titan_rank_compute_seconds"
	MetricRankMemory   = "titan_rank_memory_bytes"
	MetricLastUpdate   = "titan_last_update_timestamp_seconds"
)

// metric is one Prometheus metric family.
type metric struct{ name, kind, help string }

var (
	mUp         = metric{MetricUp, "gauge", "1 while the job runs and rank 0 has reported a step."}
	mStep       = metric{MetricStep, "gauge", "Steps completed."}
	mSteps      = metric{MetricSteps, "gauge", "training.steps of the run."}
	mLoss       = metric{MetricLoss, "gauge", "Loss of the latest step."}
	mStepsPS    = metric{MetricStepsPerSec, "gauge", "Optimizer steps per second (latest step)."}
	mTPS        = metric{MetricTokensPerSec, "gauge", "Tokens trained on per second, the whole job."}
	mMFU        = metric{MetricMFU, "gauge", "Model FLOPs utilisation, percent of the job's peak."}
	mStraggler  = metric{MetricStragglers, "counter", "Straggler reports so far."}
	mRankStep   = metric{MetricRankStep, "gauge", "Each rank's latest step time."}
	mRankComp   = metric{MetricRankCompute, "gauge", "Each rank's latest step time less its time blocked in communication."}
	mRankMem    = metric{MetricRankMemory, "gauge", "Each rank's peak resident memory."}
	mLastUpdate = metric{MetricLastUpdate, "gauge", "When rank 0 wrote the snapshot (Unix time)."}
)

// WritePrometheus renders s in the Prometheus text exposition format
// (version 0.0.4); ok false renders only titan_job_up 0.
func WritePrometheus(w io.Writer, job string, s Snapshot, ok bool) error {
	var b strings.Builder
	lbl := fmt.Sprintf(`job_id="%s"`, escape(job))
	head := func(m metric) { fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.kind) }
	one := func(m metric, v float64) {
		head(m)
		fmt.Fprintf(&b, "%s{%s} %s\n", m.name, lbl, num(v))
	}
	if !ok {
		one(mUp, 0)
		_, err := io.WriteString(w, b.String())
		return err
	}
	one(mUp, 1)
	one(mStep, float64(s.Step))
	one(mSteps, float64(s.Steps))
	one(mLoss, s.Loss)
	one(mStepsPS, s.StepsPerSec)
	one(mTPS, s.TokensPerSec)
	one(mMFU, s.MFU)
	one(mStraggler, float64(s.Stragglers))
	one(mLastUpdate, float64(s.Time.UnixNano())/1e9)
	for _, m := range []metric{mRankStep, mRankComp, mRankMem} {
		head(m)
		for _, r := range s.Ranks {
			v := r.StepS
			switch m {
			case mRankComp:
				v = r.ComputeS
			case mRankMem:
				v = r.MemGiB * (1 << 30)
			}
			fmt.Fprintf(&b, "%s{%s,rank=\"%d\",host=\"%s\"} %s\n", m.name, lbl, r.Rank, escape(r.Host), num(v))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func num(v float64) string { return fmt.Sprintf("%g", v) }

// escape escapes a label value (backslash, quote, newline).
func escape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// Handler serves /metrics from the snapshot file at path.
func Handler(job, path string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		s, ok, err := Read(path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		WritePrometheus(w, job, s, ok)
	})
	return mux
}

// CheckLoopback refuses an address whose host is not a loopback address
// (or "localhost"), unless public is set: metrics and profiles are not
// for the network by default.
func CheckLoopback(flag, addr string, public bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: want host:port: %w", flag, addr, err)
	}
	if public || host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		hint := ""
		if flag == "--metrics-addr" {
			hint = " unless --metrics-public says to serve the network"
		}
		return fmt.Errorf("%s %q: not a loopback address; metrics and profiles are served on loopback only (127.0.0.1:PORT)%s", flag, addr, hint)
	}
	return nil
}

// serve listens on addr and serves h until the server is closed; it
// returns the server and its address (the port picked for ":0").
func serve(addr string, h http.Handler) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return srv, ln.Addr().String(), nil
}

// StartPprof serves net/http/pprof on the loopback address of EnvPprof, if
// set, and returns the address it listens on ("" when off).
func StartPprof() (string, error) {
	addr := os.Getenv(EnvPprof)
	if addr == "" {
		return "", nil
	}
	if err := CheckLoopback(EnvPprof, addr, false); err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	_, at, err := serve(addr, mux)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", EnvPprof, addr, err)
	}
	return at, nil
}

// Server is a running metrics endpoint.
type Server struct {
	// File is the snapshot file rank 0 writes (pass it to the workers as
	// EnvFile); Addr the address the endpoint listens on.
	File, Addr string
	srv        *http.Server
	dir        string
}

// StartServer serves the job's live metrics on addr (loopback unless
// public) at /metrics, from a snapshot file in a new temporary folder.
func StartServer(addr, job string, public bool) (*Server, error) {
	if err := CheckLoopback("--metrics-addr", addr, public); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "titan-live-")
	if err != nil {
		return nil, fmt.Errorf("livemetrics: %w", err)
	}
	s := &Server{File: filepath.Join(dir, "live.json"), dir: dir}
	if s.srv, s.Addr, err = serve(addr, Handler(job, s.File)); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	return s, nil
}

// Close stops the endpoint (its open connections too) and removes the
// snapshot.
func (s *Server) Close() error {
	err := s.srv.Close()
	os.RemoveAll(s.dir)
	return err
}
