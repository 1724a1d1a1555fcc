//go:build unix

package process

import (
	"errors"
	"syscall"
)

// Alive reports whether a process with this pid runs on this host. A pid
// of 0 or below is never alive.
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
