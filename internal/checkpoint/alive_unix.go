//go:build unix

package checkpoint

import (
	"errors"
	"syscall"
)

// alive reports whether a process with this pid runs on this host.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
