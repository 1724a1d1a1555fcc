package control

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	testJob    = "job-test"
	testSecret = "s3cret"
)

// startServer starts a server with test defaults for the zero fields of cfg
// and stops it when the test ends.
func startServer(t *testing.T, cfg ServerConfig) *Server {
	t.Helper()
	if cfg.JobID == "" {
		cfg.JobID = testJob
	}
	if cfg.Secret == "" {
		cfg.Secret = testSecret
	}
	if cfg.WorldSize == 0 {
		cfg.WorldSize = 1
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

// dial connects to s with the test credentials and closes the client when
// the test ends.
func dial(t *testing.T, s *Server) *Client {
	t.Helper()
	c, err := Dial(context.Background(), DialConfig{Endpoint: s.Addr(), JobID: testJob, Secret: testSecret, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// nextEvent returns the next event, failing the test after wait.
func nextEvent(t *testing.T, s *Server, wait time.Duration) Event {
	t.Helper()
	select {
	case e, ok := <-s.Events():
		if !ok {
			t.Fatal("events channel closed")
		}
		return e
	case <-time.After(wait):
		t.Fatalf("no event within %v", wait)
	}
	return Event{}
}

// waitFor polls cond (a white-box view of server state) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestRendezvous(t *testing.T) {
	const nodes, perNode = 2, 2
	s := startServer(t, ServerConfig{WorldSize: nodes * perNode})
	ctx := testCtx(t)

	type result struct{ node, local, rank, world int }
	results := make(chan result, nodes*perNode)
	errs := make(chan error, nodes*perNode)
	var wg sync.WaitGroup
	// Join in a scrambled order: the ranks must not depend on it.
	for _, slot := range rand.Perm(nodes * perNode) {
		node, local := slot/perNode, slot%perNode
		c := dial(t, s)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rank, world, err := c.Join(ctx, node, local, perNode, fmt.Sprintf("10.0.0.%d:%d", node, 7000+local))
			if err != nil {
				errs <- err
				return
			}
			results <- result{node, local, rank, world}
		}()
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Fatalf("Join: %v", err)
	}
	var ranks []int
	for r := range results {
		if want := r.node*perNode + r.local; r.rank != want {
			t.Errorf("node %d local %d: rank %d, want %d", r.node, r.local, r.rank, want)
		}
		if r.world != nodes*perNode {
			t.Errorf("rank %d: world %d, want %d", r.rank, r.world, nodes*perNode)
		}
		ranks = append(ranks, r.rank)
	}
	slices.Sort(ranks)
	if !slices.Equal(ranks, []int{0, 1, 2, 3}) {
		t.Errorf("ranks %v, want [0 1 2 3]", ranks)
	}
	if err := s.WaitJoined(ctx); err != nil {
		t.Fatal(err)
	}

	members, world, complete, err := dial(t, s).Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if world != 4 || !complete || len(members) != 4 {
		t.Fatalf("Members: world %d complete %v, %d members; want 4, true, 4", world, complete, len(members))
	}
	for i, m := range members {
		wantAddr := fmt.Sprintf("10.0.0.%d:%d", i/perNode, 7000+i%perNode)
		if m.Rank != i || m.NodeRank != i/perNode || m.LocalRank != i%perNode || m.Addr != wantAddr || !strings.HasPrefix(m.Peer, "127.0.0.1:") {
			t.Errorf("member %d = %+v", i, m)
		}
	}
	var joined []int
	for range 4 {
		e := nextEvent(t, s, 5*time.Second)
		if e.Kind != EventJoined {
			t.Fatalf("event %v, want joined", e)
		}
		joined = append(joined, e.Rank)
	}
	slices.Sort(joined)
	if !slices.Equal(joined, []int{0, 1, 2, 3}) {
		t.Errorf("joined events for ranks %v", joined)
	}
}

func TestJoinErrors(t *testing.T) {
	tests := []struct {
		name          string
		first         [3]int // node, local, lws of a worker that joins first (and waits)
		node, local   int
		lws           int
		code          codes.Code
		is            error
		msg           []string
		firstMustWait bool
	}{
		{name: "duplicate slot", first: [3]int{1, 0, 2}, node: 1, local: 0, lws: 2, code: codes.AlreadyExists, is: ErrSlotTaken,
			msg: []string{"node_rank=1 local_rank=0", "rank 2", "already joined"}},
		{name: "local rank too large", first: [3]int{0, 0, 2}, node: 0, local: 2, lws: 2, code: codes.InvalidArgument,
			msg: []string{"local rank 2 out of range [0, 2)"}},
		{name: "negative local rank", first: [3]int{0, 0, 2}, node: 0, local: -1, lws: 2, code: codes.InvalidArgument,
			msg: []string{"local rank -1 out of range"}},
		{name: "zero local world size", first: [3]int{0, 0, 2}, node: 0, local: 0, lws: 0, code: codes.InvalidArgument,
			msg: []string{"local world size 0"}},
		{name: "rank outside world", first: [3]int{0, 0, 2}, node: 2, local: 0, lws: 2, code: codes.InvalidArgument,
			msg: []string{"gives rank 4, outside world size 4"}},
		{name: "negative node rank", first: [3]int{0, 0, 2}, node: -1, local: 0, lws: 2, code: codes.InvalidArgument,
			msg: []string{"node rank -1"}},
		{name: "mixed local world sizes", first: [3]int{0, 0, 2}, node: 1, local: 0, lws: 1, code: codes.InvalidArgument,
			msg: []string{"local world size 1", "differs from 2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, ServerConfig{WorldSize: 4})
			ctx, cancel := context.WithCancel(testCtx(t))
			first := dial(t, s)
			firstDone := make(chan error, 1)
			go func() {
				_, _, err := first.Join(ctx, tc.first[0], tc.first[1], tc.first[2], "")
				firstDone <- err
			}()
			waitFor(t, "first joiner", func() bool { return len(s.Members()) == 1 })

			_, _, err := dial(t, s).Join(ctx, tc.node, tc.local, tc.lws, "")
			if err == nil {
				t.Fatal("Join succeeded, want error")
			}
			if status.Code(err) != tc.code {
				t.Errorf("code %v, want %v (%v)", status.Code(err), tc.code, err)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.is)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not contain %q", err, m)
				}
			}
			cancel()
			if err := <-firstDone; !errors.Is(err, context.Canceled) {
				t.Errorf("first joiner after cancel: %v, want context.Canceled", err)
			}
		})
	}
}

func TestJoinAfterComplete(t *testing.T) {
	s := startServer(t, ServerConfig{WorldSize: 2})
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for local := range 2 {
		c := dial(t, s)
		wg.Go(func() {
			if _, _, err := c.Join(ctx, 0, local, 2, ""); err != nil {
				t.Errorf("Join local %d: %v", local, err)
			}
		})
	}
	wg.Wait()
	_, _, err := dial(t, s).Join(ctx, 0, 1, 2, "")
	if !errors.Is(err, ErrRendezvousComplete) || !strings.Contains(err.Error(), "rendezvous already complete") {
		t.Fatalf("late Join: %v, want ErrRendezvousComplete", err)
	}
}

func TestJoinCancelFreesSlot(t *testing.T) {
	s := startServer(t, ServerConfig{WorldSize: 2})
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, err := dial(t, s).Join(short, 0, 0, 2, "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Join with expiring context: %v, want DeadlineExceeded", err)
	}
	if e := nextEvent(t, s, 5*time.Second); e.Kind != EventJoined || e.Rank != 0 {
		t.Fatalf("event %v, want rank 0 joined", e)
	}
	if e := nextEvent(t, s, 5*time.Second); e.Kind != EventLeft || e.Rank != 0 {
		t.Fatalf("event %v, want rank 0 left", e)
	}
	// The slot is free again: a replacement takes it and the world completes.
	ctx := testCtx(t)
	var wg sync.WaitGroup
	for local := range 2 {
		c := dial(t, s)
		wg.Go(func() {
			if rank, _, err := c.Join(ctx, 0, local, 2, ""); err != nil || rank != local {
				t.Errorf("Join local %d: rank %d, %v", local, rank, err)
			}
		})
	}
	wg.Wait()
}

