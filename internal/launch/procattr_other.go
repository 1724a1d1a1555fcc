//go:build unix && !linux

package launch

import "syscall"

// workerProcAttr puts a worker in its own process group, so that the
// launcher alone decides which signals reach it. Without Linux's
// Pdeathsig, workers outlive a launcher that is killed with SIGKILL.
func workerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// signalGroup sends sig to the process group that worker pid leads, so that
// processes the worker started get it too.
func signalGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }
