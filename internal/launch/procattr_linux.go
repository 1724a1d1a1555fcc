package launch

import "syscall"

// workerProcAttr puts a worker in its own process group, so that the
// launcher alone decides which signals reach it, and kills it when the
// launcher's thread that started it dies (for example by SIGKILL).
func workerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroup sends sig to the process group that worker pid leads, so that
// processes the worker started get it too.
func signalGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }
