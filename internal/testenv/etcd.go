//go:build unix

package testenv

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Etcd is a throwaway one-member etcd server for tests: its data in a
// temporary folder, listening on 127.0.0.1 at free ports.
type Etcd struct {
	// Endpoint is its client address, host:port.
	Endpoint string

	dir    string
	cmd    *exec.Cmd
	log    *os.File
	exited chan error
}

// ErrNoEtcd is returned by StartEtcd when the etcd server is missing.
var ErrNoEtcd = errors.New("the etcd server is missing (Debian: apt-get install etcd-server)")

// EtcdServer starts an Etcd for tb and stops it when the test ends,
// failing the test in CI and skipping it elsewhere when etcd is not
// installed.
func EtcdServer(tb testing.TB) *Etcd {
	tb.Helper()
	e, err := StartEtcd()
	if err != nil {
		Require(tb, err.Error(), !errors.Is(err, ErrNoEtcd))
		tb.Fatal(err)
	}
	tb.Cleanup(e.Close)
	return e
}

// freeLoopbackPort returns a loopback port that was free a moment ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartEtcd starts an Etcd and waits until it is healthy; Close stops it
// and removes its data.
func StartEtcd() (_ *Etcd, err error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if _, serr := os.Stat("/usr/bin/etcd"); serr != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoEtcd, err)
		}
		bin = "/usr/bin/etcd"
	}
	e := &Etcd{}
	if e.dir, err = os.MkdirTemp("", "titan-etcd-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	client, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	peer, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	e.Endpoint = fmt.Sprintf("127.0.0.1:%d", client)
	cu, pu := "http://"+e.Endpoint, fmt.Sprintf("http://127.0.0.1:%d", peer)
	if e.log, err = os.Create(filepath.Join(e.dir, "etcd.log")); err != nil {
		return nil, err
	}
	e.cmd = exec.Command(bin, "--name", "test", "--data-dir", filepath.Join(e.dir, "data"),
		"--listen-client-urls", cu, "--advertise-client-urls", cu,
		"--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
		"--initial-cluster", "test="+pu, "--unsafe-no-fsync")
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting etcd: %w", err)
	}
	e.exited = make(chan error, 1)
	go func() { e.exited <- e.cmd.Wait() }()
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-e.exited:
			e.cmd = nil
			logText, _ := os.ReadFile(e.log.Name())
			return nil, fmt.Errorf("etcd exited at start: %v\n%s", err, logText)
		default:
		}
		if res, err := hc.Get(cu + "/health"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return e, nil
			}
		}
		if time.Now().After(deadline) {
			logText, _ := os.ReadFile(e.log.Name())
			return nil, fmt.Errorf("etcd did not become healthy within 30s\n%s", logText)
		}
	}
}

// Close stops the server and removes its folder.
func (e *Etcd) Close() {
	if e.cmd != nil && e.cmd.Process != nil {
		e.cmd.Process.Kill()
		<-e.exited
		e.cmd = nil
	}
	if e.log != nil {
		e.log.Close()
	}
	os.RemoveAll(e.dir)
}