func TestGetBlocksUntilSet(t *testing.T) {
	s := startServer(t, ServerConfig{})
	ctx := testCtx(t)
	getter, setter := dial(t, s), dial(t, s)
	got := make(chan []byte, 1)
	go func() {
		v, err := getter.Get(ctx, "addr/3")
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	// The Get is parked on the server (a waiter exists) and has not returned.
	waitFor(t, "Get to wait on the server", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.keyWait["addr/3"]
		return ok
	})
	select {
	case v := <-got:
		t.Fatalf("Get returned %q before Set", v)
	default:
	}
	want := []byte("10.1.2.3:4567")
	if err := setter.Set(ctx, "addr/3", want); err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != string(want) {
		t.Fatalf("Get = %q, want %q", v, want)
	}
	// A key that is already set returns at once; Set replaces the value;
	// Wait covers several keys; empty values round-trip.
	if err := setter.Set(ctx, "addr/3", []byte("new")); err != nil {
		t.Fatal(err)
	}
	if v, err := getter.Get(ctx, "addr/3"); err != nil || string(v) != "new" {
		t.Fatalf("Get after overwrite = %q, %v", v, err)
	}
	if err := setter.Set(ctx, "empty", nil); err != nil {
		t.Fatal(err)
	}
	if v, err := getter.Get(ctx, "empty"); err != nil || v == nil || len(v) != 0 {
		t.Fatalf("Get(empty) = %#v, %v", v, err)
	}
	if err := getter.Wait(ctx, "addr/3", "empty"); err != nil {
		t.Fatal(err)
	}
}

