//go:build unix

package launch

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/config"
	"github.com/titan-go/titan/internal/control"
)

// elasticLocal is an elastic one-node launcher spec.
func elasticLocal(t *testing.T, nproc, restarts int) Spec {
	t.Helper()
	spec, err := Detect(nil, Flags{NProc: nproc, MaxRestarts: restarts})
	if err != nil {
		t.Fatal(err)
	}
	if spec.Mode != ModeLauncher || spec.Elastic == nil {
		t.Fatalf("Detect: mode %v elastic %v, want an elastic launcher", spec.Mode, spec.Elastic)
	}
	return spec
}

// captureNotices collects the elastic launcher's notices.
func captureNotices(t *testing.T) *watchWriter {
	w := newWatchWriter("", 0)
	old := notices
	notices = w
	t.Cleanup(func() { notices = old })
	return w
}

// TestElasticRestart: a worker that dies (SIGKILL) or stops answering
// (SIGSTOP: its heartbeats stop) in the first round makes the launcher
// stop the group, say why and restart every worker in a new round, whose
// control server refuses the previous round's job id; the second round
// succeeds with every rank.
func TestElasticRestart(t *testing.T) {
	cases := []struct {
		name, post string
		want       string
	}{
		{"kill", "1:kill9", `worker rank 1 \(pid \d+\) was killed by signal 9 \(killed\); restart 1 of 1 from the latest checkpoint`},
		{"freeze", "1:freeze", `worker rank 1 \(pid \d+\) was lost \(no heartbeats\): no heartbeat for .*; restart 1 of 1 from the latest checkpoint`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			setFakeWorkers(t, "*:allreduce")
			t.Setenv(fakeFirstPostEnv, c.post)
			t.Setenv(fakeHeartbeatEnv, "100ms")
			old := heartbeatTimeout
			heartbeatTimeout = time.Second
			t.Cleanup(func() { heartbeatTimeout = old })
			shortGrace(t, 500*time.Millisecond)
			notes := captureNotices(t)
			ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
			defer cancel()
			out := newWatchWriter("", 0)
			if err := Launch(ctx, elasticLocal(t, 3, 1), nil, out); err != nil {
				t.Fatalf("Launch: %v\noutput:\n%s\nnotices:\n%s", err, out, notes)
			}
			if !regexp.MustCompile(c.want).MatchString(notes.String()) {
				t.Errorf("notices do not match %q:\n%s", c.want, notes)
			}
			// Round 0's ranks 0 and 2 succeeded too; round 1's all did.
			for r := range 3 {
				re := regexp.MustCompile(fmt.Sprintf(`(?m)^\[rank %d\] allreduce ok source=titanrun rank=%d world=3 `, r, r))
				want := 2 // rank 1's first all-reduce succeeded before it died
				if n := len(re.FindAllString(out.String(), -1)); n != want {
					t.Errorf("rank %d: %d success lines, want %d\n%s", r, n, want, out)
				}
			}
			if !strings.Contains(out.String(), "[rank 0] stale job id "+elasticLocalJob(out.String())+"-r0: refused=true") {
				t.Errorf("round 1's control server did not refuse round 0's job id\n%s", out)
			}
		})
	}
}

// elasticLocalJob finds the base job id in the launcher's output.
func elasticLocalJob(out string) string {
	m := regexp.MustCompile(`job (\S+)-r1: starting`).FindStringSubmatch(out)
	if m == nil {
		return "?"
	}
	return m[1]
}

// TestElasticRestartsRunOut: a worker that dies in every round fails the
// job after --max-restarts restarts, naming the worker and the count.
func TestElasticRestartsRunOut(t *testing.T) {
	setFakeWorkers(t, "*:allreduce")
	t.Setenv(fakePostEnv, "0:exit=7")
	shortGrace(t, 500*time.Millisecond)
	notes := captureNotices(t)
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
	defer cancel()
	out := newWatchWriter("", 0)
	err := Launch(ctx, elasticLocal(t, 2, 2), nil, out)
	var we *WorkerError
	if !errors.Is(err, errNoRestarts) || !errors.As(err, &we) || we.Rank != 0 || we.Status != 7 {
		t.Fatalf("Launch: %v, want rank 0's exit 7 after the restarts ran out\n%s\n%s", err, out, notes)
	}
	for _, want := range []string{"restart 1 of 2", "restart 2 of 2", "2 restarts used (--max-restarts 2); the job fails"} {
		if !strings.Contains(notes.String(), want) {
			t.Errorf("notices lack %q:\n%s", want, notes)
		}
	}
	if n := strings.Count(out.String(), "[rank 1] allreduce ok"); n != 3 {
		t.Errorf("%d rounds ran, want 3\n%s", n, out)
	}
}

