//go:build unix

package launch

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/titan-go/titan/internal/control"
)

// secretLogLine starts the launcher line that names a generated secret's
// file.
const secretLogLine = "job secret generated into "

// tempSecretDir makes generated secrets go to a temporary folder.
func tempSecretDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "secrets")
	old := secretDir
	secretDir = func() (string, error) { return dir, nil }
	t.Cleanup(func() { secretDir = old })
	return dir
}

// waitSecretPath waits for node 0's line naming the generated secret's
// file and returns the path.
func waitSecretPath(t *testing.T, out0 *watchWriter, errc0 <-chan error) string {
	t.Helper()
	select {
	case <-out0.done:
	case err := <-errc0:
		t.Fatalf("node 0 ended before writing the secret: %v\n%s", err, out0)
	}
	m := regexp.MustCompile(regexp.QuoteMeta(secretLogLine) + `(\S+) `).FindStringSubmatch(out0.String())
	if m == nil {
		t.Fatalf("node 0 did not name the secret's file:\n%s", out0)
	}
	fi, err := os.Stat(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("generated secret file %s has mode %#o, want 0600", m[1], fi.Mode().Perm())
	}
	return m[1]
}

// checkSecretNotShown fails the test if secret appears in any output.
func checkSecretNotShown(t *testing.T, secret string, outs ...string) {
	t.Helper()
	if len(secret) < MinSecretLen {
		t.Fatalf("secret %q is too short to search for", secret)
	}
	for i, out := range outs {
		if strings.Contains(out, secret) {
			t.Errorf("output %d shows the job secret:\n%s", i, out)
		}
	}
}

// hostAddr returns a non-loopback IPv4 address of this machine, so that
// the control server listens on every interface; loopback if none.
func hostAddr() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return "127.0.0.1"
}

