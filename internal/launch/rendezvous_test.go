//go:build unix

package launch

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/testenv"
)

// rdzvBackends opens a fresh store of each backend; every node of a test
// gets its own client of the same store.
func rdzvBackends(t *testing.T) map[string]func() rdzvStore {
	mem := newMemStore()
	t.Cleanup(func() { mem.Close() })
	ep := fmt.Sprint("127.0.0.1:", freePort(t))
	srv, err := listenC10d(ep, "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return map[string]func() rdzvStore{
		"memory": func() rdzvStore { return mem },
		"c10d": func() rdzvStore {
			c, err := newC10dClient(ep, "s3cret")
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		"etcd": func() rdzvStore {
			e := etcdOnce(t)
			s, err := openEtcd(e.Endpoint, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	}
}

var etcdServer *testenv.Etcd

// etcdOnce starts one etcd for the test (and its subtests).
func etcdOnce(t *testing.T) *testenv.Etcd {
	if etcdServer == nil {
		etcdServer = testenv.EtcdServer(t)
		t.Cleanup(func() { etcdServer = nil })
	}
	return etcdServer
}

func testCfg(minNodes, maxNodes, restarts int) rdzvConfig {
	return rdzvConfig{MinNodes: minNodes, MaxNodes: maxNodes, MaxRestarts: restarts,
		JoinTimeout: 20 * time.Second, LastCall: 300 * time.Millisecond, LeaseTTL: 2 * time.Second}
}

func mustNode(t *testing.T, store rdzvStore, cfg rdzvConfig, job, id string) *rendezvous {
	t.Helper()
	r, err := newRendezvous(context.Background(), store, cfg, job, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	return r
}

type nextResult struct {
	info roundInfo
	err  error
}

func goNext(r *rendezvous) <-chan nextResult {
	ch := make(chan nextResult, 1)
	go func() {
		info, err := r.next(context.Background())
		ch <- nextResult{info, err}
	}()
	return ch
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	panic("unreachable")
}

// TestRendezvousRounds walks one job through the rounds of an elastic
// run on every backend: two nodes meet (node ranks in id order), one
// leaves (its lease ends: a counted restart) and the other goes on alone,
// a newcomer waits and makes the member end the round (not counted), both
// meet again, a failure past --max-restarts is fatal for everyone, and a
// finished job tells a latecomer so.
func TestRendezvousRounds(t *testing.T) {
	for name, open := range rdzvBackends(t) {
		t.Run(name, func(t *testing.T) {
			cfg := testCfg(1, 2, 1)
			job := "job-" + name
			a := mustNode(t, open(), cfg, job, "0000-a")
			b := mustNode(t, open(), cfg, job, "0001-b")
			ca, cb := goNext(a), goNext(b)
			ra, rb := recv(t, ca, "a's round 0"), recv(t, cb, "b's round 0")
			if ra.err != nil || rb.err != nil {
				t.Fatalf("round 0: %v, %v", ra.err, rb.err)
			}
			if ra.info.Round != 0 || len(ra.info.Nodes) != 2 || ra.info.NodeRank != 0 || rb.info.NodeRank != 1 {
				t.Fatalf("round 0: a %+v, b %+v; want both, a first", ra.info, rb.info)
			}

			// b's launcher dies: its lease is revoked (as expiry would).
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wa := a.watch(ctx, ra.info)
			b.close()
			reason := recv(t, wa, "a's watch to see b leave")
			if !strings.Contains(reason, "node 0001-b left the rendezvous") {
				t.Errorf("reason %q", reason)
			}
			r1 := recv(t, goNext(a), "round 1")
			if r1.err != nil || r1.info.Round != 1 || len(r1.info.Nodes) != 1 || r1.info.Restarts != 1 {
				t.Fatalf("round 1: %+v, %v; want a alone after 1 restart", r1.info, r1.err)
			}

			// A newcomer waits; the member ends the round for it.
			c := mustNode(t, open(), cfg, job, "0001-c")
			cc := goNext(c)
			wa = a.watch(ctx, r1.info)
			reason = recv(t, wa, "a's watch to see c wait")
			if !strings.Contains(reason, "node 0001-c waits to join (1 of at most 2 nodes run)") {
				t.Errorf("reason %q", reason)
			}
			r2a, r2c := recv(t, goNext(a), "a's round 2"), recv(t, cc, "c's round 2")
			if r2a.err != nil || r2c.err != nil || r2a.info.Round != 2 || len(r2a.info.Nodes) != 2 || r2a.info.Restarts != 1 || r2c.info.NodeRank != 1 {
				t.Fatalf("round 2: a %+v %v, c %+v %v", r2a.info, r2a.err, r2c.info, r2c.err)
			}

			// A second failure is one more than --max-restarts 1.
			st, err := c.end(context.Background(), 2, "worker rank 3 exited with status 1", endFailure)
			if err != nil || !strings.Contains(st.Fatal, "worker rank 3 exited with status 1; 1 restarts used (--max-restarts 1)") {
				t.Fatalf("end: %+v, %v", st, err)
			}
			if _, err := a.next(context.Background()); !errors.Is(err, errNoRestarts) {
				t.Errorf("next after the fatal failure: %v", err)
			}
		})
	}
}

// TestRendezvousDoneAndTimeout: a latecomer of a finished job is told so;
// a round without MinNodes fails after the join timeout, naming the counts.
func TestRendezvousDoneAndTimeout(t *testing.T) {
	store := newMemStore()
	defer store.Close()
	a := mustNode(t, store, testCfg(1, 1, 0), "j", "a")
	info, err := a.next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.finish(context.Background(), info.Round); err != nil {
		t.Fatal(err)
	}
	late := mustNode(t, store, testCfg(1, 1, 0), "j", "b")
	if _, err := late.next(context.Background()); !errors.Is(err, errJobDone) {
		t.Errorf("latecomer: %v, want errJobDone", err)
	}
	cfg := testCfg(2, 3, 0)
	cfg.JoinTimeout = 300 * time.Millisecond
	lone := mustNode(t, store, cfg, "k", "a")
	_, err = lone.next(context.Background())
	if err == nil || !strings.Contains(err.Error(), "only 1 of the at least 2 nodes (--nnodes 2:3) joined round 0 within the join timeout of 300ms") {
		t.Errorf("lone node: %v", err)
	}
}

// TestC10dRefusesWrongSecret: the c10d store answers a wrong secret with a
// refusal that names the variable and nothing of the job.
func TestC10dRefusesWrongSecret(t *testing.T) {
	ep := fmt.Sprint("127.0.0.1:", freePort(t))
	store, srv, err := openC10d(ep, "right")
	if err != nil || srv == nil {
		t.Fatalf("openC10d: %v (hosting %v)", err, srv != nil)
	}
	defer srv.Close()
	if ok, err := store.Create(context.Background(), "/titan/rdzv/j/state", "x", 0); !ok || err != nil {
		t.Fatalf("create: %v %v", ok, err)
	}
	other, srv2, err := openC10d(ep, "wrong")
	if err != nil || srv2 != nil {
		t.Fatalf("second openC10d: %v (hosting %v), want a client of the first", err, srv2 != nil)
	}
	_, _, err = other.List(context.Background(), "/titan/")
	if err == nil || !strings.Contains(err.Error(), "refused this launcher") || strings.Contains(err.Error(), "/titan/rdzv/j") {
		t.Errorf("wrong secret: %v", err)
	}
	// The rendezvous speaks TLS only: a plaintext request gets no answer
	// from the store, and a client that skips the certificate check (so
	// reaches the handler) with a wrong secret is refused with nothing
	// about the job.
	if res, err := http.Post("http://"+ep+"/rdzv/list", "application/json", strings.NewReader(`{"key":"/titan/"}`)); err == nil {
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(body), "rdzv/j") || res.StatusCode == http.StatusOK {
			t.Errorf("plaintext request answered %s: %s", res.Status, body)
		}
	}
	skip := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, _ := http.NewRequest(http.MethodPost, "https://"+ep+"/rdzv/list", strings.NewReader(`{"key":"/titan/"}`))
	req.Header.Set(c10dSecretHeader, "wrong")
	res, err := skip.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden || strings.Contains(string(body), "rdzv/j") {
		t.Errorf("a wrong secret past TLS: %s %q, want 403 with nothing about the job", res.Status, body)
	}
}

// TestRendezvousHostLeavesBeforeEndpoint: a member waiting for the
// round's control server learns that its host left (lease gone) and the
// round ends as a failure instead of waiting forever.
func TestRendezvousHostLeavesBeforeEndpoint(t *testing.T) {
	store := newMemStore()
	defer store.Close()
	cfg := testCfg(2, 2, 3)
	a := mustNode(t, store, cfg, "j", "0000-a")
	b := mustNode(t, store, cfg, "j", "0001-b")
	ca, cb := goNext(a), goNext(b)
	recv(t, ca, "a's round")
	rb := recv(t, cb, "b's round")
	if rb.err != nil || rb.info.NodeRank != 1 {
		t.Fatalf("round 0: %+v %v", rb.info, rb.err)
	}
	a.close() // the host's launcher is gone before it published the endpoint
	ep, err := b.endpoint(context.Background(), rb.info)
	if ep != "" || err != nil {
		t.Fatalf("endpoint: %q, %v; want none", ep, err)
	}
	_, st, _, err := b.snapshot(context.Background())
	if err != nil || st.Round != 1 || st.Restarts != 1 || !strings.Contains(st.Reason, "node 0000-a left the rendezvous") {
		t.Errorf("state after the host left: %+v, %v", st, err)
	}
}
