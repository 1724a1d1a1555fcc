//go:build unix

package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// PG is a throwaway PostgreSQL server for tests: a cluster made by initdb
// in a temporary folder, listening on 127.0.0.1 at a free port, with trust
// authentication for the superuser "titan", and without fsync (a crash
// of the server keeps every commit; one of the machine would not).
type PG struct {
	// URL connects to its "postgres" database as titan.
	URL string
	// Port is the TCP port it listens on.
	Port int

	dir, data, log string
	pgCtl          string
	cred           *syscall.Credential
}

// ErrNoPostgres is returned by StartPostgres when PostgreSQL's server
// programs, or the postgres user to run them as root, are missing.
var ErrNoPostgres = errors.New("PostgreSQL server programs initdb and pg_ctl are missing (Debian: apt-get install postgresql)")

// Postgres starts a PG for tb and stops it when the test ends, failing the
// test in CI and skipping it elsewhere when PostgreSQL is not installed.
func Postgres(tb testing.TB) *PG {
	tb.Helper()
	p, err := StartPostgres()
	RequirePostgres(tb, err)
	tb.Cleanup(p.Close)
	return p
}

// RequirePostgres handles StartPostgres's error: for ErrNoPostgres it
// fails the test in CI and skips it elsewhere (Require), for any other it
// fails the test.
func RequirePostgres(tb testing.TB, err error) {
	tb.Helper()
	if err == nil {
		return
	}
	Require(tb, err.Error(), !errors.Is(err, ErrNoPostgres))
	tb.Fatal(err)
}

// StartPostgres makes and starts a PG; Close stops and removes it. Run as
// root it runs the server as the postgres user, since PostgreSQL refuses
// to run as root.
func StartPostgres() (_ *PG, err error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	p := &PG{pgCtl: filepath.Join(bin, "pg_ctl")}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("%w: no user postgres to run the server as (it refuses to run as root): %v", ErrNoPostgres, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Not a test's TempDir: its parents are private to the test's user.
	if p.dir, err = os.MkdirTemp("", "titan-pg-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(p.dir)
		}
	}()
	if p.cred != nil {
		if err := os.Chown(p.dir, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			return nil, err
		}
	}
	p.data, p.log = filepath.Join(p.dir, "data"), filepath.Join(p.dir, "server.log")
	if out, err := p.command(filepath.Join(bin, "initdb"), "-D", p.data, "-U", "titan", "-A", "trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.Port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	p.URL = fmt.Sprintf("postgres://titan@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
	if err := p.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

// Close stops the server and removes its folder.
func (p *PG) Close() {
	p.command(p.pgCtl, "-D", p.data, "-m", "immediate", "-w", "stop").Run()
	os.RemoveAll(p.dir)
}

// Start starts the server (again, after Stop), waiting until it accepts
// connections.
func (p *PG) Start() error {
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c fsync=off -c full_page_writes=off", p.Port, p.dir)
	if out, err := p.command(p.pgCtl, "-D", p.data, "-l", p.log, "-w", "-t", "60", "-o", opts, "start").CombinedOutput(); err != nil {
		logText, _ := os.ReadFile(p.log)
		return fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, logText)
	}
	return nil
}

// Stop stops the server at once (pg_ctl stop -m immediate: what a crash
// or a lost host looks like to clients).
func (p *PG) Stop() error {
	if out, err := p.command(p.pgCtl, "-D", p.data, "-m", "immediate", "-w", "stop").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return nil
}

// command runs a PostgreSQL program as the server's user, in its folder,
// without the PG* variables of the test's environment.
func (p *PG) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = p.dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	return cmd
}

// postgresBin is the folder of initdb and pg_ctl: the one on $PATH, else
// the newest /usr/lib/postgresql/<version>/bin (Debian keeps them there).
func postgresBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dir = filepath.Dir(real)
		}
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	sort.Slice(found, func(i, j int) bool { return pgVersion(found[i]) < pgVersion(found[j]) })
	if len(found) == 0 {
		return "", fmt.Errorf("%w: no initdb on $PATH nor /usr/lib/postgresql/*/bin/pg_ctl", ErrNoPostgres)
	}
	return filepath.Dir(found[len(found)-1]), nil
}

func pgVersion(pgCtl string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(pgCtl))))
	return v
}