func writeSecret(t *testing.T, dir, name, secret string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(secret+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
	return p
}

// TestLaunchRefusesStrangers runs an earlier job, then a job of two
// launchers on the same endpoint (a non-loopback address of this machine
// when it has one), one worker each. Before the real node 1 joins, node-1
// launchers with a guessed secret and with the stale secret of the earlier
// job try to join and are refused, and a caller that skips the certificate
// check is not admitted; the real node 1 then completes the job. No output
// shows a secret.
func TestLaunchRefusesStrangers(t *testing.T) {
	setFakeWorkers(t, "*:allreduce")
	dir := tempSecretDir(t)
	endpoint := net.JoinHostPort(hostAddr(), fmt.Sprint(freePort(t)))
	t.Logf("endpoint %s", endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 2*launchTimeout)
	defer cancel()
	spec0, err := Detect(nil, Flags{NProc: 1, NNodes: 2, NodeRank: 0, RdzvEndpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	node1 := func(secretFile string) (*watchWriter, error) {
		spec1, err := Detect(nil, Flags{NProc: 1, NNodes: 2, NodeRank: 1, RdzvEndpoint: endpoint, SecretFile: secretFile})
		if err != nil {
			t.Fatal(err)
		}
		out := newWatchWriter("", 0)
		return out, Launch(ctx, spec1, nil, out)
	}
	var outs []string

	// The earlier job: its secret is stale once the next job starts.
	out0 := newWatchWriter(secretLogLine, 1)
	errc0 := make(chan error, 1)
	go func() { errc0 <- Launch(ctx, spec0, nil, out0) }()
	path := waitSecretPath(t, out0, errc0)
	staleSecret, err := ReadSecretFile(path)
	if err != nil {
		t.Fatal(err)
	}
	stale := writeSecret(t, t.TempDir(), "stale.secret", staleSecret, 0o600)
	out1, err1 := node1(path)
	if err0 := <-errc0; err0 != nil || err1 != nil {
		t.Fatalf("earlier job: node 0: %v, node 1: %v\n%s\n%s", err0, err1, out0, out1)
	}
	outs = append(outs, out0.String(), out1.String())

	// The job.
	out0 = newWatchWriter(secretLogLine, 1)
	go func() { errc0 <- Launch(ctx, spec0, nil, out0) }()
	if p := waitSecretPath(t, out0, errc0); p != path {
		t.Fatalf("the job's secret went to %s, the earlier job's to %s", p, path)
	}
	secret, err := ReadSecretFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if secret == staleSecret {
		t.Fatal("the job reused the earlier job's secret")
	}
	guess := writeSecret(t, t.TempDir(), "guess.secret", "0123456789abcdef0123456789abcdef", 0o600)
	for _, tc := range []struct{ name, file string }{{"guessed secret", guess}, {"stale secret of the earlier job", stale}} {
		out, err := node1(tc.file)
		var we *WorkerError
		if !errors.As(err, &we) || we.Rank != 1 || we.Status != 1 {
			t.Errorf("%s: node 1: %v, want rank 1 to fail\n%s", tc.name, err, out)
		}
		if !strings.Contains(out.String(), control.ErrNotJobServer.Error()) || !strings.Contains(out.String(), endpoint) {
			t.Errorf("%s: node 1's output does not say that the server at %s is not the job's:\n%s", tc.name, endpoint, out)
		}
		t.Logf("%s: %v\n%s", tc.name, err, out)
		outs = append(outs, out.String())
	}
	// A caller that skips the certificate check and presents a guess.
	_, err = control.Dial(ctx, control.DialConfig{Endpoint: endpoint, JobID: spec0.JobID, Secret: "0123456789abcdef0123456789abcdef",
		TLS: &tls.Config{InsecureSkipVerify: true}, Timeout: 5 * time.Second})
	if !errors.Is(err, control.ErrNotAdmitted) || strings.Contains(err.Error(), secret) {
		t.Errorf("a caller skipping the certificate check: %v, want %q", err, control.NotAdmitted)
	}
	// A plain-text caller does not even reach the service.
	_, err = control.Dial(ctx, control.DialConfig{Endpoint: endpoint, JobID: spec0.JobID, Secret: secret, Timeout: 500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "could not reach") {
		t.Errorf("a plain-text caller: %v, want it not to reach the server", err)
	}

	out1, err1 = node1(path)
	err0 := <-errc0
	if err0 != nil || err1 != nil {
		t.Fatalf("node 0: %v\nnode 1: %v\nnode 0 output:\n%s\nnode 1 output:\n%s", err0, err1, out0, out1)
	}
	checkAllReduced(t, out0.String()+out1.String(), 2, SourceTitanrun)
	// The strangers' attempts show on the node hosting the job too.
	if !strings.Contains(out0.String(), "control server: refused a connection: ") || !strings.Contains(out0.String(), "TLS handshake failed") {
		t.Errorf("node 0's output does not show the refused connections:\n%s", out0)
	}
	outs = append(outs, out0.String(), out1.String())
	checkSecretNotShown(t, secret, outs...)
	checkSecretNotShown(t, staleSecret, outs...)
	// Each job's generated secret went with the job.
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("secret folder holds %d files after the jobs ended, want none", len(entries))
	}
}

func TestSecretSources(t *testing.T) {
	dir := t.TempDir()
	const good = "a-random-job-secret-0123456789"
	ok := writeSecret(t, dir, "ok.secret", good, 0o600)
	ro := writeSecret(t, dir, "ro.secret", good, 0o400)
	loose := writeSecret(t, dir, "loose.secret", good, 0o644)
	group := writeSecret(t, dir, "group.secret", good, 0o640)
	short := writeSecret(t, dir, "short.secret", "abc", 0o600)
	empty := writeSecret(t, dir, "empty.secret", "  ", 0o600)
	big := writeSecret(t, dir, "big.secret", strings.Repeat("x", maxSecretFile+1), 0o600)
	tests := []struct {
		name string
		env  []string
		file string
		msg  string // "" must give good
	}{
		{"flag file", nil, ok, ""},
		{"read-only file", nil, ro, ""},
		{"env file", []string{EnvSecretFile + "=" + ok}, "", ""},
		{"env secret", []string{EnvSecret + "=" + good}, "", ""},
		{"file readable by others", nil, loose, "loose.secret has mode 0644"},
		{"file readable by the group", nil, group, "group.secret has mode 0640"},
		{"env file readable by others", []string{EnvSecretFile + "=" + loose}, "", "loose.secret has mode 0644"},
		{"short file", nil, short, "short.secret: the job secret has 3 characters"},
		{"short env secret", []string{EnvSecret + "=abc"}, "", "TITANRUN_SECRET: the job secret has 3 characters"},
		{"empty file", nil, empty, "empty.secret is empty"},
		{"large file", nil, big, "big.secret is larger than"},
		{"missing file", nil, filepath.Join(dir, "nope"), "nope"},
		{"folder", nil, dir, "is not a regular file"},
		{"two sources", []string{EnvSecret + "=" + good}, ok, "given twice (--rdzv-secret-file and TITANRUN_SECRET)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := userSecret(envMap(tc.env), tc.file)
			if tc.msg == "" {
				if err != nil || got != good {
					t.Fatalf("secret %q, %v; want the file's", got, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want one containing %q", err, tc.msg)
			}
			if strings.Contains(err.Error(), good) {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
	// Through Detect, for a launcher of node 1.
	_, err := Detect(nil, Flags{NProc: 1, NNodes: 2, NodeRank: 1, RdzvEndpoint: "head:29500", SecretFile: loose})
	if err == nil || !strings.Contains(err.Error(), loose) {
		t.Errorf("Detect with a loose secret file: %v, want an error naming %s", err, loose)
	}
}

func TestWriteSecretFile(t *testing.T) {
	dir := tempSecretDir(t)
	p1, err := writeSecretFile("titanrun-10.0.0.1:29500", "first-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "titanrun-10.0.0.1_29500.secret"); p1 != want {
		t.Errorf("path %s, want %s", p1, want)
	}
	p2, err := writeSecretFile("titanrun-10.0.0.1:29500", "second-secret-0123456789")
	if err != nil || p2 != p1 {
		t.Fatalf("second write: %s, %v", p2, err)
	}
	got, err := ReadSecretFile(p1)
	if err != nil || got != "second-secret-0123456789" {
		t.Fatalf("ReadSecretFile = %q, %v; want the newer secret", got, err)
	}
	fi, _ := os.Stat(p1)
	di, _ := os.Stat(dir)
	if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 {
		t.Errorf("modes file %#o, folder %#o; want 0600 and 0700", fi.Mode().Perm(), di.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("folder holds %d entries, want 1", len(entries))
	}
}