func TestGetTimeout(t *testing.T) {
	s := startServer(t, ServerConfig{})
	c := dial(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Get(ctx, "never")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `"never"`) {
		t.Fatalf("Get of missing key: %v, want DeadlineExceeded naming the key", err)
	}
	if err := c.Wait(ctx, "never"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait of missing key: %v", err)
	}
	if err := c.Set(testCtx(t), "", []byte("x")); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Set with empty key: %v", err)
	}
}

func TestAddAtomic(t *testing.T) {
	s := startServer(t, ServerConfig{})
	ctx := testCtx(t)
	const clients, perClient, goroutines = 4, 25, 3
	var (
		mu   sync.Mutex
		seen []int64
		wg   sync.WaitGroup
	)
	for range clients {
		c := dial(t, s)
		for range goroutines {
			wg.Go(func() {
				for range perClient {
					v, err := c.Add(ctx, "counter", 1)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					seen = append(seen, v)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	// Every increment returned a distinct value: exactly 1..total.
	const total = clients * perClient * goroutines
	slices.Sort(seen)
	for i, v := range seen {
		if v != int64(i+1) {
			t.Fatalf("sorted Add results[%d] = %d, want %d (lost or duplicated update)", i, v, i+1)
		}
	}
	if len(seen) != total {
		t.Fatalf("%d results, want %d", len(seen), total)
	}
	c := dial(t, s)
	if v, err := c.Get(ctx, "counter"); err != nil || string(v) != strconv.Itoa(total) {
		t.Fatalf("Get(counter) = %q, %v; want %d", v, err, total)
	}
	if v, err := c.Add(ctx, "counter", -total-5); err != nil || v != -5 {
		t.Fatalf("Add negative = %d, %v; want -5", v, err)
	}
	if err := c.Set(ctx, "text", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Add(ctx, "text", 1); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "not an integer") {
		t.Fatalf("Add on text: %v", err)
	}
}

func TestBarrier(t *testing.T) {
	s := startServer(t, ServerConfig{})
	ctx := testCtx(t)
	const n = 4
	clients := make([]*Client, n)
	for i := range clients {
		clients[i] = dial(t, s)
	}
	// Two generations of the same barrier name: nobody leaves a generation
	// before all n have arrived, which each checks through a counter that
	// everyone bumps before entering.
	for gen := range 2 {
		key := fmt.Sprintf("arrived/%d", gen)
		var wg sync.WaitGroup
		for _, c := range clients {
			wg.Go(func() {
				if _, err := c.Add(ctx, key, 1); err != nil {
					t.Error(err)
					return
				}
				if err := c.Barrier(ctx, "step", n); err != nil {
					t.Error(err)
					return
				}
				v, err := c.Get(ctx, key)
				if err != nil || string(v) != strconv.Itoa(n) {
					t.Errorf("generation %d: after barrier %s = %q, %v; want %d", gen, key, v, err, n)
				}
			})
		}
		wg.Wait()
	}

	// Mismatched participant counts are refused.
	bctx, cancel := context.WithCancel(ctx)
	waiting := make(chan error, 1)
	go func() { waiting <- clients[0].Barrier(bctx, "mismatch", 2) }()
	waitFor(t, "barrier participant", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.barriers["mismatch"] != nil
	})
	if err := clients[1].Barrier(ctx, "mismatch", 3); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "n=3") {
		t.Fatalf("Barrier with mismatched n: %v", err)
	}
	// A participant whose context ends leaves the barrier.
	cancel()
	if err := <-waiting; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Barrier: %v", err)
	}
	waitFor(t, "barrier to be emptied", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.barriers["mismatch"] == nil
	})
	if err := clients[1].Barrier(ctx, "solo", 1); err != nil {
		t.Fatalf("Barrier with n=1: %v", err)
	}
	if err := clients[1].Barrier(ctx, "bad", 0); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Barrier with n=0: %v", err)
	}
}

