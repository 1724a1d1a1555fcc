package launch

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net"
	"runtime"
	"strconv"
	"strings"
)

// Mode says how a process takes part in a run.
type Mode int

const (
	// ModeStandalone is a single training process with no control plane,
	// as when titan runs without any launcher flags or environment.
	ModeStandalone Mode = iota
	// ModeLauncher is a launcher on one node: it spawns NProcPerNode local
	// workers (and on node rank 0 hosts the control server); see Launch.
	ModeLauncher
	// ModeWorker is one worker of a distributed job; see Join.
	ModeWorker
)

// String returns "standalone", "launcher" or "worker".
func (m Mode) String() string {
	switch m {
	case ModeStandalone:
		return "standalone"
	case ModeLauncher:
		return "launcher"
	case ModeWorker:
		return "worker"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Sources of a worker Spec, in Spec.Source.
const (
	SourceFlags    = "flags"    // launcher flags (--nproc, --nnodes, ...)
	SourceTitanrun = "titanrun" // a worker spawned by Launch
	SourceSlurm    = "slurm"    // a task started by srun
	SourceEnv      = "env"      // the env:// convention (Kubernetes, manual)
)

// Environment variables that Launch sets for its workers, beside the
// torchrun names RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK,
// MASTER_ADDR and MASTER_PORT.
const (
	EnvEndpoint = "TITANRUN_ENDPOINT" // control-plane address, host:port
	EnvSecret   = "TITANRUN_SECRET"   // job secret every joiner presents
	EnvJobID    = "TITANRUN_JOB_ID"   // job id every joiner presents
	EnvThreads  = "TITANRUN_THREADS"  // CPU threads each worker should use

	// Optional TLS for the control plane: PEM files of a certificate and
	// its key, and of a CA bundle. See Spec.TLSCert.
	EnvTLSCert = "TITANRUN_TLS_CERT"
	EnvTLSKey  = "TITANRUN_TLS_KEY"
	EnvTLSCA   = "TITANRUN_TLS_CA"
)

// Flags holds the launcher flags of `titan train` and `titan bench comm`,
// named as torchrun names them. The zero value means no flag was given.
type Flags struct {
	// NProc is --nproc, the number of worker processes on this node;
	// 0 means not given (1).
	NProc int
	// NNodes is --nnodes, the number of nodes; 0 means not given (1).
	NNodes int
	// NodeRank is --node-rank, this node's index in [0, NNodes).
	NodeRank int
	// RdzvEndpoint is --rdzv-endpoint, host:port of the control server
	// that node rank 0 hosts. Required with NNodes > 1 unless MASTER_ADDR
	// and MASTER_PORT are set; optional on one node (default: loopback
	// on a free port).
	RdzvEndpoint string
	// SecretFile is --rdzv-secret-file, a file that holds the job secret
	// (see ReadSecretFile); TITANRUN_SECRET_FILE and TITANRUN_SECRET are
	// the other ways to give it.
	SecretFile string

	// Elastic launches (see Elastic). MinNodes is MIN of --nnodes
	// MIN:MAX (NNodes is MAX); 0 means the same as NNodes.
	MinNodes int
	// MaxRestarts is --max-restarts.
	MaxRestarts int
	// RdzvBackend is --rdzv-backend: "" or "c10d", or "etcd".
	RdzvBackend string
	// RdzvConf is --rdzv-conf, torchrun's key=value,... list.
	RdzvConf string
	// RdzvID is --rdzv-id, the job id every node presents ("" derives
	// one from the endpoint).
	RdzvID string
}

// given reports whether any launcher flag asks for more than one process.
func (f Flags) given() bool {
	return f.NProc > 1 || f.NNodes > 1 || f.NodeRank > 0 || f.RdzvEndpoint != "" || f.elastic()
}

// Spec describes how this process takes part in a run. Detect fills it in
// from the flags and the environment.
type Spec struct {
	// Mode is standalone, launcher or worker.
	Mode Mode
	// Source is what configured the process: SourceFlags for a launcher,
	// SourceTitanrun, SourceSlurm or SourceEnv for a worker, "" when
	// standalone.
	Source string

	// NProcPerNode is the number of workers a launcher spawns on its node.
	NProcPerNode int
	// NNodes is the number of nodes (launchers, or Slurm nodes).
	NNodes int
	// NodeRank is this node's index in [0, NNodes).
	NodeRank int
	// Endpoint is the control server's host:port. Empty for a one-node
	// launcher until Launch picks a loopback port.
	Endpoint string
	// MetricsAddr, when not "", is where a launcher of node rank 0
	// serves the job's live metrics (Prometheus text format, package
	// livemetrics); MetricsPublic allows a non-loopback address.
	MetricsAddr   string
	MetricsPublic bool
	// Pprof makes every worker serve net/http/pprof on a loopback port.
	Pprof bool
	// JobID identifies the run; every joiner presents it. A one-node
	// launcher makes up a random one when empty.
	JobID string
	// Secret is the job secret every joiner presents. A launcher on node
	// rank 0 generates one when empty.
	Secret string

	// Rank is the worker's global rank in [0, WorldSize).
	Rank int
	// LocalRank is the worker's index on its node in [0, LocalWorldSize).
	LocalRank int
	// WorldSize is the number of workers in the job.
	WorldSize int
	// LocalWorldSize is the number of workers on this worker's node.
	LocalWorldSize int
	// HostServer reports whether this worker starts the control server
	// itself (rank 0 under Slurm and env://), listening on ListenAddr.
	HostServer bool
	// ListenAddr is where a hosting worker's control server listens: the
	// endpoint itself for a loopback endpoint, all interfaces on the
	// endpoint's port otherwise.
	ListenAddr string
	// Threads is the number of CPU threads this worker should use, so that
	// the workers of a node split its cores (TITANRUN_THREADS, else
	// SLURM_CPUS_PER_TASK under Slurm, else cores / local world size).
	// For a launcher it is the share each spawned worker gets. 0 when
	// standalone: use all cores.
	Threads int

	// TLSCert and TLSKey (TITANRUN_TLS_CERT, TITANRUN_TLS_KEY) turn on TLS
	// for the control plane: the control server serves this certificate
	// and every client presents it too. TLSCA (TITANRUN_TLS_CA) is the CA
	// bundle clients verify the server with (the system roots when empty);
	// with it, the server also requires client certificates signed by it.
	// The certificate must name the endpoint's host (an IP SAN for an IP).
	// Launch passes the three to its workers. Empty: the control plane
	// speaks TLS with the certificate control.JobTLS derives from the job
	// secret and job id.
	TLSCert, TLSKey, TLSCA string

	// Elastic is set for an elastic launcher (--max-restarts,
	// --nnodes MIN:MAX, --rdzv-backend etcd); nil otherwise.
	Elastic *Elastic
}

// Detect works out how this process takes part in a run from its launcher
// flags and environment (os.Environ() form, "KEY=value"). In order:
//
//   - TITANRUN_ENDPOINT set: a worker spawned by Launch. RANK, LOCAL_RANK,
//     WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, TITANRUN_SECRET and
//     TITANRUN_JOB_ID must be set too. Launcher flags are ignored (the
//     launcher already applied them), so the launcher may pass its own
//     arguments to its workers unchanged.
//   - SLURM_PROCID and SLURM_STEP_ID set (a task of an srun job step; a
//     batch script has no step id): a worker with Slurm's rank, task and
//     node layout. Rank 0 hosts the control server on the first node of the
//     step's node list, at a port derived from the job and step ids
//     (20000 + hash % 20000) unless MASTER_PORT is set; the job secret is
//     TITANRUN_SECRET or else derived from the job id, step id and user id
//     (see the package documentation for what that protects against). A
//     one-task step is standalone; launcher flags in a many-task step are an
//     error (srun already started the workers).
//   - MASTER_ADDR set, or WORLD_SIZE > 1 (the env:// convention, e.g. a
//     Kubernetes indexed Job or JobSet): a worker. MASTER_ADDR, MASTER_PORT,
//     WORLD_SIZE and RANK or NODE_RANK are required; LOCAL_RANK and
//     LOCAL_WORLD_SIZE default to 0 and 1. Rank 0 hosts the control server.
//     Unless MASTER_ADDR is a loopback address, TITANRUN_SECRET is
//     required. WORLD_SIZE=1 is standalone. With launcher flags (one
//     launcher per pod) --nnodes must be given, and MASTER_ADDR:MASTER_PORT
//     is the default --rdzv-endpoint.
//   - --nproc > 1 or --nnodes > 1: a launcher. Several nodes need
//     --rdzv-endpoint; nodes other than rank 0 need the job secret: the
//     file node rank 0 generated (--rdzv-secret-file), or the secret every
//     node was given.
//   - Otherwise standalone.
//
// The job secret comes from --rdzv-secret-file, TITANRUN_SECRET_FILE or
// TITANRUN_SECRET (one of them; see ReadSecretFile and the package
// documentation). In every mode but standalone, TITANRUN_TLS_CERT,
// TITANRUN_TLS_KEY and TITANRUN_TLS_CA give the control plane the user's
// certificates instead of the one derived from the secret (see
// Spec.TLSCert).
// Inconsistent or incomplete settings are errors naming the variable or
// flag at fault.
func Detect(environ []string, flags Flags) (Spec, error) {
	env := envMap(environ)
	spec, err := detect(env, flags)
	if err != nil || spec.Mode == ModeStandalone {
		return spec, err
	}
	spec.TLSCert, spec.TLSKey, spec.TLSCA = env[EnvTLSCert], env[EnvTLSKey], env[EnvTLSCA]
	switch {
	case (spec.TLSCert == "") != (spec.TLSKey == ""):
		return Spec{}, fmt.Errorf("%s and %s must be set together (got %q and %q)", EnvTLSCert, EnvTLSKey, spec.TLSCert, spec.TLSKey)
	case spec.TLSCA != "" && spec.TLSCert == "":
		return Spec{}, fmt.Errorf("%s=%s is set without %s and %s: TLS needs a certificate and key for the control server", EnvTLSCA, spec.TLSCA, EnvTLSCert, EnvTLSKey)
	}
	return spec, nil
}

func detect(env map[string]string, flags Flags) (Spec, error) {
	if err := checkFlags(flags); err != nil {
		return Spec{}, err
	}
	if _, ok := env[EnvEndpoint]; ok {
		return detectTitanrun(env)
	}
	if _, ok := env["SLURM_PROCID"]; ok && (has(env, "SLURM_STEP_ID") || has(env, "SLURM_STEPID")) {
		spec, err := detectSlurm(env, flags)
		if err != nil || spec.Mode != ModeLauncher {
			return spec, err
		}
		// A one-task step running a launcher: fall through to the flags.
	} else if spec, ok, err := detectEnvRendezvous(env, flags); ok || err != nil {
		return spec, err
	}
	if flags.given() {
		return detectLauncher(env, flags)
	}
	return Spec{Mode: ModeStandalone}, nil
}

// envMap turns KEY=value pairs into a map; later pairs win, as in os/exec.
func envMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			m[k] = v
		}
	}
	return m
}

