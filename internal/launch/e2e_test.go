//go:build unix

package launch

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/comm"
	"github.com/titan-go/titan/internal/control"
	"github.com/titan-go/titan/internal/testenv"
)

// allreduceLen is the length of the vector the fake workers all-reduce: not
// a multiple of any world size used here, so that ring chunks are uneven.
const allreduceLen = 1001

// fakeValue is rank r's element i: small integers, so float32 sums are
// exact and the expected result is a direct float64 sum.
func fakeValue(r, i int) float32 { return float32((r+1)*(i%97) - 3*r) }

// fakeAllReduce is the "allreduce" fake worker action: Detect, Join,
// all-reduce, check against a direct sum, report, wait until every rank
// has reported (a second all-reduce), then act as fakePostEnv says:
// "" exit 0; "exit=N" exit N after reporting; "hang" wait; "freeze" stop
// the process with SIGSTOP (its heartbeats stop).
func fakeAllReduce() int {
	if v := os.Getenv(fakeHeartbeatEnv); v != "" {
		d, _ := time.ParseDuration(v)
		heartbeatEvery = d
	}
	spec, err := Detect(os.Environ(), Flags{})
	if err != nil {
		fmt.Println("detect:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	round, _ := strconv.Atoi(strings.TrimPrefix(spec.JobID, os.Getenv(EnvRunID)+"-r"))
	if round > 0 && spec.Rank == 0 {
		// A worker of the previous round, with its job id, is refused.
		stale := fmt.Sprintf("%s-r%d", os.Getenv(EnvRunID), round-1)
		// It reaches this round's server (the client pins its key) but
		// presents the earlier round's job id.
		tlsc, err := spec.clientTLS()
		if err != nil {
			fmt.Println("client TLS:", err)
			return 1
		}
		_, err = control.Dial(ctx, control.DialConfig{Endpoint: spec.Endpoint, JobID: stale, Secret: spec.Secret, TLS: tlsc, Timeout: 5 * time.Second})
		fmt.Printf("stale job id %s: refused=%v\n", stale, errors.Is(err, control.ErrNotAdmitted))
	}
	w, err := Join(ctx, spec)
	if err != nil {
		fmt.Println("join:", err)
		return 1
	}
	x := make([]float32, allreduceLen)
	for i := range x {
		x[i] = fakeValue(w.Rank, i)
	}
	if err := w.World.AllReduce(ctx, comm.F32(x), comm.Sum); err != nil {
		fmt.Println("allreduce:", err)
		w.Close(err)
		return 1
	}
	bad := 0
	for i := range x {
		var want float64
		for r := range w.WorldSize {
			want += float64(fakeValue(r, i))
		}
		if float64(x[i]) != want {
			bad++
		}
	}
	if bad > 0 {
		fmt.Printf("allreduce wrong at %d of %d elements\n", bad, len(x))
		w.Close(errors.New("wrong sum"))
		return 1
	}
	fmt.Printf("allreduce ok source=%s rank=%d world=%d local=%d/%d node=%d\n", spec.Source, w.Rank, w.WorldSize, w.LocalRank, w.LocalWorldSize, w.NodeRank)
	// A barrier: every rank has reported before any of them fails, so
	// that the launcher's killing of the survivors races no report.
	if err := w.World.AllReduce(ctx, comm.F32(make([]float32, 1)), comm.Sum); err != nil {
		fmt.Println("barrier:", err)
		w.Close(err)
		return 1
	}
	post := os.Getenv(fakePostEnv)
	if v, ok := os.LookupEnv(fakeFirstPostEnv); ok && os.Getenv(EnvRestartCount) == "0" {
		post = v
	}
	if r, a, ok := strings.Cut(post, ":"); ok {
		if r != strconv.Itoa(w.Rank) {
			a = "hang"
		}
		post = a
	}
	switch {
	case strings.HasPrefix(post, "exit="):
		code, _ := strconv.Atoi(strings.TrimPrefix(post, "exit="))
		w.Close(&fakeExit{code, fmt.Sprintf("fake failure of rank %d", w.Rank)})
		return code
	case post == "hang":
		usr1 := make(chan os.Signal, 1)
		signal.Notify(usr1, syscall.SIGUSR1)
		fmt.Println("ready")
		<-usr1
		fmt.Println("SIGUSR1: flight recorder dump requested")
		select {}
	case post == "kill9":
		fmt.Println("ready")
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	case post == "freeze":
		fmt.Println("ready")
		syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		select {}
	}
	if err := w.Close(nil); err != nil {
		fmt.Println("close:", err)
		return 1
	}
	return 0
}

// fakeExit is an error with an exit code, as Worker.Close reports it.
type fakeExit struct {
	code int
	msg  string
}

func (e *fakeExit) Error() string { return e.msg }
func (e *fakeExit) ExitCode() int { return e.code }

const (
	fakePostEnv      = "LAUNCHTEST_POST"      // what an allreduce worker does after the all-reduce
	fakeHeartbeatEnv = "LAUNCHTEST_HEARTBEAT" // heartbeat interval of fake workers
	fakeFirstPostEnv = "LAUNCHTEST_POST0"     // fakePostEnv of the first round of an elastic job
)

// checkAllReduced checks that ranks 0..world-1 each printed one success
// line with the given source.
func checkAllReduced(t *testing.T, out string, world int, source string) {
	t.Helper()
	for r := range world {
		re := regexp.MustCompile(fmt.Sprintf(`(?m)^\[rank %d\] allreduce ok source=%s rank=%d world=%d `, r, source, r, world))
		if source == SourceSlurm {
			re = regexp.MustCompile(fmt.Sprintf(`(?m)^allreduce ok source=%s rank=%d world=%d `, source, r, world))
		}
		if n := len(re.FindAllString(out, -1)); n != 1 {
			t.Errorf("rank %d: %d success lines, want 1", r, n)
		}
	}
}

func TestLaunchAllReduce(t *testing.T) {
	setFakeWorkers(t, "*:allreduce")
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
	defer cancel()
	out := newWatchWriter("", 0)
	if err := Launch(ctx, localSpec(4), nil, out); err != nil {
		t.Fatalf("Launch: %v\noutput:\n%s", err, out)
	}
	checkAllReduced(t, out.String(), 4, SourceTitanrun)
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// twoNodes runs two launchers as nodes 0 and 1 of one job on loopback, 2
// workers each. Node 0 generates the secret into a file and logs its path;
// node 1 reads that file, as a user would copy it.
func twoNodes(t *testing.T) (out0, out1 *watchWriter, err0, err1 error) {
	t.Helper()
	tempSecretDir(t)
	endpoint := fmt.Sprint("127.0.0.1:", freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
	defer cancel()
	spec0, err := Detect(nil, Flags{NProc: 2, NNodes: 2, NodeRank: 0, RdzvEndpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	out0 = newWatchWriter(secretLogLine, 1)
	out1 = newWatchWriter("", 0)
	errc0 := make(chan error, 1)
	go func() { errc0 <- Launch(ctx, spec0, nil, out0) }()
	path := waitSecretPath(t, out0, errc0)
	spec1, err := Detect(nil, Flags{NProc: 2, NNodes: 2, NodeRank: 1, RdzvEndpoint: endpoint, SecretFile: path})
	if err != nil {
		t.Fatal(err)
	}
	err1 = Launch(ctx, spec1, nil, out1)
	err0 = <-errc0
	checkSecretNotShown(t, spec1.Secret, out0.String(), out1.String())
	return out0, out1, err0, err1
}

func TestLaunchTwoNodes(t *testing.T) {
	setFakeWorkers(t, "*:allreduce")
	out0, out1, err0, err1 := twoNodes(t)
	if err0 != nil || err1 != nil {
		t.Fatalf("node 0: %v\nnode 1: %v\nnode 0 output:\n%s\nnode 1 output:\n%s", err0, err1, out0, out1)
	}
	all := out0.String() + out1.String()
	checkAllReduced(t, all, 4, SourceTitanrun)
	for r := range 4 {
		node := out0
		if r >= 2 {
			node = out1
		}
		if !strings.Contains(node.String(), fmt.Sprintf("[rank %d] allreduce ok source=titanrun rank=%d world=4 local=%d/2 node=%d", r, r, r%2, r/2)) {
			t.Errorf("rank %d did not report from node %d with local rank %d", r, r/2, r%2)
		}
	}
}

func TestLaunchRemoteRankFailure(t *testing.T) {
	setFakeWorkers(t, "*:allreduce")
	t.Setenv(fakePostEnv, "3:exit=3")
	shortGrace(t, time.Second)
	out0, out1, err0, err1 := twoNodes(t)
	var we0, we1 *WorkerError
	if !errors.As(err1, &we1) || we1.Rank != 3 || we1.Status != 3 || we1.PID == 0 {
		t.Errorf("node 1: %v, want rank 3 exited with status 3\n%s", err1, out1)
	}
	if !errors.As(err0, &we0) || we0.Rank != 3 || we0.Node != 1 || we0.Status != 3 || we0.PID != 0 ||
		!strings.Contains(we0.Reason, "fake failure of rank 3") {
		t.Errorf("node 0: %v, want rank 3 on node 1 exited with status 3 and its reason\n%s", err0, out0)
	}
}

func TestLaunchLostRank(t *testing.T) {
	setFakeWorkers(t, "*:allreduce")
	t.Setenv(fakePostEnv, "1:freeze")
	t.Setenv(fakeHeartbeatEnv, "100ms")
	old := heartbeatTimeout
	heartbeatTimeout = time.Second
	t.Cleanup(func() { heartbeatTimeout = old })
	shortGrace(t, 500*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
	defer cancel()
	out := newWatchWriter("", 0)
	err := Launch(ctx, localSpec(3), nil, out)
	var we *WorkerError
	if !errors.As(err, &we) || we.Rank != 1 || !we.Lost || we.PID == 0 {
		t.Fatalf("Launch: %v, want rank 1 lost\noutput:\n%s", err, out)
	}
	if !regexp.MustCompile(`^rank 1 \(pid \d+\) was lost \(no heartbeats\)`).MatchString(err.Error()) {
		t.Errorf("error %q does not name the lost rank", err)
	}
	// The ranks waiting for it are asked to dump their flight recorders
	// before they are stopped.
	for _, r := range []string{"0", "2"} {
		if !strings.Contains(out.String(), "[rank "+r+"] SIGUSR1: flight recorder dump requested") {
			t.Errorf("rank %s was not asked to dump its flight recorder\noutput:\n%s", r, out)
		}
	}
}

func TestJoinRejectsWrongSecret(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	port := freePort(t)
	env := func(rank int, secret string) []string {
		return []string{"MASTER_ADDR=127.0.0.1", fmt.Sprint("MASTER_PORT=", port), "WORLD_SIZE=2", fmt.Sprint("RANK=", rank), EnvSecret + "=" + secret}
	}
	spec0, err := Detect(env(0, "the-right-secret-0123"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	spec1, err := Detect(env(1, "the-wrong-secret-0123"), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	w0err := make(chan error, 1)
	jctx, jcancel := context.WithCancel(ctx)
	defer jcancel()
	go func() {
		w, err := Join(jctx, spec0)
		if err == nil {
			w.Close(nil)
		}
		w0err <- err
	}()
	_, err = Join(ctx, spec1)
	t.Logf("wrong secret: %v", err)
	if !errors.Is(err, control.ErrNotJobServer) || strings.Contains(err.Error(), "the-right-secret") {
		t.Errorf("Join with a wrong secret: %v, want %q, without the secret", err, control.ErrNotJobServer)
	}
	jcancel()
	<-w0err
}

func TestJoinPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	spec, err := Detect([]string{"MASTER_ADDR=127.0.0.1", fmt.Sprint("MASTER_PORT=", port), "WORLD_SIZE=2", "RANK=0"}, Flags{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Join(context.Background(), spec)
	t.Logf("busy port: %v", err)
	if err == nil || !strings.Contains(err.Error(), "already in use") || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Errorf("Join on a busy port: %v, want an error naming the address in use", err)
	}
}

func TestLaunchPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	setFakeWorkers(t, "*:exit=0")
	spec, err := Detect(nil, Flags{NProc: 2, NNodes: 2, RdzvEndpoint: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	err = Launch(context.Background(), spec, nil, &strings.Builder{})
	t.Logf("busy port: %v", err)
	if err == nil || !strings.Contains(err.Error(), "already in use") || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Errorf("Launch on a busy endpoint: %v, want an error naming the address in use", err)
	}
}

// TestSlurm runs `srun -n 4` of the test binary as fake workers on a real
// Slurm cluster (scripts/slurm/setup-single-host.sh sets one up on this
// host) and checks that the 4 tasks joined and all-reduced.
func TestSlurm(t *testing.T) {
	srun := testenv.Tool(t, "srun", "run scripts/slurm/setup-single-host.sh as root to set up a one-host Slurm cluster")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	state, err := exec.CommandContext(ctx, "sinfo", "-h", "-o", "%T").Output()
	testenv.Require(t, fmt.Sprintf("an idle Slurm node (sinfo: %q, %v; run scripts/slurm/setup-single-host.sh as root)", strings.TrimSpace(string(state)), err),
		err == nil && regexp.MustCompile(`(?m)^(idle|mixed)`).Match(state))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, srun, "-n", "4", "--overcommit", "--kill-on-bad-exit=1", "--time=2", "--job-name=titan-launch-test", exe)
	cmd.Env = append(os.Environ(), fakeWorkerEnv+"=*:allreduce")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("srun: %v\noutput:\n%s", err, out)
	}
	checkAllReduced(t, string(out), 4, SourceSlurm)
	if t.Failed() || testing.Verbose() {
		t.Logf("srun output:\n%s", out)
	}
}

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 (serving
// as its own CA, for server and client authentication) and its key.
func writeSelfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "titan launch test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestLaunchTLS runs a job whose control plane speaks mutual TLS.
func TestLaunchTLS(t *testing.T) {
	dir := setFakeWorkers(t, "*:allreduce")
	cert, key := writeSelfSigned(t, dir)
	t.Setenv(EnvTLSCert, cert)
	t.Setenv(EnvTLSKey, key)
	t.Setenv(EnvTLSCA, cert)
	spec, err := Detect(os.Environ(), Flags{NProc: 2})
	if err != nil {
		t.Fatal(err)
	}
	if spec.TLSCert != cert || spec.TLSKey != key || spec.TLSCA != cert {
		t.Fatalf("Detect did not pick up the TLS files: %+v", spec)
	}
	ctx, cancel := context.WithTimeout(context.Background(), launchTimeout)
	defer cancel()
	out := newWatchWriter("", 0)
	if err := Launch(ctx, spec, nil, out); err != nil {
		t.Fatalf("Launch: %v\noutput:\n%s", err, out)
	}
	checkAllReduced(t, out.String(), 2, SourceTitanrun)

	// A client without TLS cannot talk to the TLS server.
	plain := spec
	plain.Mode, plain.Source, plain.Rank, plain.WorldSize, plain.LocalWorldSize = ModeWorker, SourceEnv, 0, 2, 1
	plain.TLSCert, plain.TLSKey, plain.TLSCA = "", "", ""
	srv, err := control.NewServer(control.ServerConfig{JobID: "j", Secret: "s", WorldSize: 2, TLS: mustServerTLS(t, spec)})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	defer srv.Stop()
	plain.Endpoint, plain.JobID, plain.Secret = srv.Addr(), "j", "s"
	jctx, jcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer jcancel()
	_, err = Join(jctx, plain)
	t.Logf("plain client: %v", err)
	if err == nil {
		t.Error("a client without TLS joined a TLS control server")
	}
}

func mustServerTLS(t *testing.T, spec Spec) *tls.Config {
	t.Helper()
	c, err := spec.serverTLS()
	if err != nil {
		t.Fatal(err)
	}
	return c
}
