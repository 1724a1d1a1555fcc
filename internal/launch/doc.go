// Package launch starts and supervises titan's distributed jobs: it works
// out how a process takes part in a run (Detect), runs the per-node
// launcher that spawns and monitors worker processes (Launch), and
// bootstraps a worker into the control plane and the communication world
// (Join).
//
// # Ways to start a job
//
// One node, N processes: `titan train --nproc N ...` starts a launcher that
// hosts the control server on a loopback port and re-executes the titan
// binary N times as workers. Several nodes: one launcher per node, with
// `--nnodes M --node-rank R --rdzv-endpoint host:port` as with torchrun;
// node rank 0 hosts the control server on that endpoint. Under Slurm,
// `srun -n 4 titan train ...` needs no flags: every task is a worker and
// task 0 hosts the control server. Under Kubernetes (indexed Job, JobSet)
// the env:// variables MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK (or
// NODE_RANK) make every pod a worker, and rank 0 hosts the server.
//
// Launch passes each worker the torchrun variables RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR and MASTER_PORT,
// plus TITANRUN_ENDPOINT, TITANRUN_SECRET, TITANRUN_JOB_ID and
// TITANRUN_THREADS (the worker's share of the node's cores; also set as
// GOMAXPROCS unless the launcher's environment sets GOMAXPROCS), and
// TITANRUN_HOST_PEAK_FLOPS, the node's GEMM peak measured once with all
// its cores before the workers start (kept when already set), so that
// every worker computes MFU against the same host peak. The
// TITAN_<SECTION>_<KEY> names belong to recipe keys and are not used.
//
// # Trust assumptions
//
// Every joiner of the control plane presents the job id and the job
// secret. A one-node launcher listens on loopback only and generates a
// random secret, so only processes of this machine that can read the
// workers' environment (the same user, or root) can join. A multi-node
// launcher listens on all interfaces of its endpoint's port and uses
// TITANRUN_SECRET when set, or else a random secret that it prints for the
// other nodes; the secret then guards the job against anyone who can reach
// the port but has not seen it. Without TLS the secret crosses the network
// in clear text, so use a trusted network, or set TITANRUN_TLS_CERT and
// TITANRUN_TLS_KEY (and TITANRUN_TLS_CA for mutual TLS) on every node:
// Launch and Join then run the control plane over TLS. The data plane
// (internal/comm) is neither authenticated nor encrypted.
//
// Under Slurm, the tasks of a step cannot share a random value before they
// meet, so unless TITANRUN_SECRET is set (srun passes the submitting
// environment on, e.g. `TITANRUN_SECRET=$(openssl rand -hex 16) srun ...`)
// the secret is derived from the job id, the step id and the user id. Any
// user who can list the cluster's jobs can compute it: a derived secret
// keeps stray processes of other jobs and steps, and mistakes, out of a
// job, but is no protection against a hostile user on the cluster network.
// The same holds for env:// with a loopback MASTER_ADDR, whose secret is
// derived from the endpoint and user id; with any other MASTER_ADDR,
// TITANRUN_SECRET is required.
package launch