func TestHeartbeatLoss(t *testing.T) {
	const timeout = 300 * time.Millisecond
	s := startServer(t, ServerConfig{WorldSize: 2, HeartbeatTimeout: timeout})
	healthy, dying := dial(t, s), dial(t, s)
	healthy.StartHeartbeats(1, 20*time.Millisecond)
	dying.StartHeartbeats(0, 20*time.Millisecond)
	waitFor(t, "both ranks to be monitored", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.lastBeat) == 2
	})
	stopped := time.Now()
	dying.StopHeartbeats()
	e := nextEvent(t, s, 10*timeout)
	elapsed := time.Since(stopped)
	if e.Kind != EventLost || e.Rank != 0 || !strings.Contains(e.Reason, "no heartbeat") {
		t.Fatalf("event %v, want rank 0 lost", e)
	}
	t.Logf("lost event %v after heartbeats stopped (timeout %v): %v", elapsed.Round(time.Millisecond), timeout, e)
	// The healthy rank is not declared lost.
	select {
	case e := <-s.Events():
		t.Fatalf("unexpected event %v", e)
	case <-time.After(2 * timeout):
	}
	select {
	case err := <-healthy.HeartbeatErrors():
		t.Fatalf("heartbeat error: %v", err)
	default:
	}
}

func TestHeartbeatErrorsWhenServerGone(t *testing.T) {
	s := startServer(t, ServerConfig{})
	c := dial(t, s)
	c.StartHeartbeats(0, 10*time.Millisecond)
	s.Stop()
	select {
	case err := <-c.HeartbeatErrors():
		if !strings.Contains(err.Error(), "heartbeat of rank 0") {
			t.Fatalf("heartbeat error %q does not name the rank", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat error after the server stopped")
	}
}

func TestReportExit(t *testing.T) {
	const timeout = 100 * time.Millisecond
	s := startServer(t, ServerConfig{WorldSize: 3, HeartbeatTimeout: timeout})
	c := dial(t, s)
	ctx := testCtx(t)
	c.StartHeartbeats(2, 10*time.Millisecond)
	waitFor(t, "rank 2 to be monitored", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.lastBeat) == 1
	})
	if err := c.ReportExit(ctx, 2, 137, "signal: killed"); err != nil {
		t.Fatal(err)
	}
	c.StopHeartbeats()
	e := nextEvent(t, s, 5*time.Second)
	want := Event{Kind: EventExited, Rank: 2, Code: 137, Reason: "signal: killed"}
	if e != want {
		t.Fatalf("event %+v, want %+v", e, want)
	}
	if got := e.String(); got != "rank 2 exited with code 137 (signal: killed)" {
		t.Errorf("String() = %q", got)
	}
	// An exited rank is no longer monitored: no "lost" follows.
	select {
	case e := <-s.Events():
		t.Fatalf("unexpected event %v", e)
	case <-time.After(3 * timeout):
	}
	if err := c.ReportExit(ctx, 3, 1, ""); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "rank 3 outside world size 3") {
		t.Fatalf("ReportExit of rank 3: %v", err)
	}
}

func TestStopReleasesWaiters(t *testing.T) {
	s := startServer(t, ServerConfig{WorldSize: 2})
	c := dial(t, s)
	ctx := testCtx(t)
	errs := make(chan error, 3)
	go func() { _, err := c.Get(ctx, "never"); errs <- err }()
	go func() { errs <- c.Barrier(ctx, "b", 2) }()
	go func() { _, _, err := c.Join(ctx, 0, 0, 2, ""); errs <- err }()
	waitFor(t, "three blocked calls", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.keyWait) == 1 && len(s.barriers) == 1 && len(s.members) == 1
	})
	s.Stop()
	for range 3 {
		if err := <-errs; status.Code(err) != codes.Unavailable {
			t.Errorf("blocked call after Stop: %v, want Unavailable", err)
		}
	}
	// Drain: the channel is closed after the queued events.
	for range s.Events() {
	}
	if err := s.WaitJoined(ctx); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("WaitJoined after Stop: %v", err)
	}
}

