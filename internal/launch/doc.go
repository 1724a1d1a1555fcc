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
// TITANRUN_THREADS (the worker's share of the node's cores, which its
// compute kernels use; GOMAXPROCS is set to one more, for the
// communication goroutines, unless the launcher's environment sets
// GOMAXPROCS), and
// TITANRUN_HOST_PEAK_FLOPS, the node's GEMM peak measured once with all
// its cores before the workers start (kept when already set), so that
// every worker computes MFU against the same host peak. The
// TITAN_<SECTION>_<KEY> names belong to recipe keys and are not used.
//
// # Elastic jobs
//
// With --max-restarts K, --nnodes MIN:MAX or --rdzv-backend etcd the
// launcher is elastic (see Elastic), as torchrun's agent: the launchers
// meet in rounds of a rendezvous (rendezvous.go), kept by the c10d backend
// (built in: the launcher that can bind --rdzv-endpoint hosts it, and the
// rendezvous ends with it) or by an etcd v3 cluster (--rdzv-backend etcd
// --rdzv-endpoint host:2379), where every node's membership is a key bound
// to a lease that its launcher keeps alive, so that the rendezvous
// survives the loss of any training node. A round closes with MAX nodes,
// or with at least MIN once last_call_timeout passed without another
// joining (join_timeout bounds the wait for MIN). Its nodes are ordered by
// --node-rank (then host and pid); the lowest live one hosts the round's
// control server on a fresh port, with the job id "<id>-r<round>", so
// that workers of an earlier round are refused. When a worker exits
// non-zero, is killed, or its heartbeats stop, its launcher (or the
// control server's host) ends the round; every launcher stops its
// workers (SIGTERM, SIGKILL after a grace period) and joins the next
// round, whose workers resume from the latest complete checkpoint (the
// trainer does that by itself, resharding to the new world size). A
// failure, or a member whose lease expired, counts as a restart; after K
// the job fails on every node with the reason. A node that arrives while
// a round with fewer than MAX nodes runs makes the members end it without
// counting a restart. Workers get TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS and TORCHELASTIC_RUN_ID as with torchrun. The
// round and restart messages go to the launcher's stderr.
//
// # Timeouts
//
// A lost worker must be detected before a collective gives up on it, and
// a collective must give up before the rendezvous does, so the defaults
// are ordered (TestTimeoutsOrdered checks it):
//
//	heartbeat interval           1 s    (control.DefaultHeartbeatInterval)
//	heartbeat timeout           10 s    (control.DefaultHeartbeatTimeout: the worker is lost)
//	rendezvous lease            15 s    (keep_alive_interval 5 s × keep_alive_max_attempt 3: the node left)
//	collective timeout         100 s    (comm.train_timeout_seconds)
//	bootstrap timeout          300 s    (comm.init_timeout_seconds)
//	rendezvous join timeout    600 s    (--rdzv-conf join_timeout)
//
// A worker that dies closes its data-plane connections, which its peers
// notice at once; the heartbeat timeout catches the worker that stops
// answering without dying (a stopped or hung process), the lease the node
// whose launcher is gone, before the collective timeout would end its
// peers' collectives with an error.
//
// # Trust assumptions
//
// The job secret is the one credential of a job. It comes from a file
// (--rdzv-secret-file PATH or TITANRUN_SECRET_FILE; the file must be
// readable and writable by its owner only, mode 0600 or 0400, or it is
// refused with an error naming it) or from TITANRUN_SECRET, at least 16
// random characters (`openssl rand -hex 16`), one of the three. Without
// one, a one-node launcher makes up a random secret that only its workers
// see, and node rank 0 of several writes a random one into a new file
// readable by the user only ($XDG_RUNTIME_DIR/titan/<job>.secret, else
// titan/secrets in the user's cache folder) and logs the file's path, never
// the secret: copy the file to the other nodes and pass it with
// --rdzv-secret-file. No log line, error message or worker output shows the
// secret; workers receive it in TITANRUN_SECRET, which only processes of
// the same user (or root) can read.
//
// Control plane. Every call presents the job id and the secret; the
// server compares both in constant time and refuses a call with either
// wrong with the same answer (Unauthenticated, "not admitted"), which
// names neither the job nor the world. titan's control plane always speaks
// TLS, loopback included: with the user's certificate when
// TITANRUN_TLS_CERT and TITANRUN_TLS_KEY are set (and TITANRUN_TLS_CA for
// the CA clients check, which then also asks clients for certificates),
// else with a per-job certificate derived from the secret and the job id
// (control.JobTLS: an Ed25519 key from HKDF-SHA256 of the secret) that
// clients pin. Only a holder of the secret can then serve the job or read
// its traffic, a client that holds a wrong or stale secret stops at the
// TLS handshake with an error saying that the server does not hold this
// job's secret, and the secret never reaches a server that does not hold
// it. The derived certificate's public key is seen by whoever connects;
// it reveals nothing of a random secret, which is why a secret must be
// long and random. (The control package itself also serves plain text on
// loopback, for tests and tools; off loopback it requires TLS.)
//
// Data plane. Every TCP connection between two workers (collective data,
// point-to-point and control connections of every group) starts with a
// mutual challenge-response (HMAC-SHA256 under a key derived from the
// secret and the world's id, a fresh random value of every rendezvous),
// bound to both ranks and the connection's purpose, before any tensor
// moves: a process without the secret, or with a stale one from an earlier
// rendezvous, is closed out, and the worker that dialed a stranger fails
// with an error naming the peer and the data-plane authentication. The
// data plane is not encrypted: tensors cross the network in the clear, and
// a party that can intercept and rewrite traffic between two hosts is not
// kept out; use a trusted network for that. Shared memory (same host, same
// user) needs no more: its segments are the user's files (mode 0600),
// found through the authenticated control connections.
//
// Rendezvous. The c10d rendezvous (hosted by the first launcher) speaks
// HTTPS with a certificate derived from the secret, pinned by the other
// launchers as on the control plane, and refuses a request without the
// secret with a bare 403. The etcd rendezvous trusts the etcd cluster as
// it is configured (titan passes no etcd credentials or TLS settings yet):
// whoever can write to it can disturb the rendezvous (a denial of
// service), but cannot join the job or impersonate its control server,
// whose certificate is derived from the secret that etcd never holds.
//
// Under Slurm, the tasks of a step cannot share a random value before they
// meet, so unless a secret is given (srun passes the submitting
// environment on, e.g. `TITANRUN_SECRET=$(openssl rand -hex 16) srun ...`,
// or a secret file on a shared file system) the secret is derived from the
// job id, the step id and the user id. Any user who can list the cluster's
// jobs can compute it: a derived secret keeps stray processes of other
// jobs and steps, and mistakes, out of a job, but is no protection against
// a hostile user on the cluster network. The same holds for env:// with a
// loopback MASTER_ADDR, whose secret is derived from the endpoint and user
// id; with any other MASTER_ADDR a secret is required.
package launch