// TestTimeoutsOrdered: with the defaults, a lost worker is detected
// (heartbeat timeout, and a node's rendezvous lease) before a collective
// gives up, and a collective gives up before the rendezvous does.
func TestTimeoutsOrdered(t *testing.T) {
	job := config.Default()
	collective := time.Duration(job.Comm.TrainTimeoutSeconds) * time.Second
	initTimeout := time.Duration(job.Comm.InitTimeoutSeconds) * time.Second
	var e Elastic
	if err := parseRdzvConf("", &e); err != nil {
		t.Fatal(err)
	}
	chain := []struct {
		name string
		d    time.Duration
	}{
		{"heartbeat interval", heartbeatEvery},
		{"heartbeat timeout", control.DefaultHeartbeatTimeout},
		{"rendezvous lease (keep_alive_interval × keep_alive_max_attempt)", e.LeaseTTL},
		{"collective timeout (comm.train_timeout_seconds)", collective},
		{"bootstrap timeout (comm.init_timeout_seconds)", initTimeout},
		{"rendezvous join timeout", e.JoinTimeout},
	}
	if heartbeatEvery != control.DefaultHeartbeatInterval {
		t.Errorf("workers beat every %v, the control default is %v", heartbeatEvery, control.DefaultHeartbeatInterval)
	}
	for i := 1; i < len(chain); i++ {
		if chain[i-1].d >= chain[i].d {
			t.Errorf("%s %v is not below %s %v", chain[i-1].name, chain[i-1].d, chain[i].name, chain[i].d)
		}
	}
}

func TestParseNNodes(t *testing.T) {
	for _, c := range []struct {
		in       string
		min, max int
		err      bool
	}{
		{"", 0, 0, false}, {"2", 2, 2, false}, {"1:4", 1, 4, false}, {"3:3", 3, 3, false},
		{"0", 0, 0, true}, {"2:1", 0, 0, true}, {"a:2", 0, 0, true}, {"1:", 0, 0, true},
	} {
		lo, hi, err := ParseNNodes(c.in)
		if (err != nil) != c.err || lo != c.min || hi != c.max {
			t.Errorf("ParseNNodes(%q) = %d, %d, %v", c.in, lo, hi, err)
		}
	}
}

func TestElasticFlags(t *testing.T) {
	for _, c := range []struct {
		name  string
		env   []string
		flags Flags
		err   string
	}{
		{"range without endpoint", []string{EnvSecret + "=0123456789abcdef0123456789abcdef"}, Flags{NProc: 2, NNodes: 2, MinNodes: 1}, "needs --rdzv-endpoint"},
		{"range without secret", nil, Flags{NProc: 2, NNodes: 2, MinNodes: 1, RdzvEndpoint: "127.0.0.1:1234"}, EnvSecret},
		{"etcd without endpoint", nil, Flags{NProc: 2, RdzvBackend: "etcd"}, "--rdzv-backend etcd needs --rdzv-endpoint"},
		{"unknown backend", nil, Flags{NProc: 2, RdzvBackend: "zookeeper"}, `--rdzv-backend "zookeeper"`},
		{"negative restarts", nil, Flags{NProc: 2, MaxRestarts: -1}, "--max-restarts -1"},
		{"unknown conf key", nil, Flags{NProc: 2, MaxRestarts: 1, RdzvConf: "timeout_ish=3"}, "--rdzv-conf timeout_ish: unknown key"},
		{"bad conf value", nil, Flags{NProc: 2, MaxRestarts: 1, RdzvConf: "join_timeout=-3"}, "--rdzv-conf join_timeout=-3"},
		{"ok", []string{EnvSecret + "=0123456789abcdef0123456789abcdef"}, Flags{NProc: 2, NNodes: 2, MinNodes: 1, RdzvEndpoint: "127.0.0.1:1234", RdzvConf: "last_call_timeout=2,keep_alive_interval=0.5"}, ""},
	} {
		spec, err := Detect(c.env, c.flags)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.err)
		case c.err == "":
			e := spec.Elastic
			if e == nil || e.MinNodes != 1 || e.MaxNodes != 2 || e.LastCall != 2*time.Second || e.LeaseTTL != 1500*time.Millisecond || e.Backend != BackendC10d {
				t.Errorf("%s: elastic %+v", c.name, e)
			}
		}
	}
}

// TestElasticWorldUnfit: a round whose world the job cannot run on
// (Elastic.CheckWorld) fails the job with that error before any worker
// starts, without using a restart.
func TestElasticWorldUnfit(t *testing.T) {
	setFakeWorkers(t, "*:allreduce")
	notes := captureNotices(t)
	spec := elasticLocal(t, 3, 2)
	unfit := errors.New("parallelism.data_parallel_shard_degree 4: does not fit")
	var asked []int
	spec.Elastic.CheckWorld = func(world int) error {
		asked = append(asked, world)
		return unfit
	}
	out := newWatchWriter("", 0)
	err := Launch(context.Background(), spec, nil, out)
	if !errors.Is(err, unfit) || errors.Is(err, errNoRestarts) || !strings.Contains(err.Error(), "cannot run on the 3 workers") {
		t.Fatalf("Launch: %v, want the unfit world's error", err)
	}
	if len(asked) != 1 || asked[0] != 3 || strings.Contains(out.String(), "[rank") {
		t.Errorf("asked %v; output %q: want one check of world 3 and no worker", asked, out)
	}
	if !strings.Contains(notes.String(), "; the job fails") {
		t.Errorf("notices:\n%s", notes)
	}
}