func has(env map[string]string, key string) bool {
	_, ok := env[key]
	return ok
}

// first returns the value of the first of keys that is set, and its name.
func first(env map[string]string, keys ...string) (value, key string, ok bool) {
	for _, k := range keys {
		if v, ok := env[k]; ok {
			return v, k, true
		}
	}
	return "", keys[0], false
}

// intVar parses the integer variable key, which must be set when required.
// It reports whether the variable was set.
func intVar(env map[string]string, key string, required bool, min int) (int, bool, error) {
	v, ok := env[key]
	if !ok {
		if required {
			return 0, false, fmt.Errorf("%s is not set", key)
		}
		return 0, false, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, true, fmt.Errorf("%s=%q: not an integer", key, v)
	}
	if n < min {
		return 0, true, fmt.Errorf("%s=%d: must be at least %d", key, n, min)
	}
	return n, true, nil
}

func checkFlags(f Flags) error {
	switch {
	case f.NProc < 0:
		return fmt.Errorf("--nproc %d: must be at least 1", f.NProc)
	case f.NNodes < 0:
		return fmt.Errorf("--nnodes %d: must be at least 1", f.NNodes)
	case f.NodeRank < 0:
		return fmt.Errorf("--node-rank %d: must not be negative", f.NodeRank)
	case f.NodeRank > 0 && f.NodeRank >= max(f.NNodes, 1):
		return fmt.Errorf("--node-rank %d: must be below --nnodes %d", f.NodeRank, max(f.NNodes, 1))
	}
	switch {
	case f.MaxRestarts < 0:
		return fmt.Errorf("--max-restarts %d: must not be negative", f.MaxRestarts)
	case f.MinNodes < 0 || (f.MinNodes > 0 && f.MinNodes > max(f.NNodes, 1)):
		return fmt.Errorf("--nnodes %d:%d: want 1 <= MIN <= MAX", f.MinNodes, f.NNodes)
	case f.RdzvBackend != "" && f.RdzvBackend != BackendC10d && f.RdzvBackend != BackendEtcd:
		return fmt.Errorf("--rdzv-backend %q: want %s or %s", f.RdzvBackend, BackendC10d, BackendEtcd)
	}
	if f.RdzvBackend == BackendEtcd && f.RdzvEndpoint != "" {
		for _, ep := range strings.Split(f.RdzvEndpoint, ",") {
			if err := checkEndpoint(strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://")); err != nil {
				return fmt.Errorf("--rdzv-endpoint: %w", err)
			}
		}
	} else if f.RdzvEndpoint != "" {
		if err := checkEndpoint(f.RdzvEndpoint); err != nil {
			return fmt.Errorf("--rdzv-endpoint: %w", err)
		}
	}
	return nil
}