func TestPortInUse(t *testing.T) {
	s := startServer(t, ServerConfig{})
	_, err := NewServer(ServerConfig{Addr: s.Addr(), JobID: testJob, WorldSize: 1})
	if err == nil {
		t.Fatal("second server on the same port started")
	}
	if !strings.Contains(err.Error(), s.Addr()) || !strings.Contains(err.Error(), "already in use") || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("error %q does not name %s as in use", err, s.Addr())
	}
}

func TestServerConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		cfg  ServerConfig
		msg  string // empty: must succeed
	}{
		{"loopback without secret", ServerConfig{Addr: "127.0.0.1:0", JobID: "j", WorldSize: 1}, ""},
		{"default address without secret", ServerConfig{JobID: "j", WorldSize: 1}, ""},
		{"localhost without secret", ServerConfig{Addr: "localhost:0", JobID: "j", WorldSize: 1}, ""},
		{"all interfaces without secret", ServerConfig{Addr: ":0", JobID: "j", WorldSize: 1}, "not loopback, so a job secret is required"},
		{"0.0.0.0 without secret", ServerConfig{Addr: "0.0.0.0:0", JobID: "j", WorldSize: 1}, "not loopback"},
		{"all interfaces with secret, no TLS", ServerConfig{Addr: ":0", JobID: "j", Secret: "x", WorldSize: 1}, "not loopback, so the control plane needs TLS"},
		{"all interfaces with secret and job TLS", ServerConfig{Addr: ":0", JobID: "j", Secret: "x", WorldSize: 1, TLS: jobServerTLS("x", "j")}, ""},
		{"all interfaces insecure", ServerConfig{Addr: ":0", JobID: "j", Insecure: true, WorldSize: 1}, ""},
		{"zero world", ServerConfig{JobID: "j"}, "world size 0"},
		{"empty job", ServerConfig{WorldSize: 1}, "job id must not be empty"},
		{"negative heartbeat timeout", ServerConfig{JobID: "j", WorldSize: 1, HeartbeatTimeout: -1}, "heartbeat timeout"},
		{"bad address", ServerConfig{Addr: "nonsense", JobID: "j", WorldSize: 1}, `"nonsense"`},
		{"TLS without certificate", ServerConfig{JobID: "j", WorldSize: 1, TLS: tlsConfigWithoutCert()}, "no server certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewServer(tc.cfg)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("NewServer: %v", err)
				}
				s.Stop()
				return
			}
			if err == nil {
				s.Stop()
				t.Fatalf("NewServer succeeded, want error containing %q", tc.msg)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %q does not contain %q", err, tc.msg)
			}
		})
	}
}

func TestIsLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.1.2.3": true, "::1": true, "localhost": true, "LOCALHOST": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.1": false, "example.com": false, "fe80::1%eth0": false,
	} {
		if got := isLoopbackHost(host); got != want {
			t.Errorf("isLoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestDialBeforeServerStarts(t *testing.T) {
	// Reserve a free port, release it, and start the server there only
	// after the client began dialling.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	type dialed struct {
		c   *Client
		err error
	}
	done := make(chan dialed, 1)
	go func() {
		c, err := Dial(context.Background(), DialConfig{Endpoint: addr, JobID: testJob, Secret: testSecret, Timeout: 20 * time.Second})
		done <- dialed{c, err}
	}()
	time.Sleep(200 * time.Millisecond) // let some connection attempts fail
	s := startServer(t, ServerConfig{Addr: addr})
	d := <-done
	if d.err != nil {
		t.Fatalf("Dial: %v", d.err)
	}
	defer d.c.Close()
	if err := d.c.Set(testCtx(t), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if got := s.Addr(); got != addr {
		t.Errorf("server address %s, want %s", got, addr)
	}
}

func TestDialNoServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = Dial(context.Background(), DialConfig{Endpoint: addr, JobID: testJob, Timeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "could not reach") {
		t.Fatalf("Dial to nothing: %v, want error naming %s", err, addr)
	}
	if _, err := Dial(context.Background(), DialConfig{Endpoint: "no-port", Timeout: time.Second}); err == nil || !strings.Contains(err.Error(), `"no-port"`) {
		t.Fatalf("Dial with bad endpoint: %v", err)
	}
}

func TestNewSecret(t *testing.T) {
	a, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewSecret()
	if len(a) != 64 || strings.Trim(a, "0123456789abcdef") != "" || a == b {
		t.Fatalf("NewSecret() = %q, %q; want two different 64-digit hex strings", a, b)
	}
}
