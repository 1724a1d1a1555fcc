package launch

import (
	"os"
	"syscall"
)

// workerProcAttr returns no special attributes on Windows.
func workerProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup ends worker pid: Windows has no signals to forward, so every
// signal terminates the process.
func signalGroup(pid int, _ syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}