// checkEndpoint checks a host:port with a port in 1..65535.
func checkEndpoint(ep string) error {
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return fmt.Errorf("%q: want host:port: %v", ep, err)
	}
	if host == "" {
		return fmt.Errorf("%q: missing host", ep)
	}
	if _, err := parsePort(port); err != nil {
		return fmt.Errorf("%q: %w", ep, err)
	}
	return nil
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %q: want a number in 1..65535", s)
	}
	return p, nil
}

// isLoopback reports whether host names this machine only: localhost or a
// loopback IP literal. Host names are not resolved.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// listenAddrFor returns where a control server for endpoint listens: the
// endpoint itself when its host is a loopback address, else every interface
// on the endpoint's port (the host name may not be one this machine can
// bind, e.g. a load balancer or a name that resolves to 127.0.1.1).
func listenAddrFor(endpoint string) string {
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil || isLoopback(host) {
		return endpoint
	}
	return net.JoinHostPort("", port)
}

// threadShare returns TITANRUN_THREADS when set, else fallback if positive,
// else the cores divided among local workers (at least 1).
func threadShare(env map[string]string, fallback, local int) (int, error) {
	if n, ok, err := intVar(env, EnvThreads, false, 1); ok || err != nil {
		return n, err
	}
	if fallback > 0 {
		return fallback, nil
	}
	return max(1, runtime.NumCPU()/max(local, 1)), nil
}

func detectTitanrun(env map[string]string) (Spec, error) {
	s := Spec{Mode: ModeWorker, Source: SourceTitanrun}
	var err error
	ints := []struct {
		key string
		dst *int
		min int
	}{
		{"RANK", &s.Rank, 0},
		{"LOCAL_RANK", &s.LocalRank, 0},
		{"WORLD_SIZE", &s.WorldSize, 1},
		{"LOCAL_WORLD_SIZE", &s.LocalWorldSize, 1},
		{"NODE_RANK", &s.NodeRank, 0},
	}
	for _, v := range ints {
		if *v.dst, _, err = intVar(env, v.key, true, v.min); err != nil {
			return Spec{}, fmt.Errorf("worker environment (%s is set): %w", EnvEndpoint, err)
		}
	}
	for _, v := range []struct {
		key string
		dst *string
	}{{EnvEndpoint, &s.Endpoint}, {EnvSecret, &s.Secret}, {EnvJobID, &s.JobID}} {
		*v.dst = env[v.key]
		if *v.dst == "" {
			return Spec{}, fmt.Errorf("worker environment (%s is set): %s is not set", EnvEndpoint, v.key)
		}
	}
	if err := checkEndpoint(s.Endpoint); err != nil {
		return Spec{}, fmt.Errorf("%s: %w", EnvEndpoint, err)
	}
	if err := checkLayout(&s, "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"); err != nil {
		return Spec{}, err
	}
	s.NProcPerNode = s.LocalWorldSize
	s.NNodes = (s.WorldSize + s.LocalWorldSize - 1) / s.LocalWorldSize
	if s.NodeRank >= s.NNodes {
		return Spec{}, fmt.Errorf("NODE_RANK=%d: must be below WORLD_SIZE/LOCAL_WORLD_SIZE = %d", s.NodeRank, s.NNodes)
	}
	if s.Threads, err = threadShare(env, 0, s.LocalWorldSize); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// checkLayout checks rank < world size, local rank < local world size and
// local world size <= world size, naming the variables.
func checkLayout(s *Spec, rank, localRank, world, localWorld string) error {
	switch {
	case s.Rank >= s.WorldSize:
		return fmt.Errorf("%s=%d: must be below %s=%d", rank, s.Rank, world, s.WorldSize)
	case s.LocalWorldSize > s.WorldSize:
		return fmt.Errorf("%s=%d: must not exceed %s=%d", localWorld, s.LocalWorldSize, world, s.WorldSize)
	case s.LocalRank >= s.LocalWorldSize:
		return fmt.Errorf("%s=%d: must be below %s=%d", localRank, s.LocalRank, localWorld, s.LocalWorldSize)
	}
	return nil
}

// SlurmPort returns the control-server port for a Slurm job step:
// 20000 + FNV-1a(jobID "." stepID) % 20000, so that every task of the step
// computes the same port without talking to the others, and concurrent
// steps most likely differ. MASTER_PORT overrides it.
func SlurmPort(jobID, stepID string) int {
	h := fnv.New32a()
	h.Write([]byte(jobID + "." + stepID))
	return 20000 + int(h.Sum32()%20000)
}

// derivedSecret makes a job secret that every process of a job computes
// alike from what they share; see the package documentation for the trust
// assumption.
func derivedSecret(parts ...string) string {
	h := sha256.New()
	h.Write([]byte("titanrun derived secret v1"))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// uid is the user id mixed into derived secrets; a variable for tests.
var uid = currentUID

func detectSlurm(env map[string]string, flags Flags) (Spec, error) {
	ntasks, key, ok := first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
	if !ok {
		return Spec{}, fmt.Errorf("slurm task (SLURM_PROCID is set): SLURM_NTASKS is not set")
	}
	n, err := strconv.Atoi(ntasks)
	if err != nil || n < 1 {
		return Spec{}, fmt.Errorf("%s=%q: want a positive integer", key, ntasks)
	}
	if flags.given() {
		if n > 1 {
			return Spec{}, fmt.Errorf("%s conflicts with the Slurm job step (%s=%d): srun already started the workers, so drop the launcher flags or run one task per node",
				flagList(flags), key, n)
		}
		return Spec{Mode: ModeLauncher}, nil
	}
	if n == 1 {
		return Spec{Mode: ModeStandalone}, nil
	}

	s := Spec{Mode: ModeWorker, Source: SourceSlurm, WorldSize: n}
	if s.Rank, _, err = intVar(env, "SLURM_PROCID", true, 0); err != nil {
		return Spec{}, err
	}
	if s.LocalRank, _, err = intVar(env, "SLURM_LOCALID", true, 0); err != nil {
		return Spec{}, err
	}
	if s.NodeRank, _, err = intVar(env, "SLURM_NODEID", true, 0); err != nil {
		return Spec{}, err
	}
	nn, nnKey, ok := first(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
	s.NNodes = 1
	if ok {
		if s.NNodes, err = strconv.Atoi(nn); err != nil || s.NNodes < 1 {
			return Spec{}, fmt.Errorf("%s=%q: want a positive integer", nnKey, nn)
		}
	}
	if s.NodeRank >= s.NNodes {
		return Spec{}, fmt.Errorf("SLURM_NODEID=%d: must be below %s=%d", s.NodeRank, nnKey, s.NNodes)
	}
	tpn, tpnKey, ok := first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
	switch {
	case ok:
		counts, err := ParseTasksPerNode(tpn)
		if err != nil {
			return Spec{}, fmt.Errorf("%s: %w", tpnKey, err)
		}
		if len(counts) != s.NNodes {
			return Spec{}, fmt.Errorf("%s=%q lists %d nodes, %s=%d", tpnKey, tpn, len(counts), nnKey, s.NNodes)
		}
		s.LocalWorldSize = counts[s.NodeRank]
	case n%s.NNodes == 0:
		s.LocalWorldSize = n / s.NNodes
	default:
		return Spec{}, fmt.Errorf("SLURM_STEP_TASKS_PER_NODE is not set and %s=%d tasks do not split evenly over %d nodes", key, n, s.NNodes)
	}
	if err := checkLayout(&s, "SLURM_PROCID", "SLURM_LOCALID", key, tpnKey); err != nil {
		return Spec{}, err
	}
	s.NProcPerNode = s.LocalWorldSize

	jobID, _, ok := first(env, "SLURM_JOB_ID", "SLURM_JOBID")
	if !ok || jobID == "" {
		return Spec{}, fmt.Errorf("slurm task: SLURM_JOB_ID is not set")
	}
	stepID, _, _ := first(env, "SLURM_STEP_ID", "SLURM_STEPID")

	port := SlurmPort(jobID, stepID)
	if v, ok := env["MASTER_PORT"]; ok {
		if port, err = parsePort(v); err != nil {
			return Spec{}, fmt.Errorf("MASTER_PORT: %w", err)
		}
	}
	host := "127.0.0.1"
	if s.NNodes > 1 {
		list, listKey, ok := first(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
		if !ok {
			return Spec{}, fmt.Errorf("slurm task on %d nodes: SLURM_STEP_NODELIST is not set", s.NNodes)
		}
		if host, err = FirstHost(list); err != nil {
			return Spec{}, fmt.Errorf("%s: %w", listKey, err)
		}
	}
	if v := env["MASTER_ADDR"]; v != "" {
		host = v
	}
	s.Endpoint = net.JoinHostPort(host, strconv.Itoa(port))
	s.ListenAddr = listenAddrFor(s.Endpoint)
	s.HostServer = s.Rank == 0

	s.JobID = env[EnvJobID]
	if s.JobID == "" {
		s.JobID = "slurm-" + jobID + "." + stepID
	}
	if s.Secret, _, err = userSecret(env, flags.SecretFile); err != nil {
		return Spec{}, err
	}
	if s.Secret == "" {
		s.Secret = derivedSecret("slurm", jobID, stepID, strconv.Itoa(uid()))
	}
	cpusPerTask, _, err := intVar(env, "SLURM_CPUS_PER_TASK", false, 1)
	if err != nil {
		return Spec{}, err
	}
	if s.Threads, err = threadShare(env, cpusPerTask, s.LocalWorldSize); err != nil {
		return Spec{}, err
	}
	return s, nil
}

// flagList names the launcher flags that were given, for error messages.
func flagList(f Flags) string {
	var parts []string
	if f.NProc > 1 {
		parts = append(parts, fmt.Sprintf("--nproc %d", f.NProc))
	}
	if f.NNodes > 1 {
		parts = append(parts, fmt.Sprintf("--nnodes %d", f.NNodes))
	}
	if f.NodeRank > 0 {
		parts = append(parts, fmt.Sprintf("--node-rank %d", f.NodeRank))
	}
	if f.RdzvEndpoint != "" {
		parts = append(parts, "--rdzv-endpoint "+f.RdzvEndpoint)
	}
	return strings.Join(parts, " ")
}

// detectEnvRendezvous handles the env:// convention. ok reports whether the
// environment selected it (a worker or standalone).
func detectEnvRendezvous(env map[string]string, flags Flags) (Spec, bool, error) {
	ws, wsSet, err := intVar(env, "WORLD_SIZE", false, 1)
	if err != nil {
		return Spec{}, true, fmt.Errorf("env:// rendezvous: %w", err)
	}
	addr, addrSet := env["MASTER_ADDR"]
	if !addrSet && ws <= 1 {
		return Spec{}, false, nil // a stray RANK or WORLD_SIZE=1 alone is not a job
	}
	if flags.given() {
		// One launcher per pod: the flags describe the layout, and
		// MASTER_ADDR:MASTER_PORT is the default endpoint.
		if ws > 1 && flags.NNodes == 0 {
			return Spec{}, true, fmt.Errorf("%s with env:// variables set (WORLD_SIZE=%d): pass --nnodes and --node-rank to run one launcher per node, or drop the launcher flags to run one worker per process", flagList(flags), ws)
		}
		return Spec{}, false, nil
	}
	if !addrSet || addr == "" {
		return Spec{}, true, fmt.Errorf("env:// rendezvous (WORLD_SIZE=%d): MASTER_ADDR is not set", ws)
	}
	if !wsSet {
		return Spec{}, true, fmt.Errorf("env:// rendezvous (MASTER_ADDR=%s): WORLD_SIZE is not set", addr)
	}
	portStr, ok := env["MASTER_PORT"]
	if !ok {
		return Spec{}, true, fmt.Errorf("env:// rendezvous (MASTER_ADDR=%s): MASTER_PORT is not set", addr)
	}
	port, err := parsePort(portStr)
	if err != nil {
		return Spec{}, true, fmt.Errorf("MASTER_PORT: %w", err)
	}
	if ws == 1 {
		return Spec{Mode: ModeStandalone}, true, nil
	}

	s := Spec{Mode: ModeWorker, Source: SourceEnv, WorldSize: ws, LocalWorldSize: 1}
	fail := func(err error) (Spec, bool, error) { return Spec{}, true, fmt.Errorf("env:// rendezvous: %w", err) }
	if v, ok, err := intVar(env, "LOCAL_WORLD_SIZE", false, 1); err != nil {
		return fail(err)
	} else if ok {
		s.LocalWorldSize = v
	}
	lr, lrSet, err := intVar(env, "LOCAL_RANK", false, 0)
	if err != nil {
		return fail(err)
	}
	if !lrSet && s.LocalWorldSize > 1 {
		return fail(fmt.Errorf("LOCAL_RANK is not set (LOCAL_WORLD_SIZE=%d)", s.LocalWorldSize))
	}
	s.LocalRank = lr
	rank, rankSet, err := intVar(env, "RANK", false, 0)
	if err != nil {
		return fail(err)
	}
	nodeRank, nodeSet, err := intVar(env, "NODE_RANK", false, 0)
	if err != nil {
		return fail(err)
	}
	switch {
	case rankSet:
		s.Rank = rank
		s.NodeRank = rank / s.LocalWorldSize
		if nodeSet {
			s.NodeRank = nodeRank
		}
	case nodeSet:
		s.Rank = nodeRank*s.LocalWorldSize + s.LocalRank
		s.NodeRank = nodeRank
		if s.Rank >= s.WorldSize {
			return fail(fmt.Errorf("NODE_RANK=%d with LOCAL_WORLD_SIZE=%d and LOCAL_RANK=%d gives rank %d, not below WORLD_SIZE=%d",
				nodeRank, s.LocalWorldSize, s.LocalRank, s.Rank, s.WorldSize))
		}
	default:
		return fail(fmt.Errorf("neither RANK nor NODE_RANK is set (MASTER_ADDR=%s, WORLD_SIZE=%d)", addr, ws))
	}
	if err := checkLayout(&s, "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"); err != nil {
		return fail(err)
	}
	s.NProcPerNode = s.LocalWorldSize
	s.NNodes = (s.WorldSize + s.LocalWorldSize - 1) / s.LocalWorldSize
	s.Endpoint = net.JoinHostPort(addr, strconv.Itoa(port))
	s.ListenAddr = listenAddrFor(s.Endpoint)
	s.HostServer = s.Rank == 0
	s.JobID = env[EnvJobID]
	if s.JobID == "" {
		s.JobID = "env-" + s.Endpoint
	}
	if s.Secret, _, err = userSecret(env, flags.SecretFile); err != nil {
		return fail(err)
	}
	if s.Secret == "" {
		if !isLoopback(addr) {
			return fail(fmt.Errorf("no job secret: workers on several hosts (MASTER_ADDR=%s is not a loopback address) must share one; give every worker the same random secret in a file (--rdzv-secret-file or %s) or in %s", addr, EnvSecretFile, EnvSecret))
		}
		s.Secret = derivedSecret("env", s.Endpoint, strconv.Itoa(uid()))
	}
	if s.Threads, err = threadShare(env, 0, s.LocalWorldSize); err != nil {
		return fail(err)
	}
	return s, true, nil
}

func detectLauncher(env map[string]string, flags Flags) (Spec, error) {
	s := Spec{
		Mode:         ModeLauncher,
		Source:       SourceFlags,
		NProcPerNode: max(flags.NProc, 1),
		NNodes:       max(flags.NNodes, 1),
		NodeRank:     flags.NodeRank,
		Endpoint:     flags.RdzvEndpoint,
		JobID:        env[EnvJobID],
	}
	var err error
	if s.Secret, _, err = userSecret(env, flags.SecretFile); err != nil {
		return Spec{}, err
	}
	if flags.RdzvID != "" {
		s.JobID = flags.RdzvID
	}
	s.WorldSize = s.NProcPerNode * s.NNodes
	s.LocalWorldSize = s.NProcPerNode
	if flags.elastic() {
		if err := elasticSpec(&s, env, flags); err != nil {
			return Spec{}, err
		}
		s.Threads, err = threadShare(env, 0, s.NProcPerNode)
		return s, err
	}
	if s.WorldSize == 1 {
		return Spec{Mode: ModeStandalone}, nil
	}
	if s.NNodes > 1 {
		if s.Endpoint == "" {
			addr, port := env["MASTER_ADDR"], env["MASTER_PORT"]
			if addr == "" || port == "" {
				return Spec{}, fmt.Errorf("--nnodes %d needs --rdzv-endpoint host:port (the address of node rank 0)", s.NNodes)
			}
			s.Endpoint = net.JoinHostPort(addr, port)
			if err := checkEndpoint(s.Endpoint); err != nil {
				return Spec{}, fmt.Errorf("MASTER_ADDR/MASTER_PORT as --rdzv-endpoint: %w", err)
			}
		}
		if s.NodeRank > 0 && s.Secret == "" {
			return Spec{}, fmt.Errorf("--node-rank %d needs the job secret: give it the file node rank 0 wrote (its path is in node 0's log) with --rdzv-secret-file, or give every node the same secret (--rdzv-secret-file, %s or %s)", s.NodeRank, EnvSecretFile, EnvSecret)
		}
		if s.JobID == "" {
			// Every node must present the same job id without talking
			// to the others first: derive it from the endpoint.
			s.JobID = "titanrun-" + s.Endpoint
		}
	}
	if s.Threads, err = threadShare(env, 0, s.NProcPerNode); err != nil {
		return Spec{}, err
	}
	return s, nil
}
