package launch

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// slurmEnv is the environment srun gives task rank of a step with the given
// layout (copied from what slurm 22.05 sets on the test VM, reduced to the
// variables that matter).
func slurmEnv(job, step string, rank, local, node, ntasks, nnodes int, tasksPerNode, nodelist string) []string {
	return []string{
		"SLURM_JOB_ID=" + job, "SLURM_JOBID=" + job,
		"SLURM_STEP_ID=" + step, "SLURM_STEPID=" + step,
		fmt.Sprint("SLURM_PROCID=", rank), fmt.Sprint("SLURM_LOCALID=", local), fmt.Sprint("SLURM_NODEID=", node),
		fmt.Sprint("SLURM_NTASKS=", ntasks), fmt.Sprint("SLURM_STEP_NUM_TASKS=", ntasks), fmt.Sprint("SLURM_NPROCS=", ntasks),
		fmt.Sprint("SLURM_NNODES=", nnodes), fmt.Sprint("SLURM_STEP_NUM_NODES=", nnodes),
		"SLURM_TASKS_PER_NODE=" + tasksPerNode, "SLURM_STEP_TASKS_PER_NODE=" + tasksPerNode,
		"SLURM_JOB_NODELIST=" + nodelist, "SLURM_NODELIST=" + nodelist, "SLURM_STEP_NODELIST=" + nodelist,
		"SLURM_CLUSTER_NAME=local", "SLURM_CPUS_ON_NODE=4",
	}
}

func titanrunEnv(rank, local, world, localWorld, node int) []string {
	return []string{
		fmt.Sprint("RANK=", rank), fmt.Sprint("LOCAL_RANK=", local), fmt.Sprint("WORLD_SIZE=", world),
		fmt.Sprint("LOCAL_WORLD_SIZE=", localWorld), fmt.Sprint("NODE_RANK=", node),
		"TITANRUN_ENDPOINT=127.0.0.1:4242", "TITANRUN_SECRET=s3cret", "TITANRUN_JOB_ID=job7",
		"TITANRUN_THREADS=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=4242",
	}
}

func with(env []string, extra ...string) []string {
	return append(append([]string(nil), env...), extra...)
}

// without drops the named variables.
func without(env []string, keys ...string) []string {
	var out []string
outer:
	for _, kv := range env {
		for _, k := range keys {
			if strings.HasPrefix(kv, k+"=") {
				continue outer
			}
		}
		out = append(out, kv)
	}
	return out
}

func fixUID(t *testing.T, id int) {
	old := uid
	uid = func() int { return id }
	t.Cleanup(func() { uid = old })
}

func TestDetect(t *testing.T) {
	fixUID(t, 1000)
	slurmSecret := derivedSecret("slurm", "81", "0", "1000")
	slurmPort := SlurmPort("81", "0")
	share := func(local int) int { return max(1, runtime.NumCPU()/local) }
	tests := []struct {
		name  string
		env   []string
		flags Flags
		want  Spec
	}{
		{"no flags, no environment", nil, Flags{}, Spec{Mode: ModeStandalone}},
		{"--nproc 1", nil, Flags{NProc: 1}, Spec{Mode: ModeStandalone}},
		{"stray RANK alone", []string{"RANK=3"}, Flags{}, Spec{Mode: ModeStandalone}},
		{"env:// world of one", []string{"MASTER_ADDR=10.0.0.1", "MASTER_PORT=1", "WORLD_SIZE=1", "RANK=0"}, Flags{},
			Spec{Mode: ModeStandalone}},
		{"one-task slurm step", slurmEnv("81", "0", 0, 0, 0, 1, 1, "1", "vm"), Flags{}, Spec{Mode: ModeStandalone}},
		{"slurm batch script (no step) with --nproc", without(slurmEnv("81", "0", 0, 0, 0, 4, 1, "4", "vm"), "SLURM_STEP_ID", "SLURM_STEPID",
			"SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST"),
			Flags{NProc: 2}, Spec{Mode: ModeLauncher, Source: SourceFlags, NProcPerNode: 2, NNodes: 1, WorldSize: 2, LocalWorldSize: 2, Threads: share(2)}},

		{"--nproc 4", nil, Flags{NProc: 4},
			Spec{Mode: ModeLauncher, Source: SourceFlags, NProcPerNode: 4, NNodes: 1, WorldSize: 4, LocalWorldSize: 4, Threads: share(4)}},
		{"--nproc 4 with TITANRUN_THREADS and a fixed endpoint", []string{"TITANRUN_THREADS=3", "TITANRUN_JOB_ID=j", "TITANRUN_SECRET=s-0123456789abcdef"},
			Flags{NProc: 4, RdzvEndpoint: "127.0.0.1:29500"},
			Spec{Mode: ModeLauncher, Source: SourceFlags, NProcPerNode: 4, NNodes: 1, WorldSize: 4, LocalWorldSize: 4, Threads: 3,
				Endpoint: "127.0.0.1:29500", JobID: "j", Secret: "s-0123456789abcdef"}},
		{"node 0 of 2", nil, Flags{NProc: 2, NNodes: 2, RdzvEndpoint: "head:29500"},
			Spec{Mode: ModeLauncher, Source: SourceFlags, NProcPerNode: 2, NNodes: 2, WorldSize: 4, LocalWorldSize: 2,
				Endpoint: "head:29500", JobID: "titanrun-head:29500", Threads: share(2)}},
		{"node 1 of 2", []string{"TITANRUN_SECRET=abc-0123456789abcdef"}, Flags{NProc: 2, NNodes: 2, NodeRank: 1, RdzvEndpoint: "head:29500"},
			Spec{Mode: ModeLauncher, Source: SourceFlags, NProcPerNode: 2, NNodes: 2, NodeRank: 1, WorldSize: 4, LocalWorldSize: 2,
				Endpoint: "head:29500", JobID: "titanrun-head:29500", Secret: "abc-0123456789abcdef", Threads: share(2)}},
		{"one launcher per pod, endpoint from MASTER_ADDR", []string{"MASTER_ADDR=10.1.2.3", "MASTER_PORT=23456", "WORLD_SIZE=3", "RANK=1", "TITANRUN_SECRET=k-0123456789abcdef"},
			Flags{NProc: 2, NNodes: 3, NodeRank: 1},
			Spec{Mode: ModeLauncher, Source: SourceFlags, NProcPerNode: 2, NNodes: 3, NodeRank: 1, WorldSize: 6, LocalWorldSize: 2,
				Endpoint: "10.1.2.3:23456", JobID: "titanrun-10.1.2.3:23456", Secret: "k-0123456789abcdef", Threads: share(2)}},
		{"one-task slurm step running a launcher", slurmEnv("81", "0", 0, 0, 0, 1, 1, "1", "vm"), Flags{NProc: 3},
			Spec{Mode: ModeLauncher, Source: SourceFlags, NProcPerNode: 3, NNodes: 1, WorldSize: 3, LocalWorldSize: 3, Threads: share(3)}},

		{"titanrun worker", titanrunEnv(5, 1, 8, 4, 1), Flags{},
			Spec{Mode: ModeWorker, Source: SourceTitanrun, NProcPerNode: 4, NNodes: 2, NodeRank: 1, Endpoint: "127.0.0.1:4242",
				JobID: "job7", Secret: "s3cret", Rank: 5, LocalRank: 1, WorldSize: 8, LocalWorldSize: 4, Threads: 2}},
		{"titanrun worker ignores the launcher flags it inherited", titanrunEnv(0, 0, 2, 2, 0), Flags{NProc: 2},
			Spec{Mode: ModeWorker, Source: SourceTitanrun, NProcPerNode: 2, NNodes: 1, Endpoint: "127.0.0.1:4242",
				JobID: "job7", Secret: "s3cret", WorldSize: 2, LocalWorldSize: 2, Threads: 2}},
		{"titanrun worker inside a slurm step", with(slurmEnv("81", "0", 0, 0, 0, 1, 1, "1", "vm"), titanrunEnv(1, 1, 2, 2, 0)...), Flags{},
			Spec{Mode: ModeWorker, Source: SourceTitanrun, NProcPerNode: 2, NNodes: 1, Endpoint: "127.0.0.1:4242",
				JobID: "job7", Secret: "s3cret", Rank: 1, LocalRank: 1, WorldSize: 2, LocalWorldSize: 2, Threads: 2}},

		{"slurm rank 0 of 4 on one node", slurmEnv("81", "0", 0, 0, 0, 4, 1, "4", "vm"), Flags{},
			Spec{Mode: ModeWorker, Source: SourceSlurm, NProcPerNode: 4, NNodes: 1, Endpoint: fmt.Sprint("127.0.0.1:", slurmPort),
				JobID: "slurm-81.0", Secret: slurmSecret, WorldSize: 4, LocalWorldSize: 4, HostServer: true,
				ListenAddr: fmt.Sprint("127.0.0.1:", slurmPort), Threads: share(4)}},
		{"slurm rank 3 of 4 on one node", slurmEnv("81", "0", 3, 3, 0, 4, 1, "4", "vm"), Flags{},
			Spec{Mode: ModeWorker, Source: SourceSlurm, NProcPerNode: 4, NNodes: 1, Endpoint: fmt.Sprint("127.0.0.1:", slurmPort),
				JobID: "slurm-81.0", Secret: slurmSecret, Rank: 3, LocalRank: 3, WorldSize: 4, LocalWorldSize: 4,
				ListenAddr: fmt.Sprint("127.0.0.1:", slurmPort), Threads: share(4)}},
		{"slurm rank 0 of 4 on two nodes", with(slurmEnv("81", "0", 0, 0, 0, 4, 2, "2(x2)", "node[07-08]"), "SLURM_CPUS_PER_TASK=3"), Flags{},
			Spec{Mode: ModeWorker, Source: SourceSlurm, NProcPerNode: 2, NNodes: 2, Endpoint: fmt.Sprint("node07:", slurmPort),
				JobID: "slurm-81.0", Secret: slurmSecret, WorldSize: 4, LocalWorldSize: 2, HostServer: true,
				ListenAddr: fmt.Sprint(":", slurmPort), Threads: 3}},
		{"slurm rank 2 of 3 on two uneven nodes, MASTER_PORT and secret set",
			with(slurmEnv("81", "0", 2, 0, 1, 3, 2, "2,1", "a,b"), "MASTER_PORT=31000", "TITANRUN_SECRET=mine-0123456789abcdef", "TITANRUN_THREADS=1"), Flags{},
			Spec{Mode: ModeWorker, Source: SourceSlurm, NProcPerNode: 1, NNodes: 2, NodeRank: 1, Endpoint: "a:31000",
				JobID: "slurm-81.0", Secret: "mine-0123456789abcdef", Rank: 2, WorldSize: 3, LocalWorldSize: 1,
				ListenAddr: ":31000", Threads: 1}},

		{"env:// rank 2 of 4 pods", []string{"MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", "WORLD_SIZE=4", "RANK=2", "TITANRUN_SECRET=k8s-0123456789abcdef", "TITANRUN_THREADS=8"}, Flags{},
			Spec{Mode: ModeWorker, Source: SourceEnv, NProcPerNode: 1, NNodes: 4, NodeRank: 2, Endpoint: "10.0.0.1:29500",
				JobID: "env-10.0.0.1:29500", Secret: "k8s-0123456789abcdef", Rank: 2, WorldSize: 4, LocalWorldSize: 1, ListenAddr: ":29500", Threads: 8}},
		{"env:// rank 0 hosts, from NODE_RANK and LOCAL_RANK",
			[]string{"MASTER_ADDR=head", "MASTER_PORT=29500", "WORLD_SIZE=4", "NODE_RANK=0", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "TITANRUN_SECRET=k8s-0123456789abcdef", "TITANRUN_JOB_ID=train-7"}, Flags{},
			Spec{Mode: ModeWorker, Source: SourceEnv, NProcPerNode: 2, NNodes: 2, Endpoint: "head:29500", HostServer: true,
				JobID: "train-7", Secret: "k8s-0123456789abcdef", WorldSize: 4, LocalWorldSize: 2, ListenAddr: ":29500", Threads: share(2)}},
		{"env:// NODE_RANK 1 LOCAL_RANK 1",
			[]string{"MASTER_ADDR=head", "MASTER_PORT=29500", "WORLD_SIZE=4", "NODE_RANK=1", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "TITANRUN_SECRET=k8s-0123456789abcdef", "TITANRUN_THREADS=1"}, Flags{},
			Spec{Mode: ModeWorker, Source: SourceEnv, NProcPerNode: 2, NNodes: 2, NodeRank: 1, Endpoint: "head:29500",
				JobID: "env-head:29500", Secret: "k8s-0123456789abcdef", Rank: 3, LocalRank: 1, WorldSize: 4, LocalWorldSize: 2, ListenAddr: ":29500", Threads: 1}},
		{"env:// on loopback derives the secret",
			[]string{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=29501", "WORLD_SIZE=2", "RANK=0", "TITANRUN_THREADS=1"}, Flags{},
			Spec{Mode: ModeWorker, Source: SourceEnv, NProcPerNode: 1, NNodes: 2, Endpoint: "127.0.0.1:29501", HostServer: true,
				JobID: "env-127.0.0.1:29501", Secret: derivedSecret("env", "127.0.0.1:29501", "1000"), WorldSize: 2, LocalWorldSize: 1,
				ListenAddr: "127.0.0.1:29501", Threads: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Detect(tc.env, tc.flags)
			if err != nil {
				t.Fatalf("Detect: %v", err)
			}
			if got != tc.want {
				t.Errorf("Detect =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestDetectErrors(t *testing.T) {
	slurm4 := slurmEnv("81", "0", 1, 1, 0, 4, 1, "4", "vm")
	tests := []struct {
		name  string
		env   []string
		flags Flags
		want  string
	}{
		{"negative --nproc", nil, Flags{NProc: -1}, "--nproc -1"},
		{"negative --nnodes", nil, Flags{NNodes: -2}, "--nnodes -2"},
		{"negative --node-rank", nil, Flags{NodeRank: -1}, "--node-rank -1"},
		{"--node-rank not below --nnodes", nil, Flags{NProc: 2, NNodes: 2, NodeRank: 2, RdzvEndpoint: "h:1"}, "--node-rank 2: must be below --nnodes 2"},
		{"--node-rank without --nnodes", nil, Flags{NProc: 2, NodeRank: 1}, "--node-rank 1: must be below --nnodes 1"},
		{"endpoint without port", nil, Flags{NProc: 2, RdzvEndpoint: "head"}, "--rdzv-endpoint"},
		{"endpoint port 0", nil, Flags{NProc: 2, RdzvEndpoint: "head:0"}, "--rdzv-endpoint"},
		{"endpoint without host", nil, Flags{NProc: 2, RdzvEndpoint: ":29500"}, "missing host"},
		{"several nodes without endpoint", nil, Flags{NProc: 2, NNodes: 2}, "--nnodes 2 needs --rdzv-endpoint"},
		{"node 1 without secret", nil, Flags{NNodes: 2, NodeRank: 1, RdzvEndpoint: "h:1"}, "--node-rank 1 needs the job secret: give it the file node rank 0 wrote"},
		{"TLS cert without key", []string{"TITANRUN_TLS_CERT=c.pem"}, Flags{NProc: 2}, "TITANRUN_TLS_CERT and TITANRUN_TLS_KEY must be set together"},
		{"TLS CA alone", []string{"TITANRUN_TLS_CA=ca.pem"}, Flags{NProc: 2}, "TITANRUN_TLS_CA=ca.pem is set without"},
		{"bad TITANRUN_THREADS", []string{"TITANRUN_THREADS=0"}, Flags{NProc: 2}, "TITANRUN_THREADS=0: must be at least 1"},

		{"titanrun without RANK", without(titanrunEnv(0, 0, 2, 2, 0), "RANK"), Flags{}, "RANK is not set"},
		{"titanrun RANK not a number", with(titanrunEnv(0, 0, 2, 2, 0), "RANK=one"), Flags{}, `RANK="one": not an integer`},
		{"titanrun RANK too large", titanrunEnv(2, 0, 2, 2, 0), Flags{}, "RANK=2: must be below WORLD_SIZE=2"},
		{"titanrun LOCAL_RANK too large", titanrunEnv(1, 2, 4, 2, 0), Flags{}, "LOCAL_RANK=2: must be below LOCAL_WORLD_SIZE=2"},
		{"titanrun without secret", without(titanrunEnv(0, 0, 2, 2, 0), "TITANRUN_SECRET"), Flags{}, "TITANRUN_SECRET is not set"},
		{"titanrun without job id", without(titanrunEnv(0, 0, 2, 2, 0), "TITANRUN_JOB_ID"), Flags{}, "TITANRUN_JOB_ID is not set"},
		{"titanrun bad endpoint", with(titanrunEnv(0, 0, 2, 2, 0), "TITANRUN_ENDPOINT=nowhere"), Flags{}, "TITANRUN_ENDPOINT"},
		{"titanrun NODE_RANK too large", titanrunEnv(0, 0, 2, 2, 1), Flags{}, "NODE_RANK=1"},

		{"launcher flags in a slurm step", slurm4, Flags{NProc: 2}, "--nproc 2 conflicts with the Slurm job step (SLURM_STEP_NUM_TASKS=4)"},
		{"slurm without SLURM_LOCALID", without(slurm4, "SLURM_LOCALID"), Flags{}, "SLURM_LOCALID is not set"},
		{"slurm without SLURM_NTASKS", without(slurm4, "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NPROCS"), Flags{}, "SLURM_NTASKS is not set"},
		{"slurm bad SLURM_PROCID", with(slurm4, "SLURM_PROCID=x"), Flags{}, `SLURM_PROCID="x"`},
		{"slurm SLURM_PROCID too large", with(slurm4, "SLURM_PROCID=4"), Flags{}, "SLURM_PROCID=4: must be below SLURM_STEP_NUM_TASKS=4"},
		{"slurm SLURM_NODEID too large", with(slurm4, "SLURM_NODEID=1"), Flags{}, "SLURM_NODEID=1: must be below SLURM_STEP_NUM_NODES=1"},
		{"slurm bad MASTER_PORT", with(slurm4, "MASTER_PORT=70000"), Flags{}, "MASTER_PORT"},
		{"slurm tasks per node disagree", with(slurm4, "SLURM_STEP_TASKS_PER_NODE=2,2"), Flags{}, "lists 2 nodes"},
		{"slurm bad node list", slurmEnv("81", "0", 1, 1, 0, 4, 2, "2(x2)", "n[1-"), Flags{}, "SLURM_STEP_NODELIST"},
		{"slurm without job id", without(slurm4, "SLURM_JOB_ID", "SLURM_JOBID"), Flags{}, "SLURM_JOB_ID is not set"},

		{"env:// without WORLD_SIZE", []string{"MASTER_ADDR=h", "MASTER_PORT=1", "RANK=0"}, Flags{}, "WORLD_SIZE is not set"},
		{"env:// without MASTER_ADDR", []string{"WORLD_SIZE=4", "RANK=1", "MASTER_PORT=1"}, Flags{}, "MASTER_ADDR is not set"},
		{"env:// without MASTER_PORT", []string{"MASTER_ADDR=h", "WORLD_SIZE=4", "RANK=1"}, Flags{}, "MASTER_PORT is not set"},
		{"env:// bad MASTER_PORT", []string{"MASTER_ADDR=h", "MASTER_PORT=http", "WORLD_SIZE=4", "RANK=1"}, Flags{}, `MASTER_PORT: port "http"`},
		{"env:// without RANK or NODE_RANK", []string{"MASTER_ADDR=h", "MASTER_PORT=1", "WORLD_SIZE=4", "TITANRUN_SECRET=s-0123456789abcdef"}, Flags{}, "neither RANK nor NODE_RANK is set"},
		{"env:// RANK too large", []string{"MASTER_ADDR=h", "MASTER_PORT=1", "WORLD_SIZE=4", "RANK=4", "TITANRUN_SECRET=s-0123456789abcdef"}, Flags{}, "RANK=4: must be below WORLD_SIZE=4"},
		{"env:// NODE_RANK too large", []string{"MASTER_ADDR=h", "MASTER_PORT=1", "WORLD_SIZE=4", "NODE_RANK=4", "TITANRUN_SECRET=s-0123456789abcdef"}, Flags{}, "NODE_RANK=4"},
		{"env:// bad WORLD_SIZE", []string{"MASTER_ADDR=h", "MASTER_PORT=1", "WORLD_SIZE=0", "RANK=0"}, Flags{}, "WORLD_SIZE=0: must be at least 1"},
		{"env:// LOCAL_WORLD_SIZE without LOCAL_RANK", []string{"MASTER_ADDR=h", "MASTER_PORT=1", "WORLD_SIZE=4", "RANK=0", "LOCAL_WORLD_SIZE=2", "TITANRUN_SECRET=s-0123456789abcdef"}, Flags{}, "LOCAL_RANK is not set"},
		{"env:// across hosts without secret", []string{"MASTER_ADDR=10.0.0.1", "MASTER_PORT=1", "WORLD_SIZE=2", "RANK=1"}, Flags{}, "no job secret: workers on several hosts"},
		{"env:// with --nproc but no --nnodes", []string{"MASTER_ADDR=h", "MASTER_PORT=1", "WORLD_SIZE=4", "RANK=1"}, Flags{NProc: 2}, "pass --nnodes and --node-rank"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Detect(tc.env, tc.flags)
			if err == nil {
				t.Fatalf("Detect = %+v, want an error containing %q", got, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Detect error %q, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestSlurmRendezvousAgreement checks that every task of a step computes
// the same endpoint, job id and secret, and that another step, job or user
// gets another secret.
func TestSlurmRendezvousAgreement(t *testing.T) {
	fixUID(t, 1000)
	spec := func(job, step string, rank int) Spec {
		t.Helper()
		s, err := Detect(slurmEnv(job, step, rank, rank%2, rank/2, 4, 2, "2(x2)", "c[1-2]"), Flags{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := spec("100", "3", 0)
	hosts := 0
	for r := range 4 {
		s := spec("100", "3", r)
		if s.Endpoint != base.Endpoint || s.JobID != base.JobID || s.Secret != base.Secret {
			t.Errorf("rank %d: endpoint %s job %s secret %s; rank 0 has %s %s %s", r, s.Endpoint, s.JobID, s.Secret, base.Endpoint, base.JobID, base.Secret)
		}
		if s.HostServer {
			hosts++
		}
	}
	if hosts != 1 || !base.HostServer {
		t.Errorf("%d ranks host the server, want rank 0 only", hosts)
	}
	if !strings.HasPrefix(base.Endpoint, "c1:") {
		t.Errorf("endpoint %s, want the first node c1", base.Endpoint)
	}
	if len(base.Secret) != 32 {
		t.Errorf("derived secret %q, want 32 hex digits", base.Secret)
	}
	for _, other := range []Spec{spec("100", "4", 0), spec("101", "3", 0)} {
		if other.Secret == base.Secret || other.JobID == base.JobID {
			t.Errorf("job %s has the same secret or job id as job %s", other.JobID, base.JobID)
		}
	}
	fixUID(t, 1001)
	if spec("100", "3", 0).Secret == base.Secret {
		t.Error("another user derives the same secret")
	}
	for _, p := range []int{SlurmPort("1", "0"), SlurmPort("999999", "12"), base.portOf(t)} {
		if p < 20000 || p >= 40000 {
			t.Errorf("derived port %d outside [20000, 40000)", p)
		}
	}
}

func (s Spec) portOf(t *testing.T) int {
	t.Helper()
	var p int
	if _, err := fmt.Sscanf(s.Endpoint[strings.LastIndexByte(s.Endpoint, ':')+1:], "%d", &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestModeString(t *testing.T) {
	for m, want := range map[Mode]string{ModeStandalone: "standalone", ModeLauncher: "launcher", ModeWorker: "worker", Mode(9): "Mode(9)"} {
		if got := m.String(); got != want {
			t.Errorf("Mode(%d).String() = %q, want %q", int(m), got, want)
		}
	}
}
